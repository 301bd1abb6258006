/*
** lfl_nn.c -- the nn modules and fl.models: scripting/nn.lua, embedded.
** The Lua source is compiled into the binary and the C module as a byte
** array (scripting/nn_lua.h, generated from nn.lua by make), so a module
** never depends on finding a file at run time and the two always match.
*/
#include "lfl.h"
#include "scripting/nn_lua.h"   /* static const unsigned char nn_lua[] */

/* Run nn.lua with the fl table at fl_index as its argument; the chunk
** fills fl.nn (the table already there, which the REPL's global nn also
** names) and fl.models.  Raises a Lua error when the chunk fails, which
** would be a bug in nn.lua, not a user error.  Leaves the stack as it
** found it. */
int lfl_open_nn(lua_State *L, int fl_index) {
  fl_index = lua_absindex(L, fl_index);
  if (luaL_loadbuffer(L, (const char *)nn_lua, sizeof nn_lua, "=nn.lua") != LUA_OK)
    return lua_error(L);
  lua_pushvalue(L, fl_index);
  lua_call(L, 1, 0);
  return 0;
}
