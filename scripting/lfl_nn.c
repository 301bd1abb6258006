/*
** lfl_nn.c -- the nn modules and fl.models (scripting/nn.lua), the losses
** (scripting/loss.lua), fl.optim (scripting/optim.lua) and training
** checkpoints (scripting/checkpoint.lua) and language models
** (scripting/llm.lua), embedded.  The Lua sources are
** compiled into the binary and the C module as byte arrays
** (scripting/X_lua.h, generated from X.lua by make), so a module never
** depends on finding a file at run time and the two always match.
*/
#include "lfl.h"
#include "scripting/nn_lua.h"          /* static const unsigned char nn_lua[] */
#include "scripting/loss_lua.h"        /* loss_lua[] */
#include "scripting/optim_lua.h"       /* optim_lua[] */
#include "scripting/checkpoint_lua.h"  /* checkpoint_lua[] */
#include "scripting/llm_lua.h"         /* llm_lua[] */

/* Run one embedded chunk with the table at fl_index as its argument. */
static void run_chunk(lua_State *L, int fl_index, const unsigned char *src, size_t n,
                      const char *name) {
  if (luaL_loadbuffer(L, (const char *)src, n, name) != LUA_OK) lua_error(L);
  lua_pushvalue(L, fl_index);
  lua_call(L, 1, 0);
}

/* Run nn.lua, then loss.lua, optim.lua and checkpoint.lua (which add to
** what nn.lua made), each with the fl table at fl_index as its argument; nn.lua fills
** fl.nn (the table already there, which the REPL's global nn also names)
** and fl.models.  Raises a Lua error when a chunk fails, which would be a
** bug in it, not a user error.  Leaves the stack as it found it. */
int lfl_open_nn(lua_State *L, int fl_index) {
  fl_index = lua_absindex(L, fl_index);
  run_chunk(L, fl_index, nn_lua, sizeof nn_lua, "=nn.lua");
  run_chunk(L, fl_index, loss_lua, sizeof loss_lua, "=loss.lua");
  run_chunk(L, fl_index, optim_lua, sizeof optim_lua, "=optim.lua");
  run_chunk(L, fl_index, checkpoint_lua, sizeof checkpoint_lua, "=checkpoint.lua");
  run_chunk(L, fl_index, llm_lua, sizeof llm_lua, "=llm.lua");
  return 0;
}
