/*
** lfl_measure.c -- fl.measure and fl.compare_times: every time fuselab
** shows (tour, lessons, checklist, report, the REPL's :time,
** FUSELAB_DEBUG=2) goes through exec/measure.c, so each is a median with
** its spread and a noisy flag, and each "faster" has a margin.
**
**   fl.measure(f, {args=, runs=, warmup=, budget_s=})  times f(args...)
**   fl.measure({t1, t2, ...})                           summarizes given ms
**   fl.compare_times(a, b [, {names={"a", "b"}}])       a verdict
**
** Invariant: a summary table carries every field meas_summary has (in ms),
** so compare_times reads back exactly what measure computed.
*/
#include <stdlib.h>
#include <string.h>

#include "lfl.h"
#include "exec/measure.h"

#define MAX_RUNS 10000

static const char *const measure_keys[] = {"args", "runs", "warmup", "budget_s", NULL};

static int summary_tostring(lua_State *L) {
  lua_getfield(L, 1, "text");
  return 1;
}

/* Pushes s (in ms) as a summary table: median_ms q1_ms q3_ms min_ms max_ms
** runs spread others stall cores busy noisy noise text. */
void lfl_push_summary(lua_State *L, const meas_summary *s) {
  char buf[256];
  lua_createtable(L, 0, 14);
  lua_pushnumber(L, s->median); lua_setfield(L, -2, "median_ms");
  lua_pushnumber(L, s->q1); lua_setfield(L, -2, "q1_ms");
  lua_pushnumber(L, s->q3); lua_setfield(L, -2, "q3_ms");
  lua_pushnumber(L, s->min); lua_setfield(L, -2, "min_ms");
  lua_pushnumber(L, s->max); lua_setfield(L, -2, "max_ms");
  lua_pushinteger(L, s->n); lua_setfield(L, -2, "runs");
  lua_pushnumber(L, s->spread); lua_setfield(L, -2, "spread");
  if (s->others >= 0) { lua_pushnumber(L, s->others); lua_setfield(L, -2, "others"); }
  if (s->stall >= 0) { lua_pushnumber(L, s->stall); lua_setfield(L, -2, "stall"); }
  lua_pushinteger(L, s->cores); lua_setfield(L, -2, "cores");
  lua_pushboolean(L, s->busy); lua_setfield(L, -2, "busy");
  lua_pushboolean(L, s->noisy); lua_setfield(L, -2, "noisy");
  lua_pushstring(L, meas_noise_reason(s, buf, sizeof buf)); lua_setfield(L, -2, "noise");
  lua_pushstring(L, meas_format(s, "ms", buf, sizeof buf)); lua_setfield(L, -2, "text");
  if (luaL_newmetatable(L, "fuselab.timing")) {
    lua_pushcfunction(L, summary_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_setmetatable(L, -2);
}

/* The summary table at idx (as lfl_push_summary makes it) read back. */
int lfl_to_summary(lua_State *L, int idx, meas_summary *s, const char *where) {
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx) || lua_getfield(L, idx, "median_ms") != LUA_TNUMBER)
    return luaL_error(L, "%s: expected a timing as fl.measure returns it, got %s", where,
                      luaL_typename(L, idx));
  lua_pop(L, 1);
  memset(s, 0, sizeof *s);
  s->median = lfl_num_field(L, idx, "median_ms", 0);
  s->q1 = lfl_num_field(L, idx, "q1_ms", s->median);
  s->q3 = lfl_num_field(L, idx, "q3_ms", s->median);
  s->min = lfl_num_field(L, idx, "min_ms", s->q1);
  s->max = lfl_num_field(L, idx, "max_ms", s->q3);
  s->n = (int)lfl_num_field(L, idx, "runs", 1);
  s->spread = lfl_num_field(L, idx, "spread", 0);
  s->others = lfl_num_field(L, idx, "others", -1);
  s->stall = lfl_num_field(L, idx, "stall", -1);
  s->cores = (int)lfl_num_field(L, idx, "cores", 1);
  s->busy = lfl_bool_field(L, idx, "busy");
  s->noisy = lfl_bool_field(L, idx, "noisy");
  return 0;
}

static lua_Integer int_opt(lua_State *L, int t, const char *k, lua_Integer def, lua_Integer lo,
                           lua_Integer hi) {
  lua_Integer v = def;
  if (lua_getfield(L, t, k) != LUA_TNIL) {
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < lo || lua_tointeger(L, -1) > hi)
      luaL_error(L, "measure: option %s must be an integer from %d to %d, got %s", k, (int)lo,
                 (int)hi, luaL_tolstring(L, -1, NULL));
    v = lua_tointeger(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

/* One timed call of the value at f with the args listed at args (0: none),
** then fl.synchronize (a GPU's work counts); returns ms. */
static double timed_call(lua_State *L, int f, int args, int sync) {
  int top = lua_gettop(L), n = args ? (int)luaL_len(L, args) : 0, i;
  double t0, dt;
  luaL_checkstack(L, n + 4, "measure: too many arguments");
  lua_pushvalue(L, f);
  for (i = 1; i <= n; i++) lua_geti(L, args, i);
  t0 = meas_now();        /* a clock read only: the window's /proc reads stay outside */
  lua_call(L, n, 0);
  if (sync) {
    lua_pushvalue(L, sync);
    lua_call(L, 0, 0);
  }
  dt = meas_now() - t0;
  lua_settop(L, top);
  return dt * 1e3;
}

/* Whether the value at idx can be called. */
static int callable(lua_State *L, int idx) {
  if (lua_type(L, idx) == LUA_TFUNCTION) return 1;
  if (luaL_getmetafield(L, idx, "__call") == LUA_TNIL) return 0;
  lua_pop(L, 1);
  return 1;
}

/* fl.measure(f [, opts]) or fl.measure({ms, ...}) -> summary */
static int l_measure(lua_State *L) {
  meas_summary s;
  meas_window w;
  double *t, budget = 1.0, start;
  int args = 0, sync = 0, n = 0, i;
  lua_Integer runs, warmup;
  if (lua_type(L, 1) == LUA_TTABLE && !callable(L, 1)) {
    lua_Integer m = luaL_len(L, 1), k;
    if (m > MAX_RUNS) return luaL_error(L, "measure: at most %d times, got %d", MAX_RUNS, (int)m);
    t = (double *)lua_newuserdatauv(L, (size_t)(m > 0 ? m : 1) * sizeof *t, 0);
    for (k = 1; k <= m; k++) {
      lua_rawgeti(L, 1, k);
      if (!lua_isnumber(L, -1))
        return luaL_error(L, "measure: times[%d] must be a number of ms, got %s", (int)k,
                          luaL_typename(L, -1));
      t[k - 1] = lua_tonumber(L, -1);
      lua_pop(L, 1);
    }
    meas_summarize(t, (int)m, NULL, &s);
    lfl_push_summary(L, &s);
    return 1;
  }
  if (!callable(L, 1))
    return luaL_error(L, "measure: expected a function to time or a list of times, got %s",
                      luaL_typename(L, 1));
  lua_settop(L, 2);
  if (!lua_isnil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, 2)) {
      const char *const *k = measure_keys;
      lua_pop(L, 1);
      while (*k && !(lua_type(L, -1) == LUA_TSTRING && strcmp(*k, lua_tostring(L, -1)) == 0)) k++;
      if (!*k)
        return luaL_error(L, "measure: unknown option '%s' (expected args, runs, warmup, budget_s)",
                          luaL_tolstring(L, -1, NULL));
    }
    if (lua_getfield(L, 2, "args") == LUA_TTABLE) args = lua_gettop(L);
    else if (!lua_isnil(L, -1)) return luaL_error(L, "measure: option args must be a list");
    runs = int_opt(L, 2, "runs", 20, 1, MAX_RUNS);
    warmup = int_opt(L, 2, "warmup", 1, 0, MAX_RUNS);
    budget = lfl_num_field(L, 2, "budget_s", budget);
  } else {
    runs = 20;
    warmup = 1;
  }
  lua_getfield(L, lua_upvalueindex(1), "synchronize");
  if (lua_isfunction(L, -1)) sync = lua_gettop(L);
  t = (double *)lua_newuserdatauv(L, (size_t)runs * sizeof *t, 0);
  for (i = 0; i < warmup; i++) timed_call(L, 1, args, sync);
  meas_begin(&w);
  start = w.wall;
  /* past the budget, stop once 5 runs are in: a slow function still gets
  ** a median of several, a fast one all its runs */
  for (n = 0; n < runs; n++) {
    t[n] = timed_call(L, 1, args, sync);
    if (n + 1 >= 5 && meas_now() - start > budget) { n++; break; }
  }
  meas_summarize(t, n, &w, &s);
  lfl_push_summary(L, &s);
  return 1;
}

/* fl.compare_times(a, b [, {names = {"compiled", "eager"}}]) ->
** {verdict = 1 | -1 | 0, faster = name | nil, ratio, margin, text} */
static int l_compare_times(lua_State *L) {
  meas_summary a, b;
  const char *na = "a", *nb = "b";
  double ratio, margin;
  int v;
  lfl_to_summary(L, 1, &a, "compare_times");
  lfl_to_summary(L, 2, &b, "compare_times");
  if (lua_istable(L, 3) && lua_getfield(L, 3, "names") == LUA_TTABLE) {
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    if (lua_isstring(L, -2)) na = lua_tostring(L, -2);
    if (lua_isstring(L, -1)) nb = lua_tostring(L, -1);
  }
  v = meas_verdict(&a, &b, &ratio, &margin);
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, v); lua_setfield(L, -2, "verdict");
  if (v) { lua_pushstring(L, v > 0 ? na : nb); lua_setfield(L, -2, "faster"); }
  lua_pushnumber(L, ratio); lua_setfield(L, -2, "ratio");
  lua_pushnumber(L, margin); lua_setfield(L, -2, "margin");
  if (v > 0) {
    char buf[160];
    snprintf(buf, sizeof buf, "%s is %.2fx faster than %s", na, ratio, nb);
    lua_pushstring(L, buf);
  } else if (v < 0) {
    char buf[160];
    snprintf(buf, sizeof buf, "%s is %.2fx faster than %s", nb, 1 / ratio, na);
    lua_pushstring(L, buf);
  } else {
    char buf[200];
    snprintf(buf, sizeof buf, "no clear difference here (%s/%s = %.2fx, within the noise: a "
             "difference needs more than %.0f%%%s)", nb, na, ratio, margin * 100,
             a.noisy || b.noisy ? ", the timing is noisy" : "");
    lua_pushstring(L, buf);
  }
  lua_setfield(L, -2, "text");
  return 1;
}

/* fl._break_even(cold_ms, eager_ms, steady_ms) -> calls, or nil when
** steady is no faster (meas_break_even) */
static int l_break_even(lua_State *L) {
  double n = meas_break_even(luaL_checknumber(L, 1), luaL_checknumber(L, 2), luaL_checknumber(L, 3));
  if (n < 0) lua_pushnil(L);
  else lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

static const luaL_Reg measure_funcs[] = {
  {"compare_times", l_compare_times},
  {"_break_even", l_break_even},
  {NULL, NULL}
};

void lfl_open_measure(lua_State *L, int lib) {
  lib = lua_absindex(L, lib);
  lua_pushvalue(L, lib);                       /* for C code that calls back into fl */
  lua_setfield(L, LUA_REGISTRYINDEX, LFL_LIB_KEY);
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, measure_funcs, 0);
  lua_pushvalue(L, lib);
  lua_pushcclosure(L, l_measure, 1);
  lua_setfield(L, -2, "measure");
  lua_pop(L, 1);
}
