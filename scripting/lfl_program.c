/*
** lfl_program.c -- what every backend's compiled Program shares as Lua
** sees it: k:compile(), k:try_compile(), k:run(...), k:source(), k:log(),
** print(k), collection, on the executor (exec/program.h).  The backend
** (lfl_plan.c for C, lfl_cuda.c for CUDA) names its type and run in an
** lfl_progtype; the methods find it in their upvalue.
** Invariant: a Program userdata holds one program or, once collected,
** NULL; it is created before the program, so an error between the two
** leaks nothing.
*/
#include <string.h>

#include <stdlib.h>

#include "lfl.h"
#include "exec/program.h"
#include "exec/roofline.h"

static const lfl_progtype *backend(lua_State *L) {
  return (const lfl_progtype *)lua_touserdata(L, lua_upvalueindex(1));
}

exec_program *lfl_checkprogram(lua_State *L, int idx, const lfl_progtype *be) {
  exec_program **slot = (exec_program **)luaL_checkudata(L, idx, be->type);
  if (!*slot) luaL_argerror(L, idx, "program has been released");
  return *slot;
}

exec_program **lfl_newprogram(lua_State *L, const lfl_progtype *be) {
  exec_program **slot = (exec_program **)lua_newuserdatauv(L, sizeof *slot, 0);
  *slot = NULL;
  luaL_setmetatable(L, be->type);
  return slot;
}

int lfl_program_raise(lua_State *L, exec_program *pr, const fl_err *e) {
  const char *log = exec_program_log(pr);
  if (e->code == FL_ECOMPILE && log && *log && !strstr(e->msg, log))
    return luaL_error(L, "%s\n%s", e->msg, log);
  return lfl_raise(L, "compile", e);
}

static int k_gc(lua_State *L) {
  const lfl_progtype *be = backend(L);
  exec_program **slot = (exec_program **)luaL_checkudata(L, 1, be->type);
  exec_program_free(*slot);
  *slot = NULL;
  return 0;
}

/* print(k), k:source() -> the generated source */
static int k_source(lua_State *L) {
  const lfl_progtype *be = backend(L);
  lua_pushstring(L, exec_program_source(lfl_checkprogram(L, 1, be)));
  return 1;
}

/* print(k), k:code([{preamble = true}]) -> the host program (what runs on
** every call, in order), then the kernels; the preamble on request */
static int k_code(lua_State *L) {
  const lfl_progtype *be = backend(L);
  exec_program *pr = lfl_checkprogram(L, 1, be);
  int preamble = 0;
  char *host;
  if (lua_istable(L, 2)) {
    lua_getfield(L, 2, "preamble");
    preamble = lua_toboolean(L, -1);
    lua_pop(L, 1);
  } else if (!lua_isnoneornil(L, 2)) {
    return luaL_error(L, "code: expected an options table {preamble = true}, got %s", luaL_typename(L, 2));
  }
  host = exec_program_host(pr);
  if (!host) return luaL_error(L, "code: out of memory");
  lua_pushstring(L, host);
  free(host);
  lua_pushstring(L, preamble ? exec_program_source(pr) : exec_program_body(pr));
  lua_concat(L, 2);
  return 1;
}

/* k:log() -> the compiler's output */
static int k_log(lua_State *L) {
  const lfl_progtype *be = backend(L);
  lua_pushstring(L, exec_program_log(lfl_checkprogram(L, 1, be)));
  return 1;
}

/* k:compile() -> true; raises with the compiler's log on failure */
static int k_compile(lua_State *L) {
  const lfl_progtype *be = backend(L);
  exec_program *pr = lfl_checkprogram(L, 1, be);
  fl_err e;
  err_clear(&e);
  if (exec_program_compile(pr, &e) != FL_OK) return lfl_program_raise(L, pr, &e);
  lua_pushboolean(L, 1);
  return 1;
}

/* k:try_compile() -> true, or false, the message with the log, and --
** when the compiler is not what failed (no file descriptors left, a full
** disk, Ctrl-C) -- the message alone, for a warning to name the cause
** (the form fl.compile uses to fall back to eager) */
static int k_try_compile(lua_State *L) {
  const lfl_progtype *be = backend(L);
  exec_program *pr = lfl_checkprogram(L, 1, be);
  fl_err e;
  err_clear(&e);
  if (exec_program_compile(pr, &e) == FL_OK) {
    lua_pushboolean(L, 1);
    return 1;
  }
  lua_pushboolean(L, 0);
  lua_pushfstring(L, "%s\n%s", e.msg, exec_program_log(pr));
  if (e.code == FL_ECOMPILE) return 2;
  lua_pushstring(L, e.msg);
  return 3;
}

/* k:run(x, ...) -> outputs */
static int k_run(lua_State *L) {
  const lfl_progtype *be = backend(L);
  exec_program *pr = lfl_checkprogram(L, 1, be);
  const ir_graph *g = pr->plan->g;
  const fl_tensor *in[256];
  fl_tensor *outs;
  fl_err e;
  int i, n = lua_gettop(L) - 1;
  if (n != g->ninputs) return luaL_error(L, "run: expected %d input(s), got %d", g->ninputs, n);
  if (n > 256) return luaL_error(L, "run: too many inputs (%d)", n);
  for (i = 0; i < n; i++) in[i] = lfl_checkdata(L, i + 2, "run");
  /* the results' slots live in a userdata: a raise below frees them */
  outs = lua_newuserdatauv(L, (size_t)(g->nout + 1) * sizeof *outs, 0);
  memset(outs, 0, (size_t)(g->nout + 1) * sizeof *outs);
  err_clear(&e);
  if (be->run(pr, in, n, outs, &e) != FL_OK) {
    for (i = 0; i < g->nout; i++) ten_release(&outs[i]);
    if (e.code == FL_ECOMPILE) return lfl_program_raise(L, pr, &e);
    return lfl_raise(L, "run", &e);
  }
  for (i = 0; i < g->nout; i++) {
    lfl_pushmoved(L, &outs[i]);
  }
  return g->nout;
}

/* k:profile(on) turns per-kernel timing on (counters reset) or off;
** k:profile() -> {runs = n, {name =, ms =, last_ms =, gbps =, ran =,
** kept =, flops =, bytes =, gflops =, intensity =, bound =, roof_pct =},
** ...}: the mean time of each kernel over the profiled runs, the last
** run's, the bandwidth of the mean from the plan's bytes (cost model),
** the profiled runs that launched it, and whether it is kept (reads
** weights only: launched when they change); then where it stands on this
** machine's roofline (exec/roofline.h), at its mean time per launch. */
static int k_profile(lua_State *L) {
  const lfl_progtype *be = backend(L);
  exec_program *pr = lfl_checkprogram(L, 1, be);
  roof_peaks pk;
  fl_err e;
  int k, on_cpu = pr->be->dev == FL_DEV_CPU;
  if (!lua_isnone(L, 2)) {
    if (!lua_isboolean(L, 2))
      return luaL_error(L, "profile: expected true or false, got %s", luaL_typename(L, 2));
    err_clear(&e);
    if (exec_program_set_profile(pr, lua_toboolean(L, 2), &e) != FL_OK) return lfl_raise(L, "profile", &e);
    return 0;
  }
  /* the roofs are this CPU's: a CUDA program's kernels get their counts only */
  memset(&pk, 0, sizeof pk);
  if (pr->profiled_runs > 0 && on_cpu) {
    err_clear(&e);
    if (roof_machine_peaks(&pk, 0, &e) != FL_OK) return lfl_raise(L, "profile", &e);
  }
  lua_createtable(L, pr->plan->nkernels, 1);
  lua_pushinteger(L, (lua_Integer)pr->profiled_runs);
  lua_setfield(L, -2, "runs");
  for (k = 0; k < pr->plan->nkernels && pr->profiled_runs > 0; k++) {
    double ms = pr->kernel_ms[k] / (double)pr->profiled_runs;
    roof_kernel rk;
    roof_kernel_at(pr, k, pr->kernel_ran[k] > 0 ? pr->kernel_ms[k] / (double)pr->kernel_ran[k] : 0,
                   &pk, &rk);
    lua_createtable(L, 0, 12);
    lua_pushstring(L, pr->plan->kernels[k].name); lua_setfield(L, -2, "name");
    lua_pushnumber(L, ms); lua_setfield(L, -2, "ms");
    lua_pushnumber(L, pr->last_ms[k]); lua_setfield(L, -2, "last_ms");
    lua_pushnumber(L, ms > 0 ? (double)pr->plan->kernels[k].bytes / (ms * 1e6) : 0);
    lua_setfield(L, -2, "gbps");
    lua_pushinteger(L, (lua_Integer)pr->kernel_ran[k]); lua_setfield(L, -2, "ran");
    lua_pushboolean(L, exec_kernel_kept(pr, k)); lua_setfield(L, -2, "kept");
    lua_pushinteger(L, (lua_Integer)rk.flops); lua_setfield(L, -2, "flops");
    lua_pushinteger(L, (lua_Integer)rk.bytes); lua_setfield(L, -2, "bytes");
    lua_pushnumber(L, rk.gflops); lua_setfield(L, -2, "gflops");
    lua_pushnumber(L, rk.intensity); lua_setfield(L, -2, "intensity");
    if (on_cpu) {
      lua_pushstring(L, roof_bound_name(rk.bound)); lua_setfield(L, -2, "bound");
      lua_pushnumber(L, rk.roof_pct); lua_setfield(L, -2, "roof_pct");
    }
    lua_rawseti(L, -2, k + 1);
  }
  return 1;
}

/* k:plan() -> the plan it was generated from */
static int k_plan(lua_State *L) {
  const lfl_progtype *be = backend(L);
  exec_program *pr = lfl_checkprogram(L, 1, be);
  lfl_pushplan(L, pr->plan);
  return 1;
}

void lfl_program_type(lua_State *L, const lfl_progtype *be, const luaL_Reg *extra) {
  static const luaL_Reg shared[] = {
    {"compile", k_compile}, {"try_compile", k_try_compile}, {"run", k_run},
    {"source", k_source}, {"code", k_code}, {"log", k_log}, {"profile", k_profile}, {"plan", k_plan},
    {NULL, NULL}
  };
  if (!luaL_newmetatable(L, be->type)) {
    lua_pop(L, 1);
    return;
  }
  lua_pushlightuserdata(L, (void *)be);
  lua_pushcclosure(L, k_gc, 1);
  lua_setfield(L, -2, "__gc");
  lua_pushlightuserdata(L, (void *)be);
  lua_pushcclosure(L, k_code, 1);
  lua_setfield(L, -2, "__tostring");
  lua_newtable(L);
  lua_pushlightuserdata(L, (void *)be);
  luaL_setfuncs(L, shared, 1);
  if (extra) luaL_setfuncs(L, extra, 0);
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "methods");
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
}
