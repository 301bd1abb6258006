/*
** lfl_optim.c -- fl._adam_step and fl._sgd_step: the fused updates of
** cpu/optim.h for scripting/optim.lua, which falls back to the same
** formula as tensor ops when they answer false (a dtype or layout they
** do not take).  Internal: optim.lua is their one caller.
*/
#include "lfl.h"
#include "cpu/optim.h"

/* A tensor with its values (not lazy), or NULL for nil. */
static fl_tensor *opt_tensor(lua_State *L, int idx, const char *what) {
  return lua_isnoneornil(L, idx) ? NULL : lfl_checkdata(L, idx, what);
}

/* fl._adam_step(p, grad, m, v, vmax|nil, {lr, beta1, beta2, eps,
** weight_decay, decoupled, maximize, step}) -> true when done */
static int l_adam_step(lua_State *L) {
  fl_tensor *p = lfl_checkdata(L, 1, "adam"), *g = lfl_checkdata(L, 2, "adam");
  fl_tensor *m = lfl_checkdata(L, 3, "adam"), *v = lfl_checkdata(L, 4, "adam");
  fl_tensor *x = opt_tensor(L, 5, "adam");
  cpu_adam o;
  fl_err e;
  int rc;
  luaL_checktype(L, 6, LUA_TTABLE);
  o.lr = lfl_num_field(L, 6, "lr", 0);
  o.beta1 = lfl_num_field(L, 6, "beta1", 0);
  o.beta2 = lfl_num_field(L, 6, "beta2", 0);
  o.eps = lfl_num_field(L, 6, "eps", 0);
  o.weight_decay = lfl_num_field(L, 6, "weight_decay", 0);
  o.decoupled = lfl_bool_field(L, 6, "decoupled");
  o.maximize = lfl_bool_field(L, 6, "maximize");
  o.step = (int64_t)lfl_num_field(L, 6, "step", 0);
  if (o.step < 1) return luaL_error(L, "adam: step must be >= 1, got %d", (int)o.step);
  lfl_ag_check_write(L, p, g, "adam");
  err_clear(&e);
  rc = cpu_adam_step(p, g, m, v, x, &o, &e);
  if (rc != FL_OK && rc != FL_EUNSUPPORTED) return lfl_raise(L, "adam", &e);
  lua_pushboolean(L, rc == FL_OK);
  return 1;
}

/* fl._sgd_step(p, grad, buf|nil, {lr, momentum, dampening, weight_decay,
** nesterov, maximize, first}) -> true when done */
static int l_sgd_step(lua_State *L) {
  fl_tensor *p = lfl_checkdata(L, 1, "sgd"), *g = lfl_checkdata(L, 2, "sgd");
  fl_tensor *b = opt_tensor(L, 3, "sgd");
  cpu_sgd o;
  fl_err e;
  int rc;
  luaL_checktype(L, 4, LUA_TTABLE);
  o.lr = lfl_num_field(L, 4, "lr", 0);
  o.momentum = lfl_num_field(L, 4, "momentum", 0);
  o.dampening = lfl_num_field(L, 4, "dampening", 0);
  o.weight_decay = lfl_num_field(L, 4, "weight_decay", 0);
  o.nesterov = lfl_bool_field(L, 4, "nesterov");
  o.maximize = lfl_bool_field(L, 4, "maximize");
  o.first = lfl_bool_field(L, 4, "first");
  lfl_ag_check_write(L, p, g, "sgd");
  err_clear(&e);
  rc = cpu_sgd_step(p, g, b, &o, &e);
  if (rc != FL_OK && rc != FL_EUNSUPPORTED) return lfl_raise(L, "sgd", &e);
  lua_pushboolean(L, rc == FL_OK);
  return 1;
}

void lfl_open_optim(lua_State *L, int lib) {
  static const luaL_Reg funcs[] = {
    {"_adam_step", l_adam_step}, {"_sgd_step", l_sgd_step}, {NULL, NULL}
  };
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, funcs, 0);
  lua_pop(L, 1);
}
