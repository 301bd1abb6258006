/*
** lfl_roofline.c -- the roofline from Lua:
**   fl.machine_peaks([{remeasure = true}])   this machine's two peaks (cached)
**   fl.draw_roofline(cm_or_program, path)   the chart of a program's kernels
** (k:profile()'s per-kernel flops, intensity, bound and roof_pct are in
** lfl_program.c; the numbers come from exec/roofline.h for every view.)
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lfl.h"
#include "exec/roofline.h"
#include "viz/roofline.h"

static void push_peaks(lua_State *L, const roof_peaks *p) {
  lua_createtable(L, 0, 18);
  lua_pushnumber(L, p->copy_gbs); lua_setfield(L, -2, "copy_gbs");
  lua_pushnumber(L, p->product_gflops); lua_setfield(L, -2, "product_gflops");
  lua_pushnumber(L, roof_ridge(p)); lua_setfield(L, -2, "ridge");
  lua_pushstring(L, p->cpu); lua_setfield(L, -2, "cpu");
  lua_pushinteger(L, p->threads); lua_setfield(L, -2, "threads");
  lua_pushboolean(L, p->from_cache); lua_setfield(L, -2, "from_cache");
  lua_pushstring(L, p->product_path); lua_setfield(L, -2, "product_path");
  lua_pushinteger(L, p->product_n); lua_setfield(L, -2, "product_n");
  lua_pushnumber(L, p->copy_mib); lua_setfield(L, -2, "copy_mib");
  lua_pushnumber(L, p->copy_spread); lua_setfield(L, -2, "copy_spread");
  lua_pushnumber(L, p->product_spread); lua_setfield(L, -2, "product_spread");
  lua_pushinteger(L, p->copy_runs); lua_setfield(L, -2, "copy_runs");
  lua_pushinteger(L, p->product_runs); lua_setfield(L, -2, "product_runs");
  lua_pushboolean(L, p->noisy); lua_setfield(L, -2, "noisy");
  lua_pushinteger(L, p->tries); lua_setfield(L, -2, "tries");
  if (p->noise[0]) { lua_pushstring(L, p->noise); lua_setfield(L, -2, "noise"); }
  lua_pushnumber(L, p->measure_s); lua_setfield(L, -2, "measure_s");
  if (p->warning) { lua_pushstring(L, p->warning); lua_setfield(L, -2, "warning"); }
}

/* fl.machine_peaks([{remeasure = bool}]) */
static int l_machine_peaks(lua_State *L) {
  static const char *const keys[] = {"remeasure", NULL};
  roof_peaks p;
  fl_err e;
  int remeasure = 0;
  if (!lua_isnoneornil(L, 1)) {
    if (!lua_istable(L, 1))
      return luaL_error(L, "machine_peaks: expected an options table {remeasure = true}, got %s",
                        luaL_typename(L, 1));
    lfl_checkkeys(L, 1, keys, "machine_peaks");
    if (lua_getfield(L, 1, "remeasure") != LUA_TNIL && !lua_isboolean(L, -1))
      return luaL_error(L, "machine_peaks: option remeasure must be true or false, got %s",
                        luaL_typename(L, -1));
    remeasure = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  err_clear(&e);
  if (roof_machine_peaks(&p, remeasure, &e) != FL_OK) return lfl_raise(L, "machine_peaks", &e);
  push_peaks(L, &p);
  return 1;
}

/* ---- fl.draw_roofline ------------------------------------------------------ */

/* What one call collects; a to-be-closed userdata, so an error frees it. */
typedef struct roof_call {
  viz_roof_point *pts;
  roof_kernel *rk;
  char **names;
  int n, cap;
  char *data;
} roof_call;

#define CALL_TYPE "fl.RooflineCall"

static int call_gc(lua_State *L) {
  roof_call *c = (roof_call *)luaL_checkudata(L, 1, CALL_TYPE);
  int i;
  for (i = 0; i < c->n; i++) free(c->names[i]);
  free(c->names);
  free(c->pts);
  free(c->rk);
  free(c->data);
  memset(c, 0, sizeof *c);
  return 0;
}

static roof_call *call_new(lua_State *L) {
  roof_call *c = (roof_call *)lua_newuserdatauv(L, sizeof *c, 0);
  memset(c, 0, sizeof *c);
  if (luaL_newmetatable(L, CALL_TYPE)) {
    lua_pushcfunction(L, call_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, call_gc);
    lua_setfield(L, -2, "__close");
  }
  lua_setmetatable(L, -2);
  lua_toclose(L, -1);
  return c;
}

/* Every kernel of pr as a point; prog > 0 numbers the program (several:
** a function with graph breaks or recompiles). */
static void add_program(lua_State *L, roof_call *c, const exec_program *pr, int prog,
                        const roof_peaks *pk) {
  int k, nk = pr->plan->nkernels;
  fl_err e;
  roof_kernel *rk;
  if (c->n + nk > c->cap) {
    int cap = c->cap * 2 > c->n + nk ? c->cap * 2 : c->n + nk + 16;
    viz_roof_point *p = realloc(c->pts, (size_t)cap * sizeof *p);
    char **nm;
    if (p) c->pts = p;
    nm = p ? realloc(c->names, (size_t)cap * sizeof *nm) : NULL;
    if (!p || !nm) luaL_error(L, "draw_roofline: out of memory");
    c->names = nm;
    c->cap = cap;
  }
  free(c->rk);
  if (!(c->rk = rk = malloc((size_t)(nk ? nk : 1) * sizeof *rk)))
    luaL_error(L, "draw_roofline: out of memory");
  err_clear(&e);
  if (roof_program(pr, pk, rk, &e) != FL_OK) lfl_raise(L, "draw_roofline", &e);
  for (k = 0; k < nk; k++) {
    viz_roof_point *p = &c->pts[c->n];
    char buf[200];
    if (prog > 0) snprintf(buf, sizeof buf, "p%d.k%d %s", prog, k, rk[k].name);
    else snprintf(buf, sizeof buf, "k%d %s", k, rk[k].name);
    if (!(c->names[c->n] = strdup(buf))) luaL_error(L, "draw_roofline: out of memory");
    c->n++;
    p->name = c->names[c->n - 1];
    p->intensity = rk[k].flops > 0 ? rk[k].intensity : 0;
    p->gflops = rk[k].timed ? rk[k].gflops : 0;
    p->gbps = rk[k].timed ? rk[k].gbps : 0;
    p->roof_pct = rk[k].roof_pct;
    p->compute_bound = rk[k].bound == ROOF_COMPUTE;
  }
}

static const char *what_is(lua_State *L, int idx) {
  const char *name = NULL;
  if (luaL_getmetafield(L, idx, "__name") != LUA_TNIL) {
    if (lua_type(L, -1) == LUA_TSTRING) name = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  return name ? name : luaL_typename(L, idx);
}

/* The CPU programs a compiled function ran, each added; the count. */
static int add_compiled(lua_State *L, roof_call *c, int idx, const roof_peaks *pk) {
  lua_Integer i, n;
  int found = 0, timed = 0, top = lua_gettop(L);
  lua_getfield(L, idx, "state");
  if (!lua_istable(L, -1)) luaL_error(L, "draw_roofline: the compiled function's state is incomplete");
  lua_getfield(L, -1, "programs");
  n = lua_istable(L, -1) ? luaL_len(L, -1) : 0;
  for (i = 1; i <= n; i++) {
    exec_program *pr;
    lua_rawgeti(L, -1, i);
    pr = lfl_toprogram(L, -1);
    lua_pop(L, 1);
    if (!pr) continue;                           /* a CUDA program: not this machine's roofs */
    found++;
    if (pr->profiled_runs > 0) timed++;
  }
  if (!found) {
    lua_getfield(L, idx, "calls");
    if (lua_tointeger(L, -1) == 0)
      luaL_error(L, "draw_roofline: the compiled function has not run yet, so no kernel was "
                 "timed: call it first (its CPU kernels are timed on every call)");
    luaL_error(L, "draw_roofline: the compiled function has no compiled CPU program (backend "
               "\"eager\" or \"cuda\", a fallback to eager, or no tensor operation)");
  }
  if (!timed)
    luaL_error(L, "draw_roofline: the compiled function's programs have no kernel times yet: "
               "call it once more");
  for (i = 1, found = 0; i <= n; i++) {
    exec_program *pr;
    lua_rawgeti(L, -1, i);
    pr = lfl_toprogram(L, -1);
    lua_pop(L, 1);
    if (pr && pr->profiled_runs > 0) add_program(L, c, pr, timed > 1 ? ++found : 0, pk);
  }
  lua_settop(L, top);
  return timed;
}

/* fl.draw_roofline(cm_or_program, path) -> path */
static int l_draw_roofline(lua_State *L) {
  const char *path = luaL_checkstring(L, 2);
  roof_peaks pk;
  viz_roof_chart ch;
  roof_call *c;
  fl_err e;
  char sub[400], note[600];
  if (!lua_isnoneornil(L, 3))
    return luaL_error(L, "draw_roofline: expected 2 arguments (a compiled function or a Program, "
                      "and a path), got %d", lua_gettop(L));
  if (!lfl_toprogram(L, 1) && !luaL_testudata(L, 1, "fl.Compiled"))
    return luaL_error(L, "draw_roofline: expected a compiled function (fl.compile) or a CPU "
                      "Program (p:codegen(\"cpu\")), got %s", what_is(L, 1));
  err_clear(&e);
  if (roof_machine_peaks(&pk, 0, &e) != FL_OK) return lfl_raise(L, "draw_roofline", &e);
  c = call_new(L);
  if (lfl_toprogram(L, 1)) {
    exec_program *pr = lfl_toprogram(L, 1);
    if (!pr->kernel_ms || pr->profiled_runs <= 0)
      return luaL_error(L, "draw_roofline: the program has no kernel times: it was never run "
                        "with profiling on (k:profile(true), then k:run(...))");
    add_program(L, c, pr, 0, &pk);
  } else {
    add_compiled(L, c, 1, &pk);
  }
  snprintf(sub, sizeof sub, "roofs measured on this machine%s: a triad over %.0f MiB, median of "
           "%d runs (IQR %.0f%%); a %d\xc2\xb3 product, median of %d (IQR %.0f%%)",
           pk.from_cache ? " (cached)" : "", pk.copy_mib, pk.copy_runs, 100 * pk.copy_spread,
           pk.product_n, pk.product_runs, 100 * pk.product_spread);
  snprintf(note, sizeof note, "A point: one kernel at its mean time per launch; its percent: the "
           "share of the roof above it it reaches.%s%s%s", pk.noisy ? " The peaks were measured "
           "on a noisy machine (" : "", pk.noisy ? pk.noise : "", pk.noisy ? "): "
           "fl.machine_peaks{remeasure = true} measures them again." : "");
  memset(&ch, 0, sizeof ch);
  ch.cpu = pk.cpu;
  ch.threads = pk.threads;
  ch.copy_gbs = pk.copy_gbs;
  ch.product_gflops = pk.product_gflops;
  ch.product_path = pk.product_path[0] ? pk.product_path : NULL;
  ch.subtitle = sub;
  ch.note = note;
  ch.pts = c->pts;
  ch.npts = c->n;
  if (viz_roof_render_file(&ch, path, &e) != FL_OK) return lfl_raise(L, "draw_roofline", &e);
  lua_pushstring(L, path);
  return 1;
}

static const luaL_Reg roof_funcs[] = {
  {"machine_peaks", l_machine_peaks},
  {"draw_roofline", l_draw_roofline},
  {NULL, NULL}
};

void lfl_open_roofline(lua_State *L, int lib) {
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, roof_funcs, 0);
  lua_pop(L, 1);
}
