/*
** lfl_program.c -- what every backend's compiled Program shares as Lua
** sees it: k:compile(), k:try_compile(), k:run(...), k:source(), k:log(),
** print(k), collection.  The backend (lfl_plan.c for C, lfl_cuda.c for
** CUDA) describes itself in an lfl_backend; the methods find it in their
** upvalue.
** Invariant: a Program userdata holds one program or, once collected,
** NULL; it is created before the program, so an error between the two
** leaks nothing.
*/
#include <string.h>

#include "lfl.h"

static const lfl_backend *backend(lua_State *L) {
  return (const lfl_backend *)lua_touserdata(L, lua_upvalueindex(1));
}

void *lfl_checkprogram(lua_State *L, int idx, const lfl_backend *be) {
  void **slot = (void **)luaL_checkudata(L, idx, be->type);
  if (!*slot) luaL_argerror(L, idx, "program has been released");
  return *slot;
}

void **lfl_newprogram(lua_State *L, const lfl_backend *be) {
  void **slot = (void **)lua_newuserdatauv(L, sizeof *slot, 0);
  *slot = NULL;
  luaL_setmetatable(L, be->type);
  return slot;
}

int lfl_program_raise(lua_State *L, const lfl_backend *be, void *pr, const fl_err *e) {
  const char *log = be->log(pr);
  if (e->code == FL_ECOMPILE && log && *log && !strstr(e->msg, log))
    return luaL_error(L, "%s\n%s", e->msg, log);
  return lfl_raise(L, "compile", e);
}

static int k_gc(lua_State *L) {
  const lfl_backend *be = backend(L);
  void **slot = (void **)luaL_checkudata(L, 1, be->type);
  be->destroy(*slot);
  *slot = NULL;
  return 0;
}

/* print(k), k:source() -> the generated source */
static int k_source(lua_State *L) {
  const lfl_backend *be = backend(L);
  lua_pushstring(L, be->source(lfl_checkprogram(L, 1, be)));
  return 1;
}

/* k:log() -> the compiler's output */
static int k_log(lua_State *L) {
  const lfl_backend *be = backend(L);
  lua_pushstring(L, be->log(lfl_checkprogram(L, 1, be)));
  return 1;
}

/* k:compile() -> true; raises with the compiler's log on failure */
static int k_compile(lua_State *L) {
  const lfl_backend *be = backend(L);
  void *pr = lfl_checkprogram(L, 1, be);
  fl_err e;
  err_clear(&e);
  if (be->compile(pr, &e) != FL_OK) return lfl_program_raise(L, be, pr, &e);
  lua_pushboolean(L, 1);
  return 1;
}

/* k:try_compile() -> true, or false and the message with the log (the
** form fl.compile uses to fall back to eager) */
static int k_try_compile(lua_State *L) {
  const lfl_backend *be = backend(L);
  void *pr = lfl_checkprogram(L, 1, be);
  fl_err e;
  err_clear(&e);
  if (be->compile(pr, &e) == FL_OK) {
    lua_pushboolean(L, 1);
    return 1;
  }
  lua_pushboolean(L, 0);
  lua_pushfstring(L, "%s\n%s", e.msg, be->log(pr));
  return 2;
}

/* k:run(x, ...) -> outputs */
static int k_run(lua_State *L) {
  const lfl_backend *be = backend(L);
  void *pr = lfl_checkprogram(L, 1, be);
  const ir_graph *g = be->graph(pr);
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
    if (e.code == FL_ECOMPILE) return lfl_program_raise(L, be, pr, &e);
    return lfl_raise(L, "run", &e);
  }
  for (i = 0; i < g->nout; i++) {
    lfl_pushmoved(L, &outs[i]);
  }
  return g->nout;
}

void lfl_program_type(lua_State *L, const lfl_backend *be, const luaL_Reg *extra) {
  static const luaL_Reg shared[] = {
    {"compile", k_compile}, {"try_compile", k_try_compile}, {"run", k_run},
    {"source", k_source}, {"log", k_log},
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
  lua_pushcclosure(L, k_source, 1);
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
