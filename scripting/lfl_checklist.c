/*
** lfl_checklist.c -- the go-live checklist: fl.checklist is Lua
** (checklist.lua, compiled in as a byte array); this file loads it and
** gives it the few things Lua cannot do by itself: ask whether a stream
** is a terminal (the progress bar is drawn only there), make a private
** directory, and point the kernel cache at one for a while, so that the
** "cold" first call really runs the C compiler instead of finding last
** run's object on disk.
**
** Invariant: the cache directory is the user's again whenever a
** checklist returns, also after an error (checklist.lua restores it
** through fl._cache_use_dir before rethrowing).
*/
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lfl.h"
#include "exec/cache.h"
#include "scripting/checklist_lua.h"  /* static const unsigned char checklist_lua[] */

/* fl._isatty(fd) -> boolean: is file descriptor fd (0, 1, 2) a terminal? */
static int l_isatty(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  luaL_argcheck(L, fd >= 0 && fd <= 1024, 1, "not a file descriptor");
  lua_pushboolean(L, isatty((int)fd) == 1);
  return 1;
}

/* fl._mkdtemp() -> path of a new, empty directory (mode 0700) under
** $TMPDIR or /tmp; the caller removes it. */
static int l_mkdtemp(lua_State *L) {
  const char *tmp = getenv("TMPDIR");
  char path[1024];
  if (!tmp || !*tmp) tmp = "/tmp";
  snprintf(path, sizeof path, "%s/fuselab-checklist-XXXXXX", tmp);
  if (!mkdtemp(path))
    return luaL_error(L, "checklist: cannot make a directory in %s: %s", tmp, strerror(errno));
  lua_pushstring(L, path);
  return 1;
}

/* fl._cache_use_dir(dir | nil) -> the previous $FUSELAB_CACHE_DIR (or
** nil).  Sets (or, for nil, unsets) the variable and makes the cache
** choose its directory again; objects already loaded stay loaded. */
static int l_cache_use_dir(lua_State *L) {
  const char *old = getenv("FUSELAB_CACHE_DIR");
  const char *dir = luaL_optstring(L, 1, NULL);
  if (old) lua_pushstring(L, old); else lua_pushnil(L);
  if (dir ? setenv("FUSELAB_CACHE_DIR", dir, 1) : unsetenv("FUSELAB_CACHE_DIR"))
    return luaL_error(L, "checklist: cannot set FUSELAB_CACHE_DIR: %s", strerror(errno));
  cache_reset_dir();
  return 1;
}

static const luaL_Reg checklist_funcs[] = {
  {"_isatty", l_isatty}, {"_mkdtemp", l_mkdtemp}, {"_cache_use_dir", l_cache_use_dir},
  {NULL, NULL}
};

/* Adds the helpers to the table at lib, then runs checklist.lua with it,
** which defines fl.checklist. */
void lfl_open_checklist(lua_State *L, int lib) {
  lib = lua_absindex(L, lib);
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, checklist_funcs, 0);
  lua_pop(L, 1);
  if (luaL_loadbuffer(L, (const char *)checklist_lua, sizeof checklist_lua,
                      "=checklist.lua") != LUA_OK)
    lua_error(L);
  lua_pushvalue(L, lib);
  lua_call(L, 1, 0);
}
