/*
** lfl_sym.c -- symbolic sizes in Lua: fl.SymInt (Dynamo's SymInt).
**
** While a function is captured, the size of a dynamic dim that Lua reads
** (x.shape[2], x:size(1), x:numel()) is a SymInt: a userdata naming an
** expression of the first segment's graph (graph/sym.c).  Arithmetic on it
** builds new expressions, and ops that take sizes (reshape, view, expand,
** narrow, fl.zeros/ones/full, fl.arange) record the expression, so one
** graph serves every size.  What Lua can only do with a number makes it
** concrete, recorded with the file:line that did it:
**   - a comparison (T > 64, Tq == Tk) keeps it symbolic and adds a GUARD
**     on the answer Lua saw (s0 <= 64): any size that answers the same runs
**     the same compiled graph;
**   - concatenation, true division, a size given where a plain number is
**     needed (a loop bound is an error Lua raises: compile.lua then
**     re-traces with static sizes) SPECIALIZE: the variables behind it
**     become static dims of the guards.
** Lua calls no metamethod for tonumber, table indexing or string.format's
** %d; compile.lua's retry covers the errors those raise.
** Each expression has one userdata (a cache in the trace), so sizes that
** are the same expression are rawequal and compare without a guard.
*/
#include <stdio.h>
#include <string.h>

#include "lfl.h"

#define SYM_TYPE "fl.SymInt"

typedef struct lsym {
  unsigned trace;   /* the trace it belongs to */
  int x;            /* its expression in that trace's first graph */
} lsym;

static lsym *tosym(lua_State *L, int idx) {
  return (lsym *)luaL_testudata(L, idx, SYM_TYPE);
}

int lfl_issym(lua_State *L, int idx) { return tosym(L, idx) != NULL; }

/* The trace s belongs to, recording; else an error: a size kept past the
** end of its capture means nothing any more. */
static lfl_trace *owner(lua_State *L, const lsym *s) {
  lfl_trace *tr = lfl_trace_active(L);
  if (!tr || lfl_trace_id(tr) != s->trace)
    luaL_error(L, "a symbolic size (SymInt) was used after the capture that made it ended");
  return tr;
}

static void push_sym(lua_State *L, lfl_trace *tr, int x) {
  lfl_trace_push_symcache(L);
  if (lua_rawgeti(L, -1, x) == LUA_TUSERDATA) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 1);
  {
    lsym *s = (lsym *)lua_newuserdatauv(L, sizeof *s, 0);
    s->trace = lfl_trace_id(tr);
    s->x = x;
    luaL_setmetatable(L, SYM_TYPE);
  }
  lua_pushvalue(L, -1);
  lua_rawseti(L, -3, x);
  lua_remove(L, -2);
}

/* Push expression x: an integer when it is a constant. */
static void push_expr(lua_State *L, lfl_trace *tr, const ir_graph *g, int x) {
  int64_t v;
  if (ir_sym_is_const(g, x, &v)) lua_pushinteger(L, (lua_Integer)v);
  else push_sym(L, tr, x);
}

void lfl_pushsize(lua_State *L, const fl_tensor *t, int d) {
  const lfl_ud *u = lfl_ud_of(t);
  lfl_trace *tr;
  ir_graph *g;
  if (lfl_islazy(t) && (tr = lfl_trace_active(L)) && u->trace == lfl_trace_id(tr) &&
      u->seg == 0 && (g = lfl_trace_symgraph(tr)) && g->nodes[u->node].sym[d] > 0) {
    push_sym(L, tr, g->nodes[u->node].sym[d] - 1);
    return;
  }
  lua_pushinteger(L, (lua_Integer)t->m.shape[d]);
}

void lfl_pushnumel(lua_State *L, const fl_tensor *t) {
  const lfl_ud *u = lfl_ud_of(t);
  lfl_trace *tr;
  ir_graph *g;
  fl_err e;
  if (lfl_islazy(t) && (tr = lfl_trace_active(L)) && u->trace == lfl_trace_id(tr) &&
      u->seg == 0 && (g = lfl_trace_symgraph(tr))) {
    const ir_node *nd = &g->nodes[u->node];
    int d, p, any = 0;
    for (d = 0; d < nd->meta.ndim; d++) any |= nd->sym[d] != 0;
    if (any) {
      err_clear(&e);
      if ((p = ir_sym_numel(g, nd, &e)) < 0) lfl_raise(L, "numel", &e);
      push_expr(L, tr, g, p);
      return;
    }
  }
  lua_pushinteger(L, (lua_Integer)meta_numel(&t->m));
}

/* The value s has at the sizes being captured. */
static int64_t hint(lua_State *L, const lsym *s) {
  lfl_trace *tr = owner(L, s);
  return ir_sym_hint(lfl_trace_g0(tr), s->x);
}

static void specialize(lua_State *L, const lsym *s, const char *what) {
  lfl_trace *tr = owner(L, s);
  char where[256], why[400];
  lfl_trace_where(L, where, sizeof where);
  snprintf(why, sizeof why, "%s%s%s", what, where[0] ? " at " : "", where);
  lfl_trace_specialize(L, tr, s->x, why);
}

int64_t lfl_symsize(lua_State *L, int idx, int *x, const char *what) {
  lsym *s = tosym(L, idx);
  if (x) *x = -1;
  if (!s) return (int64_t)lua_tointeger(L, idx);
  if (x && lfl_trace_symgraph(owner(L, s))) *x = s->x;
  else specialize(L, s, what);
  return hint(L, s);
}

/* ---- metamethods ----------------------------------------------------- */

/* Operand idx of an arithmetic or comparison: a SymInt (*x), or an
** integer-valued number (*v, *x = -1).  0 for anything else (a float). */
static int operand(lua_State *L, int idx, int *x, int64_t *v) {
  lsym *s = tosym(L, idx);
  if (s) { owner(L, s); *x = s->x; *v = hint(L, s); return 1; }
  *x = -1;
  if (lua_isinteger(L, idx)) { *v = (int64_t)lua_tointeger(L, idx); return 1; }
  if (lua_type(L, idx) == LUA_TNUMBER) {
    lua_Number n = lua_tonumber(L, idx);
    if (n == (lua_Number)(int64_t)n && n > -9e18 && n < 9e18) { *v = (int64_t)n; return 1; }
  }
  return 0;
}

/* Both operands as plain numbers (SymInts specialized), then Lua's own
** arithmetic: true division, powers, and mixing with non-integers. */
static int numeric(lua_State *L, int op, const char *what) {
  int i;
  for (i = 1; i <= 2; i++) {
    lsym *s = tosym(L, i);
    if (s) {
      int64_t v = hint(L, s);
      specialize(L, s, what);
      lua_pushinteger(L, (lua_Integer)v);
      lua_replace(L, i);
    }
  }
  lua_settop(L, 2);
  lua_arith(L, op);
  return 1;
}

static int arith(lua_State *L, ir_symop op, int luaop, const char *what) {
  int xa, xb, r;
  int64_t va, vb;
  lfl_trace *tr;
  ir_graph *g;
  fl_err e;
  lsym *s = tosym(L, 1) ? tosym(L, 1) : tosym(L, 2);
  tr = owner(L, s);
  g = lfl_trace_symgraph(tr);
  if (!g || !operand(L, 1, &xa, &va) || !operand(L, 2, &xb, &vb) ||
      ((op == SYM_DIV || op == SYM_MOD) && vb == 0))
    return numeric(L, luaop, what);
  err_clear(&e);
  if (xa < 0 && (xa = ir_sym_const(g, va, &e)) < 0) return lfl_raise(L, what, &e);
  if (xb < 0 && (xb = ir_sym_const(g, vb, &e)) < 0) return lfl_raise(L, what, &e);
  if ((r = ir_sym_op(g, op, xa, xb, &e)) < 0) return lfl_raise(L, what, &e);
  if (!ir_sym_is_const(g, r, NULL) && (ir_sym_hint(g, r) == 0 || ir_sym_hint(g, r) == 1)) {
    /* T - 1 at T = 2 is 1, and a size 1 broadcasts: what the graph does
    ** with it holds only at these sizes, as for sizes 0 and 1 of inputs */
    lsym tmp;
    tmp.trace = s->trace;
    tmp.x = r;
    specialize(L, &tmp, "a size expression worth 0 or 1");
    lua_pushinteger(L, (lua_Integer)ir_sym_hint(g, r));
    return 1;
  }
  push_expr(L, tr, g, r);
  return 1;
}

static int s_add(lua_State *L) { return arith(L, SYM_ADD, LUA_OPADD, "+"); }
static int s_sub(lua_State *L) { return arith(L, SYM_SUB, LUA_OPSUB, "-"); }
static int s_mul(lua_State *L) { return arith(L, SYM_MUL, LUA_OPMUL, "*"); }
static int s_idiv(lua_State *L) { return arith(L, SYM_DIV, LUA_OPIDIV, "//"); }
static int s_mod(lua_State *L) { return arith(L, SYM_MOD, LUA_OPMOD, "%"); }
static int s_unm(lua_State *L) {
  lua_settop(L, 1);
  lua_pushinteger(L, 0);
  lua_insert(L, 1);
  return arith(L, SYM_SUB, LUA_OPSUB, "-");
}
static int s_div(lua_State *L) { return numeric(L, LUA_OPDIV, "a true division (/)"); }
static int s_pow(lua_State *L) { return numeric(L, LUA_OPPOW, "a power (^)"); }

/* a cmp b, answered at the sizes seen, kept as a guard. */
static int compare(lua_State *L, int cmp) {
  static const char *sign[] = {"<", "<=", "=="}, *neg[] = {">=", ">", "~="};
  int xa, xb, res;
  int64_t va, vb;
  lfl_trace *tr;
  ir_graph *g;
  fl_err e;
  lsym *s = tosym(L, 1) ? tosym(L, 1) : tosym(L, 2);
  char where[256], ta[96], tb[96], text[512];
  tr = owner(L, s);
  g = lfl_trace_symgraph(tr);
  if (!g || !operand(L, 1, &xa, &va) || !operand(L, 2, &xb, &vb)) {
    int i;
    for (i = 1; i <= 2; i++)
      if (tosym(L, i)) {
        lua_Integer v = (lua_Integer)hint(L, tosym(L, i));
        specialize(L, tosym(L, i), "a comparison");
        lua_pushinteger(L, v);
        lua_replace(L, i);
      }
    lua_pushboolean(L, lua_compare(L, 1, 2, cmp == LFL_SYM_LT ? LUA_OPLT : cmp == LFL_SYM_LE ? LUA_OPLE : LUA_OPEQ));
    return 1;
  }
  res = cmp == LFL_SYM_LT ? va < vb : cmp == LFL_SYM_LE ? va <= vb : va == vb;
  if (xa >= 0 && xa == xb) {               /* the same expression: no guard needed */
    lua_pushboolean(L, cmp != LFL_SYM_LT);
    return 1;
  }
  if (cmp == LFL_SYM_EQ && res && (xa < 0 || xb < 0)) {
    /* s2 == 32 holding: the size is 32, as PyTorch would specialize it */
    specialize(L, tosym(L, 1) ? tosym(L, 1) : tosym(L, 2), "an equality with a number");
    lua_pushboolean(L, 1);
    return 1;
  }
  err_clear(&e);
  if (xa < 0 && (xa = ir_sym_const(g, va, &e)) < 0) return lfl_raise(L, "comparison", &e);
  if (xb < 0 && (xb = ir_sym_const(g, vb, &e)) < 0) return lfl_raise(L, "comparison", &e);
  lfl_trace_where(L, where, sizeof where);
  {
    /* said with the symbol first: 64 < s0 false reads "s0 <= 64" */
    static const char *flip[] = {">", ">=", "==", "<=", "<", "~="};
    const char *op = res ? sign[cmp] : neg[cmp];
    int swap = ir_sym_is_const(g, xa, NULL);
    if (swap) op = flip[(res ? 0 : 3) + cmp];
    snprintf(text, sizeof text, "%s %s %s%s%s", ir_sym_str(g, swap ? xb : xa, ta, sizeof ta), op,
             ir_sym_str(g, swap ? xa : xb, tb, sizeof tb),
             where[0] ? " (a comparison at " : "", where[0] ? where : "");
  }
  if (where[0]) strncat(text, ")", sizeof text - strlen(text) - 1);
  lfl_trace_guard(L, tr, xa, cmp, xb, res, text);
  lua_pushboolean(L, res);
  return 1;
}

static int s_lt(lua_State *L) { return compare(L, LFL_SYM_LT); }
static int s_le(lua_State *L) { return compare(L, LFL_SYM_LE); }
static int s_eq(lua_State *L) { return compare(L, LFL_SYM_EQ); }

/* "s0", "s0*s1": how PyTorch prints a SymInt too; no specialization. */
static int s_tostring(lua_State *L) {
  lsym *s = (lsym *)luaL_checkudata(L, 1, SYM_TYPE);
  lfl_trace *tr = lfl_trace_active(L);
  char buf[128];
  if (!tr || lfl_trace_id(tr) != s->trace) lua_pushfstring(L, "SymInt(ended capture)");
  else lua_pushstring(L, ir_sym_str(lfl_trace_g0(tr), s->x, buf, sizeof buf));
  return 1;
}

/* Building a string from it (a name, a key) needs the number. */
static int s_concat(lua_State *L) {
  int i;
  for (i = 1; i <= 2; i++) {
    lsym *s = tosym(L, i);
    if (s) {
      lua_Integer v = (lua_Integer)hint(L, s);
      specialize(L, s, "string concatenation (..)");
      lua_pushinteger(L, v);
      lua_replace(L, i);
    }
  }
  lua_concat(L, 2);
  return 1;
}

/* Push iota:narrow(1, start, len) over a constant iota of dtype dt, long
** enough for expression xend (start + len) at twice its size now, with
** the guard xend <= that length (a longer one recompiles).  xstart and
** xlen are the start's and length's expressions, or -1 for the plain
** values start and len. */
static int iota_narrow(lua_State *L, lfl_trace *tr, ir_graph *g, fl_dtype dt, fl_device dev,
                       int64_t start,
                       int xstart, int64_t len, int xlen, int xend, const char *why) {
  int64_t cap = 4096, k, end = ir_sym_hint(g, xend);
  int asym[IR_NASYM], xc;
  fl_meta m;
  fl_tensor *iota;
  const fl_tensor *in[1];
  op_attrs a;
  fl_err e;
  char text[400], where[200], ts[64];
  while (cap < 2 * end) cap *= 2;
  /* one iota per dtype and length in a trace: every arange and mask of
  ** the capture reads the same param */
  lfl_trace_push_symcache(L);
  lua_pushfstring(L, "iota %d %d %I", (int)dt, (int)dev, (lua_Integer)cap);
  if (lua_rawget(L, -2) == LUA_TUSERDATA) {
    iota = lfl_totensor(L, -1);
  } else {
    lua_pop(L, 1);
    memset(&m, 0, sizeof m);
    m.dtype = dt;
    m.ndim = 1;
    m.shape[0] = cap;
    iota = lfl_pushempty(L, &m, why);
    for (k = 0; k < cap; k++) ten_set_i64(iota, k, k);
    lfl_place(L, dev);                 /* where the values it meets live */
    lfl_trace_mark_fresh(L, lfl_totensor(L, -1));   /* a constant: loop indices */
    lua_pushfstring(L, "iota %d %d %I", (int)dt, (int)dev, (lua_Integer)cap);
    lua_pushvalue(L, -2);
    lua_rawset(L, -4);
  }
  lua_remove(L, -2);                  /* the cache; the iota stays on top */
  err_clear(&e);
  if ((xc = ir_sym_const(g, cap, &e)) < 0) return lfl_raise(L, why, &e);
  lfl_trace_where(L, where, sizeof where);
  snprintf(text, sizeof text, "%s <= %lld (%s reads a %lld-long iota%s%s)",
           ir_sym_str(g, xend, ts, sizeof ts), (long long)cap, why, (long long)cap,
           where[0] ? " at " : "", where);
  lfl_trace_guard(L, tr, xend, LFL_SYM_LE, xc, 1, text);
  in[0] = iota;
  op_attrs_init(OP_NARROW, &a);
  a.i[0] = 0;
  a.i[1] = start;
  a.i[2] = len;
  memset(asym, 0, sizeof asym);
  asym[FL_MAX_DIMS + 1] = xstart + 1;
  asym[FL_MAX_DIMS + 2] = xlen + 1;
  return lfl_dispatch_sym(L, OP_NARROW, in, 1, &a, asym);
}

int lfl_sym_arange(lua_State *L, fl_dtype dt, fl_device dev) {
  lsym *s = tosym(L, 1);
  lfl_trace *tr = owner(L, s);
  ir_graph *g = lfl_trace_symgraph(tr);
  if (!g) {
    specialize(L, s, "fl.arange after a graph break");
    return -1;                         /* the caller goes on with n */
  }
  /* arange(s0) is the first s0 entries of a constant iota */
  return iota_narrow(L, tr, g, dt, dev, 0, -1, hint(L, s), s->x, s->x, "fl.arange of a symbolic size");
}

fl_tensor *lfl_sym_totensor(lua_State *L, int idx) {
  lsym *s = tosym(L, idx);
  lfl_trace *tr = owner(L, s);
  ir_graph *g = lfl_trace_symgraph(tr);
  int64_t v = hint(L, s);
  const fl_tensor *in[1];
  op_attrs a;
  fl_err e;
  int xend;
  if (g) {
    /* x * T: entry T of a constant iota, as a 0-d int64 tensor, so the
    ** graph reads the size at run time like any other value */
    err_clear(&e);
    if ((xend = ir_sym_const(g, 1, &e)) < 0 || (xend = ir_sym_op(g, SYM_ADD, s->x, xend, &e)) < 0)
      lfl_raise(L, "size", &e);
    iota_narrow(L, tr, g, FL_I64, FL_DEV_CPU, v, s->x, 1, -1, xend, "a symbolic size used as a tensor");
    in[0] = lfl_totensor(L, -1);
    op_attrs_init(OP_RESHAPE, &a);
    a.ndims = 0;
    lfl_dispatch(L, OP_RESHAPE, in, 1, &a);
    return lfl_totensor(L, -1);
  }
  specialize(L, s, "a size used as a tensor after a graph break");
  lua_pushinteger(L, (lua_Integer)v);
  lua_replace(L, idx);
  return lfl_pushscalar(L, idx);
}

/* fl.size_eq(a, b): a == b for sizes.  Lua compares a userdata with a
** number as different without asking it, so `x.shape[3] == 32` is false
** for a symbolic dim; this asks, and guards the answer. */
static int l_size_eq(lua_State *L) {
  lua_settop(L, 2);
  if (!tosym(L, 1) && !tosym(L, 2)) {
    lua_pushboolean(L, lua_compare(L, 1, 2, LUA_OPEQ));
    return 1;
  }
  return compare(L, LFL_SYM_EQ);
}

void lfl_open_sym(lua_State *L, int lib) {
  lua_pushcfunction(L, l_size_eq);
  lua_setfield(L, lib, "size_eq");
  static const luaL_Reg mm[] = {
    {"__add", s_add}, {"__sub", s_sub}, {"__mul", s_mul}, {"__idiv", s_idiv},
    {"__mod", s_mod}, {"__unm", s_unm}, {"__div", s_div}, {"__pow", s_pow},
    {"__lt", s_lt}, {"__le", s_le}, {"__eq", s_eq}, {"__tostring", s_tostring},
    {"__concat", s_concat}, {NULL, NULL}};
  luaL_newmetatable(L, SYM_TYPE);
  luaL_setfuncs(L, mm, 0);
  lua_pop(L, 1);
}
