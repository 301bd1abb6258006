/*
** lfl_cuda.c -- the CUDA backend as Lua sees it:
**   fl.cuda_available()            -> true | false, "no CUDA device: <reason>"
**   fl.cuda_info()                 -> bytes copied each way, launches,
**                                     graph replays, pool size
**   x:cuda(), x:to("cuda"), x:cpu() -> the tensor moved (a copy), or the
**                                     no-device error
**   local k = p:codegen("cuda")    -- fl.CudaProgram: print(k) is CUDA C
**   k:compile()                    -- NVRTC, works without a GPU
**   k:ptx(), k:log(), k:stats()
**   k:run(x, ...)                  -- on the device, or the no-device error
**   fl._cuda_program(plan)         -- the same as plan:codegen("cuda"), for
**                                     fl.compile's backend "cuda"/"auto"
** Built without the toolkit, everything here raises "no CUDA device:
** fuselab was built without CUDA" and fl.cuda_available() says so.
** compile, try_compile, run, source and log are the methods every
** backend's Program shares (lfl_program.c); the rest are CUDA's own.
*/
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "lfl.h"
#include "fuse/plan.h"
#include "gpu/cuda.h"
#include "cpu/eager.h"
#include "exec/cache.h"
#include "exec/pipeline.h"
#ifdef HAVE_CUDA
#include "gpu/cuda_eager.h"
#include "gpu/cuda_program.h"
#endif

#define CPROG_TYPE "fl.CudaProgram"
#define CODEGEN_KEY "fuselab.cuda_codegen"

/* fl.cuda_available() -> true | false, reason */
static int l_cuda_available(lua_State *L) {
  fl_err e;
  err_clear(&e);
  if (cuda_available(&e)) {
    lua_pushboolean(L, 1);
    return 1;
  }
  lua_pushboolean(L, 0);
  lua_pushstring(L, e.msg);
  return 2;
}

/* the plan userdata's first field is its plan (lfl_plan.c) */
static fuse_plan *checkplan(lua_State *L, int idx) {
  fuse_plan *p = lfl_toplan(L, idx);
  if (!p) luaL_argerror(L, idx, "expected an fl.Plan (from g:fuse())");
  return p;
}

#ifdef HAVE_CUDA

/* The CUDA backend's Program (the methods every backend shares are in
** lfl_program.c); it runs through CUDA graphs in "reduce-overhead" */
static const lfl_progtype cuda_lprogram = { CPROG_TYPE, cuda_program_run };

static exec_program *checkprog(lua_State *L, int idx) {
  return (exec_program *)lfl_checkprogram(L, idx, &cuda_lprogram);
}

/* plan:codegen("cuda") and fl._cuda_program(plan) -> CudaProgram */
static int l_codegen(lua_State *L) {
  fuse_plan *p = checkplan(L, 1);
  exec_program **slot = lfl_newprogram(L, &cuda_lprogram);
  fl_err e;
  err_clear(&e);
  if (!(*slot = exec_codegen(&cuda_backend, p, NULL, &e))) return lfl_raise(L, "codegen", &e);
  return 1;
}

/* k:ptx() -> the PTX (compiles first) */
static int k_ptx(lua_State *L) {
  exec_program *pr = checkprog(L, 1);
  fl_err e;
  err_clear(&e);
  if (exec_program_compile(pr, &e) != FL_OK) return lfl_program_raise(L, pr, &e);
  lua_pushstring(L, cuda_program_ptx(pr));
  return 1;
}

/* k:set_mode("default" | "reduce-overhead") */
static int k_set_mode(lua_State *L) {
  static const char *const modes[] = {"default", "reduce-overhead", "max-autotune", NULL};
  exec_program *pr = checkprog(L, 1);
  int m = luaL_checkoption(L, 2, NULL, modes);
  if (cuda_program_set_mode(pr, m == 1 ? CUDA_MODE_GRAPH : CUDA_MODE_DEFAULT) != FL_OK)
    return luaL_error(L, "set_mode: out of memory");
  lua_settop(L, 1);
  return 1;
}

/* k:autotune(x, ...) -> what was chosen (times block sizes on the inputs) */
static int k_autotune(lua_State *L) {
  exec_program *pr = checkprog(L, 1);
  const fl_tensor *in[256];
  fl_err e;
  int i, n = lua_gettop(L) - 1;
  if (n > 256) return luaL_error(L, "autotune: too many inputs (%d)", n);
  for (i = 0; i < n; i++) in[i] = lfl_checkdata(L, i + 2, "autotune");
  err_clear(&e);
  if (cuda_program_autotune(pr, in, n, &e) != FL_OK) return lfl_raise(L, "autotune", &e);
  lua_pushstring(L, cuda_state_of(pr)->tune);
  return 1;
}

/* k:stats() -> {kernels, compiled, how, compile_ms, runs, replays,
** fused_epilogues, mode, autotune, arch} */
static int k_stats(lua_State *L) {
  static const char *const hows[] = {"compiled", "disk", "memory", "remote"};
  exec_program *pr = checkprog(L, 1);
  const nvrtc_image *img = cuda_program_image(pr);
  cuda_state *cs = cuda_state_of(pr);
  if (!cs) return luaL_error(L, "stats: out of memory");
  lua_createtable(L, 0, 10);
  lua_pushinteger(L, pr->plan->nkernels); lua_setfield(L, -2, "kernels");
  lua_pushboolean(L, img != NULL); lua_setfield(L, -2, "compiled");
  if (img) {
    lua_pushstring(L, hows[img->how >= 0 && img->how <= CACHE_REMOTE ? img->how : 0]);
    lua_setfield(L, -2, "how");
    lua_pushstring(L, img->arch); lua_setfield(L, -2, "arch");
  }
  lua_pushnumber(L, pr->compile_ms); lua_setfield(L, -2, "compile_ms");
  lua_pushinteger(L, (lua_Integer)pr->runs); lua_setfield(L, -2, "runs");
  lua_pushinteger(L, (lua_Integer)cs->replays); lua_setfield(L, -2, "replays");
  lua_pushinteger(L, cs->fused_epilogues); lua_setfield(L, -2, "fused_epilogues");
  lua_pushstring(L, cs->mode == CUDA_MODE_GRAPH ? "reduce-overhead" : "default");
  lua_setfield(L, -2, "mode");
  lua_pushstring(L, cs->tune); lua_setfield(L, -2, "autotune");
  return 1;
}

/* the CUDA backend's own methods, beside the shared ones */
static const luaL_Reg prog_methods[] = {
  {"ptx", k_ptx}, {"stats", k_stats}, {"set_mode", k_set_mode}, {"autotune", k_autotune},
  {NULL, NULL}
};

/* --- moving tensors ---------------------------------------------------------- */

/* push a copy of t on dev; raises the no-device error or the size */
static void push_moved(lua_State *L, fl_tensor *t, fl_device dev, const char *what) {
  fl_tensor *r;
  fl_err e;
  err_clear(&e);
  if (!cuda_available(&e)) { luaL_error(L, "%s", e.msg); return; }
  r = lfl_newtensor(L);
  if (cuda_copy_to(r, t, dev, &e) != FL_OK) {
    if (e.code == FL_ENOMEM) {        /* maybe garbage is holding memory */
      lfl_collect(L);
      err_clear(&e);
      if (cuda_copy_to(r, t, dev, &e) == FL_OK) return;
    }
    lfl_raise(L, what, &e);
  }
}
#endif

int lfl_place(lua_State *L, fl_device dev) {
  fl_tensor *t = lfl_totensor(L, -1);
  if (!t || t->m.device == dev) return 1;
#ifdef HAVE_CUDA
  push_moved(L, t, dev, dev == FL_DEV_CUDA ? "cuda" : "cpu");
  lua_remove(L, -2);
  return 1;
#else
  return luaL_error(L, "no CUDA device: fuselab was built without CUDA");
#endif
}

/* x:cuda() */
static int t_cuda(lua_State *L) {
  fl_tensor *t = lfl_checkdata(L, 1, "cuda");
  if (t->m.device == FL_DEV_CUDA) { lua_settop(L, 1); return 1; }
#ifdef HAVE_CUDA
  push_moved(L, t, FL_DEV_CUDA, "cuda");
  return 1;
#else
  return luaL_error(L, "no CUDA device: fuselab was built without CUDA");
#endif
}

/* x:cpu() */
static int t_cpu(lua_State *L) {
  fl_tensor *t = lfl_checkdata(L, 1, "cpu");
  if (t->m.device == FL_DEV_CPU) { lua_settop(L, 1); return 1; }
#ifdef HAVE_CUDA
  push_moved(L, t, FL_DEV_CPU, "cpu");
  return 1;
#else
  return luaL_error(L, "no CUDA device: fuselab was built without CUDA");
#endif
}

/* x:to(...) with a device among the arguments moves (the dtype change, if
** any, runs on the host side); anything else is the tensor's own `to`
** (upvalue 1). */
static int t_to(lua_State *L) {
  fl_tensor *t = lfl_checktensor(L, 1);
  fl_dtype dt = t->m.dtype;
  fl_device dev = t->m.device;
  int i, top = lua_gettop(L);
  for (i = 2; i <= top; i++) {
    if (lua_type(L, i) == LUA_TTABLE) lfl_move_options(L, i, &dt, &dev, "to");
    else if (lua_type(L, i) == LUA_TSTRING) {
      const char *s = lua_tostring(L, i);
      if (strcmp(s, "cuda") == 0) dev = FL_DEV_CUDA;
      else if (strcmp(s, "cpu") == 0) dev = FL_DEV_CPU;
      else (void)dtype_from_name(s, &dt);
    }
  }
  if (dev == t->m.device) {
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, top, 1);
    return 1;
  }
#ifdef HAVE_CUDA
  {
    fl_err e;
    err_clear(&e);
    if (!cuda_available(&e)) return luaL_error(L, "%s", e.msg);
    /* the dtype on the host: before going to the device, after coming back */
    if (dev == FL_DEV_CUDA) {
      lua_pushvalue(L, lua_upvalueindex(1));
      lua_pushvalue(L, 1);
      lua_pushstring(L, dtype_name(dt));
      lua_call(L, 2, 1);
      push_moved(L, lfl_checkdata(L, -1, "to"), FL_DEV_CUDA, "to");
    } else {
      push_moved(L, lfl_checkdata(L, 1, "to"), FL_DEV_CPU, "to");
      lua_pushvalue(L, lua_upvalueindex(1));
      lua_insert(L, -2);
      lua_pushstring(L, dtype_name(dt));
      lua_call(L, 2, 1);
    }
    return 1;
  }
#else
  (void)dt;
  return luaL_error(L, "no CUDA device: fuselab was built without CUDA");
#endif
}

void lfl_pushcudaprogram(lua_State *L, exec_program *pr) {
#ifdef HAVE_CUDA
  *lfl_newprogram(L, &cuda_lprogram) = pr;
#else
  exec_program_free(pr);
  luaL_error(L, "no CUDA device: fuselab was built without CUDA");
#endif
}

const exec_backend *lfl_cuda_backend(void) {
#ifdef HAVE_CUDA
  return &cuda_backend;
#else
  return NULL;
#endif
}

exec_program *lfl_tocudaprogram(lua_State *L, int idx) {
#ifdef HAVE_CUDA
  exec_program **slot = (exec_program **)luaL_testudata(L, idx, CPROG_TYPE);
  return slot ? *slot : NULL;
#else
  (void)L; (void)idx;
  return NULL;
#endif
}

/* ---- eager ops on CUDA tensors ------------------------------------------
** gpu/cuda_eager.c runs them: a view, or a generated per-op kernel
** compiled once and launched on the real inputs. */

int lfl_apply(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a, fl_tensor *out,
              fl_err *e) {
#ifdef HAVE_CUDA
  int k;
  for (k = 0; k < nin; k++)
    if (in[k] && in[k]->m.device == FL_DEV_CUDA) return cuda_eager_apply(op, in, nin, a, out, e);
#endif
  return eager_apply(op, in, nin, a, out, e);
}

int lfl_fill(fl_tensor *t, double v, fl_err *e) {
#ifdef HAVE_CUDA
  return cuda_fill(t, v, e);
#else
  ten_fill(t, v);
  return FL_OK;
#endif
}

int lfl_move(fl_tensor *dst, const fl_tensor *src, fl_device dev, fl_err *e) {
  if (src->m.device == dev) {
    ten_share(dst, src);
    return FL_OK;
  }
#ifdef HAVE_CUDA
  return cuda_copy_to(dst, src, dev, e);
#else
  memset(dst, 0, sizeof *dst);
  return err_set(e, FL_ENODEV, "no CUDA device: fuselab was built without CUDA");
#endif
}

/* One step of lfl_copy_into's conversion: *v = op(*v), in place of it. */
static int convert(fl_tensor *v, fl_op op, const op_attrs *a, fl_err *e) {
  const fl_tensor *in[1];
  fl_tensor r = {0};
  int rc;
  in[0] = v;
  if ((rc = lfl_apply(op, in, 1, a, &r, e)) != FL_OK) return rc;
  ten_release(v);
  *v = r;
  return FL_OK;
}

int lfl_copy_into(fl_tensor *dst, const fl_tensor *src, fl_err *e) {
  fl_tensor v;
  op_attrs a;
  int rc = FL_OK;
  if (dst->m.device == FL_DEV_CPU) {       /* the host's copy, from a host copy */
    if (src->m.device == FL_DEV_CPU) return ten_copy(dst, src, e);
    if ((rc = lfl_move(&v, src, FL_DEV_CPU, e)) != FL_OK) return rc;
    rc = ten_copy(dst, &v, e);
    ten_release(&v);
    return rc;
  }
#ifdef HAVE_CUDA
  if (!ten_is_contiguous(dst))
    return err_set(e, FL_EUNSUPPORTED, "a write into a non-contiguous tensor on cuda is not "
                   "supported; write into a contiguous one");
  /* src made dst's exactly -- its device, dtype, shape, contiguous --
  ** then one copy of the whole buffer */
  if ((rc = lfl_move(&v, src, dst->m.device, e)) != FL_OK) return rc;
  if (v.m.dtype != dst->m.dtype) {
    op_attrs_init(OP_TO, &a);
    a.dtype = dst->m.dtype;
    rc = convert(&v, OP_TO, &a, e);
  }
  if (rc == FL_OK && !meta_same_shape(&v.m, &dst->m)) {
    op_attrs_init(OP_EXPAND, &a);
    a.ndims = dst->m.ndim;
    memcpy(a.dims, dst->m.shape, (size_t)dst->m.ndim * sizeof *a.dims);
    rc = convert(&v, OP_EXPAND, &a, e);
  }
  /* a view of dst's own storage is copied out first: one buffer copy
  ** over an overlapping one is undefined on a device */
  if (rc == FL_OK && (!ten_is_contiguous(&v) || v.st == dst->st)) {
    op_attrs_init(OP_CONTIGUOUS, &a);
    rc = convert(&v, OP_CONTIGUOUS, &a, e);
  }
  if (rc == FL_OK && v.st == dst->st)
    rc = err_set(e, FL_EUNSUPPORTED, "copy: the device's contiguous kept the storage it copies into");
  if (rc == FL_OK) rc = cuda_copy_into(dst, &v, e);
  ten_release(&v);
  return rc;
#else
  (void)v; (void)a; (void)rc;
  return err_set(e, FL_ENODEV, "no CUDA device: fuselab was built without CUDA");
#endif
}

/* Is any input or weight of g on the device? */
static int on_cuda(const ir_graph *g, const fl_tensor *const *in, int n) {
  int i;
  for (i = 0; i < n; i++)
    if (in[i] && in[i]->m.device == FL_DEV_CUDA) return 1;
  for (i = 0; i < g->n; i++)
    if ((g->nodes[i].kind == IR_PARAM || g->nodes[i].kind == IR_CONST) &&
        g->nodes[i].value.m.device == FL_DEV_CUDA)
      return 1;
  return 0;
}

int lfl_graph_run_eager(const ir_graph *g, const fl_tensor *const *in, int n, fl_tensor *outs,
                        fl_err *e) {
#ifdef HAVE_CUDA
  exec_pipeline_opts o = {&cuda_backend, 0, 0};   /* op by op: the unfused plan */
  exec_pipeline b;
  int rc, i;
  if (!on_cuda(g, in, n)) return ir_run(g, eager_apply, in, n, outs, e);
  if ((rc = exec_pipeline_build(g, &o, &b, e)) == FL_OK) {
    if ((rc = b.compile_rc) != FL_OK) *e = b.compile_err;
    else rc = exec_program_run(b.pr, in, n, outs, e);
    exec_pipeline_clear(&b);
  }
  if (rc != FL_EUNSUPPORTED) return rc;
  /* an op with no CUDA kernel at all: on the host, the results moved back */
  err_clear(e);
  if ((rc = ir_run(g, cuda_host_apply, in, n, outs, e)) != FL_OK) return rc;
  for (i = 0; i < g->nout && rc == FL_OK; i++) {
    fl_tensor d;
    if (outs[i].m.device == FL_DEV_CUDA) continue;
    if ((rc = cuda_copy_to(&d, &outs[i], FL_DEV_CUDA, e)) != FL_OK) break;
    ten_release(&outs[i]);
    outs[i] = d;
  }
  if (rc != FL_OK) for (i = 0; i < g->nout; i++) ten_release(&outs[i]);
  return rc;
#else
  return ir_run(g, eager_apply, in, n, outs, e);
#endif
}

int lfl_cuda_eager(lua_State *L, fl_op op, const fl_tensor *const *in, int nin,
                   const op_attrs *a) {
#ifdef HAVE_CUDA
  fl_tensor *out = lfl_newtensor(L);
  fl_err e;
  err_clear(&e);
  if (cuda_eager_apply(op, in, nin, a, out, &e) != FL_OK) return lfl_raise(L, op_name(op), &e);
  return 1;
#else
  (void)in; (void)nin; (void)a;
  return luaL_error(L, "%s: no CUDA device: fuselab was built without CUDA", op_name(op));
#endif
}

/* fl.cuda_info() -> {device, h2d_bytes, d2h_bytes, launches, graph_replays,
** pool_bytes, pool_in_use}; without a device, {device = false, why = reason} */
static int l_cuda_info(lua_State *L) {
  fl_err e;
  err_clear(&e);
  lua_createtable(L, 0, 7);
#ifdef HAVE_CUDA
  if (cuda_available(&e) && cuda_rt_init(&e) == FL_OK) {
    cuda_counters c;
    cuda_mem_stats m;
    cuda_get_counters(&c);
    cuda_get_mem_stats(&m);
    lua_pushstring(L, cuda_device_name()); lua_setfield(L, -2, "device");
    lua_pushinteger(L, (lua_Integer)c.h2d_bytes); lua_setfield(L, -2, "h2d_bytes");
    lua_pushinteger(L, (lua_Integer)c.d2h_bytes); lua_setfield(L, -2, "d2h_bytes");
    lua_pushinteger(L, (lua_Integer)c.launches); lua_setfield(L, -2, "launches");
    lua_pushinteger(L, (lua_Integer)c.graph_replays); lua_setfield(L, -2, "graph_replays");
    lua_pushinteger(L, (lua_Integer)(m.in_use + m.cached)); lua_setfield(L, -2, "pool_bytes");
    lua_pushinteger(L, (lua_Integer)m.in_use); lua_setfield(L, -2, "pool_in_use");
    return 1;
  }
#else
  (void)cuda_available(&e);
#endif
  lua_pushboolean(L, 0); lua_setfield(L, -2, "device");
  lua_pushstring(L, e.msg); lua_setfield(L, -2, "why");
  return 1;
}

#ifndef HAVE_CUDA
/* without the toolkit: the same names, each raising why */
static int l_codegen(lua_State *L) {
  (void)checkplan(L, 1);
  return luaL_error(L, "codegen: no CUDA device: fuselab was built without CUDA");
}
#endif

static const luaL_Reg cuda_funcs[] = {
  {"cuda_available", l_cuda_available}, {"cuda_info", l_cuda_info}, {"_cuda_program", l_codegen},
  {NULL, NULL}
};

#ifdef HAVE_CUDA
/* the one-op programs go with the state that ran them */
static int eager_gc(lua_State *L) {
  (void)L;
  cuda_eager_free();
  return 0;
}
#endif

void lfl_open_cuda(lua_State *L, int lib) {
  lib = lua_absindex(L, lib);
#ifdef HAVE_CUDA
  lfl_program_type(L, &cuda_lprogram, prog_methods);
  lua_newuserdata(L, 1);
  lua_newtable(L);
  lua_pushcfunction(L, eager_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, "fuselab.cuda_eager");
#endif
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, cuda_funcs, 0);
  lua_pop(L, 1);
  /* p:codegen("cuda") finds the generator here (lfl_plan.c) */
  lua_pushcfunction(L, l_codegen);
  lua_setfield(L, LUA_REGISTRYINDEX, CODEGEN_KEY);
  /* the tensor's cuda, cpu and to learn to move data */
  luaL_getmetatable(L, LFL_TENSOR);
  lua_getfield(L, -1, "methods");
  if (lua_istable(L, -1)) {
    lua_pushcfunction(L, t_cuda);
    lua_setfield(L, -2, "cuda");
    lua_pushcfunction(L, t_cpu);
    lua_setfield(L, -2, "cpu");
    lua_getfield(L, -1, "to");
    lua_pushcclosure(L, t_to, 1);
    lua_setfield(L, -2, "to");
  }
  lua_pop(L, 2);
}
