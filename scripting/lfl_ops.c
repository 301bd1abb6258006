/*
** lfl_ops.c -- every op reachable from Lua, and the one point they all go
** through: lfl_dispatch.  Capture (tracing Lua into a graph) will hook in
** there and nowhere else, so no binding may run a kernel by another road.
** Bindings differ only in how Lua arguments become inputs and attributes;
** which binding an op gets is read from the op table itself (kind and
** arity), so a new elementwise row in ops.def appears in Lua as x:name()
** and fl.name(x) with no code here.
*/
#include <stdlib.h>
#include <string.h>

#include "lfl.h"
#include "cpu/eager.h"
#include "graph/rng.h"

/* ---------------------------------------------------------------------- */
/* THE dispatch point                                                     */
/* ---------------------------------------------------------------------- */

int lfl_dispatch(lua_State *L, fl_op op, const fl_tensor *const *in,
                 int nin, const op_attrs *a) {
  return lfl_dispatch_sym(L, op, in, nin, a, NULL);
}

int lfl_dispatch_sym(lua_State *L, fl_op op, const fl_tensor *const *in,
                     int nin, const op_attrs *a, const int *asym) {
  lfl_trace *tr;
  while (nin > 1 && in[nin - 1] == NULL) nin--;   /* absent optional inputs */
  if ((tr = lfl_trace_active(L)) != NULL)       /* capture: record, don't run */
    return lfl_trace_record(L, tr, op, in, nin, a, asym);
  return lfl_dispatch_eager(L, op, in, nin, a);
}

int lfl_dispatch_eager(lua_State *L, fl_op op, const fl_tensor *const *in,
                       int nin, const op_attrs *a) {
  fl_err e;
  fl_tensor *out;
  uint64_t key, block;
  int rc, k;
  while (nin > 1 && in[nin - 1] == NULL) nin--;
  for (k = 0; k < nin; k++)
    if (in[k] && lfl_islazy(in[k]) && !lfl_trace_resolve(L, (fl_tensor *)in[k]))
      return luaL_error(L, "%s: this tensor belongs to a capture that ended "
                        "with an error and was never computed", op_name(op));
  err_clear(&e);
  out = lfl_newtensor(L);            /* owns the result from the start */
  if (op == OP_DROPOUT) rng_get_state(&key, &block);  /* where its mask is drawn */
  else key = block = 0;
  rc = lfl_apply(op, in, nin, a, out, &e);   /* where the inputs are */
  if (rc == FL_ENOMEM) {
    lfl_collect(L);                  /* garbage may hold the memory */
    err_clear(&e);
    rc = lfl_apply(op, in, nin, a, out, &e);
  }
  if (rc != FL_OK) return lfl_raise(L, op_name(op), &e);
  if (out->st && out->st->refs == 1 && out->m.device == FL_DEV_CPU)  /* new host storage */
    lfl_account(L, out->st->nbytes);
  lfl_ag_record(L, op, in, nin, a, out, key, block);
  return 1;
}

/* The op a binding closure was registered for. */
static fl_op upop(lua_State *L) {
  return (fl_op)lua_tointeger(L, lua_upvalueindex(1));
}

/* nil -> NULL, else a tensor (optional inputs: bias, weight...). */
static const fl_tensor *opt_tensor(lua_State *L, int idx) {
  return lua_isnoneornil(L, idx) ? NULL : lfl_checktensor(L, idx);
}

/* A number, or nil for dflt; a message naming op and role otherwise. */
static double opt_number(lua_State *L, int idx, double dflt, const char *what,
                         const char *role) {
  if (lua_isnoneornil(L, idx)) return dflt;
  if (lua_type(L, idx) != LUA_TNUMBER)
    luaL_error(L, "%s: %s must be a number, got %s", what, role,
               lfl_typename(L, idx));
  return (double)lua_tonumber(L, idx);
}

/* ---------------------------------------------------------------------- */
/* elementwise                                                            */
/* ---------------------------------------------------------------------- */

/* x:exp(), fl.exp(x), -x; also contiguous(). */
static int b_unary(lua_State *L) {
  fl_op op = upop(L);
  const fl_tensor *in[1];
  op_attrs a;
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(op, &a);
  return lfl_dispatch(L, op, in, 1, &a);
}

/* x:add(y), fl.add(2, x), x + 1: numbers on either side become wrapped
** 0-dim tensors, so type promotion follows PyTorch's. */
static int b_binary(lua_State *L) {
  fl_op op = upop(L);
  const fl_tensor *in[2];
  op_attrs a;
  lua_settop(L, 2);
  if (lua_type(L, 1) == LUA_TNUMBER && lua_type(L, 2) == LUA_TNUMBER)
    return luaL_error(L, "%s: expected at least one fl.Tensor, got two "
                      "numbers", op_name(op));
  in[0] = lfl_checkoperand(L, 1);
  in[1] = lfl_checkoperand(L, 2);
  lfl_widen_numbers(L, in, 1, 2);
  /* PyTorch refuses a negative scalar exponent for integers (a tensor
  ** exponent computes, ops.def): here, before capture or eager, so a
  ** compiled function refuses it as eager does */
  if (op == OP_POW && lua_isinteger(L, 2) && lua_tointeger(L, 2) < 0 &&
      !dtype_is_float(in[0]->m.dtype))
    return luaL_error(L, "pow: integers to negative integer powers are not "
                      "allowed (exponent %I)", (LUAI_UACINT)lua_tointeger(L, 2));
  op_attrs_init(op, &a);
  return lfl_dispatch(L, op, in, 2, &a);
}

/* fl.where(cond, a, b); a and b may be numbers. */
static int b_where(lua_State *L) {
  const fl_tensor *in[3];
  op_attrs a;
  lua_settop(L, 3);
  in[0] = lfl_checktensor(L, 1);
  in[1] = lfl_checkoperand(L, 2);
  in[2] = lfl_checkoperand(L, 3);
  lfl_widen_numbers(L, in, 1, 3);
  op_attrs_init(OP_WHERE, &a);
  return lfl_dispatch(L, OP_WHERE, in, 3, &a);
}

/* x:clamp(lo, hi) with either nil, or x:clamp{min=, max=}. */
static int b_clamp(lua_State *L) {
  static const char *const keys[] = {"min", "max", NULL};
  const fl_tensor *in[1];
  op_attrs a;
  int given = 0;
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(OP_CLAMP, &a);
  if (lua_type(L, 2) == LUA_TTABLE) {
    lfl_checkkeys(L, 2, keys, "clamp");
    lua_settop(L, 2);
    lua_getfield(L, 2, "min");
    lua_getfield(L, 2, "max");
    lua_copy(L, 3, 2);                 /* now as clamp(min, max) */
    lua_copy(L, 4, 3);
    lua_settop(L, 3);
  }
  if (!lua_isnoneornil(L, 2)) { a.f[0] = opt_number(L, 2, 0, "clamp", "min"); given = 1; }
  if (!lua_isnoneornil(L, 3)) { a.f[1] = opt_number(L, 3, 0, "clamp", "max"); given = 1; }
  if (!given)
    return luaL_error(L, "clamp: expected min and/or max (x:clamp(lo, hi) or "
                      "x:clamp{min=, max=})");
  return lfl_dispatch(L, OP_CLAMP, in, 1, &a);
}

/* x:gelu() is the exact erf form; x:gelu{approximate="tanh"} (or
** x:gelu("tanh")) the tanh approximation, a row of its own. */
static int b_gelu(lua_State *L) {
  static const char *const keys[] = {"approximate", NULL};
  const fl_tensor *in[1];
  const char *mode = "none";
  fl_op op = OP_GELU;
  op_attrs a;
  in[0] = lfl_checktensor(L, 1);
  if (lua_type(L, 2) == LUA_TTABLE) {
    lfl_checkkeys(L, 2, keys, "gelu");
    lua_getfield(L, 2, "approximate");
    lua_replace(L, 2);
  }
  if (!lua_isnoneornil(L, 2)) {
    if (lua_type(L, 2) != LUA_TSTRING)
      return luaL_error(L, "gelu: approximate must be \"none\" or \"tanh\", "
                        "got %s", lfl_typename(L, 2));
    mode = lua_tostring(L, 2);
  }
  if (strcmp(mode, "tanh") == 0) op = OP_GELU_TANH;
  else if (strcmp(mode, "none") != 0)
    return luaL_error(L, "gelu: approximate must be \"none\" or \"tanh\", "
                      "not \"%s\"", mode);
  op_attrs_init(op, &a);
  return lfl_dispatch(L, op, in, 1, &a);
}

/* ---------------------------------------------------------------------- */
/* reductions and composites                                              */
/* ---------------------------------------------------------------------- */

static int cmp_i64(const void *p, const void *q) {
  int64_t a = *(const int64_t *)p, b = *(const int64_t *)q;
  return (a > b) - (a < b);
}

/* A dim (number) or dims (table) at idx into a->dims, 0-based, sorted. */
static void read_dims(lua_State *L, int idx, const fl_tensor *x, op_attrs *a,
                      const char *what) {
  int i, n = 0;
  idx = lua_absindex(L, idx);
  if (lua_type(L, idx) == LUA_TNUMBER) {
    a->dims[n++] = lfl_checkdim(L, idx, x->m.ndim, what);
  } else if (lua_type(L, idx) == LUA_TTABLE) {
    lua_Unsigned len = lua_rawlen(L, idx);
    if (len > FL_MAX_DIMS)
      luaL_error(L, "%s: at most %d dims, got %d", what, FL_MAX_DIMS,
                 (int)(len > 1000000 ? 1000000 : len));
    for (i = 1; i <= (int)len; i++) {
      lua_rawgeti(L, idx, i);
      a->dims[n++] = lfl_checkdim(L, lua_gettop(L), x->m.ndim, what);
      lua_pop(L, 1);
    }
  } else {
    luaL_error(L, "%s: dim must be a number or a table of numbers, got %s",
               what, lfl_typename(L, idx));
  }
  qsort(a->dims, (size_t)n, sizeof a->dims[0], cmp_i64);
  for (i = 1; i < n; i++)
    if (a->dims[i] == a->dims[i - 1])
      luaL_error(L, "%s: dim %d appears more than once", what,
                 (int)a->dims[i] + 1);
  /* a 0-d tensor accepts dim 1/-1 (lfl_dim): reducing "it" is all of it */
  a->ndims = x->m.ndim == 0 ? 0 : n;
}

/* x:sum(), x:sum(2), x:sum({1,2}, true), x:var(1, {correction=0}),
** x:mean{dim=-1, keepdim=true}: dim, keepdim and options in that order,
** each optional. */
static int b_reduce(lua_State *L) {
  static const char *const keys[] = {"dim", "keepdim", NULL};
  static const char *const var_keys[] = {"dim", "keepdim", "correction",
                                         "unbiased", NULL};
  fl_op op = upop(L);
  const char *what = op_name(op);
  const fl_tensor *in[1];
  op_attrs a;
  int i, top = lua_gettop(L), have_dim = 0;
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(op, &a);
  for (i = 2; i <= top; i++) {
    int ty = lua_type(L, i);
    if (ty == LUA_TNIL) continue;
    if (ty == LUA_TNUMBER || (ty == LUA_TTABLE && lua_rawlen(L, i) > 0)) {
      if (have_dim) return luaL_error(L, "%s: dim given twice", what);
      read_dims(L, i, in[0], &a, what);
      have_dim = 1;
    } else if (ty == LUA_TBOOLEAN) {
      a.keepdim = lua_toboolean(L, i);
    } else if (ty == LUA_TTABLE) {
      lfl_checkkeys(L, i, op == OP_VAR ? var_keys : keys, what);
      if (lua_getfield(L, i, "dim") != LUA_TNIL) {
        if (have_dim) return luaL_error(L, "%s: dim given twice", what);
        read_dims(L, -1, in[0], &a, what);
        have_dim = 1;
      }
      if (lua_getfield(L, i, "keepdim") != LUA_TNIL)
        a.keepdim = lua_toboolean(L, -1);
      if (lua_getfield(L, i, "correction") != LUA_TNIL)
        a.f[0] = opt_number(L, -1, 1, what, "correction");
      if (lua_getfield(L, i, "unbiased") != LUA_TNIL)
        a.f[0] = lua_toboolean(L, -1) ? 1 : 0;
      lua_pop(L, 4);
    } else {
      return luaL_typeerror(L, i, "dim, keepdim or options table");
    }
  }
  return lfl_dispatch(L, op, in, 1, &a);
}

/* x:softmax(dim), x:log_softmax(dim): dim is required, as in PyTorch. */
static int b_softmax(lua_State *L) {
  fl_op op = upop(L);
  const fl_tensor *in[1];
  op_attrs a;
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(op, &a);
  if (lua_isnoneornil(L, 2))
    return luaL_error(L, "%s: expected a dim (-1 for the last)", op_name(op));
  a.i[0] = lfl_checkdim(L, 2, in[0]->m.ndim, op_name(op));
  if (in[0]->m.ndim == 0) a.i[0] = 0;
  return lfl_dispatch(L, op, in, 1, &a);
}

/* The normalized shape of layer_norm/rms_norm (a size or a table of
** trailing sizes) must be x's last dims; the core only sees the count. */
static int norm_shape(lua_State *L, int idx, const fl_tensor *x,
                      const char *what) {
  int64_t s[FL_MAX_DIMS];
  int i, n, next;
  char b1[128], b2[128];
  fl_meta nm;
  if (lua_type(L, idx) != LUA_TNUMBER && lua_type(L, idx) != LUA_TTABLE)
    return luaL_error(L, "%s: normalized shape must be a size or a table of "
                      "sizes, got %s", what, lfl_typename(L, idx));
  if (lua_type(L, idx) == LUA_TNUMBER) {
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, idx);
    lua_rawseti(L, -2, 1);
    lua_replace(L, idx);
  }
  if (x->m.ndim == 0)
    return luaL_error(L, "%s: cannot normalize a 0-d input", what);
  n = lfl_sizes(L, idx, s, &next, what);
  memset(&nm, 0, sizeof nm);
  nm.ndim = n;
  memcpy(nm.shape, s, sizeof s);
  if (n < 1 || n > x->m.ndim)
    return luaL_error(L, "%s: normalized shape %s does not fit input %s "
                      "(expected 1 to %d trailing sizes)", what,
                      meta_shape_str(&nm, b1, sizeof b1),
                      meta_shape_str(&x->m, b2, sizeof b2), x->m.ndim);
  for (i = 0; i < n; i++)
    if (s[i] != x->m.shape[x->m.ndim - n + i])
      return luaL_error(L, "%s: normalized shape %s does not match the "
                        "trailing dims of input %s", what,
                        meta_shape_str(&nm, b1, sizeof b1),
                        meta_shape_str(&x->m, b2, sizeof b2));
  return n;
}

/* x:layer_norm(shape [, w [, b [, eps]]]) */
static int b_layer_norm(lua_State *L) {
  const fl_tensor *in[3];
  op_attrs a;
  op_attrs_init(OP_LAYER_NORM, &a);
  lua_settop(L, 5);
  in[0] = lfl_checktensor(L, 1);
  a.i[0] = norm_shape(L, 2, in[0], "layer_norm");
  in[1] = opt_tensor(L, 3);
  in[2] = opt_tensor(L, 4);
  a.f[0] = opt_number(L, 5, a.f[0], "layer_norm", "eps");
  return lfl_dispatch(L, OP_LAYER_NORM, in, 3, &a);
}

/* x:rms_norm(shape [, w [, eps]]) */
static int b_rms_norm(lua_State *L) {
  const fl_tensor *in[2];
  op_attrs a;
  op_attrs_init(OP_RMS_NORM, &a);
  lua_settop(L, 4);
  in[0] = lfl_checktensor(L, 1);
  a.i[0] = norm_shape(L, 2, in[0], "rms_norm");
  in[1] = opt_tensor(L, 3);
  a.f[0] = opt_number(L, 4, a.f[0], "rms_norm", "eps");
  return lfl_dispatch(L, OP_RMS_NORM, in, 2, &a);
}

/* ---------------------------------------------------------------------- */
/* linear algebra, vision, lookup                                          */
/* ---------------------------------------------------------------------- */

static int b_matmul(lua_State *L) {
  const fl_tensor *in[2];
  op_attrs a;
  in[0] = lfl_checktensor(L, 1);
  in[1] = lfl_checktensor(L, 2);
  op_attrs_init(OP_MATMUL, &a);
  return lfl_dispatch(L, OP_MATMUL, in, 2, &a);
}

/* fl.linear(x, w [, b]): x @ w^T + b, w is [out, in] */
static int b_linear(lua_State *L) {
  const fl_tensor *in[3];
  op_attrs a;
  in[0] = lfl_checktensor(L, 1);
  in[1] = lfl_checktensor(L, 2);
  in[2] = opt_tensor(L, 3);
  op_attrs_init(OP_LINEAR, &a);
  return lfl_dispatch(L, OP_LINEAR, in, 3, &a);
}

/* fl.embedding(idx, weight): rows of weight at the (0-based) indices */
static int b_embedding(lua_State *L) {
  const fl_tensor *in[2];
  op_attrs a;
  in[0] = lfl_checktensor(L, 1);
  in[1] = lfl_checktensor(L, 2);
  op_attrs_init(OP_EMBEDDING, &a);
  return lfl_dispatch(L, OP_EMBEDDING, in, 2, &a);
}

/* An (h, w) pair from field `key` of the options table at idx: a number
** for both or a table {h, w}; dflt when absent.  min is the least value
** allowed (stride and kernel 1, padding 0). */
static void pair_field(lua_State *L, int idx, const char *key, int64_t *out,
                       const int64_t *dflt, int64_t min, const char *what) {
  int i, ty;
  if (idx == 0) lua_pushnil(L);
  else lua_getfield(L, idx, key);
  ty = lua_type(L, -1);
  out[0] = dflt[0];
  out[1] = dflt[1];
  if (ty == LUA_TNUMBER) {
    lua_pushvalue(L, -1);
    lua_pushvalue(L, -1);
  } else if (ty == LUA_TTABLE && lua_rawlen(L, -1) == 2) {
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
  } else if (ty != LUA_TNIL) {
    luaL_error(L, "%s: %s must be a number or a pair {h, w}, got %s", what,
               key, ty == LUA_TTABLE ? "a table of another length"
                                     : lfl_typename(L, -1));
  }
  if (ty != LUA_TNIL) {
    for (i = 0; i < 2; i++) {
      int ok;
      lua_Integer v = lua_tointegerx(L, -2 + i, &ok);
      if (!ok)
        luaL_error(L, "%s: %s must be integers, got %s", what, key,
                   lua_type(L, -2 + i) == LUA_TNUMBER ? lua_tostring(L, -2 + i)
                                                      : lfl_typename(L, -2 + i));
      if (v < min)
        luaL_error(L, "%s: %s must be >= %d, got %I", what, key, (int)min, v);
      out[i] = (int64_t)v;
    }
    lua_pop(L, 2);
  }
  lua_pop(L, 1);
}

static int opts_index(lua_State *L, int idx, const char *const *keys,
                      const char *what) {
  if (lua_isnoneornil(L, idx)) return 0;
  if (lua_type(L, idx) != LUA_TTABLE || lfl_istensor(L, idx))
    luaL_typeerror(L, idx, "options table");
  lfl_checkkeys(L, idx, keys, what);
  return idx;
}

/* padding = n, {h, w} or {top, left, bottom, right} into out[0..3] as
** top, left, bottom, right (ops.def's order for conv2d and the pools). */
static void pad4_field(lua_State *L, int idx, int64_t *out, const char *what) {
  int i, n = 0, ty;
  lua_Integer v[4] = {0, 0, 0, 0};
  if (idx == 0) lua_pushnil(L);
  else lua_getfield(L, idx, "padding");
  ty = lua_type(L, -1);
  if (ty == LUA_TNUMBER) {
    n = 1;
  } else if (ty == LUA_TTABLE && !lfl_istensor(L, -1) &&
             (lua_rawlen(L, -1) == 2 || lua_rawlen(L, -1) == 4)) {
    n = (int)lua_rawlen(L, -1);
  } else if (ty != LUA_TNIL) {
    luaL_error(L, "%s: padding must be a number, a pair {h, w} or {top, left, "
               "bottom, right}, got %s", what,
               ty == LUA_TTABLE ? "a table of another length" : lfl_typename(L, -1));
  }
  for (i = 0; i < n; i++) {
    int ok;
    if (ty == LUA_TTABLE) lua_rawgeti(L, -1, i + 1);
    else lua_pushvalue(L, -1);
    v[i] = lua_tointegerx(L, -1, &ok);
    if (!ok)
      luaL_error(L, "%s: padding must be integers, got %s", what,
                 lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : lfl_typename(L, -1));
    if (v[i] < 0) luaL_error(L, "%s: padding must be >= 0, got %I", what, v[i]);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  if (n == 1) v[1] = v[2] = v[3] = v[0];
  if (n == 2) { v[2] = v[0]; v[3] = v[1]; }
  for (i = 0; i < 4; i++) out[i] = (int64_t)v[i];
}

/* A boolean option (absent: dflt). */
static int bool_field(lua_State *L, int idx, const char *key, int dflt, const char *what) {
  int r = dflt;
  if (idx == 0) return dflt;
  lua_getfield(L, idx, key);
  if (lua_type(L, -1) == LUA_TBOOLEAN) r = lua_toboolean(L, -1);
  else if (!lua_isnil(L, -1))
    luaL_error(L, "%s: %s must be a boolean, got %s", what, key, lfl_typename(L, -1));
  lua_pop(L, 1);
  return r;
}

/* An integer option >= min (absent: dflt). */
static int64_t int_field(lua_State *L, int idx, const char *key, int64_t dflt,
                         int64_t min, const char *what) {
  lua_Integer v = dflt;
  int ok;
  if (idx == 0) return dflt;
  lua_getfield(L, idx, key);
  if (!lua_isnil(L, -1)) {
    v = lua_tointegerx(L, -1, &ok);
    if (!ok)
      luaL_error(L, "%s: %s must be an integer, got %s", what, key,
                 lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : lfl_typename(L, -1));
    if (v < min) luaL_error(L, "%s: %s must be >= %d, got %I", what, key, (int)min, v);
  }
  lua_pop(L, 1);
  return (int64_t)v;
}

/* fl.conv2d(x, w [, b] [, {stride=, padding=, dilation=, groups=}]); the
** options may stand in the bias slot. */
static int b_conv2d(lua_State *L) {
  static const char *const keys[] = {"stride", "padding", "dilation", "groups", NULL};
  static const int64_t one[2] = {1, 1};
  const fl_tensor *in[3];
  op_attrs a;
  int o;
  lua_settop(L, 4);
  in[0] = lfl_checktensor(L, 1);
  in[1] = lfl_checktensor(L, 2);
  if (lua_type(L, 3) == LUA_TTABLE && !lfl_istensor(L, 3)) {   /* fl.conv2d(x, w, {stride=2}) */
    lua_pushvalue(L, 3);
    lua_replace(L, 4);
    lua_pushnil(L);
    lua_replace(L, 3);
  }
  in[2] = opt_tensor(L, 3);
  op_attrs_init(OP_CONV2D, &a);
  o = opts_index(L, 4, keys, "conv2d");
  pair_field(L, o, "stride", &a.i[0], one, 1, "conv2d");
  pad4_field(L, o, &a.i[2], "conv2d");
  pair_field(L, o, "dilation", &a.i[6], one, 1, "conv2d");
  a.i[8] = int_field(L, o, "groups", 1, 1, "conv2d");
  return lfl_dispatch(L, OP_CONV2D, in, 3, &a);
}

/* A tensor option, or NULL when absent; the options table keeps it alive. */
static const fl_tensor *tensor_field(lua_State *L, int idx, const char *key, const char *what) {
  const fl_tensor *t = NULL;
  if (idx == 0) return NULL;
  lua_getfield(L, idx, key);
  if (!lua_isnil(L, -1) && !(t = lfl_totensor(L, -1)))
    luaL_error(L, "%s: %s must be an fl.Tensor, got %s", what, key, lfl_typename(L, -1));
  lua_pop(L, 1);
  return t;
}

/* fl.rnn(x, w, r [, {cell=, direction=, bias=, sequence_lens=, initial_h=,
** initial_c=, peepholes=, clip=, linear_before_reset=, activations=}])
** -> y [T, D, B, H], y_h [D, B, H] (and y_c for an LSTM): ONNX's RNN, GRU
** and LSTM (layout 0, its input order and gate order).  cell defaults to
** what R's shape says (R [D, G*H, H]: G = 1 rnn, 3 gru, 4 lstm);
** activations lists ONNX's names per direction (f; f g; f g h).  The op's
** packed result (ops.def) is taken apart here with narrow, so the
** sequence length stays symbolic under capture. */
static int b_rnn(lua_State *L) {
  static const char *const keys[] = {"cell", "direction", "bias", "sequence_lens", "initial_h",
                                     "initial_c", "peepholes", "clip", "linear_before_reset",
                                     "activations", NULL};
  static const char *const cells[] = {"rnn", "gru", "lstm", NULL};
  static const char *const dirs[] = {"forward", "reverse", "bidirectional", NULL};
  const fl_tensor *in[8];
  op_attrs a;
  int o, k, nact, ndir, states, nin;
  lua_settop(L, 4);
  in[0] = lfl_checktensor(L, 1);
  in[1] = lfl_checktensor(L, 2);
  in[2] = lfl_checktensor(L, 3);
  op_attrs_init(OP_RNN, &a);
  o = opts_index(L, 4, keys, "rnn");
  a.i[0] = in[2]->m.ndim == 3 && in[2]->m.shape[2] > 0 && in[2]->m.shape[1] == 3 * in[2]->m.shape[2]
           ? OP_RNN_CELL_GRU
           : in[2]->m.ndim == 3 && in[2]->m.shape[1] == in[2]->m.shape[2] ? OP_RNN_CELL_RNN
                                                                           : OP_RNN_CELL_LSTM;
  if (o) {
    lua_getfield(L, o, "cell");
    if (!lua_isnil(L, -1)) a.i[0] = luaL_checkoption(L, -1, NULL, cells);
    lua_getfield(L, o, "direction");
    if (!lua_isnil(L, -1)) a.i[1] = luaL_checkoption(L, -1, NULL, dirs);
    lua_getfield(L, o, "clip");
    if (!lua_isnil(L, -1)) {
      a.i[3] = 1;
      a.f[0] = opt_number(L, -1, 0, "rnn", "clip");
    }
    lua_pop(L, 3);
  }
  in[3] = tensor_field(L, o, "bias", "rnn");
  in[4] = tensor_field(L, o, "sequence_lens", "rnn");
  in[5] = tensor_field(L, o, "initial_h", "rnn");
  in[6] = tensor_field(L, o, "initial_c", "rnn");
  in[7] = tensor_field(L, o, "peepholes", "rnn");
  a.i[2] = bool_field(L, o, "linear_before_reset", 0, "rnn");
  nact = a.i[0] == OP_RNN_CELL_RNN ? 1 : a.i[0] == OP_RNN_CELL_GRU ? 2 : 3;
  ndir = a.i[1] == 2 ? 2 : 1;
  if (o) {
    lua_getfield(L, o, "activations");
    if (!lua_isnil(L, -1)) {
      lua_Integer n;
      luaL_checktype(L, -1, LUA_TTABLE);
      n = (lua_Integer)lua_rawlen(L, -1);
      if (n != nact * ndir)
        return luaL_error(L, "rnn: activations lists %I names, expected %d (%d per direction)", n,
                          nact * ndir, nact);
      for (k = 0; k < n; k++) {
        const char *nm;
        int code;
        lua_rawgeti(L, -1, k + 1);
        nm = lua_tostring(L, -1);
        if (!nm || !(code = op_rnn_act_by_name(nm)))
          return luaL_error(L, "rnn: activation %s is not one of Sigmoid, Tanh, Relu, Softsign, "
                            "Softplus", nm ? nm : lfl_typename(L, -1));
        a.i[4 + 3 * (k / nact) + k % nact] = code;
        lua_pop(L, 1);
      }
    }
    lua_pop(L, 1);
  }
  for (nin = 8; !in[nin - 1]; nin--) {}   /* the absent trailing inputs dropped */
  lfl_dispatch(L, OP_RNN, in, nin, &a);
  /* y, y_h (, y_c): rows S.. of the packed result, then rows 0 and 1 */
  states = a.i[0] == OP_RNN_CELL_LSTM ? 2 : 1;
  lua_getfield(L, -1, "narrow");
  lua_pushvalue(L, -2);
  lua_pushinteger(L, 1);
  lua_pushinteger(L, states + 1);
  lfl_pushsize(L, in[0], 0);          /* symbolic under capture: it stays so */
  lua_call(L, 4, 1);
  for (k = 0; k < states; k++) {
    lua_getfield(L, -2 - k, "narrow");
    lua_pushvalue(L, -3 - k);
    lua_pushinteger(L, 1);
    lua_pushinteger(L, k + 1);
    lua_pushinteger(L, 1);
    lua_call(L, 4, 1);
    lua_getfield(L, -1, "squeeze");
    lua_insert(L, -2);
    lua_pushinteger(L, 1);
    lua_call(L, 2, 1);
  }
  return 1 + states;
}

/* x:max_pool2d(k [, {stride=, padding=, dilation=, ceil_mode=}]),
** x:avg_pool2d(k [, {stride=, padding=, ceil_mode=, count_include_pad=}]),
** stride defaulting to k. */
static int b_pool(lua_State *L) {
  static const char *const max_keys[] = {"stride", "padding", "dilation", "ceil_mode", NULL};
  static const char *const avg_keys[] = {"stride", "padding", "ceil_mode", "count_include_pad", NULL};
  static const int64_t zero[2] = {0, 0}, one[2] = {1, 1};
  fl_op op = upop(L);
  const char *what = op_name(op);
  const fl_tensor *in[1];
  int64_t k[2];
  op_attrs a;
  int o;
  lua_settop(L, 3);
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(op, &a);
  if (lua_isnil(L, 2))
    return luaL_error(L, "%s: expected a kernel size", what);
  /* the kernel size reads like an option: move it into a table */
  lua_createtable(L, 0, 1);
  lua_pushvalue(L, 2);
  lua_setfield(L, -2, "kernel size");
  pair_field(L, lua_gettop(L), "kernel size", k, zero, 1, what);
  lua_pop(L, 1);
  a.i[0] = k[0];
  a.i[1] = k[1];
  o = opts_index(L, 3, op == OP_MAX_POOL2D ? max_keys : avg_keys, what);
  pair_field(L, o, "stride", &a.i[2], k, 1, what);
  pad4_field(L, o, &a.i[4], what);
  if (op == OP_MAX_POOL2D) pair_field(L, o, "dilation", &a.i[8], one, 1, what);
  a.i[10] = bool_field(L, o, "ceil_mode", 0, what);
  if (op == OP_AVG_POOL2D) a.i[11] = bool_field(L, o, "count_include_pad", 1, what);
  return lfl_dispatch(L, op, in, 1, &a);
}

/* fl.batch_norm(x, mean, var [, w [, b [, eps | {eps =, batch_stats =}]]]):
** batch_stats says mean and var are x's own statistics (training), which
** only the gradient rule reads (ops.def). */
static int b_batch_norm(lua_State *L) {
  static const char *const keys[] = {"eps", "batch_stats", NULL};
  const fl_tensor *in[5];
  op_attrs a;
  op_attrs_init(OP_BATCH_NORM, &a);
  in[0] = lfl_checktensor(L, 1);
  in[1] = lfl_checktensor(L, 2);
  in[2] = lfl_checktensor(L, 3);
  lua_settop(L, 6);
  in[3] = opt_tensor(L, 4);
  in[4] = opt_tensor(L, 5);
  if (lua_istable(L, 6)) {
    lfl_checkkeys(L, 6, keys, "batch_norm");
    lua_getfield(L, 6, "eps");
    a.f[0] = opt_number(L, -1, a.f[0], "batch_norm", "eps");
    lua_getfield(L, 6, "batch_stats");
    if (!lua_isnil(L, -1) && !lua_isboolean(L, -1))
      return luaL_error(L, "batch_norm: batch_stats must be a boolean, got %s", lfl_typename(L, -1));
    a.i[0] = lua_toboolean(L, -1);
    lua_settop(L, 6);
  } else {
    a.f[0] = opt_number(L, 6, a.f[0], "batch_norm", "eps");
  }
  return lfl_dispatch(L, OP_BATCH_NORM, in, 5, &a);
}

/* ---------------------------------------------------------------------- */
/* views and data movement                                                */
/* ---------------------------------------------------------------------- */

/* x:reshape(2, -1), x:view{2, 3}, x:expand(4, -1): the target shape. */
static int b_shape(lua_State *L) {
  fl_op op = upop(L);
  const fl_tensor *in[1];
  op_attrs a;
  int next, asym[IR_NASYM];
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(op, &a);
  memset(asym, 0, sizeof asym);
  /* reshape(B, T*h): sizes may be symbolic */
  a.ndims = lfl_sizes_sym(L, 2, a.dims, asym, &next, op_name(op));
  if (!lua_isnone(L, next))
    return luaL_typeerror(L, next, "size");
  return lfl_dispatch_sym(L, op, in, 1, &a, asym);
}

static int b_transpose(lua_State *L) {
  const fl_tensor *in[1];
  op_attrs a;
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(OP_TRANSPOSE, &a);
  a.i[0] = lfl_checkdim(L, 2, in[0]->m.ndim, "transpose");
  a.i[1] = lfl_checkdim(L, 3, in[0]->m.ndim, "transpose");
  return lfl_dispatch(L, OP_TRANSPOSE, in, 1, &a);
}

/* x:permute(2, 1, 3) or x:permute{2, 1, 3}: 1-based source dims. */
static int b_permute(lua_State *L) {
  const fl_tensor *in[1];
  op_attrs a;
  int i, n, next;
  int64_t d[FL_MAX_DIMS];
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(OP_PERMUTE, &a);
  n = lfl_sizes(L, 2, d, &next, "permute");
  if (!lua_isnone(L, next)) return luaL_typeerror(L, next, "dim");
  for (i = 0; i < n; i++)
    a.dims[i] = lfl_dim(L, (lua_Integer)d[i], in[0]->m.ndim, "permute");
  a.ndims = n;
  return lfl_dispatch(L, OP_PERMUTE, in, 1, &a);
}

/* x:unsqueeze(d): the new dim's position in the result, so an n-d tensor
** takes 1..n+1 (or -(n+1)..-1; -1 appends). */
static int b_unsqueeze(lua_State *L) {
  const fl_tensor *in[1];
  op_attrs a;
  int n;
  lua_Integer d;
  in[0] = lfl_checktensor(L, 1);
  n = in[0]->m.ndim + 1;
  op_attrs_init(OP_UNSQUEEZE, &a);
  d = luaL_checkinteger(L, 2);
  if (d == 0)
    return luaL_error(L, "unsqueeze: dim 0 is invalid: dims count from 1 "
                      "(expected 1..%d or -%d..-1)", n, n);
  if (d > n || d < -n)
    return luaL_error(L, "unsqueeze: dim %I out of range for a %d-d tensor "
                      "(expected 1..%d or -%d..-1)", d, n - 1, n, n);
  a.i[0] = d > 0 ? d - 1 : n + d;
  return lfl_dispatch(L, OP_UNSQUEEZE, in, 1, &a);
}

/* x:squeeze() drops every size-1 dim, x:squeeze(d) only d. */
static int b_squeeze(lua_State *L) {
  const fl_tensor *in[1];
  op_attrs a;
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(OP_SQUEEZE, &a);
  if (!lua_isnoneornil(L, 2)) {
    a.i[0] = lfl_checkdim(L, 2, in[0]->m.ndim, "squeeze");
    a.i[1] = in[0]->m.ndim > 0;
  }
  return lfl_dispatch(L, OP_SQUEEZE, in, 1, &a);
}

/* x:narrow(dim, start, length): start is 1-based as in Torch7 (negative
** counts from the end); the core checks start + length against the size. */
static int b_narrow(lua_State *L) {
  const fl_tensor *in[1];
  op_attrs a;
  int asym[IR_NASYM];
  lua_Integer start, size, len;
  int d;
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(OP_NARROW, &a);
  d = lfl_checkdim(L, 2, in[0]->m.ndim, "narrow");
  size = in[0]->m.ndim ? in[0]->m.shape[d] : 1;
  memset(asym, 0, sizeof asym);
  if (lfl_issym(L, 3)) {                  /* a symbolic start is specialized */
    lua_pushinteger(L, (lua_Integer)lfl_symsize(L, 3, NULL, "narrow's start"));
    lua_replace(L, 3);
  }
  if (lfl_issym(L, 4)) {                  /* narrow(d, 1, T): the length stays symbolic */
    int x;
    lua_pushinteger(L, (lua_Integer)lfl_symsize(L, 4, &x, "narrow's length"));
    lua_replace(L, 4);
    asym[FL_MAX_DIMS + 2] = x + 1;
  }
  start = luaL_checkinteger(L, 3);
  /* counted from the end of a symbolic dim, the position depends on the
  ** size: specialize it (a guard), or another size would read the wrong
  ** slice */
  if (start < 0 && in[0]->m.ndim) {
    lfl_pushsize(L, in[0], d);
    if (lfl_issym(L, -1)) lfl_symsize(L, -1, NULL, "narrow from the end");
    lua_pop(L, 1);
  }
  if (start < 0 && start >= -size) start += size + 1;
  if (start < 1 || start > size + 1)
    return luaL_error(L, "narrow: start %I out of range for dim %d of size "
                      "%I (expected 1..%I or -%I..-1)", luaL_checkinteger(L, 3),
                      d + 1, size, size, size);
  len = luaL_checkinteger(L, 4);
  if (len < 0 || len > size - (start - 1))   /* said here: start 1-based */
    return luaL_error(L, "narrow: length %I from start %I runs past the end "
                      "of dim %d (size %I)", len, start, d + 1, size);
  a.i[0] = d;
  a.i[1] = start - 1;
  a.i[2] = len;
  return lfl_dispatch_sym(L, OP_NARROW, in, 1, &a, asym);
}

/* x:slice(dim, start, stop [, step]): elements start, start + step, ...
** up to stop inclusive, 1-based, negative counting from the end (-1 the
** last), out-of-range ends clamped (as Python's and ONNX's slices clamp);
** step >= 1 is a view, a negative step walks backward (a view sliced, then
** flipped: a copy). */
static int b_slice(lua_State *L) {
  const fl_tensor *in[1];
  op_attrs a;
  lua_Integer n, s, t, step, count;
  int d;
  in[0] = lfl_checktensor(L, 1);
  if (in[0]->m.ndim == 0) return luaL_error(L, "slice: cannot slice a 0-dim tensor");
  d = lfl_checkdim(L, 2, in[0]->m.ndim, "slice");
  n = in[0]->m.shape[d];
  s = luaL_checkinteger(L, 3);
  t = luaL_checkinteger(L, 4);
  step = luaL_optinteger(L, 5, 1);
  if (step == 0) return luaL_error(L, "slice: step must not be 0");
  if (step == LUA_MININTEGER) return luaL_error(L, "slice: step %I is too large", step);
  /* to 1-based positions; past either end they clamp */
  if (s < 0) s = s < -n ? 0 : s + n + 1;
  if (t < 0) t = t < -n ? 0 : t + n + 1;
  if (step > 0) {
    if (s < 1) s = 1;
    if (s > n + 1) s = n + 1;
    if (t > n) t = n;
    count = t >= s ? (t - s) / step + 1 : 0;
  } else {
    if (s > n) s = n;
    if (t < 1) t = 1;
    count = s >= t && s >= 1 ? (s - t) / -step + 1 : 0;
  }
  op_attrs_init(OP_SLICE, &a);
  a.i[0] = d;
  a.i[2] = count;
  a.i[3] = step > 0 ? step : -step;
  /* 0-based first element read in memory order */
  a.i[1] = count == 0 ? 0 : step > 0 ? s - 1 : (s - 1) + (count - 1) * step;
  lfl_dispatch(L, OP_SLICE, in, 1, &a);
  if (step > 0 || count <= 1) return 1;
  in[0] = lfl_checktensor(L, -1);
  op_attrs_init(OP_FLIP, &a);
  a.ndims = 1;
  a.dims[0] = d;
  return lfl_dispatch(L, OP_FLIP, in, 1, &a);
}

/* x:flip(dims): dims a number or a table of them (1-based, negative from
** the end). */
static int b_flip(lua_State *L) {
  const fl_tensor *in[1];
  op_attrs a;
  int k, n;
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(OP_FLIP, &a);
  if (lua_type(L, 2) == LUA_TTABLE) {
    n = (int)lua_rawlen(L, 2);
    if (n > FL_MAX_DIMS) return luaL_error(L, "flip: %d dims given, at most %d", n, FL_MAX_DIMS);
    for (k = 0; k < n; k++) {
      lua_rawgeti(L, 2, k + 1);
      a.dims[k] = lfl_checkdim(L, -1, in[0]->m.ndim, "flip");
      lua_pop(L, 1);
    }
    a.ndims = n;
  } else {
    a.dims[0] = lfl_checkdim(L, 2, in[0]->m.ndim, "flip");
    a.ndims = 1;
  }
  return lfl_dispatch(L, OP_FLIP, in, 1, &a);
}

/* fl.pad(x, pads [, {mode=, value=}]): pads in ONNX's order, {before_1,
** ..., before_n, after_1, ..., after_n} for dims 1..n, negative crops. */
static int b_pad(lua_State *L) {
  static const char *const keys[] = {"mode", "value", NULL};
  static const char *const modes[] = {"constant", "reflect", "edge", NULL};
  const fl_tensor *in[1];
  op_attrs a;
  int nd, k, o;
  in[0] = lfl_checktensor(L, 1);
  nd = in[0]->m.ndim;
  luaL_checktype(L, 2, LUA_TTABLE);
  if ((int)lua_rawlen(L, 2) != 2 * nd)
    return luaL_error(L, "pad: %d pads given for a %d-d tensor (expected %d: the befores of "
                      "dims 1..%d, then the afters)", (int)lua_rawlen(L, 2), nd, 2 * nd, nd);
  op_attrs_init(OP_PAD, &a);
  a.ndims = nd;
  for (k = 0; k < 2 * nd; k++) {
    int ok;
    lua_Integer v;
    lua_rawgeti(L, 2, k + 1);
    v = lua_tointegerx(L, -1, &ok);
    if (!ok) return luaL_error(L, "pad: pad #%d must be an integer, got %s", k + 1, lfl_typename(L, -1));
    lua_pop(L, 1);
    if (k < nd) a.dims[k] = v;
    else a.i[k - nd] = v;
  }
  lua_settop(L, 3);
  o = opts_index(L, 3, keys, "pad");
  if (o) {
    lua_getfield(L, o, "mode");
    if (!lua_isnil(L, -1)) {
      const char *m = lua_tostring(L, -1);
      for (k = 0; modes[k] && (!m || strcmp(m, modes[k]) != 0); k++) {}
      if (!modes[k] || lua_type(L, -1) != LUA_TSTRING)
        return luaL_error(L, "pad: unknown mode %s (expected \"constant\", \"reflect\" or \"edge\")",
                          lua_type(L, -1) == LUA_TSTRING ? m : lfl_typename(L, -1));
      a.i[8] = k;
    }
    lua_pop(L, 1);
    lua_getfield(L, o, "value");
    if (!lua_isnil(L, -1)) {
      int isint;
      lua_Integer iv = lua_tointegerx(L, -1, &isint);
      if (lua_type(L, -1) != LUA_TNUMBER)
        return luaL_error(L, "pad: value must be a number, got %s", lfl_typename(L, -1));
      if (in[0]->m.dtype == FL_I64 && !isint)
        return luaL_error(L, "pad: value %s is not an integer, for an int64 tensor",
                          lua_tostring(L, -1));
      a.f[0] = lua_tonumber(L, -1);
      a.i[9] = isint ? iv : (int64_t)0;
      if (a.i[8] != 0) return luaL_error(L, "pad: value is for mode \"constant\" only");
    }
    lua_pop(L, 1);
  }
  return lfl_dispatch(L, OP_PAD, in, 1, &a);
}

/* fl.gather(x, dim, idx): ONNX's Gather (not torch.gather): the slices of
** x along dim at the int64 indices idx (0-based, negative from the end). */
static int b_gather(lua_State *L) {
  const fl_tensor *in[2];
  op_attrs a;
  in[0] = lfl_checktensor(L, 1);
  if (in[0]->m.ndim == 0) return luaL_error(L, "gather: cannot gather from a 0-dim tensor");
  op_attrs_init(OP_GATHER, &a);
  a.i[0] = lfl_checkdim(L, 2, in[0]->m.ndim, "gather");
  in[1] = lfl_checktensor(L, 3);
  return lfl_dispatch(L, OP_GATHER, in, 2, &a);
}

/* fl.matmul_int8(a, b [, {a_type=, b_type=, a_zero=, b_zero=}]): the
** exact product of 8-bit values held in int64 tensors (ops.def); the types
** are "int8" (the default) or "uint8". */
static int b_matmul_int8(lua_State *L) {
  static const char *const keys[] = {"a_type", "b_type", "a_zero", "b_zero", NULL};
  static const char *const types[] = {"int8", "uint8"};
  const fl_tensor *in[4];
  op_attrs a;
  int o, k, nin;
  lua_settop(L, 3);
  in[0] = lfl_checktensor(L, 1);
  in[1] = lfl_checktensor(L, 2);
  op_attrs_init(OP_MATMUL_INT8, &a);
  o = opts_index(L, 3, keys, "matmul_int8");
  for (k = 0; o && k < 2; k++) {
    const char *ty;
    lua_getfield(L, o, keys[k]);
    ty = lua_isnil(L, -1) ? types[0] : lua_tostring(L, -1);
    if (!ty || (strcmp(ty, types[0]) && strcmp(ty, types[1])))
      return luaL_error(L, "matmul_int8: %s %s (int8 or uint8)", keys[k], ty ? ty : lfl_typename(L, -1));
    a.i[k] = strcmp(ty, types[1]) == 0;
    lua_pop(L, 1);
  }
  in[2] = tensor_field(L, o, "a_zero", "matmul_int8");
  in[3] = tensor_field(L, o, "b_zero", "matmul_int8");
  for (nin = 4; !in[nin - 1]; nin--) {}
  return lfl_dispatch(L, OP_MATMUL_INT8, in, nin, &a);
}

/* fl.cumsum(x, dim [, {exclusive=, reverse=}]): the running sum along dim
** (ONNX's CumSum attributes; PyTorch's torch.cumsum is the default). */
static int b_cumsum(lua_State *L) {
  static const char *const keys[] = {"exclusive", "reverse", NULL};
  const fl_tensor *in[1];
  op_attrs a;
  int o;
  in[0] = lfl_checktensor(L, 1);
  op_attrs_init(OP_CUMSUM, &a);
  a.i[0] = lfl_checkdim(L, 2, in[0]->m.ndim, "cumsum");
  lua_settop(L, 3);
  o = opts_index(L, 3, keys, "cumsum");
  a.i[1] = bool_field(L, o, "exclusive", 0, "cumsum");
  a.i[2] = bool_field(L, o, "reverse", 0, "cumsum");
  return lfl_dispatch(L, OP_CUMSUM, in, 1, &a);
}

/* Sizes must agree off the cat dim; checked here too so the message
** counts dims from 1 like every other Lua message. */
static void cat_check(lua_State *L, const fl_tensor *x, const fl_tensor *t,
                      int dim, lua_Integer k) {
  char s0[128], s1[128];
  int d;
  if (t->m.ndim != x->m.ndim) return;    /* the core says which */
  for (d = 0; d < x->m.ndim; d++)
    if (d != dim && t->m.shape[d] != x->m.shape[d])
      luaL_error(L, "cat: sizes must match except in dim %d: tensor 1 is %s, "
                 "tensor %I is %s", dim + 1, meta_shape_str(&x->m, s0, sizeof s0),
                 k, meta_shape_str(&t->m, s1, sizeof s1));
}

/* fl.cat({a, b, ...} [, dim]): dim defaults to 1.  Longer lists than one
** op row takes are joined in chunks. */
static int b_cat(lua_State *L) {
  enum { MAXIN = 64 };
  const fl_tensor *in[MAXIN], *first = NULL;
  op_attrs a;
  lua_Integer n, i;
  int k = 0;
  luaL_checktype(L, 1, LUA_TTABLE);
  n = (lua_Integer)lua_rawlen(L, 1);
  if (n == 0) return luaL_error(L, "cat: expected a non-empty list of tensors");
  op_attrs_init(OP_CAT, &a);
  lua_settop(L, 2);
  for (i = 1; i <= n; i++) {
    fl_tensor *t;
    lua_rawgeti(L, 1, i);
    if ((t = lfl_totensor(L, -1)) == NULL)
      return luaL_error(L, "cat: element %I is a %s, expected fl.Tensor", i,
                        lfl_typename(L, -1));
    lua_pop(L, 1);                   /* the list keeps it alive */
    if (i == 1) {
      first = t;
      a.i[0] = lua_isnil(L, 2) ? 0 : lfl_checkdim(L, 2, t->m.ndim, "cat");
    } else {
      cat_check(L, first, t, (int)a.i[0], i);
    }
    if (k == MAXIN) {                /* join what we have, carry it on */
      lfl_dispatch(L, OP_CAT, in, k, &a);
      in[0] = lfl_totensor(L, -1);
      k = 1;
    }
    in[k++] = t;
  }
  return lfl_dispatch(L, OP_CAT, in, k, &a);
}

/* ---------------------------------------------------------------------- */
/* registration: which binding each op row gets                           */
/* ---------------------------------------------------------------------- */

enum { METHOD = 1, FUNC = 2, BOTH = 3 };

/* Ops whose Lua form is not the generic one for their kind.  fn NULL:
** reached another way (x:to in lfl_tensor.c, gelu_tanh via gelu). */
static const struct binding {
  fl_op op;
  lua_CFunction fn;
  int where;
} special[] = {
  {OP_TO, NULL, 0},
  {OP_GELU, b_gelu, BOTH},
  {OP_GELU_TANH, NULL, 0},
  {OP_CLAMP, b_clamp, BOTH},
  {OP_WHERE, b_where, FUNC},
  {OP_SOFTMAX, b_softmax, BOTH},
  {OP_LOG_SOFTMAX, b_softmax, BOTH},
  {OP_LAYER_NORM, b_layer_norm, BOTH},
  {OP_RMS_NORM, b_rms_norm, BOTH},
  {OP_MATMUL, b_matmul, BOTH},
  {OP_LINEAR, b_linear, FUNC},
  {OP_CONV2D, b_conv2d, FUNC},
  {OP_MATMUL_INT8, b_matmul_int8, FUNC},
  {OP_RESHAPE, b_shape, BOTH},
  {OP_VIEW, b_shape, BOTH},
  {OP_EXPAND, b_shape, BOTH},
  {OP_TRANSPOSE, b_transpose, BOTH},
  {OP_PERMUTE, b_permute, BOTH},
  {OP_UNSQUEEZE, b_unsqueeze, BOTH},
  {OP_SQUEEZE, b_squeeze, BOTH},
  {OP_NARROW, b_narrow, BOTH},
  {OP_CONTIGUOUS, b_unary, BOTH},
  {OP_CAT, b_cat, FUNC},
  {OP_EMBEDDING, b_embedding, FUNC},
  {OP_SLICE, b_slice, BOTH},
  {OP_PAD, b_pad, BOTH},
  {OP_FLIP, b_flip, BOTH},
  {OP_GATHER, b_gather, FUNC},
  {OP_CUMSUM, b_cumsum, BOTH},
  {OP_RNN, b_rnn, FUNC},
  {OP_MAX_POOL2D, b_pool, BOTH},
  {OP_AVG_POOL2D, b_pool, BOTH},
  {OP_BATCH_NORM, b_batch_norm, FUNC},
  /* fl.rand, fl.randn, fl.dropout: lfl_lib.c (sizes, p, training) */
  {OP_RAND, NULL, 0},
  {OP_RANDN, NULL, 0},
  {OP_DROPOUT, NULL, 0},
};

/* Lua operators: numbers broadcast on either side through b_binary. */
static const struct { const char *event; fl_op op; } operators[] = {
  {"__add", OP_ADD}, {"__sub", OP_SUB}, {"__mul", OP_MUL},
  {"__div", OP_DIV}, {"__pow", OP_POW}, {"__mod", OP_REMAINDER}, {"__unm", OP_NEG},
};

static const struct binding *find_special(fl_op op) {
  size_t i;
  for (i = 0; i < sizeof special / sizeof special[0]; i++)
    if (special[i].op == op) return &special[i];
  return NULL;
}

/* The generic binding an op's kind and arity call for. */
static struct binding generic(fl_op op) {
  const op_info *oi = op_info_of(op);
  struct binding b = {op, NULL, BOTH};
  if (oi->kind == OPK_ELEMWISE && oi->min_args == 1 && oi->max_args == 1)
    b.fn = b_unary;
  else if (oi->kind == OPK_BROADCAST && oi->min_args == 2 && oi->max_args == 2)
    b.fn = b_binary;
  else if (oi->kind == OPK_REDUCTION && !(oi->flags & OPF_COMPOSITE))
    b.fn = b_reduce;
  return b;
}

static void push_binding(lua_State *L, lua_CFunction fn, fl_op op) {
  lua_pushinteger(L, op);
  lua_pushcclosure(L, fn, 1);
}

void lfl_open_ops(lua_State *L, int meta, int methods, int lib) {
  int op;
  size_t i;
  meta = lua_absindex(L, meta);
  methods = lua_absindex(L, methods);
  lib = lua_absindex(L, lib);
  for (op = 0; op < OP_COUNT; op++) {
    const struct binding *s = find_special((fl_op)op);
    struct binding b = s ? *s : generic((fl_op)op);
    if (!b.fn) continue;
    if (b.where & METHOD) {
      push_binding(L, b.fn, (fl_op)op);
      lua_setfield(L, methods, op_name((fl_op)op));
    }
    if (b.where & FUNC) {
      push_binding(L, b.fn, (fl_op)op);
      lua_setfield(L, lib, op_name((fl_op)op));
    }
  }
  for (i = 0; i < sizeof operators / sizeof operators[0]; i++) {
    push_binding(L, operators[i].op == OP_NEG ? b_unary : b_binary,
                 operators[i].op);
    lua_setfield(L, meta, operators[i].event);
  }
}
