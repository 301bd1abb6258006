/*
** lfl_graph.c -- the fl.Graph userdata: a captured graph as Lua sees it.
** print(g) is the IR listing; g:decompose() and g:optimize() return new
** Graphs and print what they changed; g:run(...) interprets it eagerly.
** Invariant: the userdata owns exactly one ir_graph (or none after __gc).
*/
#include <stdlib.h>
#include <string.h>

#include "lfl.h"
#include "cpu/eager.h"
#include "graph/ir.h"
#include "graph/pass.h"
#include "fuse/kernel.h"
#include "fuse/plan.h"
#include "graph/ref.h"
#include "graph/joint.h"
#include "fuse/partition.h"

#define GRAPH_TYPE "fl.Graph"

typedef struct lgraph { ir_graph *g; } lgraph;

void lfl_pushgraph(lua_State *L, ir_graph *g) {
  lgraph *lg = (lgraph *)lua_newuserdatauv(L, sizeof *lg, 0);
  lg->g = g;
  luaL_setmetatable(L, GRAPH_TYPE);
}

ir_graph *lfl_checkgraph(lua_State *L, int idx) {
  lgraph *lg = (lgraph *)luaL_checkudata(L, idx, GRAPH_TYPE);
  if (!lg->g) luaL_argerror(L, idx, "graph has been released");
  return lg->g;
}

static int g_gc(lua_State *L) {
  lgraph *lg = (lgraph *)luaL_checkudata(L, 1, GRAPH_TYPE);
  ir_free(lg->g);
  lg->g = NULL;
  return 0;
}

/* Push a malloc'd string and free it; raises on NULL (out of memory). */
static void push_owned(lua_State *L, char *s, const char *what) {
  if (!s) luaL_error(L, "%s: out of memory", what);
  lua_pushstring(L, s);
  free(s);
}

static int g_tostring(lua_State *L) {
  push_owned(L, ir_listing(lfl_checkgraph(L, 1)), "graph");
  return 1;
}

/* Print text through Lua's print (the REPL may redirect it). */
static void lua_print(lua_State *L, const char *text) {
  if (lua_getglobal(L, "print") == LUA_TFUNCTION) {
    lua_pushstring(L, text);
    lua_call(L, 1, 0);
  } else {
    lua_pop(L, 1);
  }
}

/* g:decompose{quiet=} / g:optimize{quiet=} -> new graph, log */
/* opts.rules of g:optimize: a list of pass_rule_names, as a mask */
static unsigned optimize_rules(lua_State *L) {
  unsigned mask = 0;
  lua_Integer i, n;
  if (!lua_istable(L, 2) || lua_getfield(L, 2, "rules") == LUA_TNIL) {
    if (lua_istable(L, 2)) lua_pop(L, 1);
    return PASS_ALL_RULES;
  }
  if (!lua_istable(L, -1)) luaL_error(L, "optimize: rules must be a list of rule names, got %s", luaL_typename(L, -1));
  n = luaL_len(L, -1);
  for (i = 1; i <= n; i++) {
    const char *s;
    int k;
    lua_rawgeti(L, -1, i);
    s = lua_tostring(L, -1);
    for (k = 0; s && k < PASS_NRULES && strcmp(s, pass_rule_names[k]) != 0; k++) {}
    if (!s || k == PASS_NRULES) {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      for (k = 0; k < PASS_NRULES; k++) {
        luaL_addstring(&b, k ? ", " : "");
        luaL_addstring(&b, pass_rule_names[k]);
      }
      luaL_pushresult(&b);
      luaL_error(L, "optimize: unknown rule %s (rules: %s)", s ? s : luaL_typename(L, -2), lua_tostring(L, -1));
    }
    mask |= 1u << k;
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return mask;
}

static int run_pass(lua_State *L, int optimize, const char *what) {
  ir_graph *g = lfl_checkgraph(L, 1), *h;
  char *log = NULL;
  int quiet = 0;
  unsigned rules = optimize ? optimize_rules(L) : 0;
  fl_err e;
  if (lua_istable(L, 2)) {
    lua_getfield(L, 2, "quiet");
    quiet = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  err_clear(&e);
  lfl_pushgraph(L, NULL);                    /* owner first, then the graph */
  h = optimize ? pass_optimize_rules(g, rules, &log, &e) : pass_decompose(g, &log, &e);
  if (!h) return lfl_raise(L, what, &e);
  /* the derived graph is compared with the one it came from, as captured */
  if (g->origin.known) h->origin = g->origin;
  else if (fuse_graph_cost(g, &h->origin) != FL_OK) h->origin.known = 0;
  ((lgraph *)lua_touserdata(L, -1))->g = h;
  lfl_note_origin(L, 1, h);
  lua_pushstring(L, log);
  free(log);
  if (!quiet) {
    lua_pushfstring(L, "%s: %s", what, lua_tostring(L, -1));
    /* drop the trailing newline print would double */
    {
      size_t n;
      const char *s = lua_tolstring(L, -1, &n);
      if (n && s[n - 1] == '\n') {
        lua_pushlstring(L, s, n - 1);
        lua_remove(L, -2);
      }
    }
    lua_print(L, lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  return 2;
}

static int g_decompose(lua_State *L) { return run_pass(L, 0, "decompose"); }
static int g_optimize(lua_State *L) { return run_pass(L, 1, "optimize"); }

/* g:stats() -> {nodes, ops, inputs, params, consts, outputs, bytes,
** peak_bytes}: bytes and peak_bytes are this graph run op by op, the cost
** model every view shares (fuse_graph_cost). */
static int g_stats(lua_State *L) {
  ir_graph *g = lfl_checkgraph(L, 1);
  int i, params = 0, consts = 0;
  ir_opcost c;
  for (i = 0; i < g->n; i++) {
    params += g->nodes[i].kind == IR_PARAM;
    consts += g->nodes[i].kind == IR_CONST;
  }
  if (fuse_graph_cost(g, &c) != FL_OK) return luaL_error(L, "stats: out of memory");
  lua_createtable(L, 0, 7);
  lua_pushinteger(L, g->n); lua_setfield(L, -2, "nodes");
  lua_pushinteger(L, ir_op_count(g)); lua_setfield(L, -2, "ops");
  lua_pushinteger(L, g->ninputs); lua_setfield(L, -2, "inputs");
  lua_pushinteger(L, params); lua_setfield(L, -2, "params");
  lua_pushinteger(L, consts); lua_setfield(L, -2, "consts");
  lua_pushinteger(L, g->nout); lua_setfield(L, -2, "outputs");
  lua_pushinteger(L, (lua_Integer)c.bytes); lua_setfield(L, -2, "bytes");
  lua_pushinteger(L, (lua_Integer)c.peak_bytes); lua_setfield(L, -2, "peak_bytes");
  return 1;
}

/* g:ops() -> {"matmul", "add", ...} in program order */
static int g_ops(lua_State *L) {
  ir_graph *g = lfl_checkgraph(L, 1);
  int i, k = 0;
  lua_newtable(L);
  for (i = 0; i < g->n; i++) {
    if (g->nodes[i].kind != IR_OP) continue;
    lua_pushstring(L, op_name(g->nodes[i].op));
    lua_rawseti(L, -2, ++k);
  }
  return 1;
}

/* g:nodes() -> one table per node: {id, kind, op, type, inputs, where,
** scope, name, requires_grad (a leaf captured requiring grad)}; ids are
** the %N of the listing. */
static int g_nodes(lua_State *L) {
  static const char *const kinds[] = {"input", "param", "const", "op"};
  ir_graph *g = lfl_checkgraph(L, 1);
  char ty[160];
  int i, k;
  lua_createtable(L, g->n, 0);
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    lua_createtable(L, 0, 8);
    lua_pushinteger(L, i); lua_setfield(L, -2, "id");
    lua_pushstring(L, kinds[nd->kind]); lua_setfield(L, -2, "kind");
    if (nd->kind == IR_OP) {
      lua_pushstring(L, op_name(nd->op)); lua_setfield(L, -2, "op");
      lua_pushstring(L, op_kind_name(op_info_of(nd->op)->kind));
      lua_setfield(L, -2, "op_kind");
      /* a view moves no data and launches nothing (doc/API.md, "Counting") */
      if (fk_is_view(g, i)) { lua_pushboolean(L, 1); lua_setfield(L, -2, "view"); }
      lua_createtable(L, nd->nin, 0);
      for (k = 0; k < nd->nin; k++) {
        lua_pushinteger(L, nd->in[k]);
        lua_rawseti(L, -2, k + 1);
      }
      lua_setfield(L, -2, "inputs");
    }
    lua_pushstring(L, ir_type_str(g, i, ty, sizeof ty)); lua_setfield(L, -2, "type");
    if (nd->where) { lua_pushstring(L, nd->where); lua_setfield(L, -2, "where"); }
    if (nd->scope) { lua_pushstring(L, nd->scope); lua_setfield(L, -2, "scope"); }
    if (nd->name) { lua_pushstring(L, nd->name); lua_setfield(L, -2, "name"); }
    if ((nd->kind == IR_INPUT || nd->kind == IR_PARAM) && nd->requires_grad) {
      lua_pushboolean(L, 1);
      lua_setfield(L, -2, "requires_grad");
    }
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* g:run(x, ...) -> outputs: the graph interpreted with the eager kernels
** (g:run_reference(...) with the reference interpreter, the oracle). */
static int run_with(lua_State *L, ir_apply_fn apply) {
  ir_graph *g = lfl_checkgraph(L, 1);
  const fl_tensor *in[256];
  fl_tensor *outs;
  fl_err e;
  int i, n = lua_gettop(L) - 1;
  if (n != g->ninputs)
    return luaL_error(L, "graph: expected %d input(s), got %d", g->ninputs, n);
  if (n > 256) return luaL_error(L, "graph: too many inputs (%d)", n);
  for (i = 0; i < n; i++) in[i] = lfl_checkdata(L, i + 2, "graph");
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    const fl_tensor *t;
    int d, bad;
    if (nd->kind != IR_INPUT) continue;
    t = in[nd->index];
    bad = t->m.dtype != nd->meta.dtype || t->m.ndim != nd->meta.ndim;
    for (d = 0; !bad && d < nd->meta.ndim; d++)
      bad = nd->sym[d] ? t->m.shape[d] < 2 : t->m.shape[d] != nd->meta.shape[d];
    if (bad) {
      char a[160], b[128];
      return luaL_error(L, "graph: input %d: expected %s, got %s%s", nd->index + 1,
                        ir_type_str(g, i, a, sizeof a), dtype_name(t->m.dtype),
                        meta_shape_str(&t->m, b, sizeof b));
    }
  }
  /* result userdata first: each gets its value below */
  outs = lua_newuserdatauv(L, (size_t)(g->nout + 1) * sizeof *outs, 0);
  memset(outs, 0, (size_t)(g->nout + 1) * sizeof *outs);
  err_clear(&e);
  /* the eager kernels run where the tensors are (lfl_graph_run_eager) */
  if ((apply == eager_apply ? lfl_graph_run_eager(g, in, n, outs, &e)
                            : ir_run(g, apply, in, n, outs, &e)) != FL_OK)
    return lfl_raise(L, "graph", &e);
  /* the write-backs are done: what is returned is the results */
  for (i = ir_nresults(g); i < g->nout; i++) ten_release(&outs[i]);
  for (i = 0; i < ir_nresults(g); i++) lfl_pushmoved(L, &outs[i]);
  return ir_nresults(g);
}

static int g_run(lua_State *L) { return run_with(L, eager_apply); }

/* g:_on_cuda() -> whether an input or a weight of g lives on the device
** (backend "auto" compiles where the tensors are) */
static int g_on_cuda(lua_State *L) {
  ir_graph *g = lfl_checkgraph(L, 1);
  int i, on = 0;
  for (i = 0; i < g->n && !on; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind == IR_INPUT) on = nd->meta.device == FL_DEV_CUDA;
    else if (nd->kind == IR_PARAM || nd->kind == IR_CONST) on = nd->value.m.device == FL_DEV_CUDA;
  }
  lua_pushboolean(L, on);
  return 1;
}
static int g_run_reference(lua_State *L) { return run_with(L, ref_apply); }

/* g:_set_name(id, name): compile.lua names params by where they were
** found ("fc1.weight"). */
static int g_set_name(lua_State *L) {
  ir_graph *g = lfl_checkgraph(L, 1);
  lua_Integer id = luaL_checkinteger(L, 2);
  const char *name = luaL_checkstring(L, 3);
  fl_err e;
  if (id < 0 || id >= g->n) return luaL_argerror(L, 2, "no such node");
  if (ir_set_name(g, (int)id, name, &e) != FL_OK) return lfl_raise(L, "graph", &e);
  return 0;
}

/* g:_set_requires_grad(id, on): input id requires grad (its joint graph
** then gives its gradient): a compiled training segment called with
** another argument or earlier result requiring grad than at its capture */
static int g_set_requires_grad(lua_State *L) {
  ir_graph *g = lfl_checkgraph(L, 1);
  lua_Integer id = luaL_checkinteger(L, 2);
  if (id < 0 || id >= g->n || g->nodes[id].kind != IR_INPUT) return luaL_argerror(L, 2, "no such input");
  g->nodes[id].requires_grad = lua_toboolean(L, 3);
  return 0;
}

/* g:outputs() -> node ids the graph returns, in order (not the
** write-backs) */
static int g_outputs(lua_State *L) {
  ir_graph *g = lfl_checkgraph(L, 1);
  int i;
  lua_createtable(L, ir_nresults(g), 0);
  for (i = 0; i < ir_nresults(g); i++) {
    lua_pushinteger(L, g->outputs[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* g:writebacks() -> {{node=, into=, name=, kind="input"|"param"}...}: the
** in-place updates the graph captured, each written after it ran */
static int g_writebacks(lua_State *L) {
  ir_graph *g = lfl_checkgraph(L, 1);
  int k;
  lua_createtable(L, g->nwb, 0);
  for (k = 0; k < g->nwb; k++) {
    const ir_node *d = &g->nodes[g->wb[k]];
    lua_createtable(L, 0, 4);
    lua_pushinteger(L, g->outputs[ir_nresults(g) + k]);
    lua_setfield(L, -2, "node");
    lua_pushinteger(L, g->wb[k]);
    lua_setfield(L, -2, "into");
    lua_pushstring(L, d->name ? d->name : "?");
    lua_setfield(L, -2, "name");
    lua_pushstring(L, d->kind == IR_INPUT ? "input" : "param");
    lua_setfield(L, -2, "kind");
    if (d->kind == IR_PARAM && d->value.st) {   /* the tensor written, by reference */
      ten_share(lfl_newtensor(L), &d->value);
      lua_setfield(L, -2, "tensor");
    }
    lua_rawseti(L, -2, k + 1);
  }
  return 1;
}

/* g:_add_param(t) -> id: a param bound to tensor t by reference (fl.capture:
** a result the trace did not compute, such as a returned upvalue). */
static int g_add_param(lua_State *L) {
  ir_graph *g = lfl_checkgraph(L, 1);
  fl_tensor *t = lfl_checkdata(L, 2, "graph");
  fl_err e;
  int id = ir_add_param(g, t, NULL, &e);
  if (id < 0) return lfl_raise(L, "graph", &e);
  lua_pushinteger(L, id);
  return 1;
}

/* g:_clone() -> a copy of g (its outputs can be changed, g's not) */
static int g_clone(lua_State *L) {
  ir_graph *c = ir_clone(lfl_checkgraph(L, 1));
  if (!c) return luaL_error(L, "graph: out of memory");
  lfl_pushgraph(L, c);
  return 1;
}

/* g:_set_outputs{id, ...}: the graph returns these nodes, in this order
** (fl.capture: what the function returned). */
static int g_set_outputs(lua_State *L) {
  ir_graph *g = lfl_checkgraph(L, 1);
  lua_Integer n, i;
  fl_err e;
  luaL_checktype(L, 2, LUA_TTABLE);
  n = luaL_len(L, 2);
  for (i = 1; i <= n; i++) {
    lua_Integer id;
    lua_rawgeti(L, 2, i);
    id = luaL_checkinteger(L, -1);
    lua_pop(L, 1);
    if (id < 0 || id >= g->n) return luaL_argerror(L, 2, "no such node");
  }
  {
    /* the write-backs stay, after the new results */
    int nwb = g->nwb, k, *src = NULL, *dst = g->wb;
    if (nwb && !(src = malloc((size_t)nwb * sizeof *src))) return luaL_error(L, "graph: out of memory");
    for (k = 0; k < nwb; k++) src[k] = g->outputs[ir_nresults(g) + k];
    g->nout = 0;
    g->nwb = 0;
    g->wb = NULL;
    for (i = 1; i <= n; i++) {
      lua_rawgeti(L, 2, i);
      if (ir_add_output(g, (int)lua_tointeger(L, -1), &e) != FL_OK) break;
      lua_pop(L, 1);
    }
    for (k = 0; k < nwb && i > n; k++)
      if (ir_add_writeback(g, src[k], dst[k], &e) != FL_OK) break;
    free(src);
    free(dst);
    if (i <= n || k < nwb) return lfl_raise(L, "graph", &e);
  }
  return 0;
}

/* g:joint([{tangents = bool}]) -> the joint forward+backward graph of a
** captured loss */
static int g_joint(lua_State *L) {
  static const char *const keys[] = {"tangents", NULL};
  ir_graph *g = lfl_checkgraph(L, 1), *j;
  int tangents = 0;
  fl_err e;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lfl_checkkeys(L, 2, keys, "joint");
    lua_getfield(L, 2, "tangents");
    tangents = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  err_clear(&e);
  lfl_pushgraph(L, NULL);                    /* owner first, then the graph */
  if (!(j = ir_joint(g, tangents, &e))) return lfl_raise(L, "joint", &e);
  ((lgraph *)lua_touserdata(L, -1))->g = j;
  return 1;
}

/* t[key] = v for the table on top */
static void field_int(lua_State *L, const char *key, int64_t v) {
  lua_pushinteger(L, (lua_Integer)v);
  lua_setfield(L, -2, key);
}
static void field_str(lua_State *L, const char *key, const char *v) {
  lua_pushstring(L, v);
  lua_setfield(L, -2, key);
}

/* j:partition{policy = "mincut" | "save_all" | "recompute_all"} -> fw, bw,
** info {saved = {{name, bytes, why, node [, input]}}, recomputed = {{op,
** reason, node}}, grads = {{input = k | param = t, name}}, results,
** tangents = {result positions}, saved_bytes, eager_saved_bytes} */
static int g_partition(lua_State *L) {
  static const char *const keys[] = {"policy", NULL};
  static const char *const names[] = {"mincut", "save_all", "recompute_all"};
  ir_graph *j = lfl_checkgraph(L, 1), *fw, *bw;
  part_policy pol = PART_MINCUT;
  part_info info;
  fl_err e;
  char desc[64];
  int i, k;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lfl_checkkeys(L, 2, keys, "partition");
    if (lua_getfield(L, 2, "policy") != LUA_TNIL) {
      const char *s = lua_tostring(L, -1);
      for (k = 0; k < 3 && !(s && lua_type(L, -1) == LUA_TSTRING && strcmp(s, names[k]) == 0); k++) {}
      if (k == 3)
        return luaL_error(L, "partition: unknown policy %s (expected mincut, save_all or recompute_all)",
                          lua_type(L, -1) == LUA_TSTRING ? s : luaL_typename(L, -1));
      pol = (part_policy)k;
    }
    lua_pop(L, 1);
  }
  err_clear(&e);
  if (fuse_partition(j, pol, &fw, &bw, &info, &e) != FL_OK) return lfl_raise(L, "partition", &e);
  lfl_pushgraph(L, fw);
  lfl_pushgraph(L, bw);
  lua_createtable(L, 0, 4);
  lua_createtable(L, info.nsaved, 0);
  for (i = 0; i < info.nsaved; i++) {
    const ir_node *nd = &j->nodes[info.saved[i].node];
    lua_createtable(L, 0, 4);
    if (nd->kind == IR_INPUT) lua_pushstring(L, nd->name ? nd->name : "input");
    else {
      fk_describe(j, info.saved[i].node, desc, sizeof desc);
      lua_pushfstring(L, "%%%d %s", info.saved[i].node, desc);
    }
    lua_setfield(L, -2, "name");
    field_int(L, "bytes", info.saved[i].bytes);
    field_str(L, "why", info.saved[i].why);
    field_int(L, "node", info.saved[i].node);
    if (nd->kind == IR_INPUT) field_int(L, "input", nd->index + 1);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "saved");
  /* what each gradient the backward returns is for: a graph input (its
  ** position) or a parameter (a tensor sharing its storage) */
  {
    int ng = ir_nresults(j) - j->joint_nres;
    lua_createtable(L, ng > 0 ? ng : 0, 0);
    for (i = 0; i < ng; i++) {
      const ir_node *nd = &j->nodes[j->joint_wrt[i]];
      lua_createtable(L, 0, 2);
      if (nd->kind == IR_INPUT) field_int(L, "input", nd->index + 1);
      else {
        ten_share(lfl_newtensor(L), &nd->value);
        lua_setfield(L, -2, "param");
      }
      if (nd->name) field_str(L, "name", nd->name);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "grads");
  }
  field_int(L, "results", j->joint_nres);
  /* the results whose gradients the backward takes after the saved values */
  lua_createtable(L, j->joint_ntan, 0);
  for (i = 0; i < j->joint_ntan; i++) {
    lua_pushinteger(L, j->joint_tan[i] + 1);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "tangents");
  lua_createtable(L, info.nrec, 0);
  for (i = 0; i < info.nrec; i++) {
    lua_createtable(L, 0, 3);
    field_str(L, "op", op_name(j->nodes[info.rec[i].node].op));
    field_str(L, "reason", info.rec[i].reason);
    field_int(L, "node", info.rec[i].node);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "recomputed");
  field_int(L, "saved_bytes", info.saved_bytes);
  field_int(L, "eager_saved_bytes", info.eager_saved_bytes);
  field_str(L, "policy", names[pol]);
  part_info_free(&info);
  return 3;
}

static const luaL_Reg graph_methods[] = {
  {"joint", g_joint}, {"partition", g_partition},
  {"_set_name", g_set_name}, {"_set_requires_grad", g_set_requires_grad}, {"outputs", g_outputs}, {"writebacks", g_writebacks},
  {"_add_param", g_add_param}, {"_set_outputs", g_set_outputs}, {"_clone", g_clone},
  {"decompose", g_decompose}, {"optimize", g_optimize}, {"stats", g_stats},
  {"ops", g_ops}, {"nodes", g_nodes}, {"run", g_run},
  {"run_reference", g_run_reference}, {"_on_cuda", g_on_cuda},
  {NULL, NULL}
};

void lfl_open_graph(lua_State *L, int lib) {
  (void)lib;
  if (luaL_newmetatable(L, GRAPH_TYPE)) {
    lua_pushcfunction(L, g_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, g_tostring);
    lua_setfield(L, -2, "__tostring");
    luaL_newlib(L, graph_methods);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "methods");
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
}
