/*
** lfl_lib.c -- the `fl` table: creation functions, seeding, timing, files,
** allclose, and the argument helpers every binding shares.  Arguments are
** checked here, before the core sees them, only where the Lua form has
** something the core cannot know (1-based dims, Lua number types, option
** tables); everything else is left to the core, whose messages already
** name the op and the shapes.
*/
#include "config.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lfl.h"
#include "io/npy.h"
#include "graph/rng.h"
#include "gpu/cuda.h"
#include "exec/measure.h"

/* ---------------------------------------------------------------------- */
/* shared helpers                                                         */
/* ---------------------------------------------------------------------- */

const char *lfl_typename(lua_State *L, int idx) {
  return lfl_istensor(L, idx) ? "fl.Tensor" : luaL_typename(L, idx);
}

int lfl_raise(lua_State *L, const char *what, const fl_err *e) {
  const char *msg = e->msg[0] ? e->msg : "failed (no reason given)";
  size_t n = what ? strlen(what) : 0;
  if (n && !(strncmp(msg, what, n) == 0 && msg[n] == ':'))
    return luaL_error(L, "%s: %s", what, msg);
  return luaL_error(L, "%s", msg);
}

/* Dims are 1-based; -1 is the last.  A 0-d tensor accepts 1 and -1 (as
** PyTorch accepts 0 and -1) so reductions over "the" dim of a scalar work. */
int lfl_dim(lua_State *L, lua_Integer d, int ndim, const char *what) {
  int n = ndim > 0 ? ndim : 1;
  if (d >= 1 && d <= n) return (int)(d - 1);
  if (d <= -1 && d >= -n) return (int)(n + d);
  if (d == 0)
    return luaL_error(L, "%s: dim 0 is invalid: dims count from 1 "
                      "(expected 1..%d or -%d..-1)", what, n, n);
  return luaL_error(L, "%s: dim %I out of range for a %d-d tensor "
                    "(expected 1..%d or -%d..-1)", what, d, ndim, n, n);
}

/* An integer argument, with a message naming the op when it is a string,
** a table or a fraction. */
static lua_Integer check_int(lua_State *L, int idx, const char *what,
                             const char *role) {
  int ok;
  lua_Integer v = lua_tointegerx(L, idx, &ok);
  if (!ok) {
    if (lua_type(L, idx) == LUA_TNUMBER)
      luaL_error(L, "%s: %s %s is not an integer", what, role,
                 lua_tostring(L, idx));
    luaL_error(L, "%s: %s must be an integer, got %s", what, role,
               lfl_typename(L, idx));
  }
  return v;
}

int lfl_checkdim(lua_State *L, int idx, int ndim, const char *what) {
  if (lua_type(L, idx) != LUA_TNUMBER)
    luaL_typeerror(L, idx, "integer dim");
  return lfl_dim(L, check_int(L, idx, what, "dim"), ndim, what);
}

/* One size: an integer-valued number.  Negative sizes pass through; the
** core rejects them (meta_check_size) or gives -1 its meaning (reshape). */
static int64_t to_size(lua_State *L, int idx, const char *what, int pos, int *asym) {
  int ok;
  lua_Integer v;
  if (lfl_issym(L, idx)) {
    /* a symbolic size: kept as its expression where the caller can (asym),
    ** else made concrete, which the guards will say */
    int x;
    int64_t h = lfl_symsize(L, idx, asym ? &x : NULL, what);
    if (asym) *asym = x + 1;
    return h;
  }
  if (lua_type(L, idx) != LUA_TNUMBER)
    luaL_error(L, "%s: size #%d is a %s, expected an integer", what, pos,
               lfl_typename(L, idx));
  v = lua_tointegerx(L, idx, &ok);
  if (!ok) {
    lua_Number x = lua_tonumber(L, idx);
    if (isfinite(x) && floor(x) == x)
      luaL_error(L, "%s: size %s is out of range", what, lua_tostring(L, idx));
    luaL_error(L, "%s: size %s is not an integer", what, lua_tostring(L, idx));
  }
  return (int64_t)v;
}

int lfl_sizes(lua_State *L, int idx, int64_t *sizes, int *next,
              const char *what) {
  return lfl_sizes_sym(L, idx, sizes, NULL, next, what);
}

int lfl_sizes_sym(lua_State *L, int idx, int64_t *sizes, int *asym, int *next,
                  const char *what) {
  int n = 0;
  idx = lua_absindex(L, idx);
  if (lua_type(L, idx) == LUA_TTABLE && !lfl_istensor(L, idx)) {
    lua_Unsigned len = lua_rawlen(L, idx);
    if (len > FL_MAX_DIMS)
      luaL_error(L, "%s: at most %d dims, got %d", what, FL_MAX_DIMS,
                 (int)(len > 1000000 ? 1000000 : len));
    for (n = 0; n < (int)len; n++) {
      lua_rawgeti(L, idx, n + 1);
      sizes[n] = to_size(L, -1, what, n + 1, asym ? &asym[n] : NULL);
      lua_pop(L, 1);
    }
    *next = idx + 1;
    return n;
  }
  while (lua_type(L, idx + n) == LUA_TNUMBER || lfl_issym(L, idx + n)) {
    if (n == FL_MAX_DIMS) {
      int m = n;
      while (lua_type(L, idx + m) == LUA_TNUMBER || lfl_issym(L, idx + m)) m++;
      luaL_error(L, "%s: at most %d dims, got %d", what, FL_MAX_DIMS, m);
    }
    sizes[n] = to_size(L, idx + n, what, n + 1, asym ? &asym[n] : NULL);
    n++;
  }
  *next = idx + n;
  return n;
}

void lfl_checkkeys(lua_State *L, int idx, const char *const *allowed,
                   const char *what) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    int i, known = 0;
    lua_pop(L, 1);                     /* the value; keep the key */
    if (lua_type(L, -1) == LUA_TSTRING)
      for (i = 0; allowed[i]; i++)
        if (strcmp(lua_tostring(L, -1), allowed[i]) == 0) known = 1;
    if (!known) {
      luaL_Buffer b;
      const char *key = luaL_tolstring(L, -1, NULL);
      luaL_buffinit(L, &b);
      for (i = 0; allowed[i]; i++) {
        if (i) luaL_addstring(&b, ", ");
        luaL_addstring(&b, allowed[i]);
      }
      luaL_pushresult(&b);
      luaL_error(L, "%s: unknown option '%s' (expected %s)", what, key,
                 lua_tostring(L, -1));
    }
  }
}

static int parse_dtype(lua_State *L, int idx, fl_dtype *out, const char *what) {
  const char *s;
  if (lua_type(L, idx) != LUA_TSTRING)
    return luaL_error(L, "%s: dtype must be a string, got %s", what,
                      lfl_typename(L, idx));
  s = lua_tostring(L, idx);
  if (dtype_from_name(s, out) != 0)
    return luaL_error(L, "%s: unknown dtype '%s' (expected float32, "
                      "float64, float16, bfloat16, int64 or bool)", what, s);
  return 0;
}

static void options(lua_State *L, int idx, fl_dtype *dtype, fl_device *dev,
                    const char *what, const char *const *keys) {
  if (lua_isnoneornil(L, idx)) return;
  if (lua_type(L, idx) != LUA_TTABLE) luaL_typeerror(L, idx, "options table");
  lfl_checkkeys(L, idx, keys, what);
  if (lua_getfield(L, idx, "dtype") != LUA_TNIL) parse_dtype(L, -1, dtype, what);
  lua_pop(L, 1);
  if (lua_getfield(L, idx, "device") != LUA_TNIL) {
    const char *s = lua_tostring(L, -1);
    if (lua_type(L, -1) == LUA_TSTRING && strcmp(s, "cpu") == 0)
      *dev = FL_DEV_CPU;
    else if (lua_type(L, -1) == LUA_TSTRING && strcmp(s, "cuda") == 0)
      *dev = FL_DEV_CUDA;
    else
      luaL_error(L, "%s: unknown device '%s' (expected cpu or cuda)", what,
                 luaL_tolstring(L, -1, NULL));
  }
  lua_pop(L, 1);
}

void lfl_options(lua_State *L, int idx, fl_dtype *dtype, fl_device *dev,
                 const char *what) {
  /* requires_grad: read by the factories' wrapper (lfl_autograd.c) */
  static const char *const keys[] = {"dtype", "device", "requires_grad", NULL};
  options(L, idx, dtype, dev, what, keys);
}

void lfl_move_options(lua_State *L, int idx, fl_dtype *dtype, fl_device *dev,
                      const char *what) {
  static const char *const keys[] = {"dtype", "device", NULL};
  options(L, idx, dtype, dev, what, keys);
}

double lfl_num_field(lua_State *L, int t, const char *k, double def) {
  double v = def;
  if (lua_getfield(L, t, k) == LUA_TNUMBER) v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

int lfl_bool_field(lua_State *L, int t, const char *k) {
  int v;
  lua_getfield(L, t, k);
  v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

void lfl_checkdevice(lua_State *L, fl_device dev, const char *what) {
  fl_err e;
  if (dev == FL_DEV_CPU) return;
  err_clear(&e);
  if (!cuda_available(&e)) luaL_error(L, "%s: %s", what, e.msg);
}

/* ---------------------------------------------------------------------- */
/* creation                                                               */
/* ---------------------------------------------------------------------- */

/* (sizes... | {sizes}) [, {dtype=, device=}] from idx into *m; symbolic
** sizes go to asym when it is not NULL (else they are specialized). */
static void creation_args_sym(lua_State *L, int idx, fl_meta *m, int *asym, const char *what) {
  int next;
  memset(m, 0, sizeof *m);
  m->dtype = FL_F32;
  m->device = FL_DEV_CPU;
  /* fl.zeros{dtype="int64"}: a table with no array part is options */
  if (lua_type(L, idx) == LUA_TTABLE && lua_rawlen(L, idx) == 0) {
    lua_pushnil(L);
    if (lua_next(L, idx)) { lua_pop(L, 2); next = idx; goto options; }
  }
  m->ndim = lfl_sizes_sym(L, idx, m->shape, asym, &next, what);
options:
  if (!lua_isnoneornil(L, next) && lua_type(L, next) != LUA_TTABLE)
    luaL_typeerror(L, next, "size or options table");
  lfl_options(L, next, &m->dtype, &m->device, what);
  if (lua_gettop(L) > next)
    luaL_error(L, "%s: unexpected argument #%d after the options table",
               what, next + 1);
  lfl_checkdevice(L, m->device, what);
}

static void creation_args(lua_State *L, int idx, fl_meta *m, const char *what) {
  creation_args_sym(L, idx, m, NULL, what);
}

static int any_sym(const int *asym) {
  int d;
  for (d = 0; d < FL_MAX_DIMS; d++) if (asym[d]) return 1;
  return 0;
}

/* Under capture, a tensor of one value with symbolic sizes is that value
** expanded to them: the graph records expand(const, [s0, s0]), which
** serves every size.  The filled [1, ..., 1] tensor is on top. */
static int expand_symbolic(lua_State *L, const fl_meta *m, const int *asym) {
  const fl_tensor *in[1];
  op_attrs a;
  int d;
  in[0] = lfl_totensor(L, -1);
  op_attrs_init(OP_EXPAND, &a);
  a.ndims = m->ndim;
  for (d = 0; d < m->ndim; d++) a.dims[d] = m->shape[d];
  return lfl_dispatch_sym(L, OP_EXPAND, in, 1, &a, asym);
}

/* The [1, ..., 1] meta of m's rank. */
static fl_meta ones_meta(const fl_meta *m) {
  fl_meta o = *m;
  int d;
  for (d = 0; d < o.ndim; d++) o.shape[d] = 1;
  return o;
}

/* Store Lua value idx into element i, exactly for integers into int64. */
static void store_value(lua_State *L, int idx, fl_tensor *t, int64_t i) {
  if (t->m.dtype == FL_I64 && lua_isinteger(L, idx))
    *(int64_t *)ten_elem_ptr(t, i) = (int64_t)lua_tointeger(L, idx);
  else if (lua_type(L, idx) == LUA_TBOOLEAN)
    ten_set(t, i, lua_toboolean(L, idx) ? 1.0 : 0.0);
  else
    ten_set(t, i, (double)lua_tonumber(L, idx));
}

static int filled(lua_State *L, double v, const char *what) {
  fl_meta m, o;
  fl_device dev;
  int asym[IR_NASYM] = {0};
  creation_args_sym(L, 1, &m, asym, what);
  dev = m.device;                     /* made on the host, then placed */
  m.device = FL_DEV_CPU;
  if (any_sym(asym)) {
    o = ones_meta(&m);
    ten_fill(lfl_pushempty(L, &o, what), v);
    lfl_place(L, dev);
    m.device = dev;
    return expand_symbolic(L, &m, asym);
  }
  ten_fill(lfl_pushempty(L, &m, what), v);
  return lfl_place(L, dev);
}

static int l_zeros(lua_State *L) { return filled(L, 0.0, "zeros"); }
static int l_ones(lua_State *L) { return filled(L, 1.0, "ones"); }

/* fl.full(shape, v [, opts]): the dtype follows v as in PyTorch (integer
** -> int64, float -> float32, boolean -> bool) unless opts say. */
static int l_full(lua_State *L) {
  fl_meta m;
  fl_tensor *t;
  int64_t i, n;
  int next, asym[IR_NASYM] = {0};
  fl_device dev;
  memset(&m, 0, sizeof m);
  if (lua_type(L, 1) != LUA_TTABLE && lua_type(L, 1) != LUA_TNUMBER && !lfl_issym(L, 1))
    luaL_typeerror(L, 1, "shape table");
  if (lua_type(L, 1) != LUA_TTABLE) {
    m.ndim = 1;
    m.shape[0] = to_size(L, 1, "full", 1, &asym[0]);
    next = 2;
  } else {
    m.ndim = lfl_sizes_sym(L, 1, m.shape, asym, &next, "full");
  }
  if (lua_type(L, next) == LUA_TBOOLEAN) m.dtype = FL_BOOL;
  else if (lua_type(L, next) == LUA_TNUMBER)
    m.dtype = lua_isinteger(L, next) ? FL_I64 : FL_F32;
  else
    luaL_typeerror(L, next, "fill value (number or boolean)");
  lfl_options(L, next + 1, &m.dtype, &m.device, "full");
  lfl_checkdevice(L, m.device, "full");
  dev = m.device;                     /* made on the host, then placed */
  m.device = FL_DEV_CPU;
  if (any_sym(asym)) {
    fl_meta o = ones_meta(&m);
    store_value(L, next, lfl_pushempty(L, &o, "full"), 0);
    lfl_place(L, dev);
    m.device = dev;
    return expand_symbolic(L, &m, asym);
  }
  t = lfl_pushempty(L, &m, "full");
  n = meta_numel(&m);
  for (i = 0; i < n; i++) store_value(L, next, t, i);
  return lfl_place(L, dev);
}

static void check_float_dtype(lua_State *L, fl_dtype t, const char *what) {
  if (!dtype_is_float(t))
    luaL_error(L, "%s: dtype %s is not a floating dtype (expected float32, "
               "float16 or bfloat16)", what, dtype_name(t));
}

/* fl.rand / fl.randn: an op with no inputs, so that while a trace records
** the draw is a graph node (a compiled function draws anew at every call)
** rather than a tensor frozen into the graph.  On a CUDA device the op's
** generated kernel draws there: the same stream, the same numbers. */
static int random_tensor(lua_State *L, fl_op op, const char *what) {
  fl_meta m;
  op_attrs a;
  int d, asym[IR_NASYM] = {0};
  creation_args_sym(L, 1, &m, asym, what);   /* rand(B, T) under capture: symbolic */
  check_float_dtype(L, m.dtype, what);
  if (meta_check_size(&m, what, NULL) != FL_OK) lfl_pushempty(L, &m, what);  /* raises */
  op_attrs_init(op, &a);
  a.ndims = m.ndim;
  for (d = 0; d < m.ndim; d++) a.dims[d] = m.shape[d];
  a.dtype = m.dtype;
  if (m.device != FL_DEV_CPU && !lfl_trace_active(L)) return lfl_cuda_eager(L, op, NULL, 0, &a);
  return lfl_dispatch_sym(L, op, NULL, 0, &a, asym);
}

static int l_rand(lua_State *L) { return random_tensor(L, OP_RAND, "rand"); }
static int l_randn(lua_State *L) { return random_tensor(L, OP_RANDN, "randn"); }

/* fl.dropout(x [, p [, training]]): PyTorch's F.dropout: zeroes each
** element with probability p (default 0.5) and scales the rest by
** 1/(1-p); training=false returns x itself. */
static int l_dropout(lua_State *L) {
  const fl_tensor *in[1];
  op_attrs a;
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(OP_DROPOUT, &a);
  if (!lua_isnoneornil(L, 2)) {
    if (lua_type(L, 2) != LUA_TNUMBER)
      return luaL_error(L, "dropout: p must be a number, got %s", lfl_typename(L, 2));
    a.f[0] = (double)lua_tonumber(L, 2);
  }
  if (!lua_isnoneornil(L, 3) && !lua_toboolean(L, 3)) {
    if (!(a.f[0] >= 0.0 && a.f[0] <= 1.0))
      return luaL_error(L, "dropout: p must be a probability in [0, 1], got %g", a.f[0]);
    lua_settop(L, 1);
    return 1;
  }
  return lfl_dispatch(L, OP_DROPOUT, in, 1, &a);
}

/* fl.eye(n [, m] [, opts]) */
static int l_eye(lua_State *L) {
  fl_meta m;
  fl_device dev;
  fl_tensor *t;
  int64_t i, k;
  creation_args(L, 1, &m, "eye");
  if (m.ndim < 1 || m.ndim > 2)
    return luaL_error(L, "eye: expected n or n, m; got %d sizes", m.ndim);
  if (m.ndim == 1) { m.ndim = 2; m.shape[1] = m.shape[0]; }
  dev = m.device;
  m.device = FL_DEV_CPU;
  t = lfl_pushempty(L, &m, "eye");
  k = m.shape[0] < m.shape[1] ? m.shape[0] : m.shape[1];
  for (i = 0; i < k; i++) ten_set(t, i * m.shape[1] + i, 1.0);
  return lfl_place(L, dev);
}

/* fl.arange(n), fl.arange(a, b [, step]), then an optional options table.
** int64 when every bound is a Lua integer, else float32 (PyTorch's rule);
** PyTorch refuses a step pointing away from the end, and so do we. */
static int l_arange(lua_State *L) {
  fl_meta m;
  fl_device dev;
  fl_tensor *t;
  int nnum = 0, allint = 1;
  double s, e, st, c;
  int64_t k, count;
  lua_Integer is = 0, ist = 1;
  if (lfl_issym(L, 1) && !lfl_issym(L, 2) && lua_type(L, 2) != LUA_TNUMBER) {
    /* fl.arange(T) of a symbolic T: a graph op under capture */
    memset(&m, 0, sizeof m);
    m.dtype = FL_I64;
    lfl_options(L, 2, &m.dtype, &m.device, "arange");
    lfl_checkdevice(L, m.device, "arange");
    if (lfl_sym_arange(L, m.dtype, m.device) > 0) return 1;
  }
  for (nnum = 1; nnum <= 3; nnum++)            /* other forms: concrete sizes */
    if (lfl_issym(L, nnum)) {
      lua_pushinteger(L, (lua_Integer)lfl_symsize(L, nnum, NULL, "fl.arange"));
      lua_replace(L, nnum);
    }
  nnum = 0;
  while (nnum < 3 && lua_type(L, nnum + 1) == LUA_TNUMBER) {
    if (!lua_isinteger(L, nnum + 1)) allint = 0;
    nnum++;
  }
  if (nnum == 0) return luaL_typeerror(L, 1, "number");
  s = nnum >= 2 ? lua_tonumber(L, 1) : 0;
  e = nnum >= 2 ? lua_tonumber(L, 2) : lua_tonumber(L, 1);
  st = nnum == 3 ? lua_tonumber(L, 3) : 1;
  memset(&m, 0, sizeof m);
  m.dtype = allint ? FL_I64 : FL_F32;
  lfl_options(L, nnum + 1, &m.dtype, &m.device, "arange");
  lfl_checkdevice(L, m.device, "arange");
  if (!isfinite(s) || !isfinite(e) || !isfinite(st)) {
    char msg[160];
    snprintf(msg, sizeof msg, "arange: start %.15g, end %.15g and step %.15g "
             "must be finite", s, e, st);
    return luaL_error(L, "%s", msg);
  }
  if (st == 0) return luaL_error(L, "arange: step must be nonzero");
  if ((e > s && st < 0) || (e < s && st > 0)) {
    char msg[160];
    snprintf(msg, sizeof msg, "arange: step %.15g goes away from the end "
             "(start %.15g, end %.15g)", st, s, e);
    return luaL_error(L, "%s", msg);
  }
  c = ceil((e - s) / st);
  if (c > 9e18) c = 9e18;            /* meta_check_size names it */
  count = (int64_t)c;
  if (allint) {                      /* exact, beyond 2^53 too */
    is = nnum >= 2 ? lua_tointeger(L, 1) : 0;
    ist = nnum == 3 ? lua_tointeger(L, 3) : 1;
    if (fabs(s) < 4e18 && fabs(e) < 4e18) {
      lua_Integer d = (nnum >= 2 ? lua_tointeger(L, 2) : lua_tointeger(L, 1)) - is;
      count = (int64_t)(d / ist + (d % ist != 0));
    }
  }
  m.ndim = 1;
  m.shape[0] = count;
  dev = m.device;
  m.device = FL_DEV_CPU;
  t = lfl_pushempty(L, &m, "arange");
  for (k = 0; k < count; k++) {
    if (allint && m.dtype == FL_I64)
      *(int64_t *)ten_elem_ptr(t, k) = (int64_t)(is + (lua_Integer)k * ist);
    else
      ten_set(t, k, s + (double)k * st);
  }
  lfl_place(L, dev);
  lfl_trace_mark_fresh(L, lfl_totensor(L, -1));
  return 1;
}

/* ---- fl.tensor{...}: nested tables -> a tensor ------------------------- */

typedef struct nest {
  int nd;                          /* nesting depth = ndim */
  int64_t shape[FL_MAX_DIMS];
  int kind;                        /* widest element: 0 bool, 1 int, 2 float */
  int64_t path[FL_MAX_DIMS];       /* 1-based position, for messages */
  fl_tensor *t;                    /* NULL in the checking pass */
  int64_t next;                    /* element index in the storing pass */
} nest;

static const char *path_str(lua_State *L, const nest *n, int d) {
  luaL_Buffer b;
  int i;
  luaL_buffinit(L, &b);
  if (d == 0) luaL_addstring(&b, "the top level");
  for (i = 0; i < d; i++) {
    char s[32];
    snprintf(s, sizeof s, "[%lld]", (long long)n->path[i]);
    luaL_addstring(&b, s);
  }
  luaL_pushresult(&b);
  return lua_tostring(L, -1);
}

/* Walk the value on top of the stack at depth d: check it has the shape
** found along the first elements, then (second pass) store elements. */
static void nest_walk(lua_State *L, nest *n, int d) {
  int ty = lua_type(L, -1);
  const char *tname = lfl_typename(L, -1);  /* before path_str pushes */
  if (d < n->nd) {
    int64_t k, len;
    if (ty != LUA_TTABLE)
      luaL_error(L, "tensor: ragged nested table at %s: expected a table of "
                 "%I elements, got a %s", path_str(L, n, d),
                 (lua_Integer)n->shape[d], tname);
    len = (int64_t)lua_rawlen(L, -1);
    if (len != n->shape[d])
      luaL_error(L, "tensor: ragged nested table at %s: expected %I "
                 "elements, got %I", path_str(L, n, d),
                 (lua_Integer)n->shape[d], (lua_Integer)len);
    luaL_checkstack(L, 4, "tensor: nesting too deep");
    for (k = 1; k <= len; k++) {
      n->path[d] = k;
      lua_rawgeti(L, -1, (lua_Integer)k);
      nest_walk(L, n, d + 1);
      lua_pop(L, 1);
    }
    return;
  }
  if (ty == LUA_TNUMBER || ty == LUA_TBOOLEAN) {
    if (n->t) store_value(L, -1, n->t, n->next++);
    else if (ty == LUA_TNUMBER) {
      int k = lua_isinteger(L, -1) ? 1 : 2;
      if (k > n->kind) n->kind = k;
    }
    return;
  }
  if (ty == LUA_TTABLE)
    luaL_error(L, "tensor: ragged nested table at %s: expected a number, got "
               "a table", path_str(L, n, d));
  luaL_error(L, "tensor: element at %s is a %s, expected a number or boolean",
             path_str(L, n, d), tname);
}

static int l_tensor(lua_State *L) {
  nest n;
  fl_meta m;
  fl_device dev;
  fl_tensor *src;
  int has_dtype = 0, has_device = 0;
  memset(&n, 0, sizeof n);
  memset(&m, 0, sizeof m);
  if (!lua_isnoneornil(L, 2)) {
    fl_dtype dt = FL_NDTYPES;          /* "not given" */
    lfl_options(L, 2, &dt, &m.device, "tensor");
    if (dt != FL_NDTYPES) { m.dtype = dt; has_dtype = 1; }
    lfl_checkdevice(L, m.device, "tensor");
    has_device = m.device != FL_DEV_CPU;
  }
  if ((src = lfl_totensor(L, 1)) != NULL) {   /* a copy, as torch.tensor(t) */
    fl_err e;
    fl_meta cm = lfl_checkdata(L, 1, "tensor")->m;
    fl_tensor *t;
    cm.wrapped = 0;
    if (has_dtype) cm.dtype = m.dtype;
    if (src->m.device != FL_DEV_CPU) {          /* a device copy, then placed */
      lua_settop(L, 1);
      lfl_place(L, FL_DEV_CPU);
      src = lfl_totensor(L, -1);
      cm.device = FL_DEV_CPU;
    }
    t = lfl_pushempty(L, &cm, "tensor");
    err_clear(&e);
    if (ten_copy(t, src, &e) != FL_OK) lfl_raise(L, "tensor", &e);
    return lfl_place(L, has_device ? m.device : lfl_totensor(L, 1)->m.device);
  }
  if (lua_type(L, 1) != LUA_TTABLE && lua_type(L, 1) != LUA_TNUMBER &&
      lua_type(L, 1) != LUA_TBOOLEAN)
    return luaL_typeerror(L, 1, "table of numbers");
  lua_settop(L, 1);
  /* the shape is read along the first elements, then everything checked */
  lua_pushvalue(L, 1);
  while (lua_type(L, -1) == LUA_TTABLE && !lfl_istensor(L, -1)) {
    lua_Unsigned len = lua_rawlen(L, -1);
    if (n.nd == FL_MAX_DIMS)
      return luaL_error(L, "tensor: nested deeper than %d dims", FL_MAX_DIMS);
    n.shape[n.nd++] = (int64_t)len;
    if (len == 0) break;
    lua_rawgeti(L, -1, 1);
    lua_remove(L, -2);
  }
  lua_settop(L, 1);
  lua_pushvalue(L, 1);
  nest_walk(L, &n, 0);
  lua_settop(L, 1);
  if (!has_dtype) {
    /* PyTorch's inference: any float -> float32, integers -> int64, only
    ** booleans -> bool; no elements at all -> float32 */
    int i;
    int64_t numel = 1;
    for (i = 0; i < n.nd; i++) numel *= n.shape[i];
    m.dtype = (numel == 0 || n.kind == 2) ? FL_F32
              : n.kind == 1 ? FL_I64 : FL_BOOL;
  }
  m.ndim = n.nd;
  memcpy(m.shape, n.shape, sizeof m.shape);
  dev = m.device;
  m.device = FL_DEV_CPU;
  n.t = lfl_pushempty(L, &m, "tensor");
  lua_pushvalue(L, 1);
  nest_walk(L, &n, 0);
  lua_pop(L, 1);
  return lfl_place(L, dev);
}

/* ---------------------------------------------------------------------- */
/* seeding, timing, files, comparison                                     */
/* ---------------------------------------------------------------------- */

static int l_manual_seed(lua_State *L) {
  rng_seed((uint64_t)check_int(L, 1, "manual_seed", "seed"));
  return 0;
}

/* fl.get_rng_state() -> {seed=, offset=} (offset in Philox blocks of 4
** values); fl.set_rng_state(s) puts the stream back there, so a piece of
** code can be run twice on the same draws (torch.get_rng_state). */
static int l_get_rng_state(lua_State *L) {
  uint64_t key, block;
  rng_get_state(&key, &block);
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, (lua_Integer)key);
  lua_setfield(L, -2, "seed");
  lua_pushinteger(L, (lua_Integer)block);
  lua_setfield(L, -2, "offset");
  return 1;
}

static int l_set_rng_state(lua_State *L) {
  lua_Integer key, block;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "seed");
  lua_getfield(L, 1, "offset");
  if (!lua_isinteger(L, -2) || !lua_isinteger(L, -1))
    return luaL_error(L, "set_rng_state: expected a table from fl.get_rng_state() "
                      "({seed=integer, offset=integer})");
  key = lua_tointeger(L, -2);
  block = lua_tointeger(L, -1);
  rng_set_state((uint64_t)key, (uint64_t)block);
  return 0;
}

static int l_now(lua_State *L) {
  lua_pushnumber(L, (lua_Number)meas_now());
  return 1;
}

static int l_synchronize(lua_State *L) {
  (void)L;                           /* nothing runs asynchronously on CPU */
  return 0;
}

static int l_save(lua_State *L) {
  fl_tensor *t = lfl_checkdata(L, 1, "save");
  const char *path = luaL_checkstring(L, 2);
  fl_err e;
  if (t->m.device != FL_DEV_CPU)
    return luaL_error(L, "save: the tensor is on cuda; call :cpu() first");
  err_clear(&e);
  if (npy_save(path, t, &e) != FL_OK) return lfl_raise(L, "save", &e);
  return 0;
}

static int l_load(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  fl_err e;
  fl_tensor *t = lfl_newtensor(L);
  err_clear(&e);
  if (npy_load(path, t, &e) != FL_OK) return lfl_raise(L, "load", &e);
  if (t->st) lfl_account(L, t->st->nbytes);
  return 1;
}

/* Row-major index into t of the broadcast element whose coordinates in
** the nd-d broadcast shape are c (t's dims align to the right). */
static int64_t bcast_index(const fl_tensor *t, int nd, const int64_t *c) {
  int i, off = nd - t->m.ndim;
  int64_t lin = 0;
  for (i = 0; i < t->m.ndim; i++)
    lin = lin * t->m.shape[i] + (t->m.shape[i] == 1 ? 0 : c[off + i]);
  return lin;
}

/* fl.allclose(a, b [, rtol [, atol]]) or (a, b, {rtol=, atol=, equal_nan=}):
** |a - b| <= atol + rtol * |b| everywhere; equal values (infinities too)
** are close; NaN is close only to NaN and only with equal_nan, as
** PyTorch.  Two integer values compare exactly (no rounding to double). */
static int l_allclose(lua_State *L) {
  static const char *const keys[] = {"rtol", "atol", "equal_nan", NULL};
  fl_tensor *a = lfl_readable(L, 1, "allclose"), *b = lfl_readable(L, 2, "allclose");
  double rtol = 1e-5, atol = 1e-8;
  fl_meta bm;
  fl_err e;
  int64_t c[FL_MAX_DIMS], i, n;
  int d, close = 1, equal_nan = 0, ints;
  if (lua_type(L, 3) == LUA_TTABLE) {
    lfl_checkkeys(L, 3, keys, "allclose");
    lua_getfield(L, 3, "rtol");
    rtol = luaL_optnumber(L, -1, rtol);
    lua_getfield(L, 3, "atol");
    atol = luaL_optnumber(L, -1, atol);
    lua_getfield(L, 3, "equal_nan");
    equal_nan = lua_toboolean(L, -1);
  } else {
    rtol = luaL_optnumber(L, 3, rtol);
    atol = luaL_optnumber(L, 4, atol);
  }
  err_clear(&e);
  if (op_broadcast_shapes("allclose", &a->m, &b->m, &bm, &e) != FL_OK)
    return lfl_raise(L, "allclose", &e);
  n = meta_numel(&bm);
  if (n > FL_MAX_NUMEL) {          /* expanded views: minutes per 2^40 */
    char s[160];
    return luaL_error(L, "allclose: broadcast shape %s is too large to "
                      "compare: %I elements, at most 2^40 = %I",
                      meta_shape_str(&bm, s, sizeof s), (lua_Integer)n,
                      (lua_Integer)FL_MAX_NUMEL);
  }
  ints = !dtype_is_float(a->m.dtype) && !dtype_is_float(b->m.dtype);
  memset(c, 0, sizeof c);
  for (i = 0; i < n && close; i++) {
    int64_t ia = bcast_index(a, bm.ndim, c), ib = bcast_index(b, bm.ndim, c);
    double x = ten_get(a, ia), y = ten_get(b, ib);
    if (ints) {
      /* unequal integers differ by at least 1, whatever double says */
      int64_t p = ten_get_i64(a, ia), q = ten_get_i64(b, ib);
      if (p != q && !(fmax(fabs(x - y), 1.0) <= atol + rtol * fabs(y))) close = 0;
    } else if (x != x || y != y) {
      if (!(equal_nan && x != x && y != y)) close = 0;
    } else if (x != y && (isinf(x) || isinf(y) ||
                          !(fabs(x - y) <= atol + rtol * fabs(y)))) {
      close = 0;   /* an infinity is close only to itself */
    }
    for (d = bm.ndim - 1; d >= 0; d--) {     /* next coordinate */
      if (++c[d] < bm.shape[d]) break;
      c[d] = 0;
    }
  }
  lua_pushboolean(L, close);
  return 1;
}

static int l_is_tensor(lua_State *L) {
  lua_pushboolean(L, lfl_istensor(L, 1));
  return 1;
}

/* fl.machine_peaks, fl.draw_roofline (lfl_roofline.c) */
void lfl_open_roofline(lua_State *L, int lib);

static const luaL_Reg fl_funcs[] = {
  {"tensor", l_tensor}, {"zeros", l_zeros}, {"ones", l_ones},
  {"full", l_full}, {"arange", l_arange}, {"rand", l_rand},
  {"randn", l_randn}, {"dropout", l_dropout}, {"eye", l_eye},
  {"manual_seed", l_manual_seed}, {"get_rng_state", l_get_rng_state},
  {"set_rng_state", l_set_rng_state}, {"now", l_now},
  {"synchronize", l_synchronize},
  {"save", l_save}, {"load", l_load},
  {"allclose", l_allclose}, {"is_tensor", l_is_tensor},
  {NULL, NULL}
};

/* A stock lua5.4 dlcloses C modules when its state closes, while the
** OpenMP worker threads the eager kernels started are still parked in
** libgomp; unmapping it under them crashes the exit.  So this library
** (and with it libgomp) stays loaded for the life of the process.  Built
** into the fuselab binary this pins the executable: a no-op. */
static void pin_library(void) {
  Dl_info info;
  if (dladdr((void *)luaopen_fuselab, &info) && info.dli_fname)
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

/* The `fl` table.  Safe to call more than once in a state (the metatable
** is shared, the tables are new): built into the fuselab binary and
** loaded by a stock lua5.4 as require "fuselab". */
int luaopen_fuselab(lua_State *L) {
  int meta, methods, lib;
  pin_library();
  luaL_newmetatable(L, LFL_TENSOR);
  meta = lua_gettop(L);
  lua_newtable(L);
  methods = lua_gettop(L);
  luaL_newlib(L, fl_funcs);
  lib = lua_gettop(L);
  lfl_open_tensor(L, meta, methods);
  lfl_open_ops(L, meta, methods, lib);
  lfl_open_autograd(L, methods, lib);
  lfl_open_optim(L, lib);
  lua_pushvalue(L, methods);
  lua_setfield(L, lib, "Tensor");
  lua_newtable(L);                     /* filled by the nn modules */
  lua_setfield(L, lib, "nn");
  lua_pushstring(L, PACKAGE_VERSION);
  lua_setfield(L, lib, "version");
  lfl_open_trace(L, lib);
  lfl_open_sym(L, lib);
  lfl_open_graph(L, lib);
  lfl_open_plan(L, lib);
  lfl_open_compile(L, lib);
  lfl_open_viz(L, lib);
  lfl_open_weights(L, lib);
  lfl_open_nn(L, lib);
  lfl_open_measure(L, lib);
  lfl_open_checklist(L, lib);
  lfl_open_onnx(L, lib);
  lfl_open_tokenizer(L, lib);
  lfl_open_cuda(L, lib);
  lfl_open_roofline(L, lib);
  return 1;
}
