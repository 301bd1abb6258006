/*
** lfl_compile.c -- the hot half of fl.compile: the callable and its cache
** entries.  A call checks each entry's guards in C and, on the first that
** holds, runs that entry's graph without running any Lua; only a miss goes
** to the Lua half (compile.lua), which traces, records the reason and
** builds a new entry.
**
** An entry's guards: each argument's kind (tensor or plain value); for a
** tensor its dtype, device, rank, and each size (equal, or >= 2 for a
** symbolic dim); plain values, globals and upvalues read during capture
** compared with the captured value; each parameter still being the same
** tensor at the place it was found.  Invariant: an entry whose guards hold
** computes what running the function's Lua body would.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lfl.h"
#include "cpu/eager.h"
#include "cpu/backend.h"
#include "graph/view.h"
#include "graph/ir.h"
#include "exec/cache_disk.h"
#include "exec/measure.h"
#include "graph/autograd.h"
#include "scripting/compile_lua.h"  /* static const unsigned char compile_lua[] */

#define ENTRY_TYPE "fl.Entry"
#define COMPILED_TYPE "fl.Compiled"
#define MAXARGS 64

typedef struct argspec {
  int is_tensor;                 /* else a plain value, compared in VALUES */
  fl_dtype dtype;
  fl_device device;
  int ndim;
  int64_t shape[FL_MAX_DIMS];
  unsigned dyn;                  /* bit d: dim d is symbolic (any size >= 2) */
  int number;                    /* a Lua number that is a graph input (a
                                    0-d tensor, as Dynamo's automatic
                                    dynamic makes a changed float one):
                                    1 a float, 2 an integer */
  char name[32];                 /* for reasons: "x" */
} argspec;

/* A guard on symbolic sizes: (expression a cmp expression b) == expect,
** both expressions of the entry's graph (a comparison Lua made). */
#define MAXSG 32
typedef struct symguard {
  int a, b, cmp, expect;
  char text[200];
} symguard;

/* A return slot: graph output k, the captured value #k, argument k, or
** a view of a tensor argument (node: the view in the graph, output k
** its computed copy, which gives the shape): eager code returns a view
** sharing the argument's storage, so the entry rebuilds one. */
typedef struct retspec { int kind, k, node; } retspec;
enum { RET_OUT, RET_CONST, RET_ARG, RET_ALIAS };

static int reshape_like(fl_op op) {
  return op == OP_RESHAPE || op == OP_VIEW || op == OP_SQUEEZE || op == OP_UNSQUEEZE;
}

/* The views from graph input to node (chain[0] is node), the input's
** index, and whether they are all reshapes; -1 when node is not such a
** view or one of its views has a symbolic attribute that is not a
** reshape's (its size would have to be recomputed). */
static int alias_chain(const ir_graph *g, int node, int *chain, int *n, int *all_reshape) {
  int j;
  *n = 0;
  *all_reshape = 1;
  while (g->nodes[node].kind == IR_OP) {
    const ir_node *nd = &g->nodes[node];
    if (!(op_info_of(nd->op)->flags & OPF_VIEW) || nd->nin < 1 || nd->in[0] < 0 || *n == 16) return -1;
    if (!reshape_like(nd->op)) {
      *all_reshape = 0;
      for (j = 0; j < IR_NASYM; j++)
        if (nd->asym[j]) return -1;
    }
    chain[(*n)++] = node;
    node = nd->in[0];
  }
  return g->nodes[node].kind == IR_INPUT ? g->nodes[node].index : -1;
}

/* Push the view of argument arg that chain (alias_chain's) makes: out
** (the computed copy) gives its shape; where eager code would copy (a
** reshape of a non-contiguous tensor) the copy is the result. */
static void push_alias(lua_State *L, const ir_graph *g, const int *chain, int n, int all,
                       const fl_tensor *arg, int outidx) {
  const fl_tensor *out = lfl_totensor(L, outidx);
  int k, ok = 1;
  fl_tensor cur, nxt;
  fl_err e;
  if (all) {
    ok = ten_is_contiguous(arg);
    if (ok) {
      cur = *arg;
      cur.m = out->m;                       /* the shape; where it lives is arg's */
      cur.m.device = arg->m.device;
      cur.m.wrapped = 0;
      ten_set_contiguous_strides(&cur);
      ten_share(lfl_newtensor(L), &cur);
    }
  } else {
    ten_share(&cur, arg);
    for (k = n - 1; k >= 0 && ok; k--) {
      const ir_node *nd = &g->nodes[chain[k]];
      const fl_meta *im = &cur.m;
      fl_meta m;
      err_clear(&e);
      memset(&nxt, 0, sizeof nxt);
      ok = op_infer(nd->op, &im, 1, &nd->attrs, &m, &e) == FL_OK &&
           view_apply(nd->op, &cur, &nd->attrs, &m, &nxt, &e) == FL_OK;
      ten_release(&cur);
      cur = nxt;
    }
    if (ok) lfl_pushmoved(L, &cur);
    else ten_release(&cur);
  }
  if (!ok) lua_pushvalue(L, outidx);
}

typedef struct entry {
  int nargs;
  argspec arg[MAXARGS];
  int ninputs;                   /* tensor args, in order: graph inputs */
  int input_arg[MAXARGS];        /* graph input i <- argument input_arg[i] */
  int nret;
  retspec ret[MAXARGS];
  ir_graph *g;                   /* borrowed from the Graph in UV_GRAPH */
  exec_program *pr;               /* borrowed from EUV_PROGRAM (either
                                    backend's), or NULL: interpret g with
                                    the eager kernels */
  int nsg;
  symguard sg[MAXSG];
  long hits;
  int train;                     /* returns a loss: in grad mode with
                                    grads wanted, compile.lua's forward and
                                    backward pair runs (state.train) */
} entry;

/* uservalues of an entry */
enum { EUV_GRAPH = 1,   /* the fl.Graph owning g */
       EUV_VALUES,      /* array of {kind="arg"|"global"|"upvalue", key=, value=, name=} */
       EUV_PARAMS,      /* array of {path={root, k1, ...}, key=<lightuserdata>, name=} */
       EUV_CONSTS,      /* array of captured return values */
       EUV_PROGRAM,     /* the fl.Program compiled from g, or nil */
       EUV_GUARDS,      /* {prog = {...}, names = {...}}: the guard program
                           on what the function reaches (run_guards) */
       EUV_COUNT = EUV_GUARDS };

/* uservalues of a compiled callable */
enum { CUV_FN = 1,      /* the function or module compiled */
       CUV_ENTRIES,     /* array of entries, most recent first */
       CUV_SLOW,        /* Lua function(state, reason, argi, dim, ...) */
       CUV_STATE,       /* the Lua state table (stats...) */
       CUV_PLAN,        /* the fl.Resume plan (lfl_resume.c): replays the
                           segments of a function whose Lua runs each call */
       CUV_COUNT = CUV_PLAN };

#define RECENT_CALLS 256           /* steady-state calls remembered */

typedef struct compiled {
  long calls, hits;
  int debug;                     /* FUSELAB_DEBUG at creation */
  /* wall ms of the calls that returned: the first (capture + compile, or
  ** a load from the disk cache), the second, and the latest later ones
  ** (a ring): what fl.report and cm:stats() show without running anything */
  double first_ms, second_ms;
  double recent[RECENT_CALLS];
  long timed;                    /* calls timed in all */
  double runs_ms[RECENT_CALLS];  /* FUSELAB_DEBUG >= 2: the latest cached runs alone */
  long nruns;
} compiled;

static entry *checkentry(lua_State *L, int idx) {
  return (entry *)luaL_checkudata(L, idx, ENTRY_TYPE);
}

/* ---- building an entry (from compile.lua) -------------------------------- */

static int get_int(lua_State *L, int t, const char *k) {
  int v;
  lua_getfield(L, t, k);
  v = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  return v;
}

/* fl._entry_new(graph, spec) where spec = {args = {{tensor=true, dtype=,
** shape={...}, dyn={d...}, name=} | {tensor=false, name=}...}, values =
** {...}, params = {...}, rets = {{kind="out"|"const"|"arg", k=}...},
** consts = {...}} */
static int e_new(lua_State *L) {
  ir_graph *g = lfl_checkgraph(L, 1);
  entry *en;
  int i, n, eidx;
  luaL_checktype(L, 2, LUA_TTABLE);
  en = (entry *)lua_newuserdatauv(L, sizeof *en, EUV_COUNT);
  memset(en, 0, sizeof *en);
  eidx = lua_gettop(L);
  luaL_setmetatable(L, ENTRY_TYPE);
  en->g = g;
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, eidx, EUV_GRAPH);
  lua_getfield(L, 2, "args");
  n = (int)luaL_len(L, -1);
  if (n > MAXARGS) return luaL_error(L, "compile: more than %d arguments", MAXARGS);
  en->nargs = n;
  for (i = 0; i < n; i++) {
    argspec *a = &en->arg[i];
    int t;
    lua_rawgeti(L, -1, i + 1);
    t = lua_gettop(L);
    lua_getfield(L, t, "name");
    snprintf(a->name, sizeof a->name, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "?");
    lua_pop(L, 1);
    lua_getfield(L, t, "tensor");
    a->is_tensor = lua_toboolean(L, -1);
    lua_pop(L, 1);
    a->number = get_int(L, t, "number");
    if (a->number) en->input_arg[en->ninputs++] = i;
    if (a->is_tensor) {
      int d;
      lua_getfield(L, t, "dtype");
      if (dtype_from_name(luaL_checkstring(L, -1), &a->dtype) != 0)
        return luaL_error(L, "compile: bad dtype in guard");
      lua_pop(L, 1);
      a->device = get_int(L, t, "device") ? FL_DEV_CUDA : FL_DEV_CPU;
      lua_getfield(L, t, "shape");
      a->ndim = (int)luaL_len(L, -1);
      for (d = 0; d < a->ndim && d < FL_MAX_DIMS; d++) {
        lua_rawgeti(L, -1, d + 1);
        a->shape[d] = lua_tointeger(L, -1);
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
      lua_getfield(L, t, "dyn");
      if (lua_istable(L, -1)) {
        lua_Integer k, m = luaL_len(L, -1);
        for (k = 1; k <= m; k++) {
          lua_rawgeti(L, -1, k);
          d = (int)lua_tointeger(L, -1) - 1;
          if (d >= 0 && d < FL_MAX_DIMS) a->dyn |= 1u << d;
          lua_pop(L, 1);
        }
      }
      lua_pop(L, 1);
      en->input_arg[en->ninputs++] = i;
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  if (en->ninputs != g->ninputs)
    return luaL_error(L, "compile: %d tensor (or number) arguments but the graph has %d inputs",
                      en->ninputs, g->ninputs);
  lua_getfield(L, 2, "rets");
  n = (int)luaL_len(L, -1);
  if (n > MAXARGS) return luaL_error(L, "compile: more than %d results", MAXARGS);
  en->nret = n;
  for (i = 0; i < n; i++) {
    const char *kind;
    lua_rawgeti(L, -1, i + 1);
    lua_getfield(L, -1, "kind");
    kind = luaL_checkstring(L, -1);
    en->ret[i].kind = strcmp(kind, "out") == 0 ? RET_OUT : strcmp(kind, "arg") == 0 ? RET_ARG :
                      strcmp(kind, "alias") == 0 ? RET_ALIAS : RET_CONST;
    lua_pop(L, 1);
    en->ret[i].k = get_int(L, lua_gettop(L), "k");
    en->ret[i].node = get_int(L, lua_gettop(L), "node");
    if ((en->ret[i].kind == RET_OUT || en->ret[i].kind == RET_ALIAS) &&
        (en->ret[i].k < 1 || en->ret[i].k > ir_nresults(g)))
      return luaL_error(L, "compile: result %d names no graph output", i + 1);
    if (en->ret[i].kind == RET_ALIAS) {
      int chain[16], nc, all;
      if (en->ret[i].node < 0 || en->ret[i].node >= g->n ||
          alias_chain(g, en->ret[i].node, chain, &nc, &all) < 0)
        return luaL_error(L, "compile: result %d is a view the compiled entry cannot rebuild", i + 1);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  lua_getfield(L, 2, "sym_guards");
  if (lua_istable(L, -1)) {
    lua_Integer k, m = luaL_len(L, -1);
    if (m > MAXSG) return luaL_error(L, "compile: more than %d guards on sizes", MAXSG);
    for (k = 1; k <= m; k++) {
      symguard *sg = &en->sg[en->nsg++];
      lua_rawgeti(L, -1, k);
      sg->a = get_int(L, lua_gettop(L), "a");
      sg->b = get_int(L, lua_gettop(L), "b");
      sg->cmp = get_int(L, lua_gettop(L), "cmp");
      lua_getfield(L, -1, "expect");
      sg->expect = lua_toboolean(L, -1);
      lua_getfield(L, -2, "text");
      snprintf(sg->text, sizeof sg->text, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "?");
      lua_pop(L, 3);
      if (sg->a < 0 || sg->b < 0 || sg->a >= g->nsx || sg->b >= g->nsx)
        return luaL_error(L, "compile: a guard names no size expression");
    }
  }
  lua_pop(L, 1);
  lua_getfield(L, 2, "values");
  lua_setiuservalue(L, eidx, EUV_VALUES);
  lua_getfield(L, 2, "params");
  lua_setiuservalue(L, eidx, EUV_PARAMS);
  lua_getfield(L, 2, "consts");
  lua_setiuservalue(L, eidx, EUV_CONSTS);
  lua_getfield(L, 2, "guards");
  lua_setiuservalue(L, eidx, EUV_GUARDS);
  en->train = lua_getfield(L, 2, "train") != LUA_TNIL && lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, 2, "program");
  en->pr = lfl_toanyprogram(L, -1);
  if (en->pr && en->pr->plan->g->ninputs != g->ninputs)
    return luaL_error(L, "compile: the program does not match the graph");
  lua_setiuservalue(L, eidx, EUV_PROGRAM);
  lua_settop(L, eidx);
  return 1;
}

/* ---- checking guards ------------------------------------------------------ */

/* Push the value at the end of the path at pidx: path[1] = {"upvalue", i}
** | {"global"} | {"self"}, then steps: a key (rawget in a table), {"up",
** i} (upvalue i of a function), {"meta"} (a table's metatable).  nil
** where the path no longer leads anywhere. */
static void push_path(lua_State *L, int fnidx, int pidx) {
  lua_Integer j, m = luaL_len(L, pidx);
  const char *root;
  lua_rawgeti(L, pidx, 1);
  lua_rawgeti(L, -1, 1);
  root = lua_tostring(L, -1);
  if (root && strcmp(root, "upvalue") == 0) {
    lua_rawgeti(L, -2, 2);
    if (!lua_getupvalue(L, fnidx, (int)lua_tointeger(L, -1))) lua_pushnil(L);
    lua_remove(L, -2);
  } else if (root && strcmp(root, "self") == 0) {
    lua_pushvalue(L, fnidx);
  } else {
    lua_pushglobaltable(L);
  }
  lua_remove(L, -2);
  lua_remove(L, -2);
  for (j = 2; j <= m && !lua_isnil(L, -1); j++) {
    if (lua_rawgeti(L, pidx, j) == LUA_TTABLE) {
      const char *kind;
      lua_rawgeti(L, -1, 1);
      kind = lua_tostring(L, -1);
      if (kind && strcmp(kind, "up") == 0 && lua_type(L, -3) == LUA_TFUNCTION) {
        lua_rawgeti(L, -2, 2);
        if (!lua_getupvalue(L, -4, (int)lua_tointeger(L, -1))) lua_pushnil(L);
        lua_remove(L, -2);
      } else if (kind && strcmp(kind, "meta") == 0) {
        if (!lua_getmetatable(L, -3)) lua_pushnil(L);
      } else if (kind && strcmp(kind, "inner") == 0 && luaL_testudata(L, -3, COMPILED_TYPE)) {
        lua_getiuservalue(L, -3, CUV_FN);       /* what a compiled callable runs */
      } else {
        lua_pushnil(L);
      }
      lua_remove(L, -2);
      lua_remove(L, -2);
    } else if (lua_istable(L, -2)) {
      lua_rawget(L, -2);
    } else {
      lua_pop(L, 1);
      lua_pushnil(L);
    }
    lua_remove(L, -2);
  }
}

/* The guards on what the function reaches (compile.lua's reach: fields
** of the module and of tables, upvalues of the functions it reaches), as
** a small program over one flat array, so a call walks each table once
** and reads with rawgeti: ROOT_* push where a path starts, DOWN* push a
** field, an upvalue, a metatable or a compiled callee's function of the
** value on top, CHECK* compare one of its fields or upvalues with the
** value captured, POP goes back up.  compile.lua's guard_program writes
** it; the codes are the same there. */
enum { G_ROOT_SELF = 1, G_ROOT_UP, G_ROOT_GLOBAL, G_DOWN, G_DOWN_UP, G_DOWN_META,
       G_DOWN_INNER, G_CHECK, G_CHECK_UP, G_POP };

static lua_Integer next_int(lua_State *L, int pidx, lua_Integer *pc) {
  lua_Integer v;
  lua_rawgeti(L, pidx, (*pc)++);
  v = lua_tointeger(L, -1);
  lua_pop(L, 1);
  return v;
}

/* 1 when every guard of the program at gidx holds; else 0 and the reason
** names the first value that changed ("self.dim: expected 2, got 1"). */
static int run_guards(lua_State *L, int fnidx, int gidx, char *reason, size_t rn) {
  lua_Integer pc = 1, n, checks = 0;
  int top = lua_gettop(L), pidx, ok = 1;
  lua_getfield(L, gidx, "prog");
  pidx = lua_gettop(L);
  n = (lua_Integer)lua_rawlen(L, pidx);
  luaL_checkstack(L, 40, "compile: guards nested too deep");
  while (ok && pc <= n) {
    int op = (int)next_int(L, pidx, &pc);
    switch (op) {
    case G_ROOT_SELF: lua_pushvalue(L, fnidx); break;
    case G_ROOT_UP:
      if (!lua_getupvalue(L, fnidx, (int)next_int(L, pidx, &pc))) lua_pushnil(L);
      break;
    case G_ROOT_GLOBAL: lua_pushglobaltable(L); break;
    case G_DOWN:
      lua_rawgeti(L, pidx, pc++);
      if (lua_istable(L, -2)) lua_rawget(L, -2);
      else { lua_pop(L, 1); lua_pushnil(L); }
      break;
    case G_DOWN_UP: {
      int i = (int)next_int(L, pidx, &pc);
      if (lua_type(L, -1) != LUA_TFUNCTION || !lua_getupvalue(L, -1, i)) lua_pushnil(L);
      break;
    }
    case G_DOWN_META:
      if (!lua_getmetatable(L, -1)) lua_pushnil(L);
      break;
    case G_DOWN_INNER:
      if (luaL_testudata(L, -1, COMPILED_TYPE)) lua_getiuservalue(L, -1, CUV_FN);
      else lua_pushnil(L);
      break;
    case G_CHECK: case G_CHECK_UP: {
      if (op == G_CHECK_UP) {
        int i = (int)next_int(L, pidx, &pc);
        if (lua_type(L, -1) != LUA_TFUNCTION || !lua_getupvalue(L, -1, i)) lua_pushnil(L);
      } else {
        lua_rawgeti(L, pidx, pc++);
        if (lua_istable(L, -2)) lua_rawget(L, -2);
        else { lua_pop(L, 1); lua_pushnil(L); }
      }
      lua_rawgeti(L, pidx, pc++);                /* stack: ..., now, want */
      checks++;
      if (!lua_rawequal(L, -1, -2) || lua_type(L, -1) != lua_type(L, -2)) {
        const char *want, *got;
        lua_getfield(L, gidx, "names");
        lua_rawgeti(L, -1, checks);
        want = luaL_tolstring(L, -3, NULL);
        got = luaL_tolstring(L, -5, NULL);
        snprintf(reason, rn, "%s: expected %s, got %s", lua_tostring(L, -3), want, got);
        ok = 0;
      } else {
        lua_pop(L, 2);
      }
      break;
    }
    case G_POP: lua_pop(L, 1); break;
    default:
      snprintf(reason, rn, "compile: a guard program with an unknown step");
      ok = 0;
    }
  }
  lua_settop(L, top);
  return ok;
}

/* Writes why arguments at base.. (nargs of them) fail e's guards into
** reason and returns 0; returns 1 when every guard holds.  *argi and *dim
** name a failed tensor size (for automatic dynamic shapes); *argi is -k
** when number argument k changed value; else both are 0. */
static int check(lua_State *L, int eidx, const entry *en, int fnidx, int base,
                 int nargs, char *reason, size_t rn, int *argi, int *dim) {
  int i, d;
  *argi = *dim = 0;
  if (nargs != en->nargs) {
    snprintf(reason, rn, "called with %d argument(s), captured with %d", nargs, en->nargs);
    return 0;
  }
  for (i = 0; i < en->nargs; i++) {
    const argspec *a = &en->arg[i];
    const fl_tensor *t;
    if (a->number) {
      /* any value of its kind: the graph reads it as an input */
      if (lua_type(L, base + i) != LUA_TNUMBER || (a->number == 2) != lua_isinteger(L, base + i)) {
        snprintf(reason, rn, "%s: expected %s, got %s", a->name,
                 a->number == 2 ? "an integer" : "a float",
                 lua_type(L, base + i) != LUA_TNUMBER ? lfl_typename(L, base + i) :
                 lua_isinteger(L, base + i) ? "an integer" : "a float");
        return 0;
      }
      continue;
    }
    if (!a->is_tensor) continue;
    t = lfl_totensor(L, base + i);
    if (t && lfl_islazy(t)) lfl_trace_resolve(L, (fl_tensor *)t);
    if (!t || lfl_islazy(t)) {
      snprintf(reason, rn, "%s: expected a tensor, got %s", a->name, lfl_typename(L, base + i));
      return 0;
    }
    if (t->m.dtype != a->dtype) {
      snprintf(reason, rn, "%s.dtype: expected %s, got %s", a->name,
               dtype_name(a->dtype), dtype_name(t->m.dtype));
      return 0;
    }
    if (t->m.device != a->device) {
      snprintf(reason, rn, "%s.device: expected %s, got %s", a->name,
               a->device == FL_DEV_CPU ? "cpu" : "cuda", t->m.device == FL_DEV_CPU ? "cpu" : "cuda");
      return 0;
    }
    if (t->m.ndim != a->ndim) {
      snprintf(reason, rn, "%s.dim(): expected %d, got %d", a->name, a->ndim, t->m.ndim);
      return 0;
    }
    for (d = 0; d < a->ndim; d++) {
      int64_t s = t->m.shape[d];
      if ((a->dyn >> d) & 1u) {
        if (s >= 2) continue;
        /* 0 and 1 are always specialized: they change broadcasting */
        snprintf(reason, rn, "%s.shape[%d]: expected a size >= 2 (dynamic), got %lld",
                 a->name, d + 1, (long long)s);
      } else {
        if (s == a->shape[d]) continue;
        snprintf(reason, rn, "%s.shape[%d]: expected %lld, got %lld", a->name, d + 1,
                 (long long)a->shape[d], (long long)s);
      }
      *argi = i + 1;
      *dim = d + 1;
      return 0;
    }
  }
  /* comparisons Lua made on symbolic sizes still answer the same */
  if (en->nsg) {
    const fl_meta *im[MAXARGS];
    int64_t vars[IR_MAX_SYMX], vals[IR_MAX_SYMX];
    fl_err e;
    int k;
    static const fl_meta scalar_meta;             /* a number input: 0-d */
    for (i = 0; i < en->ninputs; i++)
      im[i] = en->arg[en->input_arg[i]].number ? &scalar_meta
                                               : &lfl_totensor(L, base + en->input_arg[i])->m;
    ir_sym_vars(en->g, im, vars);
    err_clear(&e);
    if (ir_sym_eval(en->g, vars, vals, &e) != FL_OK) {
      snprintf(reason, rn, "%.500s", e.msg);
      return 0;
    }
    for (k = 0; k < en->nsg; k++) {
      const symguard *sg = &en->sg[k];
      int64_t a = vals[sg->a], b = vals[sg->b];
      int r = sg->cmp == LFL_SYM_LT ? a < b : sg->cmp == LFL_SYM_LE ? a <= b : a == b;
      if (r != sg->expect) {
        snprintf(reason, rn, "guard %s no longer holds (%lld vs %lld)", sg->text,
                 (long long)a, (long long)b);
        return 0;
      }
    }
  }
  /* plain values: arguments, globals, upvalues */
  lua_getiuservalue(L, eidx, EUV_VALUES);
  if (lua_istable(L, -1)) {
    lua_Integer k, n = luaL_len(L, -1);
    for (k = 1; k <= n; k++) {
      const char *kind, *name;
      int same;
      lua_rawgeti(L, -1, k);
      lua_getfield(L, -1, "kind");
      kind = lua_tostring(L, -1);
      lua_getfield(L, -2, "name");
      name = lua_tostring(L, -1);
      lua_getfield(L, -3, "value");
      lua_getfield(L, -4, "key");
      if (kind && strcmp(kind, "arg") == 0) {
        lua_pushvalue(L, base + (int)lua_tointeger(L, -1) - 1);
      } else if (kind && strcmp(kind, "upvalue") == 0) {
        if (!lua_getupvalue(L, fnidx, (int)lua_tointeger(L, -1))) lua_pushnil(L);
      } else {
        lua_pushglobaltable(L);
        lua_pushvalue(L, -2);
        lua_rawget(L, -2);
        lua_remove(L, -2);
      }
      same = lua_rawequal(L, -1, -3) && lua_type(L, -1) == lua_type(L, -3);
      if (!same && kind && strcmp(kind, "arg") == 0 && lua_type(L, -1) == LUA_TNUMBER &&
          lua_type(L, -3) == LUA_TNUMBER)
        *argi = -(int)lua_tointeger(L, -2);    /* a number argument changed value */
      if (!same) {
        const char *want = luaL_tolstring(L, -3, NULL);
        const char *got = luaL_tolstring(L, -2, NULL);
        snprintf(reason, rn, "%s '%s': expected %s, got %s",
                 kind && strcmp(kind, "arg") == 0 ? "argument" : kind ? kind : "value",
                 name ? name : "?", want, got);
        lua_pop(L, 8);
        return 0;
      }
      lua_pop(L, 6);
    }
  }
  lua_pop(L, 1);
  /* parameters: still the same tensor where they were found */
  lua_getiuservalue(L, eidx, EUV_PARAMS);
  if (lua_istable(L, -1)) {
    lua_Integer k, n = luaL_len(L, -1);
    for (k = 1; k <= n; k++) {
      const void *want;
      const fl_tensor *t;
      lua_rawgeti(L, -1, k);
      lua_getfield(L, -1, "key");
      want = lua_touserdata(L, -1);
      lua_pop(L, 1);
      lua_getfield(L, -1, "path");
      push_path(L, fnidx, lua_gettop(L));     /* stack: ..., path, value */
      t = lfl_totensor(L, -1);
      if (t != want) {
        lua_getfield(L, -3, "name");
        snprintf(reason, rn, "parameter %s: a different tensor now", lua_tostring(L, -1));
        lua_pop(L, 5);
        return 0;
      }
      lua_pop(L, 3);
    }
  }
  lua_pop(L, 1);
  /* what the function reaches: module fields, tables, upvalues */
  if (lua_getiuservalue(L, eidx, EUV_GUARDS) == LUA_TTABLE) {
    int ok = run_guards(L, fnidx, lua_gettop(L), reason, rn);
    lua_pop(L, 1);
    return ok;
  }
  lua_pop(L, 1);
  return 1;
}

/* Push e's results for the arguments at base, running its graph. */
static int run_entry(lua_State *L, int eidx, entry *en, int base) {
  const fl_tensor *in[MAXARGS];
  fl_tensor *outs;
  fl_err e;
  int i;
  luaL_checkstack(L, en->nret + en->g->nout + en->ninputs + 8, "compiled: too many results");
  for (i = 0; i < en->ninputs; i++)
    in[i] = en->arg[en->input_arg[i]].number ? lfl_pushscalar(L, base + en->input_arg[i])
                                             : lfl_totensor(L, base + en->input_arg[i]);
  outs = lua_newuserdatauv(L, (size_t)(en->g->nout + 1) * sizeof *outs, 0);
  memset(outs, 0, (size_t)(en->g->nout + 1) * sizeof *outs);
  err_clear(&e);
  if ((en->pr ? exec_program_run(en->pr, in, en->ninputs, outs, &e)
              : lfl_graph_run_eager(en->g, in, en->ninputs, outs, &e)) != FL_OK) {
    for (i = 0; i < en->g->nout; i++) ten_release(&outs[i]);
    return lfl_raise(L, "compiled", &e);
  }
  for (i = 0; i < en->g->nout; i++) {        /* owners, in output order */
    lfl_pushmoved(L, &outs[i]);
  }
  {
    int outbase = lua_gettop(L) - en->g->nout, consts;
    lua_getiuservalue(L, eidx, EUV_CONSTS);
    consts = lua_gettop(L);
    for (i = 0; i < en->nret; i++) {
      const retspec *r = &en->ret[i];
      if (r->kind == RET_OUT) lua_pushvalue(L, outbase + r->k);
      else if (r->kind == RET_ARG) lua_pushvalue(L, base + r->k - 1);
      else if (r->kind == RET_ALIAS) {
        int chain[16], nc, all, gi = alias_chain(en->g, r->node, chain, &nc, &all);
        push_alias(L, en->g, chain, nc, all, lfl_totensor(L, base + en->input_arg[gi]), outbase + r->k);
      }
      else lua_rawgeti(L, consts, r->k);
    }
  }
  en->hits++;
  return en->nret;
}

/* ---- the callable ---------------------------------------------------------- */

/* In grad mode, does a call with these arguments train: a tensor argument
** or one of the entry's parameters requires grad?  Called after check():
** each parameter is the very tensor its key names, so the key is read,
** not the path walked again. */
static int grad_wanted(lua_State *L, int eidx, int base, int nargs) {
  int k, want = 0;
  if (!ag_grad_enabled()) return 0;
  for (k = 0; k < nargs && !want; k++) {
    const fl_tensor *t = lfl_totensor(L, base + k);
    want = t && lfl_requires_grad(t);
  }
  if (want) return 1;
  if (lua_getiuservalue(L, eidx, EUV_PARAMS) == LUA_TTABLE) {
    lua_Integer i, n = luaL_len(L, -1);
    for (i = 1; i <= n && !want; i++) {
      const fl_tensor *t;
      lua_rawgeti(L, -1, i);
      lua_getfield(L, -1, "key");
      t = (const fl_tensor *)lua_touserdata(L, -1);
      want = t && lfl_requires_grad(t);
      lua_pop(L, 2);
    }
  }
  lua_pop(L, 1);
  return want;
}

/* cm(...): first entry whose guards hold runs; else, for a function whose
** Lua runs each call (graph breaks), its recorded segments replay; else
** the Lua slow path slow(state, reason, argi, dim, ...) decides (trace,
** recompile, fall back). */
static int call_inner(lua_State *L, compiled *c) {
  int nargs = lua_gettop(L) - 1, fnidx, entries, k, n, argi = 0, dim = 0;
  char reason[512] = "";
  /* the paths below push the arguments again after a few values of
  ** their own: room for them (a C function is promised 20 slots) */
  luaL_checkstack(L, nargs + 16, "compiled: too many arguments");
  c->calls++;
  lua_getiuservalue(L, 1, CUV_FN);
  fnidx = lua_gettop(L);
  lua_getiuservalue(L, 1, CUV_ENTRIES);
  entries = lua_gettop(L);
  n = (int)luaL_len(L, entries);
  for (k = 1; k <= n; k++) {
    int eidx, ai, dm;
    char why[512];
    lua_rawgeti(L, entries, k);
    eidx = lua_gettop(L);
    if (check(L, eidx, checkentry(L, eidx), fnidx, 2, nargs, why, sizeof why, &ai, &dm)) {
      entry *en = checkentry(L, eidx);
      int nr;
      double t0 = 0;
      c->hits++;
      if (en->train && grad_wanted(L, eidx, 2, nargs)) {
        /* training: compile.lua's forward and backward pair for this
        ** entry (its guards held: the function is the one it traced) */
        int top = lua_gettop(L);
        lua_getiuservalue(L, 1, CUV_STATE);
        lua_getfield(L, -1, "train");
        lua_insert(L, -2);
        lua_pushvalue(L, eidx);
        for (k = 0; k < nargs; k++) lua_pushvalue(L, 2 + k);
        lua_call(L, 2 + nargs, LUA_MULTRET);
        return lua_gettop(L) - top;
      }
      if (c->debug >= 1)
        fprintf(stderr, "fuselab: cache hit: cached graph %d of %d (%d ops)\n", k, n,
                ir_op_count(en->g));
      if (c->debug >= 2) t0 = meas_now();
      nr = run_entry(L, eidx, en, 2);
      if (c->debug >= 2 && en->pr) {
        double dt = meas_now() - t0, t[RECENT_CALLS];
        long m = c->nruns < RECENT_CALLS ? c->nruns : RECENT_CALLS;
        char med[200] = "", fmt[160];
        if (m >= 3) {
          meas_summary sum;
          memcpy(t, c->runs_ms, (size_t)m * sizeof *t);
          meas_summarize(t, (int)m, NULL, &sum);
          snprintf(med, sizeof med, "; earlier runs: median %s", meas_format(&sum, "ms", fmt, sizeof fmt));
        }
        c->runs_ms[c->nruns++ % RECENT_CALLS] = dt * 1e3;
        fprintf(stderr, "fuselab: ran %d kernel(s) in %.3f ms (this run), %.2f GB/s%s\n",
                en->pr->plan->stats.kernels, dt * 1e3,
                (double)en->pr->plan->stats.bytes_after / dt / 1e9, med);
        exec_program_print_profile(en->pr, stderr, "fuselab:   ");
      }
      return nr;
    }
    if (k == 1) {                            /* the newest entry's reason */
      memcpy(reason, why, sizeof reason);
      argi = ai;
      dim = dm;
    }
    lua_settop(L, entries);
  }
  /* a loss with graph breaks trains eagerly in grad mode (compile.lua's
  ** slow path decides): no replay, which would give results without a
  ** history */
  lua_getiuservalue(L, 1, CUV_STATE);
  k = ag_grad_enabled() && lua_getfield(L, -1, "train_breaks") != LUA_TNIL && lua_toboolean(L, -1);
  lua_settop(L, entries);
  lua_getiuservalue(L, 1, CUV_PLAN);
  if (!k && lfl_resume_enabled(L, -1)) {
    char why[512];
    int ai, dm, nr = lfl_resume_call(L, lua_gettop(L), fnidx, 2, nargs, why, sizeof why, &ai, &dm);
    if (nr >= 0) return nr;
    memcpy(reason, why, sizeof reason);
    argi = ai;
    dim = dm;
    n = 1;                                   /* a reason to report */
  }
  lua_settop(L, nargs + 1);
  lua_getiuservalue(L, 1, CUV_SLOW);
  lua_getiuservalue(L, 1, CUV_STATE);
  if (n > 0) lua_pushstring(L, reason); else lua_pushnil(L);
  lua_pushinteger(L, argi);
  lua_pushinteger(L, dim);
  for (k = 0; k < nargs; k++) lua_pushvalue(L, 2 + k);
  lua_call(L, 4 + nargs, LUA_MULTRET);
  return lua_gettop(L) - (nargs + 1);
}

/* cm(...): call_inner, timed (the times the report and stats show). */
static int c_call(lua_State *L) {
  compiled *c = (compiled *)luaL_checkudata(L, 1, COMPILED_TYPE);
  double t0 = meas_now(), dt;
  int n;
  if (lfl_trace_active(L)) {
    /* called while another function is captured: its body is traced
    ** into that graph (Dynamo inlines a compiled callee); not a call of
    ** its own, so nothing is counted here */
    lua_getiuservalue(L, 1, CUV_FN);
    lua_replace(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
  }
  n = call_inner(L, c);
  dt = (meas_now() - t0) * 1e3;
  if (c->timed == 0) c->first_ms = dt;
  else if (c->timed == 1) c->second_ms = dt;
  else c->recent[(c->timed - 2) % RECENT_CALLS] = dt;
  c->timed++;
  return n;
}

/* cm.timings -> {first_ms=, second_ms=, steady={ms, ...}} of the calls so
** far (steady: the latest after the second, oldest first) */
static void push_timings(lua_State *L, const compiled *c) {
  long m = c->timed - 2 < RECENT_CALLS ? c->timed - 2 : RECENT_CALLS, i, at;
  lua_createtable(L, 0, 3);
  if (c->timed >= 1) { lua_pushnumber(L, c->first_ms); lua_setfield(L, -2, "first_ms"); }
  if (c->timed >= 2) { lua_pushnumber(L, c->second_ms); lua_setfield(L, -2, "second_ms"); }
  lua_createtable(L, m > 0 ? (int)m : 0, 0);
  at = c->timed - 2 > RECENT_CALLS ? (c->timed - 2) % RECENT_CALLS : 0;
  for (i = 0; i < m; i++) {
    lua_pushnumber(L, c->recent[(at + i) % RECENT_CALLS]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "steady");
}

/* fl._compiled_new(fn, entries, slow, state, plan) -> callable */
static int c_new(lua_State *L) {
  compiled *c;
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  luaL_checktype(L, 4, LUA_TTABLE);
  c = (compiled *)lua_newuserdatauv(L, sizeof *c, CUV_COUNT);
  memset(c, 0, sizeof *c);
  if (getenv("FUSELAB_DEBUG")) c->debug = atoi(getenv("FUSELAB_DEBUG"));
  luaL_setmetatable(L, COMPILED_TYPE);
  /* the methods (compile.lua's table, the same for every compiled
  ** function) join the metatable for completion, as a tensor's do */
  luaL_getmetatable(L, COMPILED_TYPE);
  if (lua_getfield(L, -1, "methods") == LUA_TNIL && lua_istable(L, 4)) {
    lua_getfield(L, 4, "methods");
    lua_setfield(L, -3, "methods");
  }
  lua_pop(L, 2);
  lua_pushvalue(L, 1); lua_setiuservalue(L, -2, CUV_FN);
  lua_pushvalue(L, 2); lua_setiuservalue(L, -2, CUV_ENTRIES);
  lua_pushvalue(L, 3); lua_setiuservalue(L, -2, CUV_SLOW);
  lua_pushvalue(L, 4); lua_setiuservalue(L, -2, CUV_STATE);
  lua_pushvalue(L, 5); lua_setiuservalue(L, -2, CUV_PLAN);
  return 1;
}

/* cm:state() -> the Lua state table; cm:counts() -> calls, hits */
static int c_index(lua_State *L) {
  compiled *c = (compiled *)luaL_checkudata(L, 1, COMPILED_TYPE);
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "calls") == 0) { lua_pushinteger(L, c->calls); return 1; }
  if (strcmp(k, "hits") == 0) { lua_pushinteger(L, c->hits); return 1; }
  if (strcmp(k, "timings") == 0) { push_timings(L, c); return 1; }
  lua_getiuservalue(L, 1, CUV_STATE);
  if (strcmp(k, "state") == 0) return 1;
  lua_getfield(L, -1, "methods");            /* state.methods[k] */
  if (!lua_istable(L, -1)) return 0;
  lua_getfield(L, -1, k);
  return 1;
}

/* print(cm): the Lua half renders it from cm:stats(), so the two agree
** (the hits of replayed segments are counted there, not in c->hits). */
static int c_tostring(lua_State *L) {
  luaL_checkudata(L, 1, COMPILED_TYPE);
  lua_getiuservalue(L, 1, CUV_STATE);
  lua_getfield(L, -1, "methods");
  if (lua_istable(L, -1) && lua_getfield(L, -1, "_tostring") == LUA_TFUNCTION) {
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    return 1;
  }
  lua_pushliteral(L, "fl.compile");
  return 1;
}

/* fl._compiled_inner(v) -> the function or module a compiled callable
** runs, or nil for anything else */
static int l_compiled_inner(lua_State *L) {
  if (luaL_testudata(L, 1, COMPILED_TYPE)) lua_getiuservalue(L, 1, CUV_FN);
  else lua_pushnil(L);
  return 1;
}

/* fl._tensor_key(x) -> a light userdata naming x (identity for params) */
static int l_tensor_key(lua_State *L) {
  fl_tensor *t = lfl_totensor(L, 1);
  if (!t) lua_pushnil(L); else lua_pushlightuserdata(L, t);
  return 1;
}

/* fl._graph_key(g) -> fingerprint string (the segment cache key) */
static int l_graph_key(lua_State *L) {
  char hex[33];
  ir_fingerprint(lfl_checkgraph(L, 1), hex);
  lua_pushstring(L, hex);
  return 1;
}

/* fl._debug_dir(dir) -> the folder this process writes its compiled
** graphs' debug files to (FUSELAB_COMPILE_DEBUG=dir), or nil and why.
** dir is made mode 0700 when missing and must then pass the compile
** cache's trust check (owned by the user, writable by nobody else, in a
** parent nobody else can swap it out of): debug files hold the model's
** code and names, and a folder another user can write could be a trap.
** Inside it a new folder run_<time>_pid<pid>, made exclusively (mkdir
** fails on anything already there, a symlink too). */
static int l_debug_dir(lua_State *L) {
  const char *dir = luaL_checkstring(L, 1);
  char why[512], run[4096], stamp[32];
  time_t now = time(NULL);
  struct tm tm;
  int i;
  if (cdisk_mkdirs(dir) != 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "cannot make %s: %s", dir, strerror(errno));
    return 2;
  }
  if (!cdisk_trusted_dir(dir, why, sizeof why)) {
    lua_pushnil(L);
    lua_pushfstring(L, "%s is not safe to write to: %s", dir, why);
    return 2;
  }
  if (!localtime_r(&now, &tm) || !strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &tm))
    snprintf(stamp, sizeof stamp, "%ld", (long)now);
  for (i = 0; i < 100; i++) {
    if (i) snprintf(run, sizeof run, "%s/run_%s_pid%ld_%d", dir, stamp, (long)getpid(), i);
    else snprintf(run, sizeof run, "%s/run_%s_pid%ld", dir, stamp, (long)getpid());
    if (mkdir(run, 0700) == 0) {
      lua_pushstring(L, run);
      return 1;
    }
    if (errno != EEXIST) break;
  }
  lua_pushnil(L);
  lua_pushfstring(L, "cannot make a folder in %s: %s", dir, strerror(errno));
  return 2;
}

/* fl._debug_subdir(parent, name) -> parent/name made mode 0700 (exclusive),
** or nil and why */
static int l_debug_subdir(lua_State *L) {
  const char *parent = luaL_checkstring(L, 1), *name = luaL_checkstring(L, 2);
  const char *path = lua_pushfstring(L, "%s/%s", parent, name);
  if (strchr(name, '/') || mkdir(path, 0700) != 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "cannot make %s: %s", path, strchr(name, '/') ? "a name with a slash" : strerror(errno));
    return 2;
  }
  return 1;
}

/* fl._shown(v) -> v, noted as already printed: a function that prints
** its text and also returns it (cm:explain) calls this, and the REPL
** does not echo a result it finds noted here (the text would show twice).
** The REPL clears the note before each line it runs. */
static int l_shown(lua_State *L) {
  lua_settop(L, 1);
  lua_pushvalue(L, 1);
  lua_setfield(L, LUA_REGISTRYINDEX, LFL_SHOWN_KEY);
  return 1;
}

/* fl._drop(t, ...): each tensor's storage let go now, not at the next
** collection (compiled training's own handles on a step's gradients and
** saved values: freed memory goes back to the host pool, so the next step
** reuses it instead of faulting in fresh pages).  Only for tensors no user
** code can reach. */
static int l_drop(lua_State *L) {
  int i, n = lua_gettop(L);
  for (i = 1; i <= n; i++) {
    fl_tensor *t = lfl_totensor(L, i);
    if (t) lfl_drop(L, t);
  }
  return 0;
}

static const luaL_Reg compile_funcs[] = {
  {"_drop", l_drop},
  {"_entry_new", e_new}, {"_compiled_new", c_new}, {"_shown", l_shown},
  {"_debug_dir", l_debug_dir}, {"_debug_subdir", l_debug_subdir},
  {"_tensor_key", l_tensor_key}, {"_compiled_inner", l_compiled_inner}, {"_graph_key", l_graph_key},
  {NULL, NULL}
};

void lfl_open_compile(lua_State *L, int lib) {
  lib = lua_absindex(L, lib);
  luaL_newmetatable(L, ENTRY_TYPE);
  lua_pop(L, 1);
  if (luaL_newmetatable(L, COMPILED_TYPE)) {
    lua_pushcfunction(L, c_call);
    lua_setfield(L, -2, "__call");
    lua_pushcfunction(L, c_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, c_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_createtable(L, 3, 0);  /* what c_index computes, for completion */
    lua_pushliteral(L, "calls"); lua_rawseti(L, -2, 1);
    lua_pushliteral(L, "hits"); lua_rawseti(L, -2, 2);
    lua_pushliteral(L, "state"); lua_rawseti(L, -2, 3);
    lua_setfield(L, -2, "__fields");
  }
  lua_pop(L, 1);
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, compile_funcs, 0);
  lua_pop(L, 1);
  /* the Lua half: fl.compile, fl.capture, fl.explain, fl.mark_dynamic */
  if (luaL_loadbuffer(L, (const char *)compile_lua, sizeof compile_lua,
                      "=compile.lua") != LUA_OK)
    lua_error(L);
  lua_pushvalue(L, lib);
  lua_call(L, 1, 0);
}
