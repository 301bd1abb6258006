/*
** lfl_autograd.c -- autograd at the Lua surface, with PyTorch's names:
** x.requires_grad, x.grad, x.grad_fn, x.is_leaf, x:requires_grad_(),
** x:backward(), x:detach(), x:retain_grad(), fl.no_grad, fl.enable_grad,
** fl.grad, and {requires_grad = true} on the factories.  The tape itself
** is graph/autograd.c; this file only attaches its fns to tensors and
** records every op lfl_dispatch_eager runs (the one dispatch point).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lfl.h"
#include "cpu/eager.h"
#include "exec/measure.h"
#include "exec/pair.h"
#include "exec/program.h"
#include "graph/autograd.h"
#include "graph/rng.h"

#define AG(t) (lfl_ud_of(t)->ag)

int lfl_requires_grad(const fl_tensor *t) { return t && AG(t) != NULL; }

const char *lfl_ag_label(const fl_tensor *t, char *buf, size_t n) {
  char name[64];
  if (!AG(t)) return NULL;
  if (AG(t)->kind == AG_LEAF) snprintf(buf, n, "requires grad");
  else snprintf(buf, n, "grad_fn %s", ag_fn_name(AG(t), name, sizeof name));
  return buf;
}

/* A leaf's fn belongs to its tensor alone, so once the tensor goes its
** .grad can no longer be read: it goes too, and with it the cycle a
** backward with create_graph makes (x.grad's history reaches x). */
void lfl_ag_release(fl_tensor *t) {
  ag_fn *f = AG(t);
  if (f && f->kind == AG_LEAF && f->grad_fn) {
    ag_fn *g = f->grad_fn;
    f->grad_fn = NULL;
    ten_release(&f->grad);
    ag_unref(g);
  }
  ag_unref(f);
  AG(t) = NULL;
}

static int float_dtype(const fl_tensor *t) { return dtype_is_float(t->m.dtype); }

/* The dropout mask the forward drew (its scaled keep pattern): the same
** draw again over ones, from the stream position the forward started at.
** A device draws the host's numbers (the same stream), so the host draws
** it and it moves to x's device. */
static int dropout_mask(const fl_tensor *x, const op_attrs *a, uint64_t key,
                        uint64_t block, fl_tensor *mask, fl_err *e) {
  fl_tensor ones = {0}, host = {0};
  const fl_tensor *in[1];
  uint64_t k2, b2;
  int rc;
  fl_meta m = x->m;
  m.wrapped = 0;
  m.device = FL_DEV_CPU;
  if ((rc = ten_empty(&ones, &m, e)) != FL_OK) return rc;
  ten_fill(&ones, 1.0);
  in[0] = &ones;
  rng_get_state(&k2, &b2);
  rng_set_state(key, block);
  rc = eager_apply(OP_DROPOUT, in, 1, a, &host, e);
  rng_set_state(k2, b2);
  ten_release(&ones);
  if (rc == FL_OK) rc = lfl_move(mask, &host, x->m.device, e);
  ten_release(&host);
  return rc;
}

void lfl_ag_record(lua_State *L, fl_op op, const fl_tensor *const *in, int nin,
                   const op_attrs *a, fl_tensor *out, uint64_t key, uint64_t block) {
  ag_fn *next[64], *f;
  fl_tensor mask = {0};
  fl_err e;
  int k, any = 0;
  if (!ag_grad_enabled() || !op_differentiable(op) || !float_dtype(out)) return;
  for (k = 0; k < nin && k < 64; k++) {
    next[k] = in[k] ? AG(in[k]) : NULL;
    if (next[k]) any = 1;
  }
  if (!any) return;
  err_clear(&e);
  if (op == OP_DROPOUT && dropout_mask(in[0], a, key, block, &mask, &e) != FL_OK)
    lfl_raise(L, "dropout", &e);
  f = ag_record(op, a, in, nin, next, out, mask.st ? &mask : NULL, &e);
  ten_release(&mask);
  if (!f) lfl_raise(L, op_name(op), &e);
  AG(out) = f;
}

void lfl_ag_check_write(lua_State *L, const fl_tensor *t, const fl_tensor *src,
                        const char *what) {
  if (!ag_grad_enabled()) return;
  if (lfl_requires_grad(t) && AG(t)->kind == AG_LEAF)
    luaL_error(L, "%s: a leaf tensor that requires grad cannot change in place while "
               "grad mode is on; do it inside fl.no_grad(function() ... end), as an "
               "optimizer does", what);
  if (lfl_requires_grad(t))
    luaL_error(L, "%s: an in-place change of a tensor that requires grad would lose "
               "its history; use the out-of-place op", what);
  if (src && lfl_requires_grad(src))
    luaL_error(L, "%s: writing a value that requires grad into a tensor that does "
               "not would lose its gradient; use the out-of-place op", what);
}

/* ---------------------------------------------------------------------- */
/* fields                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct { ag_fn *f; } gradfn_ud;
#define GRADFN "fl.GradFn"

static void push_gradfn(lua_State *L, ag_fn *f) {
  gradfn_ud *u;
  if (!f) { lua_pushnil(L); return; }
  u = (gradfn_ud *)lua_newuserdatauv(L, sizeof *u, 0);
  u->f = NULL;
  luaL_setmetatable(L, GRADFN);
  ag_ref(f);
  u->f = f;
}

static int gf_gc(lua_State *L) {
  gradfn_ud *u = (gradfn_ud *)luaL_checkudata(L, 1, GRADFN);
  ag_unref(u->f);
  u->f = NULL;
  return 0;
}

static int gf_tostring(lua_State *L) {
  gradfn_ud *u = (gradfn_ud *)luaL_checkudata(L, 1, GRADFN);
  char name[64], s[128];
  ag_fn *f = u->f;
  int k;
  luaL_Buffer b;
  if (!f) { lua_pushstring(L, "<released grad_fn>"); return 1; }
  luaL_buffinit(L, &b);
  luaL_addchar(&b, '<');
  luaL_addstring(&b, ag_fn_name(f, name, sizeof name));
  if (f->kind == AG_OP) {
    luaL_addstring(&b, ": ");
    luaL_addstring(&b, op_name(f->op));
    luaL_addchar(&b, '(');
    for (k = 0; k < f->nin; k++) {
      if (k) luaL_addstring(&b, ", ");
      if (f->in_meta[k].ndim < 0) { luaL_addstring(&b, "none"); continue; }
      luaL_addstring(&b, dtype_name(f->in_meta[k].dtype));
      luaL_addstring(&b, meta_shape_str(&f->in_meta[k], s, sizeof s));
      if (!f->next[k]) luaL_addstring(&b, " no grad");
    }
    luaL_addstring(&b, ") -> ");
    luaL_addstring(&b, dtype_name(f->out_meta.dtype));
    luaL_addstring(&b, meta_shape_str(&f->out_meta, s, sizeof s));
    if (f->freed) luaL_addstring(&b, ", saved values freed");
  } else {
    luaL_addstring(&b, " of ");
    luaL_addstring(&b, dtype_name(f->out_meta.dtype));
    luaL_addstring(&b, meta_shape_str(&f->out_meta, s, sizeof s));
    if (f->kind == AG_CALL) {
      lua_pushfstring(L, ", %d gradient(s)%s", f->nin, f->freed ? ", saved values freed" : "");
      luaL_addvalue(&b);
    }
  }
  luaL_addchar(&b, '>');
  luaL_pushresult(&b);
  return 1;
}

/* g.name, g.next_functions ({fn or false per input}), g.op */
static int gf_index(lua_State *L) {
  gradfn_ud *u = (gradfn_ud *)luaL_checkudata(L, 1, GRADFN);
  const char *k = luaL_checkstring(L, 2);
  char name[64];
  int i;
  if (!u->f) return 0;
  if (strcmp(k, "name") == 0) lua_pushstring(L, ag_fn_name(u->f, name, sizeof name));
  else if (strcmp(k, "op") == 0) {
    if (u->f->kind == AG_OP) lua_pushstring(L, op_name(u->f->op)); else lua_pushnil(L);
  } else if (strcmp(k, "next_functions") == 0) {
    lua_createtable(L, u->f->nin, 0);
    for (i = 0; i < u->f->nin; i++) {
      if (u->f->next[i]) push_gradfn(L, u->f->next[i]); else lua_pushboolean(L, 0);
      lua_rawseti(L, -2, i + 1);
    }
  } else lua_pushnil(L);
  return 1;
}

int lfl_ag_index(lua_State *L, fl_tensor *t, const char *k) {
  ag_fn *f = AG(t);
  if (strcmp(k, "requires_grad") == 0) lua_pushboolean(L, f != NULL);
  else if (strcmp(k, "is_leaf") == 0) lua_pushboolean(L, !f || f->kind == AG_LEAF);
  else if (strcmp(k, "grad_fn") == 0) push_gradfn(L, f && f->kind != AG_LEAF ? f : NULL);
  else if (strcmp(k, "grad") == 0) {
    if (f && f->grad.st) {
      fl_tensor *g = lfl_newtensor(L);
      ten_share(g, &f->grad);
      if ((AG(g) = f->grad_fn) != NULL) ag_ref(f->grad_fn);   /* create_graph */
    } else lua_pushnil(L);
  } else return 0;
  return 1;
}

static void set_requires_grad(lua_State *L, fl_tensor *t, int on, const char *what) {
  fl_err e;
  if (!on) {
    if (AG(t) && AG(t)->kind != AG_LEAF)
      luaL_error(L, "%s: only a leaf's requires_grad can be turned off (this tensor "
                 "comes from %s; use x:detach())", what,
                 AG(t)->kind == AG_OP ? op_name(AG(t)->op) : "a compiled function");
    lfl_ag_release(t);
    return;
  }
  if (AG(t)) return;
  if (!dtype_is_float(t->m.dtype))
    luaL_error(L, "%s: only floating-point tensors can require gradients (this one "
               "is %s)", what, dtype_name(t->m.dtype));
  if (lfl_islazy(t))
    luaL_error(L, "%s: a tensor of a capture in progress cannot start requiring "
               "gradients", what);
  err_clear(&e);
  if (!(AG(t) = ag_leaf(&t->m, &e))) lfl_raise(L, what, &e);
}

int lfl_ag_newindex(lua_State *L, fl_tensor *t, const char *k, int v) {
  if (strcmp(k, "requires_grad") == 0) {
    if (lua_type(L, v) != LUA_TBOOLEAN)
      luaL_error(L, "requires_grad: expected a boolean, got %s", lfl_typename(L, v));
    set_requires_grad(L, t, lua_toboolean(L, v), "requires_grad");
    return 1;
  }
  if (strcmp(k, "grad") == 0) {
    ag_fn *f = AG(t);
    fl_tensor *g;
    if (lua_isnil(L, v)) {
      if (f) {
        ag_fn *old = f->grad_fn;
        f->grad_fn = NULL;
        ten_release(&f->grad);
        ag_unref(old);
      }
      return 1;
    }
    if (!lfl_istensor(L, v))
      luaL_error(L, "grad: expected a tensor or nil, got %s", lfl_typename(L, v));
    g = lfl_checktensor(L, v);
    if (!f || (f->kind != AG_LEAF && !f->retain))
      luaL_error(L, "grad: this tensor keeps no gradient (it does not require grad, or "
                 "is not a leaf: call x:retain_grad() first)");
    if (!meta_same_shape(&g->m, &t->m) || g->m.dtype != t->m.dtype) {
      char s1[128], s2[128];
      luaL_error(L, "grad: assigned gradient %s%s differs from the tensor's %s%s",
                 dtype_name(g->m.dtype), meta_shape_str(&g->m, s1, sizeof s1),
                 dtype_name(t->m.dtype), meta_shape_str(&t->m, s2, sizeof s2));
    }
    if (g->m.device != t->m.device)
      luaL_error(L, "grad: the assigned gradient is on %s, the tensor on %s",
                 g->m.device == FL_DEV_CPU ? "cpu" : "cuda", t->m.device == FL_DEV_CPU ? "cpu" : "cuda");
    g = lfl_checkdata(L, v, "grad");
    {
      ag_fn *old = f->grad_fn;       /* the values are kept, not a history */
      f->grad_fn = NULL;
      ten_release(&f->grad);
      ten_share(&f->grad, g);
      ag_unref(old);
    }
    return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------------- */
/* methods                                                                 */
/* ---------------------------------------------------------------------- */

static int t_requires_grad_(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  set_requires_grad(L, t, lua_isnone(L, 2) ? 1 : lua_toboolean(L, 2), "requires_grad_");
  lua_settop(L, 1);
  return 1;
}

static int t_detach(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1), *d;
  /* a value being captured: the graph records no gradient either way (its
  ** joint graph's rules decide what flows where), so it is its own detach */
  if (lfl_islazy(t)) { lua_settop(L, 1); return 1; }
  d = lfl_newtensor(L);
  ten_share(d, t);
  return 1;
}

static int t_retain_grad(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  if (!AG(t))
    return luaL_error(L, "retain_grad: this tensor does not require grad");
  if (AG(t)->kind == AG_OP) AG(t)->retain = 1;
  lua_settop(L, 1);
  return 1;
}

/* {retain_graph = bool, create_graph = bool} of backward, and of fl.grad
** with its own keys too: returns retain_graph (by default create_graph,
** as in PyTorch), *create create_graph */
static int retain_opt(lua_State *L, int idx, const char *what, int *create) {
  static const char *const grad_keys[] = {"retain_graph", "grad_outputs", "create_graph",
                                          "allow_unused", NULL};
  static const char *const backward_keys[] = {"retain_graph", "create_graph", NULL};
  int r;
  *create = 0;
  if (lua_isnoneornil(L, idx)) return 0;
  luaL_checktype(L, idx, LUA_TTABLE);
  lfl_checkkeys(L, idx, strcmp(what, "grad") == 0 ? grad_keys : backward_keys, what);
  if (lua_getfield(L, idx, "create_graph") != LUA_TNIL) *create = lua_toboolean(L, -1);
  lua_pop(L, 1);
  r = *create;
  if (lua_getfield(L, idx, "retain_graph") != LUA_TNIL) r = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return r;
}

/* The seed of root t: grad at idx, or 1 for a one-element output (a
** tensor on the stack; with create, a gradient given in another dtype is
** cast by a recorded op, so its own history stays). */
static const fl_tensor *seed_of(lua_State *L, const fl_tensor *t, int idx, const char *what,
                                int create) {
  fl_tensor *s;
  if (!AG(t))
    luaL_error(L, "%s: this tensor does not require grad and has no grad_fn "
               "(nothing it came from requires grad, it was made under fl.no_grad, "
               "or it is the result of a fl.compile'd function that does not return a "
               "loss: compiled training compiles functions whose first result is a "
               "float scalar; compute the loss inside the compiled function, or run "
               "it uncompiled)", what);
  if (idx && !lua_isnoneornil(L, idx)) {
    fl_tensor *g = lfl_checkdata(L, idx, what);
    if (!meta_same_shape(&g->m, &t->m)) {
      char s1[128], s2[128];
      luaL_error(L, "%s: the gradient's shape %s differs from the output's %s", what,
                 meta_shape_str(&g->m, s1, sizeof s1), meta_shape_str(&t->m, s2, sizeof s2));
    }
    if (!dtype_is_float(g->m.dtype))
      luaL_error(L, "%s: the gradient must be floating point, got %s", what,
                 dtype_name(g->m.dtype));
    if (g->m.dtype == t->m.dtype) return g;
    if (create && AG(g)) {
      op_attrs a;
      const fl_tensor *in[1];
      in[0] = g;
      op_attrs_init(OP_TO, &a);
      a.dtype = t->m.dtype;
      lfl_dispatch_eager(L, OP_TO, in, 1, &a);
      s = lfl_totensor(L, -1);
      if (!AG(s)) {                  /* grad mode off: record it all the same */
        ag_fn *next[1];
        fl_err e;
        next[0] = AG(g);
        err_clear(&e);
        if (!(AG(s) = ag_record(OP_TO, &a, in, 1, next, s, NULL, &e))) lfl_raise(L, what, &e);
      }
      return s;
    }
    {
      /* the gradient in the output's dtype, where it is */
      const fl_tensor *in[1];
      op_attrs a;
      fl_err e;
      in[0] = g;
      op_attrs_init(OP_TO, &a);
      a.dtype = t->m.dtype;
      s = lfl_newtensor(L);
      err_clear(&e);
      if (lfl_apply(OP_TO, in, 1, &a, s, &e) != FL_OK) lfl_raise(L, what, &e);
      return s;
    }
  }
  if (meta_numel(&t->m) != 1) {
    char s1[128];
    luaL_error(L, "%s: the output has shape %s: backward() without a gradient needs "
               "one element (a loss); pass y:backward(grad) with the output's shape",
               what, meta_shape_str(&t->m, s1, sizeof s1));
  }
  {
    fl_meta m = t->m;
    m.wrapped = 0;
    fl_err e;
    s = lfl_pushempty(L, &m, what);
    err_clear(&e);
    if (lfl_fill(s, 1.0, &e) != FL_OK) lfl_raise(L, what, &e);
  }
  return s;
}

/* FUSELAB_DEBUG=autograd: each backward prints the time its graph spent
** in each op (stderr), to see what a backward costs. */
static double op_ms[OP_COUNT];
static int op_calls[OP_COUNT];

static int timed_apply(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                       fl_tensor *out, fl_err *e) {
  double t0 = meas_now();
  int rc = lfl_apply(op, in, nin, a, out, e);
  op_ms[op] += (meas_now() - t0) * 1e3;
  op_calls[op]++;
  return rc;
}

static int debug_autograd(void) {
  const char *d = getenv("FUSELAB_DEBUG");
  return d && strstr(d, "autograd") != NULL;
}

static void print_op_times(void) {
  double total = 0;
  int k;
  for (k = 0; k < OP_COUNT; k++) total += op_ms[k];
  fprintf(stderr, "backward: %.2f ms in ops:", total);
  for (k = 0; k < OP_COUNT; k++)
    if (op_calls[k]) fprintf(stderr, " %s %d x %.2f ms;", op_name((fl_op)k), op_calls[k], op_ms[k]);
  fprintf(stderr, "\n");
  memset(op_ms, 0, sizeof op_ms);
  memset(op_calls, 0, sizeof op_calls);
}

/* seed_fns: with create, each seed's fn (NULL: none); wfn: with create
** and want, what the gradients' fns go to. */
static int run_backward(lua_State *L, ag_fn **roots, const fl_tensor **seeds, ag_fn **seed_fns,
                        int n, ag_fn **want, int nwant, fl_tensor *wout, ag_fn **wfn,
                        int retain, int create, const char *what) {
  fl_err e;
  int rc;
  ir_apply_fn apply = debug_autograd() ? timed_apply : lfl_apply;
  err_clear(&e);
  rc = ag_backward(roots, seeds, seed_fns, n, want, nwant, wout, wfn, retain, create, apply, &e);
  if (rc == FL_ENOMEM) {
    lfl_collect(L);
    err_clear(&e);
    rc = ag_backward(roots, seeds, seed_fns, n, want, nwant, wout, wfn, retain, create, apply, &e);
  }
  if (apply == timed_apply) print_op_times();
  if (rc != FL_OK) return lfl_raise(L, what, &e);
  return 0;
}

/* y:backward([grad] [, {retain_graph = bool, create_graph = bool}]) */
static int t_backward(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  const fl_tensor *seed;
  /* a loss still lazy under a trace: its segment runs first (a break),
  ** which gives it its history when that segment trains compiled */
  if (lfl_islazy(t)) t = lfl_checkdata(L, 1, "backward");
  ag_fn *root, *sfn;
  int opts = lua_istable(L, 2) ? 2 : 3, retain, create;
  retain = retain_opt(L, opts, "backward", &create);
  seed = seed_of(L, t, opts == 3 ? 2 : 0, "backward", create);
  root = AG(t);
  sfn = create ? AG(seed) : NULL;
  run_backward(L, &root, &seed, &sfn, 1, NULL, 0, NULL, NULL, retain, create, "backward");
  return 0;
}

/* ---------------------------------------------------------------------- */
/* library                                                                 */
/* ---------------------------------------------------------------------- */

/* fl.no_grad(fn, ...) / fl.enable_grad(fn, ...): fn's results, grad mode
** restored however fn ends. */
static int with_grad(lua_State *L, int on) {
  int was = ag_grad_enabled(), rc, n;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  ag_set_grad_enabled(on);
  rc = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  ag_set_grad_enabled(was);
  if (rc != LUA_OK) return lua_error(L);
  n = lua_gettop(L);
  return n;
}
static int l_no_grad(lua_State *L) { return with_grad(L, 0); }
static int l_enable_grad(lua_State *L) { return with_grad(L, 1); }
/* fl._autograd_live(): fns alive now (tests: the tape is freed) */
static int l_autograd_live(lua_State *L) { lua_pushinteger(L, ag_live()); return 1; }
static int l_is_grad_enabled(lua_State *L) { lua_pushboolean(L, ag_grad_enabled()); return 1; }
static int l_set_grad_enabled(lua_State *L) {
  luaL_checktype(L, 1, LUA_TBOOLEAN);
  ag_set_grad_enabled(lua_toboolean(L, 1));
  return 0;
}

/* A tensor or an array of tensors at idx as a list on the stack (a table
** at its own slot); returns the count. */
static int tensor_list(lua_State *L, int idx, const char *what, const char *name) {
  int n, k;
  if (lfl_istensor(L, idx)) {
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, idx);
    lua_rawseti(L, -2, 1);
    lua_replace(L, idx);
  }
  if (!lua_istable(L, idx)) luaL_error(L, "%s: %s must be a tensor or a list of tensors", what, name);
  n = (int)lua_rawlen(L, idx);
  if (n < 1 || n > 256) luaL_error(L, "%s: %s: 1 to 256 tensors, got %d", what, name, n);
  for (k = 1; k <= n; k++) {
    lua_rawgeti(L, idx, k);
    if (!lfl_istensor(L, -1)) luaL_error(L, "%s: %s[%d] is not a tensor", what, name, k);
    lua_pop(L, 1);
  }
  return n;
}

/* fl.grad(outputs, inputs [, {grad_outputs =, retain_graph =, create_graph =,
** allow_unused =}]): the gradients of the outputs with respect to each
** input, as a list; no .grad changes. */
static int l_grad(lua_State *L) {
  ag_fn *roots[256], *want[256], *sfn[256], *wfn[256];
  const fl_tensor *seeds[256];
  fl_tensor *wout;
  int nout, nin, k, retain, create, allow = 0, go = 0;
  lua_settop(L, 3);
  nout = tensor_list(L, 1, "grad", "outputs");
  nin = tensor_list(L, 2, "grad", "inputs");
  retain = retain_opt(L, 3, "grad", &create);
  if (!lua_isnil(L, 3)) {
    if (lua_getfield(L, 3, "allow_unused") != LUA_TNIL) allow = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (lua_getfield(L, 3, "grad_outputs") != LUA_TNIL) {
      go = lua_gettop(L);
      if (tensor_list(L, go, "grad", "grad_outputs") != nout)
        luaL_error(L, "grad: grad_outputs must give one gradient per output");
    } else lua_pop(L, 1);
  }
  for (k = 0; k < nout; k++) {
    fl_tensor *t;
    lua_rawgeti(L, 1, k + 1);
    t = lfl_totensor(L, -1);
    if (go) lua_rawgeti(L, go, k + 1);
    seeds[k] = seed_of(L, t, go ? lua_gettop(L) : 0, "grad", create);
    sfn[k] = create ? AG(seeds[k]) : NULL;
    roots[k] = AG(t);
  }
  for (k = 0; k < nin; k++) {
    fl_tensor *t;
    lua_rawgeti(L, 2, k + 1);
    t = lfl_totensor(L, -1);
    if (!AG(t)) luaL_error(L, "grad: inputs[%d] does not require grad", k + 1);
    want[k] = AG(t);
    lua_pop(L, 1);
  }
  wout = lfl_newslots(L, nin);
  memset(wfn, 0, sizeof wfn);
  run_backward(L, roots, seeds, sfn, nout, want, nin, wout, wfn, retain, create, "grad");
  lua_createtable(L, nin, 0);
  for (k = 0; k < nin; k++) {    /* each fn moves to its tensor first: no error leaks one */
    if (wout[k].st) {
      fl_tensor *r = lfl_pushmoved(L, &wout[k]);
      AG(r) = wfn[k];
      wfn[k] = NULL;
      lua_rawseti(L, -2, k + 1);
    }
  }
  for (k = 0; k < nin; k++)
    if (lua_rawgeti(L, -1, k + 1) == LUA_TNIL) {
      lua_pop(L, 1);
      if (!allow)
        luaL_error(L, "grad: inputs[%d] was not used to compute the outputs (pass "
                   "allow_unused = true to get nil for it)", k + 1);
      lua_pushboolean(L, 0);
      lua_rawseti(L, -2, k + 1);
    } else lua_pop(L, 1);
  return 1;
}

/* fl.backward_graph(y [, grad]): the graph y:backward() would run, unrun:
** its constants are the values the forward saved (named by the op that
** saved them) and the output's gradient; its outputs the leaves'
** gradients.  What a class reads to see what backward keeps. */
static int l_backward_graph(lua_State *L) {
  static const char *const keys[] = {"params", NULL};
  fl_tensor *t = lfl_checktensor(L, 1);
  const fl_tensor *seed;
  ag_fn *root, **who = NULL;
  ir_graph *g;
  fl_err e;
  int opts = 0, gi, j;
  lua_settop(L, 3);
  if (lua_istable(L, 2)) {         /* (y, opts): no gradient given */
    lua_pushvalue(L, 2);
    lua_replace(L, 3);
    lua_pushnil(L);
    lua_replace(L, 2);
  }
  if (!lua_isnil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    lfl_checkkeys(L, 3, keys, "backward_graph");
    opts = 3;
  }
  seed = seed_of(L, t, 2, "backward_graph", 0);
  root = AG(t);
  err_clear(&e);
  if (!(g = ag_backward_graph(&root, &seed, 1, &who, &e))) return lfl_raise(L, "backward_graph", &e);
  lfl_pushgraph(L, g);             /* owns g from here */
  gi = lua_gettop(L);
  if (opts && lua_getfield(L, opts, "params") != LUA_TNIL) {
    int map;
    if (!lua_istable(L, -1)) {
      free(who);
      return luaL_error(L, "backward_graph: params must be a module or a table of named "
                        "tensors, got %s", lfl_typename(L, -1));
    }
    /* a module: its named_parameters(); else a table name -> tensor */
    if (lua_getfield(L, -1, "named_parameters") == LUA_TFUNCTION) {
      lua_insert(L, -2);
      lua_call(L, 1, 1);
    } else lua_pop(L, 1);
    if (!lua_istable(L, -1)) {
      free(who);
      return luaL_error(L, "backward_graph: params must be a module or a table of named tensors");
    }
    map = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, map)) {
      fl_tensor *p = lfl_totensor(L, -1);
      if (p && AG(p) && lua_type(L, -2) == LUA_TSTRING)
        for (j = 0; j < g->nout; j++)
          if (who[j] == AG(p)) {
            char name[256];
            snprintf(name, sizeof name, "grad of %s", lua_tostring(L, -2));
            if (ir_set_name(g, g->outputs[j], name, &e) != FL_OK) {
              free(who);
              return lfl_raise(L, "backward_graph", &e);
            }
          }
      lua_pop(L, 1);
    }
  }
  free(who);
  lua_settop(L, gi);
  return 1;
}

int lfl_ag_push_graph(lua_State *L, int idx) {
  fl_tensor *t = lfl_totensor(L, idx);
  if (!t || !AG(t) || AG(t)->kind != AG_OP) return 0;
  lua_pushcfunction(L, l_backward_graph);
  lua_pushvalue(L, idx);
  lua_call(L, 1, 1);
  return 1;
}

/* fl.zeros(..., {requires_grad = true}) and the other factories: the
** original (upvalue 1, a C function without upvalues, run in this very
** call so its argument errors name it), then requires_grad_ when the
** last argument asks. */
static int factory(lua_State *L) {
  lua_CFunction make = lua_tocfunction(L, lua_upvalueindex(1));
  int n = lua_gettop(L), rg = 0;
  if (n > 0 && lua_type(L, n) == LUA_TTABLE) {
    lua_getfield(L, n, "requires_grad");
    rg = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  n = make(L);
  if (rg && n == 1) {
    fl_tensor *t = lfl_checktensor(L, -1);
    set_requires_grad(L, t, 1, "requires_grad");
  }
  return 1;
}

/* ---------------------------------------------------------------------- */
/* a compiled backward on the tape                                         */
/* ---------------------------------------------------------------------- */

/* What a compiled function's loss keeps for its backward: its pair
** (exec/pair.h) and the values the forward saved for it, in the backward's
** input order.  With tangents (a function whose other results need
** gradients too: the joint graph's tangents), the backward takes the
** loss's gradient and then each other result's after the saved values;
** those results' own histories (tan_call) leave their gradients in tan[]
** first.  Shared by the loss's fn and theirs: freed by the last. */
typedef struct cbw {
  int refs;
  exec_pair *pair;
  fl_tensor *saved;       /* pair->nsaved */
  fl_tensor *tan;         /* pair->ntan: the gradient that reached each, or empty */
  fl_meta *tan_meta;
  fl_meta loss_meta;
} cbw;

static void cbw_clear_tan(cbw *c) {
  int k;
  for (k = 0; k < c->pair->ntan; k++) ten_release(&c->tan[k]);
}

static void cbw_release(void *ctx) {
  cbw *c = ctx;
  int k;
  for (k = 0; k < c->pair->nsaved; k++) ten_release(&c->saved[k]);
  cbw_clear_tan(c);
}

static void cbw_free(void *ctx) {
  cbw *c = ctx;
  if (!c || --c->refs > 0) return;
  cbw_release(c);
  exec_pair_free(c->pair);
  free(c->saved);
  free(c->tan);
  free(c->tan_meta);
  free(c);
}

/* Is the gradient reaching a loss the usual 1 (read on the host)? */
static int seed_is_one(const fl_tensor *g) {
  fl_tensor h = {0};
  fl_err e;
  int one;
  if (meta_numel(&g->m) != 1) return 0;
  err_clear(&e);
  if (lfl_move(&h, g, FL_DEV_CPU, &e) != FL_OK) return 0;   /* scaled: right either way */
  one = ten_get(&h, 0) == 1.0;
  ten_release(&h);
  return one;
}

/* Unseeded, the backward program computes the gradients for a loss
** gradient of 1, and a seed g scales them (the loss is a scalar, the
** backward linear in g).  Seeded, g is its input, beside the other
** results' gradients (zeros where none reached them). */
static int cbw_call(void *ctx, const fl_tensor *gout, fl_tensor *gin, ir_apply_fn apply, fl_err *e) {
  cbw *c = ctx;
  exec_pair *p = c->pair;
  int k, rc = FL_OK, nout = p->bw->plan->g->nout;
  int unit = p->seeded || seed_is_one(gout);
  fl_tensor *outs = calloc((size_t)nout + 1, sizeof *outs);
  if (!outs) { cbw_clear_tan(c); return err_set(e, FL_ENOMEM, "backward: out of memory"); }
  for (k = 0; k < p->ntan && rc == FL_OK; k++)
    if (!c->tan[k].st) rc = ten_empty(&c->tan[k], &c->tan_meta[k], e);   /* zeros */
  if (rc == FL_OK) rc = exec_pair_backward(p, c->saved, gout, c->tan, outs, e);
  cbw_clear_tan(c);      /* this backward's: the next one brings its own */
  for (k = 0; k < nout && rc == FL_OK; k++) {
    if (unit) {
      gin[k] = outs[k];
      memset(&outs[k], 0, sizeof outs[k]);
    } else {
      const fl_tensor *two[2] = {&outs[k], gout};
      op_attrs a;
      op_attrs_init(OP_MUL, &a);
      rc = apply(OP_MUL, two, 2, &a, &gin[k], e);
    }
  }
  for (k = 0; k < nout; k++) ten_release(&outs[k]);
  free(outs);
  return rc;
}

/* An other result's history: the gradient reaching it is left in its
** slot of the shared cbw, and the loss's fn (its one input) gets a zero,
** so that it runs, after this one (it was made first), with them all. */
typedef struct tan_ref { cbw *c; int k; } tan_ref;

static int tan_call(void *ctx, const fl_tensor *gout, fl_tensor *gin, ir_apply_fn apply, fl_err *e) {
  tan_ref *t = ctx;
  cbw *c = t->c;
  int rc;
  if (!c->tan[t->k].st) ten_share(&c->tan[t->k], gout);
  else if ((rc = ag_add_into(&c->tan[t->k], gout, apply, e)) != FL_OK) return rc;
  return ten_empty(&gin[0], &c->loss_meta, e);   /* zeros */
}

static void tan_release(void *ctx) { (void)ctx; }   /* the loss's fn releases */

static void tan_free(void *ctx) {
  tan_ref *t = ctx;
  if (!t) return;
  cbw_free(t->c);
  free(t);
}

/* out gets an AG_CALL history, a CompiledFunctionBackward of call whose
** nin inputs' gradients go to next (freed here, as call's ctx on failure). */
static int attach_call(lua_State *L, fl_tensor *out, int nin, ag_fn **next, ag_call *call,
                       const char *what) {
  fl_err e;
  call->name = "CompiledFunctionBackward";
  err_clear(&e);
  AG(out) = ag_call_new(&out->m, nin, next, call, &e);
  free(next);
  if (!AG(out)) return lfl_raise(L, what, &e);
  return 0;
}

/* ---- fl.Pair: a compiled training pair as Lua holds it ------------------ */

#define PAIR_TYPE "fl.Pair"

static exec_pair *checkpair(lua_State *L, int idx) {
  exec_pair **slot = (exec_pair **)luaL_checkudata(L, idx, PAIR_TYPE);
  if (!*slot) luaL_argerror(L, idx, "the pair has been released");
  return *slot;
}

static int pair_gc(lua_State *L) {
  exec_pair **slot = (exec_pair **)luaL_checkudata(L, 1, PAIR_TYPE);
  exec_pair_free(*slot);
  *slot = NULL;
  return 0;
}

/* A list of integers at idx, each plus delta, into a new array (n). */
static int *int_list(lua_State *L, int idx, int delta, int *n) {
  int *v, k;
  luaL_checktype(L, idx, LUA_TTABLE);
  *n = (int)luaL_len(L, idx);
  v = lua_newuserdatauv(L, (size_t)(*n + 1) * sizeof *v, 0);   /* collected with the stack */
  for (k = 0; k < *n; k++) {
    lua_rawgeti(L, idx, k + 1);
    v[k] = (int)luaL_checkinteger(L, -1) + delta;
    lua_pop(L, 1);
  }
  return v;
}

/* fl._pair(fw, bw, saved_in, nres, tangents) -> fl.Pair: saved_in[k] the
** forward input (1-based) saved value k is, or 0: the forward's next
** output; tangents the results (1-based, the loss's first) whose
** gradients the backward takes, {} for the loss alone. */
static int l_pair(lua_State *L) {
  exec_program *fw = lfl_toanyprogram(L, 1), *bw = lfl_toanyprogram(L, 2);
  int nsaved, ntan, *saved_in, *tan, nres = (int)luaL_checkinteger(L, 4);
  exec_pair **slot;
  fl_err e;
  luaL_argcheck(L, fw != NULL, 1, "expected a compiled program");
  luaL_argcheck(L, bw != NULL, 2, "expected a compiled program");
  saved_in = int_list(L, 3, -1, &nsaved);
  tan = int_list(L, 5, -1, &ntan);
  if (ntan > 65) return luaL_error(L, "_pair: %d tangents (at most 65)", ntan);
  slot = (exec_pair **)lua_newuserdatauv(L, sizeof *slot, 0);
  *slot = NULL;
  luaL_setmetatable(L, PAIR_TYPE);
  err_clear(&e);
  /* the first tangent is the backward's gout: the others follow it */
  if (!(*slot = exec_pair_new(fw, bw, nres, nsaved, saved_in, ntan > 0, ntan ? ntan - 1 : 0, tan + 1, &e)))
    return lfl_raise(L, "_pair", &e);
  return 1;
}

/* The loss (a tensor userdata at idx) gets the pair's backward, reading
** saved (moved into it), its gradients going to leaves (a table at lidx:
** tensors, or false); the other results with tangents (at tidx[k]) get
** histories that bring theirs to it. */
static void attach(lua_State *L, exec_pair *p, int idx, fl_tensor *saved, int lidx, const int *tidx) {
  fl_tensor *out = lfl_checktensor(L, idx);
  int nl = p->bw->plan->g->nout, k;
  ag_fn **next;
  ag_call call;
  cbw *c = calloc(1, sizeof *c);
  next = calloc((size_t)nl + 1, sizeof *next);
  if (c) {
    c->saved = calloc((size_t)p->nsaved + 1, sizeof *c->saved);
    c->tan = calloc((size_t)p->ntan + 1, sizeof *c->tan);
    c->tan_meta = calloc((size_t)p->ntan + 1, sizeof *c->tan_meta);
  }
  if (!c || !next || !c->saved || !c->tan || !c->tan_meta) {
    if (c) { free(c->saved); free(c->tan); free(c->tan_meta); }
    free(c); free(next);
    luaL_error(L, "backward: out of memory");
    return;
  }
  c->refs = 1;
  c->pair = exec_pair_ref(p);
  c->loss_meta = out->m;
  memcpy(c->saved, saved, (size_t)p->nsaved * sizeof *saved);
  memset(saved, 0, (size_t)p->nsaved * sizeof *saved);
  for (k = 0; k < p->ntan; k++) c->tan_meta[k] = lfl_checktensor(L, tidx[k])->m;
  for (k = 0; k < nl; k++) {
    fl_tensor *t;
    lua_rawgeti(L, lidx, k + 1);
    t = lfl_totensor(L, -1);
    next[k] = t ? AG(t) : NULL;
    lua_pop(L, 1);
  }
  call.call = cbw_call;
  call.release = cbw_release;
  call.free_ctx = cbw_free;
  call.ctx = c;
  attach_call(L, out, nl, next, &call, "backward");
  /* the others' fns, made after the loss's: a backward runs them first */
  for (k = 0; k < p->ntan; k++) {
    tan_ref *t = malloc(sizeof *t);
    ag_fn **one = malloc(sizeof *one);
    if (!t || !one) { free(t); free(one); luaL_error(L, "backward: out of memory"); return; }
    t->c = c;
    t->k = k;
    c->refs++;
    one[0] = AG(out);
    call.call = tan_call;
    call.release = tan_release;
    call.free_ctx = tan_free;
    call.ctx = t;
    attach_call(L, lfl_checktensor(L, tidx[k]), 1, one, &call, "backward");
  }
}

/* pair:run(leaves, x, ...) -> the results, then the written-back values:
** the forward on the inputs; in grad mode with leaves (a list of tensors
** or false, one per gradient) the loss gets a CompiledFunctionBackward
** that runs the backward on what the forward saved and hands gradient k
** to leaves[k].  The saved values are held by that backward alone (not
** returned), so they go with it; without it, at once. */
static int pair_run(lua_State *L) {
  exec_pair *p = checkpair(L, 1);
  const ir_graph *fg = p->fw->plan->g;
  int nin = lua_gettop(L) - 2, base, k, j, train;
  const fl_tensor **in;
  fl_tensor *outs, *saved;
  int tidx[64];
  fl_err e;
  if (nin != fg->ninputs) return luaL_error(L, "run: expected %d input(s), got %d", fg->ninputs, nin);
  train = ag_grad_enabled() && lua_istable(L, 2);
  in = lua_newuserdatauv(L, (size_t)(nin + 1) * sizeof *in, 0);
  for (k = 0; k < nin; k++) in[k] = lfl_checkdata(L, k + 3, "run");
  outs = lfl_newslots(L, fg->nout);
  saved = lfl_newslots(L, p->nsaved);
  err_clear(&e);
  if (exec_pair_forward(p, in, outs, saved, &e) != FL_OK) return lfl_raise(L, "run", &e);
  luaL_checkstack(L, fg->nout + 4, "run: too many results");
  base = lua_gettop(L);
  for (k = 0; k < p->nres; k++) lfl_pushmoved(L, &outs[k]);
  for (j = p->nres + p->nsaved_out; j < fg->nout; j++) lfl_pushmoved(L, &outs[j]);
  /* the forward's own handles on the saved values go now, not at the
  ** next collection: the next step reuses their memory */
  for (j = p->nres; j < p->nres + p->nsaved_out; j++) ten_release(&outs[j]);
  for (k = 0; k < p->ntan; k++) tidx[k] = base + 1 + p->tan[k];
  if (train) attach(L, p, base + 1, saved, 2, tidx);
  for (k = 0; k < p->nsaved; k++) ten_release(&saved[k]);   /* (attach took them) */
  return lua_gettop(L) - base;
}

/* fl._same_storage(a, b): the same memory (a parameter and the graph's
** reference to it) */
static int l_same_storage(lua_State *L) {
  fl_tensor *a = lfl_totensor(L, 1), *b = lfl_totensor(L, 2);
  lua_pushboolean(L, a && b && a->st && a->st == b->st && a->offset == b->offset &&
                  meta_same_shape(&a->m, &b->m));
  return 1;
}

void lfl_open_autograd(lua_State *L, int methods, int lib) {
  static const luaL_Reg tmethods[] = {
    {"requires_grad_", t_requires_grad_}, {"detach", t_detach},
    {"retain_grad", t_retain_grad}, {"backward", t_backward}, {NULL, NULL}
  };
  static const luaL_Reg funcs[] = {
    {"no_grad", l_no_grad}, {"enable_grad", l_enable_grad},
    {"is_grad_enabled", l_is_grad_enabled}, {"set_grad_enabled", l_set_grad_enabled},
    {"grad", l_grad}, {"backward_graph", l_backward_graph},
    {"_autograd_live", l_autograd_live}, {"_pair", l_pair},
    {"_same_storage", l_same_storage}, {NULL, NULL}
  };
  static const char *const factories[] = {"zeros", "ones", "full", "rand", "randn",
                                          "eye", "arange", "tensor", NULL};
  int i;
  methods = lua_absindex(L, methods);
  lib = lua_absindex(L, lib);
  if (luaL_newmetatable(L, GRADFN)) {
    lua_pushcfunction(L, gf_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, gf_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushcfunction(L, gf_index);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, PAIR_TYPE)) {
    lua_pushcfunction(L, pair_gc);
    lua_setfield(L, -2, "__gc");
    lua_newtable(L);
    lua_pushcfunction(L, pair_run);
    lua_setfield(L, -2, "run");
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_pushvalue(L, methods);
  luaL_setfuncs(L, tmethods, 0);
  lua_pop(L, 1);
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, funcs, 0);
  for (i = 0; factories[i]; i++) {
    lua_getfield(L, -1, factories[i]);
    lua_pushcclosure(L, factory, 1);
    lua_setfield(L, -2, factories[i]);
  }
  lua_pop(L, 1);
}
