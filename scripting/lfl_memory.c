/*
** lfl_memory.c -- bytes alive at each step, from Lua:
**   p:memory()                        the two curves and their peaks, as a table
**   p:memory_text([rows])             the same as text (the REPL's :memory)
**   fl.draw_memory(stage, "mem.png")  the picture (viz/memory.h)
** A stage is a Graph (planned with the default fusion), a Plan, a Program
** or a compiled function (its first plan).  fuse/memtrace.h counts.
**
** "Op by op" is the graph the plan's peak_bytes_before was counted from:
** for a plan of g:decompose():optimize() that is g as captured, which the
** plan does not hold (it keeps only g's numbers).  So the passes that
** derive graphs and plans (g:decompose, g:optimize, g:fuse) note, per
** result, the captured graph it came from (lfl_note_origin), in a
** registry table whose values are weak: the note never keeps a graph
** alive, and fuse_mem_trace_build uses it only when its cost op by op is
** the one the plan recorded.  Without it, "op by op" is the planned
** graph, and the picture says so.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lfl_viz.h"
#include "cpu/backend.h"
#include "fuse/memtrace.h"
#include "viz/memory.h"

#define ORIGIN_KEY "fuselab.memory.origin"
#define CALL_TYPE "fl.MemoryCall"

/* ---- the captured graph behind a derived graph or plan ------------------ */

/* Pushes the captured Graph noted for the C object p, or nil. */
static void push_origin(lua_State *L, const void *p) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, ORIGIN_KEY) != LUA_TTABLE) return;   /* nil: not opened */
  lua_rawgetp(L, -1, p);
  lua_remove(L, -2);
}

/* Notes that the object made from the Graph at src (a graph or a plan, C
** pointer made) came from src's captured graph: the one noted for src, or
** src itself when src was never derived.  Called by the passes that derive
** them (g:decompose, g:optimize, g:fuse) and here. */
void lfl_note_origin(lua_State *L, int src, const void *made) {
  const ir_graph *g = lfl_checkgraph(L, src);
  src = lua_absindex(L, src);
  if (lua_getfield(L, LUA_REGISTRYINDEX, ORIGIN_KEY) != LUA_TTABLE) { lua_pop(L, 1); return; }
  lua_pop(L, 1);
  push_origin(L, g);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    if (g->origin.known) return;              /* derived elsewhere: unknown */
    lua_pushvalue(L, src);
  }
  lua_getfield(L, LUA_REGISTRYINDEX, ORIGIN_KEY);
  lua_insert(L, -2);
  lua_rawsetp(L, -2, made);
  lua_pop(L, 1);
}

/* ---- one call's trace, freed when the call returns or unwinds ----------- */

typedef struct mem_call {
  fuse_plan *own;            /* a Graph's plan, made here */
  fuse_mem_trace t;
  int has_t;
  char *text;
} mem_call;

static int call_gc(lua_State *L) {
  mem_call *c = (mem_call *)luaL_checkudata(L, 1, CALL_TYPE);
  if (c->has_t) fuse_mem_trace_free(&c->t);
  fuse_plan_free(c->own);
  free(c->text);
  memset(c, 0, sizeof *c);
  return 0;
}

static mem_call *call_new(lua_State *L) {
  mem_call *c = (mem_call *)lua_newuserdatauv(L, sizeof *c, 0);
  memset(c, 0, sizeof *c);
  luaL_setmetatable(L, CALL_TYPE);
  lua_toclose(L, -1);
  return c;
}

/* The plan a stage stands for, and a note when the stage has several
** graphs (a compiled function: its first plan is drawn). */
static const fuse_plan *stage_plan(lua_State *L, mem_call *c, int idx, const char *what,
                                   char *note, size_t nnote) {
  int kind = lfl_viz_kind(L, idx);
  fl_err e;
  note[0] = '\0';
  if (kind == LFL_VIZ_GRAPH) {
    const ir_graph *g = lfl_checkgraph(L, idx);
    err_clear(&e);
    if (!(c->own = fuse_plan_build(g, NULL, &e))) lfl_raise(L, what, &e);
    lfl_note_origin(L, idx, c->own);
    return c->own;
  }
  if (kind == LFL_VIZ_PLAN || kind == LFL_VIZ_PROGRAM) return lfl_viz_plan_at(L, idx, what);
  if (kind == LFL_VIZ_COMPILED) {
    const fuse_plan *p;
    lua_Integer np, ng;
    lua_getfield(L, idx, "state");
    if (!lua_istable(L, -1)) luaL_error(L, "%s: the compiled function's state is incomplete", what);
    lua_getfield(L, -1, "graphs");
    ng = lua_istable(L, -1) ? luaL_len(L, -1) : 0;
    lua_getfield(L, -2, "plans");
    np = lua_istable(L, -1) ? luaL_len(L, -1) : 0;
    if (ng == 0) {
      lua_getfield(L, idx, "calls");
      if (lua_tointeger(L, -1) == 0)
        luaL_error(L, "%s: the compiled function has not run yet, so there is no graph: "
                   "call it once first", what);
      luaL_error(L, "%s: the compiled function captured no graph (backend \"eager\", or "
                 "no tensor operation)", what);
    }
    if (np == 0)
      luaL_error(L, "%s: the compiled function's graphs run on the eager kernels: no plan "
                 "to count", what);
    lua_rawgeti(L, -1, 1);
    if (!(p = lfl_toplan(L, -1))) luaL_error(L, "%s: the compiled function's plan is gone", what);
    if (np > 1)
      snprintf(note, nnote, "the first of its %d graphs; cm:plans()[i] for each of the others",
               (int)np);
    lua_pop(L, 4);          /* the plan stays referenced by the state */
    return p;
  }
  luaL_error(L, "%s: cannot count the memory of a %s (expected a Graph, Plan, Program or "
             "compiled function%s)", what, lfl_viz_typeof(L, idx),
             lua_istable(L, idx) ? "; a module is counted from its graph: "
             "fl.draw_memory(fl.capture(model, x), path)" : "");
  return NULL;
}

/* The trace of the stage at idx, in c. */
static void stage_trace(lua_State *L, mem_call *c, int idx, const char *what, char *note,
                        size_t nnote) {
  const fuse_plan *p = stage_plan(L, c, idx, what, note, nnote);
  const ir_graph *cap = NULL;
  fl_err e;
  push_origin(L, p);
  if (luaL_testudata(L, -1, "fl.Graph")) cap = lfl_checkgraph(L, -1);
  err_clear(&e);
  if (fuse_mem_trace_build(p, cap, &c->t, &e) != FL_OK) lfl_raise(L, what, &e);
  c->has_t = 1;
  lua_pop(L, 1);
}

/* The chart of plan p as SVG (malloc'd) for the report, or NULL with e set. */
char *lfl_memory_svg(lua_State *L, const fuse_plan *p, fl_err *e) {
  fuse_mem_trace t;
  viz_mem_chart mc;
  const ir_graph *cap = NULL;
  char *svg = NULL;
  size_t len;
  push_origin(L, p);
  if (luaL_testudata(L, -1, "fl.Graph")) cap = lfl_checkgraph(L, -1);
  if (fuse_mem_trace_build(p, cap, &t, e) != FL_OK) { lua_pop(L, 1); return NULL; }
  lua_pop(L, 1);
  memset(&mc, 0, sizeof mc);
  mc.t = &t;
  if (viz_mem_render_mem(&mc, "svg", &svg, &len, e) != FL_OK) svg = NULL;
  fuse_mem_trace_free(&t);
  return svg;
}

/* ---- p:memory() ----------------------------------------------------------- */

static void push_steps(lua_State *L, const fuse_mem_curve *cv) {
  int i;
  lua_createtable(L, cv->n, 0);
  for (i = 0; i < cv->n; i++) {
    lua_createtable(L, 0, 4);
    lua_pushinteger(L, i + 1); lua_setfield(L, -2, "step");
    lua_pushstring(L, cv->steps[i].name); lua_setfield(L, -2, "name");
    lua_pushinteger(L, (lua_Integer)cv->steps[i].bytes); lua_setfield(L, -2, "bytes");
    lua_pushinteger(L, cv->steps[i].id); lua_setfield(L, -2, "id");
    lua_rawseti(L, -2, i + 1);
  }
}

static void push_peak(lua_State *L, const fuse_mem_curve *cv) {
  int i;
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, (lua_Integer)cv->peak); lua_setfield(L, -2, "bytes");
  if (cv->peak_at >= 0) {
    lua_pushinteger(L, cv->peak_at + 1); lua_setfield(L, -2, "at");
    lua_pushstring(L, cv->steps[cv->peak_at].name); lua_setfield(L, -2, "name");
  }
  lua_createtable(L, cv->nbufs, 0);
  for (i = 0; i < cv->nbufs; i++) {
    const fuse_mem_buf *b = &cv->bufs[i];
    lua_createtable(L, 0, 4);
    lua_pushinteger(L, b->id); lua_setfield(L, -2, "id");
    lua_pushstring(L, b->name); lua_setfield(L, -2, "name");
    lua_pushinteger(L, (lua_Integer)b->bytes); lua_setfield(L, -2, "bytes");
    if (b->scope) { lua_pushstring(L, b->scope); lua_setfield(L, -2, "scope"); }
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "buffers");
}

/* p:memory() -> {before = {{step=, name=, bytes=, id=}...}, after = ...,
** peak_before = {bytes=, at=, name=, buffers = {{id=, name=, bytes=,
** scope=}...}}, peak_after = ..., before_graph = "captured" | "planned"} */
static int p_memory(lua_State *L) {
  mem_call *c;
  char note[200];
  lua_settop(L, 1);
  luaL_checkudata(L, 1, "fl.Plan");
  c = call_new(L);
  stage_trace(L, c, 1, "memory", note, sizeof note);
  lua_createtable(L, 0, 5);
  push_steps(L, &c->t.before); lua_setfield(L, -2, "before");
  push_steps(L, &c->t.after); lua_setfield(L, -2, "after");
  push_peak(L, &c->t.before); lua_setfield(L, -2, "peak_before");
  push_peak(L, &c->t.after); lua_setfield(L, -2, "peak_after");
  lua_pushstring(L, c->t.before_own ? "planned" : "captured");
  lua_setfield(L, -2, "before_graph");
  return 1;
}

/* The text of the stage at 1, rows per side at most (arg 2, default 24). */
static int memory_text(lua_State *L, const char *what) {
  mem_call *c;
  char note[200];
  lua_Integer rows = luaL_optinteger(L, 2, 24);
  lua_settop(L, 2);
  if (rows < 0) return luaL_error(L, "%s: rows must be >= 0, got %d", what, (int)rows);
  c = call_new(L);
  stage_trace(L, c, 1, what, note, sizeof note);
  if (!(c->text = fuse_mem_text(&c->t, (int)(rows > 100000 ? 100000 : rows))))
    return luaL_error(L, "%s: out of memory", what);
  if (note[0]) lua_pushfstring(L, "(%s)\n%s", note, c->text);
  else lua_pushstring(L, c->text);
  return 1;
}

static int p_memory_text(lua_State *L) {
  luaL_checkudata(L, 1, "fl.Plan");
  return memory_text(L, "memory_text");
}

/* fl._memory_text(stage [, rows]): the REPL's :memory */
static int l_memory_text(lua_State *L) { return memory_text(L, "memory"); }

/* ---- fl.draw_memory --------------------------------------------------------- */

static const char *const mem_keys[] = {"scale", "title", NULL};

/* fl.draw_memory(stage, path [, opts]) -> path */
static int l_draw_memory(lua_State *L) {
  const char *path;
  viz_opts o;
  viz_mem_chart mc;
  mem_call *c;
  char note[200], title[260];
  fl_err e;
  lua_settop(L, 3);
  if (lfl_viz_kind(L, 1) == LFL_VIZ_NONE || lfl_viz_kind(L, 1) == LFL_VIZ_EXPLAIN ||
      lfl_viz_kind(L, 1) == LFL_VIZ_LIST)
    return luaL_error(L, "draw_memory: cannot draw the memory of a %s (expected a Graph, Plan, "
                      "Program or compiled function)", lfl_viz_typeof(L, 1));
  if (lua_type(L, 2) != LUA_TSTRING)
    return luaL_error(L, "draw_memory: expected a file name (\"mem.png\") as argument 2, got %s",
                      lfl_viz_typeof(L, 2));
  path = lua_tostring(L, 2);
  lfl_viz_opts(L, 3, &o, mem_keys, "draw_memory");
  c = call_new(L);
  stage_trace(L, c, 1, "draw_memory", note, sizeof note);
  memset(&mc, 0, sizeof mc);
  mc.t = &c->t;
  mc.scale = o.scale;
  mc.title = o.title;
  if (!mc.title && note[0]) {
    snprintf(title, sizeof title, "Memory alive at each step (%s)", note);
    mc.title = title;
  }
  err_clear(&e);
  if (viz_mem_render_file(&mc, path, &e) != FL_OK) return lfl_viz_raise(L, "draw_memory", &e);
  lua_pushvalue(L, 2);
  return 1;
}

static const luaL_Reg mem_funcs[] = {
  {"draw_memory", l_draw_memory}, {"_memory_text", l_memory_text}, {NULL, NULL}
};

void lfl_open_memory(lua_State *L, int lib);

void lfl_open_memory(lua_State *L, int lib) {
  lib = lua_absindex(L, lib);
  if (luaL_newmetatable(L, CALL_TYPE)) {
    lua_pushcfunction(L, call_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, call_gc);
    lua_setfield(L, -2, "__close");
  }
  lua_pop(L, 1);
  lua_newtable(L);                         /* the origin notes: weak values */
  lua_createtable(L, 0, 1);
  lua_pushstring(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, ORIGIN_KEY);
  luaL_getmetatable(L, "fl.Plan");
  lua_getfield(L, -1, "__index");
  lua_pushcfunction(L, p_memory);
  lua_setfield(L, -2, "memory");
  lua_pushcfunction(L, p_memory_text);
  lua_setfield(L, -2, "memory_text");
  lua_pop(L, 2);
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, mem_funcs, 0);
  lua_pop(L, 1);
}
