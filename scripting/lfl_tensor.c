/*
** lfl_tensor.c -- the fl.Tensor userdata: lifetime, fields, queries,
** printing, device/dtype moves and the in-place ops.
** Invariant: a userdata holds at most one storage reference, taken after
** the userdata exists and dropped exactly once; __gc may run again (a
** resurrected object) and then finds the slot already empty.
*/
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lfl.h"

/* ---------------------------------------------------------------------- */
/* lifetime                                                               */
/* ---------------------------------------------------------------------- */

fl_tensor *lfl_newtensor(lua_State *L) {
  lfl_ud *u = (lfl_ud *)lua_newuserdatauv(L, sizeof *u, 0);
  memset(u, 0, sizeof *u);
  u->node = -1;
  luaL_setmetatable(L, LFL_TENSOR);
  return &u->t;
}

fl_tensor *lfl_totensor(lua_State *L, int idx) {
  return (fl_tensor *)luaL_testudata(L, idx, LFL_TENSOR);
}

fl_tensor *lfl_checktensor(lua_State *L, int idx) {
  fl_tensor *t = (fl_tensor *)luaL_checkudata(L, idx, LFL_TENSOR);
  /* only reachable through a finalized (resurrected) object; a lazy
  ** tensor has no storage yet on purpose */
  if (t->st == NULL && meta_numel(&t->m) > 0 && !lfl_islazy(t))
    luaL_argerror(L, idx, "tensor has been released");
  return t;
}

fl_tensor *lfl_checkdata(lua_State *L, int idx, const char *what) {
  fl_tensor *t = lfl_checktensor(L, idx);
  if (lfl_islazy(t)) lfl_trace_materialize(L, t, what);
  return t;
}

/* Lua's collector sees only the small userdata, not the storage behind
** it, so a loop dropping large tensors would pile up gigabytes of garbage
** before Lua thought its heap had grown.  Storage bytes are counted here
** (per state): once as many bytes have been allocated as were live after
** the last collection, a full collection runs -- Lua's own "pause 200%"
** rule applied to tensor memory.  The floor (LFL_GC_MIN) is modest
** because garbage outputs hold memory the next outputs of a loop could
** reuse: a compiled call whose last output is dropped at once (as
** Python's reference counts do) writes into mapped pages, one whose old
** outputs wait for the collection writes into fresh ones, a page fault
** per 4 KiB (2.3 us each on this kind of VM, about 0.56 ms per MiB; with
** a 64 MiB floor a compiled MLP's first 128 calls all faulted).  A full
** collection costs about 0.1 ms on fuselab's own heap and grows with
** Lua's, so the interval is also at least 8 times Lua's heap: the
** collector's share stays near 6 us per MiB allocated.  Garbage stays
** below max(live, 8 x Lua's heap, LFL_GC_MIN). */
#define LFL_GC_MIN ((size_t)16 << 20)

typedef struct mem_acct {
  size_t live;                 /* storage bytes held by live userdata */
  size_t since;                /* bytes allocated since the last collection */
  size_t limit;                /* collect when since passes this */
} mem_acct;

static const char acct_key = 'a';

static mem_acct *get_acct(lua_State *L) {
  mem_acct *a;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &acct_key) == LUA_TUSERDATA) {
    a = (mem_acct *)lua_touserdata(L, -1);
  } else {
    lua_pop(L, 1);
    a = (mem_acct *)lua_newuserdatauv(L, sizeof *a, 0);
    a->live = a->since = 0;
    a->limit = LFL_GC_MIN;
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &acct_key);
  }
  lua_pop(L, 1);                     /* the registry keeps it alive */
  return a;
}

void lfl_account(lua_State *L, size_t n) {
  mem_acct *a = get_acct(L);
  a->live += n;
  a->since += n;
  if (a->since > a->limit) {
    size_t heap8;
    lua_gc(L, LUA_GCCOLLECT);        /* finalizers lower a->live */
    a->since = 0;
    heap8 = (size_t)lua_gc(L, LUA_GCCOUNT, 0) << 13;   /* KiB -> 8 x bytes */
    a->limit = a->live > LFL_GC_MIN ? a->live : LFL_GC_MIN;
    if (heap8 > a->limit) a->limit = heap8;
  }
}

/* Called as a userdata lets go of storage it may be the last to hold. */
static void unaccount(lua_State *L, const fl_tensor *t) {
  mem_acct *a;
  if (!t->st || t->st->refs != 1) return;
  a = get_acct(L);
  a->live = a->live > t->st->nbytes ? a->live - t->st->nbytes : 0;
}

/* After an allocation failure: collect everything collectable once, so
** the caller can retry before reporting the size it could not get. */
void lfl_collect(lua_State *L) {
  mem_acct *a = get_acct(L);
  lua_gc(L, LUA_GCCOLLECT);
  a->since = 0;
}

fl_tensor *lfl_pushempty(lua_State *L, const fl_meta *m, const char *what) {
  fl_err e;
  fl_tensor *t;
  int rc;
  err_clear(&e);
  if (meta_check_size(m, what, &e) != FL_OK) lfl_raise(L, what, &e);
  t = lfl_newtensor(L);
  rc = ten_empty(t, m, &e);
  if (rc == FL_ENOMEM) {             /* garbage may hold the memory */
    lfl_collect(L);
    err_clear(&e);
    rc = ten_empty(t, m, &e);
  }
  if (rc != FL_OK) lfl_raise(L, what, &e);
  if (t->st) lfl_account(L, t->st->nbytes);
  return t;
}

/* Slots for tensors a binding fills and hands on: whatever is still in
** them when the userdata is collected (a raise between filling and
** handing on) is released then. */
#define LFL_SLOTS "fl.TensorSlots"

typedef struct slots {
  int n;
  fl_tensor t[];
} slots;

static int slots_gc(lua_State *L) {
  slots *s = (slots *)luaL_checkudata(L, 1, LFL_SLOTS);
  int i;
  for (i = 0; i < s->n; i++) ten_release(&s->t[i]);
  return 0;
}

fl_tensor *lfl_newslots(lua_State *L, int n) {
  slots *s = (slots *)lua_newuserdatauv(L, sizeof *s + (size_t)(n + 1) * sizeof(fl_tensor), 0);
  s->n = n;
  memset(s->t, 0, (size_t)(n + 1) * sizeof(fl_tensor));
  if (luaL_newmetatable(L, LFL_SLOTS)) {
    lua_pushcfunction(L, slots_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  return s->t;
}

fl_tensor *lfl_pushmoved(lua_State *L, fl_tensor *src) {
  fl_tensor *t = lfl_newtensor(L);
  *t = *src;
  src->st = NULL;
  if (t->st && t->st->refs == 1) lfl_account(L, t->st->nbytes);
  return t;
}

static fl_tensor *push_number(lua_State *L, int idx, fl_dtype fdt) {
  fl_meta m;
  fl_tensor *t;
  int isint = lua_isinteger(L, idx);
  memset(&m, 0, sizeof m);
  m.dtype = isint ? FL_I64 : fdt;
  m.device = FL_DEV_CPU;
  m.ndim = 0;
  m.wrapped = 1;
  t = lfl_pushempty(L, &m, "scalar");
  if (isint)
    *(int64_t *)ten_data(t) = (int64_t)lua_tointeger(L, idx);
  else
    ten_set(t, 0, (double)lua_tonumber(L, idx));
  return t;
}

fl_tensor *lfl_pushscalar(lua_State *L, int idx) { return push_number(L, idx, FL_F32); }

void lfl_widen_numbers(lua_State *L, const fl_tensor **in, int first, int n) {
  int k, wide = 0;
  for (k = 0; k < n; k++)
    if (in[k] && !in[k]->m.wrapped && in[k]->m.dtype == FL_F64) wide = 1;
  for (k = 0; wide && k < n; k++)
    if (lua_type(L, first + k) == LUA_TNUMBER && !lua_isinteger(L, first + k))
      in[k] = push_number(L, first + k, FL_F64);
}

fl_tensor *lfl_checkoperand(lua_State *L, int idx) {
  fl_tensor *t;
  if (lua_type(L, idx) == LUA_TNUMBER) return lfl_pushscalar(L, idx);
  if (lfl_issym(L, idx)) return lfl_sym_totensor(L, idx);
  if ((t = lfl_totensor(L, idx)) == NULL)
    luaL_typeerror(L, idx, "fl.Tensor or number");
  return lfl_checktensor(L, idx);
}

void lfl_drop(lua_State *L, fl_tensor *t) {
  if (lfl_islazy(t)) lfl_trace_forget(L, t);   /* an orphan maybe */
  lfl_ag_release(t);
  unaccount(L, t);
  ten_release(t);                    /* leaves st NULL: idempotent */
}

static int t_gc(lua_State *L) {
  lfl_drop(L, (fl_tensor *)luaL_checkudata(L, 1, LFL_TENSOR));
  return 0;
}

/* ---------------------------------------------------------------------- */
/* fields and queries                                                     */
/* ---------------------------------------------------------------------- */

static const char *device_name(fl_device d) {
  return d == FL_DEV_CUDA ? "cuda" : "cpu";
}

/* Sizes of a capture's dynamic dims are SymInts (lfl_sym.c). */
void lfl_pushshape(lua_State *L, const fl_tensor *t) {
  int i;
  lua_createtable(L, t->m.ndim, 0);
  for (i = 0; i < t->m.ndim; i++) {
    lfl_pushsize(L, t, i);
    lua_rawseti(L, -2, i + 1);
  }
}

/* The fields __index computes; the metatable lists them as __fields, so
** the REPL can complete x.sh as it completes methods. */
static const char *const tensor_fields[] = {"shape", "dtype", "device", "grad",
                                            "requires_grad", "grad_fn", "is_leaf", NULL};

/* x[i] as in Torch7: the i-th slice along dim 1 (1-based, negative from
** the end), a view that shares x's storage; of a 1-D tensor, the element
** as a Lua value (x:item() of that slice).  Built from the methods in
** upvalue 1 (narrow, squeeze, item), so it traces like them. */
static void push_slice(lua_State *L, fl_tensor *t, int what) {
  lua_Integer i, n;
  int ok;
  if (lfl_issym(L, 2)) {  /* x[T] under capture: the value it has now, guarded */
    lua_pushinteger(L, (lua_Integer)lfl_symsize(L, 2, NULL, "x[i]"));
    lua_replace(L, 2);
  }
  i = lua_tointegerx(L, 2, &ok);
  if (!ok)
    luaL_error(L, "index: x[i] takes an integer, got %s%s", luaL_typename(L, 2),
               lua_type(L, 2) == LUA_TNUMBER ? " with a fraction" : "");
  if (t->m.ndim == 0)
    luaL_error(L, "index: x[%I] on a 0-d tensor (it has no dims: use x:item())", i);
  n = (lua_Integer)t->m.shape[0];
  if (i == 0 || i > n || i < -n)
    luaL_error(L, "index: x[%I] is out of range for dim 1 of size %I (valid: 1..%I, "
               "or -%I..-1 from the end)", i, n, n, n);
  lua_getfield(L, lua_upvalueindex(1), "narrow");
  lua_pushvalue(L, 1);
  lua_pushinteger(L, 1);
  lua_pushinteger(L, i);          /* negative: narrow counts from the end */
  lua_pushinteger(L, 1);
  lua_call(L, 4, 1);
  if (what == 'w') return;       /* x[i] = v writes into the [1, ...] view */
  lua_getfield(L, lua_upvalueindex(1), t->m.ndim == 1 ? "item" : "squeeze");
  lua_insert(L, -2);
  if (t->m.ndim == 1) lua_call(L, 1, 1);
  else {
    lua_pushinteger(L, 1);
    lua_call(L, 2, 1);
  }
}

/* __index: methods first (upvalue 1), then the read-only fields; an
** integer key is x[i] (push_slice). */
static int t_index(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  const char *k;
  if (lua_type(L, 2) == LUA_TNUMBER || lfl_issym(L, 2)) {
    push_slice(L, t, 'r');
    return 1;
  }
  if (lua_type(L, 2) != LUA_TSTRING) return 0;
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
  k = lua_tostring(L, 2);
  if (strcmp(k, "shape") == 0) lfl_pushshape(L, t);
  else if (strcmp(k, "dtype") == 0) lua_pushstring(L, dtype_name(t->m.dtype));
  else if (strcmp(k, "device") == 0) lua_pushstring(L, device_name(t->m.device));
  else if (!lfl_ag_index(L, t, k)) lua_pushnil(L);
  return 1;
}

/* x[i] = v: a number fills the slice, a tensor is copied into it (its
** shape must broadcast to the slice's, as copy_ asks); fields stay
** read-only. */
static int t_newindex(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  if (lua_type(L, 2) == LUA_TNUMBER || lfl_issym(L, 2)) {
    int tensor = lfl_istensor(L, 3);
    if (!tensor && lua_type(L, 3) != LUA_TNUMBER && lua_type(L, 3) != LUA_TBOOLEAN)
      return luaL_error(L, "index: x[i] = v takes a number or a tensor, got %s",
                        luaL_typename(L, 3));
    push_slice(L, t, 'w');
    if (tensor) {   /* a slice's shape, [1, ...] viewed as [...] */
      lua_getfield(L, lua_upvalueindex(1), "squeeze");
      lua_insert(L, -2);
      lua_pushinteger(L, 1);
      lua_call(L, 2, 1);
    }
    lua_getfield(L, lua_upvalueindex(1), tensor ? "copy_" : "fill_");
    lua_insert(L, -2);
    lua_pushvalue(L, 3);
    lua_call(L, 2, 0);
    return 0;
  }
  if (lua_type(L, 2) == LUA_TSTRING && lfl_ag_newindex(L, t, lua_tostring(L, 2), 3))
    return 0;
  return luaL_error(L, "fl.Tensor: cannot assign field '%s' (tensor fields "
                    "are read-only but grad and requires_grad; use reshape, to or copy_)",
                    luaL_tolstring(L, 2, NULL));
}

static int t_dim(lua_State *L) {
  lua_pushinteger(L, lfl_checktensor(L, 1)->m.ndim);
  return 1;
}

static int t_numel(lua_State *L) {
  lfl_pushnumel(L, lfl_checktensor(L, 1));
  return 1;
}

static int t_size(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  if (lua_isnoneornil(L, 2)) {
    lfl_pushshape(L, t);
    return 1;
  }
  if (t->m.ndim == 0) {
    luaL_checkinteger(L, 2);
    return luaL_error(L, "size: a 0-d tensor has no dims");
  }
  {
    int d = lfl_checkdim(L, 2, t->m.ndim, "size");
    lfl_pushsize(L, t, d);
  }
  return 1;
}

static int t_len(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  if (t->m.ndim == 0)
    return luaL_error(L, "len: a 0-d tensor has no length");
  lfl_pushsize(L, t, 0);
  return 1;
}

fl_tensor *lfl_readable(lua_State *L, int idx, const char *what) {
  fl_tensor *t = lfl_checkdata(L, idx, what);
  if (t->m.device == FL_DEV_CPU) return t;
  /* read on the host, as PyTorch's item() syncs and copies */
  idx = lua_absindex(L, idx);
  lua_pushvalue(L, idx);
  lfl_place(L, FL_DEV_CPU);
  lua_replace(L, idx);
  return lfl_totensor(L, idx);
}

/* Push element i (row-major logical index) as a Lua value: int64 as an
** integer (exactly, not through double), bool as a boolean. */
static void push_elem(lua_State *L, const fl_tensor *t, int64_t i) {
  switch (t->m.dtype) {
  case FL_I64: lua_pushinteger(L, *(const int64_t *)ten_elem_ptr(t, i)); break;
  case FL_BOOL: lua_pushboolean(L, *(const unsigned char *)ten_elem_ptr(t, i) != 0); break;
  default: lua_pushnumber(L, ten_get(t, i)); break;
  }
}

static int t_item(lua_State *L) {
  fl_tensor *t = lfl_checkdata(L, 1, "item");
  int64_t n = meta_numel(&t->m);
  if (n != 1) {
    char s[128];
    return luaL_error(L, "item: expected a tensor with one element, got "
                      "shape %s (%I elements)",
                      meta_shape_str(&t->m, s, sizeof s), (lua_Integer)n);
  }
  t = lfl_readable(L, 1, "item");
  push_elem(L, t, 0);
  return 1;
}

static void push_list(lua_State *L, const fl_tensor *t, int d, int64_t lin) {
  int64_t k, n;
  if (d == t->m.ndim) { push_elem(L, t, lin); return; }
  n = t->m.shape[d];
  luaL_checkstack(L, 3, "tolist: nesting too deep");
  lua_createtable(L, n > INT_MAX ? INT_MAX : (int)n, 0);
  for (k = 0; k < n; k++) {
    push_list(L, t, d + 1, lin * n + k);
    lua_rawseti(L, -2, (lua_Integer)k + 1);
  }
}

/* Lua values tolist makes: the outer table, then at each depth one table
** (or, at the last, one element) per index of the dims above it; a
** [2^62, 0] tensor has no elements but would make 2^62 empty tables. */
#define TOLIST_MAX ((int64_t)1 << 26)

static int t_tolist(lua_State *L) {
  fl_tensor *t = lfl_readable(L, 1, "tolist");
  int64_t values = 1, level = 1;
  int d;
  for (d = 0; d < t->m.ndim && values <= TOLIST_MAX; d++) {
    if (!sz_mul(level, t->m.shape[d], &level) || !sz_add(values, level, &values))
      values = INT64_MAX;
  }
  if (values > TOLIST_MAX) {
    char s[160];
    return luaL_error(L, "tolist: tensor %s is too large for Lua tables "
                      "(it would make more than 2^26 = %I values)",
                      meta_shape_str(&t->m, s, sizeof s), (lua_Integer)TOLIST_MAX);
  }
  push_list(L, t, 0, 0);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* printing, Torch7 style: values, then [float32 tensor of size 2x3]       */
/* ---------------------------------------------------------------------- */

#define SUMMARIZE_ABOVE 1000   /* elements; as PyTorch's print threshold */
#define EDGE 3                 /* items kept at each end when summarized */

enum { VF_INT, VF_BOOL, VF_INTEGRAL, VF_FIXED, VF_SCI };

typedef struct pfmt {
  int kind;                    /* VF_*, one format for the whole tensor */
  int width;                   /* widest printed value */
  int summarize;
  int any, all_integral;       /* scan state over finite float values */
  double maxabs, minabs;
} pfmt;

static int fmt_value(char *buf, size_t n, const fl_tensor *t, int64_t i,
                     int kind) {
  double v;
  if (t->m.dtype == FL_I64)
    return snprintf(buf, n, "%lld", (long long)*(const int64_t *)ten_elem_ptr(t, i));
  if (t->m.dtype == FL_BOOL)
    return snprintf(buf, n, "%s", *(const unsigned char *)ten_elem_ptr(t, i)
                    ? "true" : "false");
  v = ten_get(t, i);
  if (isnan(v)) return snprintf(buf, n, "nan");
  if (isinf(v)) return snprintf(buf, n, v > 0 ? "inf" : "-inf");
  if (kind == VF_INTEGRAL) return snprintf(buf, n, "%.0f", v);
  if (kind == VF_FIXED) return snprintf(buf, n, "%.4f", v);
  return snprintf(buf, n, "%.4e", v);
}

/* Visit the elements that will be printed (all, or EDGE at each end of
** every dim when summarizing), in row-major order. */
static void visit(const fl_tensor *t, int d, int64_t lin, pfmt *f, int pass) {
  int64_t k, n;
  if (d == t->m.ndim) {
    char buf[64];
    if (pass == 0) {
      double v, a;
      if (!dtype_is_float(t->m.dtype)) return;
      v = ten_get(t, lin);
      if (!isfinite(v)) return;
      a = fabs(v);
      if (v != floor(v) || a >= 1e15) f->all_integral = 0;
      if (!f->any || a > f->maxabs) f->maxabs = a;
      if (a > 0 && (f->minabs == 0 || a < f->minabs)) f->minabs = a;
      f->any = 1;
    } else {
      int w = fmt_value(buf, sizeof buf, t, lin, f->kind);
      if (w > f->width) f->width = w;
    }
    return;
  }
  n = t->m.shape[d];
  for (k = 0; k < n; k++) {
    if (f->summarize && n > 2 * EDGE && k == EDGE) k = n - EDGE;
    visit(t, d + 1, lin * n + k, f, pass);
  }
}

static void choose_format(const fl_tensor *t, pfmt *f) {
  memset(f, 0, sizeof *f);
  f->summarize = meta_numel(&t->m) > SUMMARIZE_ABOVE;
  f->all_integral = 1;
  if (t->m.dtype == FL_I64) f->kind = VF_INT;
  else if (t->m.dtype == FL_BOOL) f->kind = VF_BOOL;
  else {
    visit(t, 0, 0, f, 0);
    if (!f->any || f->all_integral) f->kind = VF_INTEGRAL;
    else if (f->maxabs < 1e5 && (f->minabs == 0 || f->minabs >= 1e-4))
      f->kind = VF_FIXED;
    else f->kind = VF_SCI;
  }
  visit(t, 0, 0, f, 1);
}

static void add_value(luaL_Buffer *b, const fl_tensor *t, int64_t i,
                      const pfmt *f) {
  char buf[64], pad[80];
  fmt_value(buf, sizeof buf, t, i, f->kind);
  snprintf(pad, sizeof pad, " %*s", f->width, buf);
  luaL_addstring(b, pad);
}

/* One 2-d block (or the 1-d column Torch7 prints) starting at row-major
** block index lin. */
static void add_matrix(luaL_Buffer *b, const fl_tensor *t, int64_t lin,
                       const pfmt *f) {
  int nd = t->m.ndim;
  int64_t r, c;
  int64_t R = nd >= 2 ? t->m.shape[nd - 2] : t->m.shape[0];
  int64_t C = nd >= 2 ? t->m.shape[nd - 1] : 1;
  for (r = 0; r < R; r++) {
    if (f->summarize && R > 2 * EDGE && r == EDGE) {
      luaL_addstring(b, " ...\n");
      r = R - EDGE;
    }
    for (c = 0; c < C; c++) {
      if (f->summarize && C > 2 * EDGE && c == EDGE) {
        luaL_addstring(b, " ...");
        c = C - EDGE;
      }
      add_value(b, t, (lin * R + r) * C + c, f);
    }
    luaL_addchar(b, '\n');
  }
}

/* Leading dims of a >2-d tensor: one "(i,j,.,.) =" block per matrix,
** indices 1-based as everywhere in Lua. */
static void add_blocks(luaL_Buffer *b, const fl_tensor *t, int d,
                       int64_t lin, int64_t *idx, const pfmt *f, int *first) {
  int nd = t->m.ndim, i;
  int64_t k, n;
  if (d == nd - 2) {
    char s[32];
    if (!*first) luaL_addchar(b, '\n');
    *first = 0;
    luaL_addchar(b, '(');
    for (i = 0; i < nd - 2; i++) {
      snprintf(s, sizeof s, "%lld,", (long long)idx[i] + 1);
      luaL_addstring(b, s);
    }
    luaL_addstring(b, ".,.) =\n");
    add_matrix(b, t, lin, f);
    return;
  }
  n = t->m.shape[d];
  for (k = 0; k < n; k++) {
    if (f->summarize && n > 2 * EDGE && k == EDGE) {
      luaL_addstring(b, "\n...\n");
      k = n - EDGE;
    }
    idx[d] = k;
    add_blocks(b, t, d + 1, lin * n + k, idx, f, first);
  }
}

static void push_tostring(lua_State *L, const fl_tensor *t) {
  luaL_Buffer b;
  pfmt f;
  char s[96];   /* also ", grad_fn CompiledFunctionBackward" */
  int i;
  int64_t numel = meta_numel(&t->m);
  luaL_buffinit(L, &b);
  if (t->m.device == FL_DEV_CPU && numel > 0) {
    choose_format(t, &f);
    if (t->m.ndim == 0) {
      char v[64];
      fmt_value(v, sizeof v, t, 0, f.kind);
      luaL_addstring(&b, v);
      luaL_addchar(&b, '\n');
    } else if (t->m.ndim <= 2) {
      add_matrix(&b, t, 0, &f);
    } else {
      int64_t idx[FL_MAX_DIMS];
      int first = 1;
      add_blocks(&b, t, 0, 0, idx, &f, &first);
    }
  }
  luaL_addchar(&b, '[');
  luaL_addstring(&b, dtype_name(t->m.dtype));
  luaL_addstring(&b, " tensor of size ");
  if (t->m.ndim == 0) luaL_addstring(&b, "(scalar)");
  for (i = 0; i < t->m.ndim; i++) {
    snprintf(s, sizeof s, i ? "x%lld" : "%lld", (long long)t->m.shape[i]);
    luaL_addstring(&b, s);
  }
  if (t->m.device != FL_DEV_CPU) {
    luaL_addstring(&b, " on ");
    luaL_addstring(&b, device_name(t->m.device));
  }
  if (lfl_ag_label(t, s, sizeof s)) {  /* ", requires grad" or its grad_fn */
    luaL_addstring(&b, ", ");
    luaL_addstring(&b, s);
  }
  luaL_addchar(&b, ']');
  luaL_pushresult(&b);
}

static int t_tostring(lua_State *L) {
  push_tostring(L, lfl_checkdata(L, 1, "tostring"));
  return 1;
}

/* ---------------------------------------------------------------------- */
/* dtype and device moves                                                 */
/* ---------------------------------------------------------------------- */

/* Move to device dev: only the host exists until the CUDA backend does,
** so asking for cuda reports why it cannot be used. */
static void move_to(lua_State *L, fl_device dev, const char *what) {
  lfl_checkdevice(L, dev, what);
}

/* x:to("float16"), x:to("cuda"), x:to("cuda", "float16"), x:to{dtype=,
** device=}.  A no-op move returns x itself, as PyTorch does. */
static int t_to(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  fl_dtype dt = t->m.dtype;
  fl_device dev = t->m.device;
  int i, top = lua_gettop(L);
  if (top < 2) return luaL_error(L, "to: expected a dtype or a device");
  for (i = 2; i <= top; i++) {
    if (lua_type(L, i) == LUA_TTABLE) {
      lfl_move_options(L, i, &dt, &dev, "to");
    } else {
      const char *s = luaL_checkstring(L, i);
      if (strcmp(s, "cpu") == 0) dev = FL_DEV_CPU;
      else if (strcmp(s, "cuda") == 0) dev = FL_DEV_CUDA;
      else if (dtype_from_name(s, &dt) != 0)
        return luaL_error(L, "to: unknown dtype or device '%s' (expected "
                          "float32, float64, float16, bfloat16, int64, bool, "
                          "cpu or cuda)", s);
    }
  }
  if (dev != t->m.device) move_to(L, dev, "to");
  if (dt == t->m.dtype) { lua_pushvalue(L, 1); return 1; }
  {
    op_attrs a;
    const fl_tensor *in[1];
    in[0] = t;
    op_attrs_init(OP_TO, &a);
    a.dtype = dt;
    return lfl_dispatch(L, OP_TO, in, 1, &a);
  }
}

static int t_cuda(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  if (t->m.device != FL_DEV_CUDA) move_to(L, FL_DEV_CUDA, "cuda");
  lua_pushvalue(L, 1);
  return 1;
}

static int t_cpu(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  if (t->m.device != FL_DEV_CPU) move_to(L, FL_DEV_CPU, "cpu");
  lua_pushvalue(L, 1);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* in place: the result is written into x's storage, x is returned         */
/* ---------------------------------------------------------------------- */

/* Writing through a broadcast view would store several results into one
** element; refuse, as PyTorch does.  Every in-place method asks this
** before it writes, so it is also where the storage's version moves on
** (ten_wrote). */
static void check_writable(lua_State *L, fl_tensor *t, const char *what) {
  int i;
  if (t->m.device != FL_DEV_CPU && !ten_is_contiguous(t))
    luaL_error(L, "%s: a write into a non-contiguous tensor on %s is not supported; "
               "write into a contiguous one", what, device_name(t->m.device));
  for (i = 0; i < t->m.ndim; i++)
    if (t->stride[i] == 0 && t->m.shape[i] > 1)
      luaL_error(L, "%s: cannot write into an expanded tensor (dim %d has "
                 "stride 0); call :contiguous() first", what, i + 1);
  ten_wrote(t);
}

/* dst <- src (broadcast to dst's shape, converted to dst's dtype), on
** either device; the core copies overlapping layouts through a temporary
** itself. */
static void copy_into(lua_State *L, fl_tensor *dst, const fl_tensor *src,
                      const char *what) {
  fl_err e;
  err_clear(&e);
  if (lfl_copy_into(dst, src, &e) != FL_OK) lfl_raise(L, what, &e);
}

/* Every element of t set to v, on either device. */
static void fill(lua_State *L, fl_tensor *t, double v, const char *what) {
  fl_err e;
  err_clear(&e);
  if (lfl_fill(t, v, &e) != FL_OK) lfl_raise(L, what, &e);
}

/* A write of the value at idx (a tensor or number) into x while a trace
** records: captured as graph ops when it can be (lfl_trace_write), else
** 0 after the break the eager write needs. */
static int traced_write(lua_State *L, fl_tensor *t, int idx, const char *what) {
  const fl_tensor *v;
  if (!lfl_trace_active(L)) return 0;
  if (lua_type(L, idx) == LUA_TBOOLEAN) {
    lua_pushinteger(L, lua_toboolean(L, idx));
    lua_replace(L, idx);
  }
  v = lua_type(L, idx) == LUA_TNUMBER ? lfl_pushscalar(L, idx) : lfl_totensor(L, idx);
  if (v && lfl_trace_write(L, t, v, what)) return 1;
  lfl_trace_before_write(L, t, what);
  return 0;
}

static int t_copy_(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  if (lua_type(L, 2) != LUA_TNUMBER) lfl_checktensor(L, 2);
  lfl_ag_check_write(L, t, lfl_totensor(L, 2), "copy_");
  if (traced_write(L, t, 2, "copy_")) { lua_settop(L, 1); return 1; }
  t = lfl_checkdata(L, 1, "copy_");
  check_writable(L, t, "copy_");
  if (lua_type(L, 2) == LUA_TNUMBER) fill(L, t, lua_tonumber(L, 2), "copy_");
  else {
    fl_tensor *src = lfl_checkdata(L, 2, "copy_");
    copy_into(L, t, src, "copy_");
  }
  lua_settop(L, 1);
  return 1;
}

static int t_fill_(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  double v;
  if (lua_type(L, 2) != LUA_TBOOLEAN) luaL_checknumber(L, 2);
  lfl_ag_check_write(L, t, NULL, "fill_");
  if (traced_write(L, t, 2, "fill_")) { lua_settop(L, 1); return 1; }
  t = lfl_checkdata(L, 1, "fill_");
  if (lua_type(L, 2) == LUA_TBOOLEAN) v = lua_toboolean(L, 2);
  else v = (double)luaL_checknumber(L, 2);
  check_writable(L, t, "fill_");
  if (t->m.dtype == FL_I64 && lua_isinteger(L, 2) && t->m.device == FL_DEV_CPU) {
    /* exact for integers beyond 2^53, which double would round */
    int64_t k, n = meta_numel(&t->m), iv = (int64_t)lua_tointeger(L, 2);
    for (k = 0; k < n; k++) *(int64_t *)ten_elem_ptr(t, k) = iv;
  } else {
    fill(L, t, v, "fill_");
  }
  lua_settop(L, 1);
  return 1;
}

static int t_zero_(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  lua_settop(L, 1);
  lua_pushinteger(L, 0);
  lfl_ag_check_write(L, t, NULL, "zero_");
  if (traced_write(L, t, 2, "zero_")) { lua_settop(L, 1); return 1; }
  t = lfl_checkdata(L, 1, "zero_");
  check_writable(L, t, "zero_");
  fill(L, t, 0.0, "zero_");
  lua_settop(L, 1);
  return 1;
}

static int dtype_rank(fl_dtype t) {
  return t == FL_BOOL ? 0 : t == FL_I64 ? 1 : 2;
}

/* x:add_(y) and friends (upvalue 1: the op, upvalue 2: the name): the
** out-of-place op through the one dispatch point, then copied into x.  The
** result must keep x's shape and fit x's dtype (no float into int64). */
static int t_inplace(lua_State *L) {
  fl_op op = (fl_op)lua_tointeger(L, lua_upvalueindex(1));
  const char *what = lua_tostring(L, lua_upvalueindex(2));
  fl_tensor *t = lfl_checktensor(L, 1), *r;
  const fl_tensor *in[2];
  op_attrs a;
  int traced = lfl_trace_active(L) != NULL;
  lua_settop(L, 2);
  in[0] = t;
  in[1] = lfl_checkoperand(L, 2);
  lfl_widen_numbers(L, in, 1, 2);
  lfl_ag_check_write(L, t, in[1], what);
  op_attrs_init(op, &a);
  /* under capture the op is recorded, then the result written as any
  ** captured write; else (or where that cannot be) it runs eagerly */
  if (traced) lfl_dispatch(L, op, in, 2, &a);
  else {
    t = lfl_checkdata(L, 1, what);   /* a lazy of an ended capture: its value */
    check_writable(L, t, what);
    lfl_dispatch_eager(L, op, in, 2, &a);
  }
  r = lfl_totensor(L, -1);           /* the result lfl_dispatch pushed */
  if (!meta_same_shape(&r->m, &t->m)) {
    char s1[128], s2[128];
    return luaL_error(L, "%s: the result shape %s differs from the "
                      "in-place target's shape %s", what,
                      meta_shape_str(&r->m, s1, sizeof s1),
                      meta_shape_str(&t->m, s2, sizeof s2));
  }
  if (dtype_rank(r->m.dtype) > dtype_rank(t->m.dtype))
    return luaL_error(L, "%s: result type %s can't be cast to the in-place "
                      "target's dtype %s", what, dtype_name(r->m.dtype),
                      dtype_name(t->m.dtype));
  if (traced) {
    if (lfl_trace_write(L, t, r, what)) { lua_settop(L, 1); return 1; }
    lfl_trace_before_write(L, t, what);
    t = lfl_checkdata(L, 1, what);
    check_writable(L, t, what);
    r = lfl_checkdata(L, -1, what);
  }
  copy_into(L, t, r, what);
  lua_settop(L, 1);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* registration                                                           */
/* ---------------------------------------------------------------------- */

static const luaL_Reg tensor_methods[] = {
  {"dim", t_dim}, {"numel", t_numel}, {"size", t_size},
  {"item", t_item}, {"tolist", t_tolist},
  {"to", t_to}, {"cuda", t_cuda}, {"cpu", t_cpu},
  {"copy_", t_copy_}, {"fill_", t_fill_}, {"zero_", t_zero_},
  {NULL, NULL}
};

static const struct { const char *name; fl_op op; } inplace_ops[] = {
  {"add_", OP_ADD}, {"sub_", OP_SUB}, {"mul_", OP_MUL}, {"div_", OP_DIV},
  {NULL, OP_COUNT}
};

static const luaL_Reg tensor_meta[] = {
  {"__gc", t_gc}, {"__tostring", t_tostring}, {"__len", t_len},
  {NULL, NULL}
};

void lfl_open_tensor(lua_State *L, int meta, int methods) {
  int i;
  meta = lua_absindex(L, meta);
  methods = lua_absindex(L, methods);
  get_acct(L);                       /* exists before any finalizer asks */
  lua_pushvalue(L, meta);
  luaL_setfuncs(L, tensor_meta, 0);
  lua_pushvalue(L, methods);
  lua_pushcclosure(L, t_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pushvalue(L, methods);
  lua_pushcclosure(L, t_newindex, 1);
  lua_setfield(L, -2, "__newindex");
  lua_createtable(L, 3, 0);
  for (i = 0; tensor_fields[i]; i++) {
    lua_pushstring(L, tensor_fields[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "__fields");
  /* the method table, for completion and introspection (the __index
  ** above is a function because fields are computed) */
  lua_pushvalue(L, methods);
  lua_setfield(L, -2, "methods");
  lua_pop(L, 1);
  lua_pushvalue(L, methods);
  luaL_setfuncs(L, tensor_methods, 0);
  for (i = 0; inplace_ops[i].name; i++) {
    lua_pushinteger(L, inplace_ops[i].op);
    lua_pushstring(L, inplace_ops[i].name);
    lua_pushcclosure(L, t_inplace, 2);
    lua_setfield(L, -2, inplace_ops[i].name);
  }
  lua_pop(L, 1);
}
