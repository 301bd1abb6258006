/*
** lfl_plan.c -- fusion plans and compiled programs as Lua sees them:
**   local p = g:fuse{explain=true}   -- fl.Plan: kernels and decisions
**   local k = p:codegen("cpu")        -- fl.Program: print(k) is the C
**   local y = k:run(x)                -- compiled (through the cache), run
** and fl.cache_info() / fl.cache_clear().  The Program methods every
** backend shares (compile, run, source, ...) are in lfl_program.c.
** Invariant: each userdata holds one reference to its plan or program (or
** none after __gc); the C objects count their own references.
*/
#include <stdlib.h>
#include <string.h>

#include "lfl.h"
#include "exec/pipeline.h"
#include "cpu/backend.h"
#include "exec/cache.h"
#include "cpu/blas.h"
#include "cpu/codegen.h"
#include "cpu/mm.h"
#include "fuse/plan.h"
#include "graph/hostpool.h"

#define PLAN_TYPE "fl.Plan"
#define PROGRAM_TYPE "fl.Program"

typedef struct lplan { fuse_plan *p; } lplan;

/* The C backend's Program (the methods every backend shares are in
** lfl_program.c) */
static const lfl_progtype c_program = { PROGRAM_TYPE, exec_program_run };

static fuse_plan *checkplan(lua_State *L, int idx) {
  lplan *lp = (lplan *)luaL_checkudata(L, idx, PLAN_TYPE);
  if (!lp->p) luaL_argerror(L, idx, "plan has been released");
  return lp->p;
}

fuse_plan *lfl_toplan(lua_State *L, int idx) {
  lplan *lp = (lplan *)luaL_testudata(L, idx, PLAN_TYPE);
  return lp ? lp->p : NULL;
}

exec_program *lfl_toprogram(lua_State *L, int idx) {
  exec_program **slot = (exec_program **)luaL_testudata(L, idx, PROGRAM_TYPE);
  return slot ? *slot : NULL;
}

exec_program *lfl_toanyprogram(lua_State *L, int idx) {
  exec_program *pr = lfl_toprogram(L, idx);
  return pr ? pr : lfl_tocudaprogram(L, idx);
}

static exec_program *checkprogram(lua_State *L, int idx) {
  return (exec_program *)lfl_checkprogram(L, idx, &c_program);
}

static void push_owned(lua_State *L, char *s, const char *what) {
  if (!s) luaL_error(L, "%s: out of memory", what);
  lua_pushstring(L, s);
  free(s);
}

/* ---- g:fuse ------------------------------------------------------------- */

/* g:fuse{explain=, fuse=, max_nodes=} -> plan.  explain prints the plan
** with every decision. */
static int g_fuse(lua_State *L) {
  static const char *const keys[] = {"explain", "fuse", "max_nodes", NULL};
  ir_graph *g = lfl_checkgraph(L, 1);
  fuse_opts o;
  lplan *lp;
  fl_err e;
  fuse_opts_default(&o);
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lfl_checkkeys(L, 2, keys, "fuse");
    lua_getfield(L, 2, "explain");
    o.explain = lua_toboolean(L, -1);
    lua_getfield(L, 2, "fuse");
    if (!lua_isnil(L, -1)) o.fuse = lua_toboolean(L, -1);
    lua_getfield(L, 2, "max_nodes");
    if (!lua_isnil(L, -1)) {
      lua_Integer m = luaL_checkinteger(L, -1);
      if (m < 1) return luaL_error(L, "fuse: max_nodes must be >= 1, got %d", (int)m);
      o.max_nodes = (int)m;
    }
    lua_pop(L, 3);
  }
  lp = (lplan *)lua_newuserdatauv(L, sizeof *lp, 0);
  lp->p = NULL;
  luaL_setmetatable(L, PLAN_TYPE);
  err_clear(&e);
  lp->p = fuse_plan_build(g, &o, &e);
  if (!lp->p) return lfl_raise(L, "fuse", &e);
  lfl_note_origin(L, 1, lp->p);
  if (o.explain) {
    char *s = fuse_plan_listing(lp->p, 1);
    if (lua_getglobal(L, "print") == LUA_TFUNCTION) {
      push_owned(L, s, "fuse");
      lua_call(L, 1, 0);
    } else {
      lua_pop(L, 1);
      free(s);
    }
  }
  return 1;
}

static int p_gc(lua_State *L) {
  lplan *lp = (lplan *)luaL_checkudata(L, 1, PLAN_TYPE);
  fuse_plan_free(lp->p);
  lp->p = NULL;
  return 0;
}

static int p_tostring(lua_State *L) {
  push_owned(L, fuse_plan_listing(checkplan(L, 1), 0), "plan");
  return 1;
}

/* p:decisions() -> {{a=, b=, fused=, reason=, bytes_saved=, horizontal=,
** memory=}...} with a and b node ids as in the listing (%N); memory: taken
** back because the plan with it peaks above the captured graph. */
static int p_decisions(lua_State *L) {
  fuse_plan *p = checkplan(L, 1);
  int i;
  lua_createtable(L, p->ndec, 0);
  for (i = 0; i < p->ndec; i++) {
    const fuse_decision *d = &p->dec[i];
    lua_createtable(L, 0, 7);
    lua_pushinteger(L, d->a); lua_setfield(L, -2, "a");
    lua_pushinteger(L, d->b); lua_setfield(L, -2, "b");
    lua_pushboolean(L, d->fused); lua_setfield(L, -2, "fused");
    lua_pushboolean(L, d->horizontal); lua_setfield(L, -2, "horizontal");
    lua_pushstring(L, d->reason); lua_setfield(L, -2, "reason");
    lua_pushinteger(L, (lua_Integer)d->bytes_saved); lua_setfield(L, -2, "bytes_saved");
    lua_pushboolean(L, d->memory); lua_setfield(L, -2, "memory");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int p_stats(lua_State *L) {
  fuse_plan *p = checkplan(L, 1);
  const fuse_stats *s = &p->stats;
  lua_createtable(L, 0, 12);
  lua_pushinteger(L, s->kernels); lua_setfield(L, -2, "kernels");
  /* nodes and ops as g:stats() counts them (doc/API.md, "Counting") */
  lua_pushinteger(L, p->g->n); lua_setfield(L, -2, "nodes");
  lua_pushinteger(L, s->nodes); lua_setfield(L, -2, "ops");
  lua_pushinteger(L, s->kernels_before); lua_setfield(L, -2, "kernels_before");
  lua_pushinteger(L, (lua_Integer)s->bytes_before); lua_setfield(L, -2, "bytes_before");
  lua_pushinteger(L, (lua_Integer)s->bytes_after); lua_setfield(L, -2, "bytes_after");
  lua_pushinteger(L, s->buffers_before); lua_setfield(L, -2, "buffers_before");
  lua_pushinteger(L, s->buffers_after); lua_setfield(L, -2, "buffers_after");
  lua_pushinteger(L, (lua_Integer)s->peak_bytes_before); lua_setfield(L, -2, "peak_bytes_before");
  lua_pushinteger(L, (lua_Integer)s->peak_bytes_after); lua_setfield(L, -2, "peak_bytes_after");
  if (s->note[0]) { lua_pushstring(L, s->note); lua_setfield(L, -2, "note"); }
  /* bytes_before - bytes_after = decisions + shared_reads - passes */
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, (lua_Integer)s->bytes_decisions); lua_setfield(L, -2, "decisions");
  lua_pushinteger(L, (lua_Integer)(s->bytes_graph - s->bytes_after - s->bytes_decisions));
  lua_setfield(L, -2, "shared_reads");
  lua_pushinteger(L, (lua_Integer)(s->bytes_graph - s->bytes_before)); lua_setfield(L, -2, "passes");
  {
    char why[320];
    fuse_bytes_causes(s, why, sizeof why);
    if (why[0]) { lua_pushstring(L, why); lua_setfield(L, -2, "text"); }
  }
  lua_setfield(L, -2, "bytes_saved_by");
  return 1;
}

static const char *fk_kind_name(fk_kind k) {
  return k == FK_POINTWISE ? "pointwise" : k == FK_REDUCE ? "reduce" : "extern";
}

/* p:kernels() -> {{name=, kind=, nodes={ids}, bytes=}...} in run order */
static int p_kernels(lua_State *L) {
  fuse_plan *p = checkplan(L, 1);
  int i, k;
  lua_createtable(L, p->nkernels, 0);
  for (i = 0; i < p->nkernels; i++) {
    const fk_kernel *kr = &p->kernels[i];
    lua_createtable(L, 0, 4);
    lua_pushstring(L, kr->name); lua_setfield(L, -2, "name");
    lua_pushstring(L, fk_kind_name(kr->kind)); lua_setfield(L, -2, "kind");
    lua_pushinteger(L, (lua_Integer)kr->bytes); lua_setfield(L, -2, "bytes");
    lua_newtable(L);
    for (k = 0; k < p->g->n; k++)
      if (p->kernel_of[k] == i) {
        lua_pushinteger(L, k);
        lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
      }
    lua_setfield(L, -2, "nodes");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* p:graph() -> the planned graph (a copy) */
static int p_graph(lua_State *L) {
  fuse_plan *p = checkplan(L, 1);
  ir_graph *c;
  lfl_pushgraph(L, NULL);
  c = ir_clone(p->g);
  if (!c) return luaL_error(L, "plan: out of memory");
  lua_pop(L, 1);
  lfl_pushgraph(L, c);
  return 1;
}

/* p:codegen("cpu") -> program */
static int p_codegen(lua_State *L) {
  fuse_plan *p = checkplan(L, 1);
  const char *target = luaL_optstring(L, 2, "cpu");
  const char *prefix = NULL;
  exec_program **slot;
  fl_err e;
  if (strcmp(target, "cuda") == 0) {
    /* the CUDA generator registered by lfl_cuda.c: an fl.CudaProgram */
    lua_getfield(L, LUA_REGISTRYINDEX, "fuselab.cuda_codegen");
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    return 1;
  }
  if (strcmp(target, "cpu") != 0)
    return luaL_error(L, "codegen: unknown target '%s' (expected cpu or cuda)", target);
  /* p:codegen("cpu", "fl_p3_"): kernel symbols start with the prefix, so
  ** programs compiled together (fl.compile_batch) never share a name; a C
  ** identifier, checked before it reaches the source */
  if (!lua_isnoneornil(L, 3)) {
    size_t n, i;
    prefix = luaL_checklstring(L, 3, &n);
    if (n == 0 || n > 32) return luaL_error(L, "codegen: prefix must be 1 to 32 characters");
    for (i = 0; i < n; i++) {
      char c = prefix[i];
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (i > 0 && c >= '0' && c <= '9')))
        return luaL_error(L, "codegen: prefix must be a C identifier (letters, digits, _)");
    }
  }
  slot = lfl_newprogram(L, &c_program);
  err_clear(&e);
  if (!(*slot = exec_codegen(&cpu_backend, p, prefix, &e))) return lfl_raise(L, "codegen", &e);
  return 1;
}

/* ---- programs ------------------------------------------------------------ */

/* k:stats() -> {kernels, compiled, how = "compiled"|"disk"|"memory"|"remote",
** compile_ms, runs, run_ms (their wall time, summed), kept, kept_runs, kept_skips}: kept kernels read
** weights only (exec_program.keep); their launches, and those saved */
static int k_stats(lua_State *L) {
  static const char *const hows[] = {"compiled", "disk", "memory", "remote"};
  exec_program *pr = checkprogram(L, 1);
  int k, kept = 0;
  for (k = 0; k < pr->plan->nkernels; k++) kept += exec_kernel_kept(pr, k);
  lua_createtable(L, 0, 8);
  lua_pushinteger(L, pr->plan->nkernels); lua_setfield(L, -2, "kernels");
  lua_pushinteger(L, kept); lua_setfield(L, -2, "kept");
  lua_pushinteger(L, (lua_Integer)pr->kept_runs); lua_setfield(L, -2, "kept_runs");
  lua_pushinteger(L, (lua_Integer)pr->kept_skips); lua_setfield(L, -2, "kept_skips");
  lua_pushboolean(L, pr->image != NULL); lua_setfield(L, -2, "compiled");
  if (pr->image) {
    lua_pushstring(L, hows[pr->how >= 0 && pr->how <= CACHE_REMOTE ? pr->how : 0]);
    lua_setfield(L, -2, "how");
  }
  lua_pushnumber(L, pr->compile_ms); lua_setfield(L, -2, "compile_ms");
  lua_pushinteger(L, (lua_Integer)pr->runs); lua_setfield(L, -2, "runs");
  lua_pushnumber(L, pr->run_ms); lua_setfield(L, -2, "run_ms");
  return 1;
}

void lfl_pushplan(lua_State *L, fuse_plan *p) {
  lplan *lp = (lplan *)lua_newuserdatauv(L, sizeof *lp, 0);
  lp->p = fuse_plan_ref(p);
  luaL_setmetatable(L, PLAN_TYPE);
}

/* ---- the cache ------------------------------------------------------------ */

/* How OpenMP's idle threads wait: the fuselab binary's choice at start
** (repl/main.c puts it, with the reason, in FUSELAB_OMP_WAIT) while the
** variables still say what it chose; otherwise what the user set, or
** libgomp's own default (the module loaded from a stock lua).  chose_says:
** the reason begins "name=value:". */
static int chose_says(const char *chose, const char *name, const char *value) {
  size_t n = strlen(name), v = strlen(value);
  return strncmp(chose, name, n) == 0 && chose[n] == '=' && strncmp(chose + n + 1, value, v) == 0 &&
         chose[n + 1 + v] == ':';
}

static void push_omp_wait(lua_State *L) {
  const char *pol = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
  const char *chose = getenv("FUSELAB_OMP_WAIT");
  if (chose && ((pol && !spin && chose_says(chose, "OMP_WAIT_POLICY", pol)) ||
                (spin && !pol && chose_says(chose, "GOMP_SPINCOUNT", spin))))
    lua_pushstring(L, chose);
  else if (pol || spin)
    lua_pushfstring(L, "%s%s%s%s%s: set by you", pol ? "OMP_WAIT_POLICY=" : "", pol ? pol : "",
                    pol && spin ? " " : "", spin ? "GOMP_SPINCOUNT=" : "", spin ? spin : "");
  else
    lua_pushstring(L, "libgomp's default: idle threads spin 300,000 rounds, then sleep");
  lua_setfield(L, -2, "threads");
}

/* fl.blas_info() -> {config, core, was, why, matmul}: the BLAS kernels
** convolutions (and products without oneDNN) run on (cpu/blas.h), picked
** before the first product; matmul: what float32 products run on (cpu/mm.h),
** onednn_calls / onednn_posts: how many ran there, with post-ops;
** reordered_products: those of them that took the rows of their left
** operand in another order (one weight for all, a's rows strided);
** onednn_int8_calls: 8-bit products (matmul_int8) run on oneDNN;
** row_products / row_posts: products of a few rows run by cpu/mm_rows.c
** instead, with post-ops;
** packed_calls / packed_weights / packed_bytes / packed_made: products and
** convolutions that read a weight kept in oneDNN's layout, the weights and
** bytes kept, the copies made (once per weight, layout and value);
** conv: what float32 convolutions run on, onednn_convs / onednn_conv_posts
** / onednn_conv_matmuls: how many ran on oneDNN, with post-ops, as a
** batched matmul; depthwise_convs: depthwise ones on plain layouts run by
** cpu/conv_dw.c instead, shuffles_read_in_place: those of them that read
** a channel shuffle's planes where they lay, pointwise_convs: 1x1s run by cpu/conv_pw.c,
** pointwise_blocked: those of them that read or wrote blocks;
** conv_block: the channel block a convolution's result is
** kept in for the next (0: none), blocked_reads / blocked_writes /
** unblocked: convolutions that read or wrote it, values put back plain
** (cpu/backend.c), channels_last_writes: results left channels last for
** the next convolution; threads: how idle OpenMP threads wait, par_min:
** the fewest elements a generated loop starts threads for under it */
static int l_blas_info(lua_State *L) {
  cpu_blas_info b;
  cpu_blas_get_info(&b);
  lua_createtable(L, 0, 4);
  lua_pushstring(L, b.config); lua_setfield(L, -2, "config");
  lua_pushstring(L, b.core); lua_setfield(L, -2, "core");
  if (b.was[0]) { lua_pushstring(L, b.was); lua_setfield(L, -2, "was"); }
  lua_pushstring(L, b.why); lua_setfield(L, -2, "why");
  lua_pushstring(L, cpu_mm_describe()); lua_setfield(L, -2, "matmul");
  {
    int64_t calls, posts, reordered;
    cpu_mm_counts(&calls, &posts, &reordered);
    lua_pushinteger(L, (lua_Integer)calls); lua_setfield(L, -2, "onednn_calls");
    lua_pushinteger(L, (lua_Integer)posts); lua_setfield(L, -2, "onednn_posts");
    lua_pushinteger(L, (lua_Integer)reordered); lua_setfield(L, -2, "reordered_products");
    lua_pushinteger(L, (lua_Integer)cpu_mm_int8_calls()); lua_setfield(L, -2, "onednn_int8_calls");
    cpu_mm_rows_counts(&calls, &posts);
    lua_pushinteger(L, (lua_Integer)calls); lua_setfield(L, -2, "row_products");
    lua_pushinteger(L, (lua_Integer)posts); lua_setfield(L, -2, "row_posts");
  }
  {
    int64_t calls, weights, bytes, made;
    cpu_mm_pack_info(&calls, &weights, &bytes, &made);
    lua_pushinteger(L, (lua_Integer)made); lua_setfield(L, -2, "packed_made");
    lua_pushinteger(L, (lua_Integer)calls); lua_setfield(L, -2, "packed_calls");
    lua_pushinteger(L, (lua_Integer)weights); lua_setfield(L, -2, "packed_weights");
    lua_pushinteger(L, (lua_Integer)bytes); lua_setfield(L, -2, "packed_bytes");
  }
  lua_pushstring(L, cpu_conv_enabled() ? "oneDNN convolution (im2col + sgemm where it refuses)"
                                       : "im2col + OpenBLAS sgemm");
  lua_setfield(L, -2, "conv");
  {
    int64_t calls, posts, mms, nhwc;
    cpu_conv_counts(&calls, &posts, &mms);
    lua_pushinteger(L, (lua_Integer)calls); lua_setfield(L, -2, "onednn_convs");
    lua_pushinteger(L, (lua_Integer)posts); lua_setfield(L, -2, "onednn_conv_posts");
    lua_pushinteger(L, (lua_Integer)mms); lua_setfield(L, -2, "onednn_conv_matmuls");
    lua_pushinteger(L, (lua_Integer)cpu_conv_dw_calls()); lua_setfield(L, -2, "depthwise_convs");
    lua_pushinteger(L, (lua_Integer)cpu_conv_dw_shuffled()); lua_setfield(L, -2, "shuffles_read_in_place");
    cpu_conv_pw_counts(&calls, &posts);
    lua_pushinteger(L, (lua_Integer)calls); lua_setfield(L, -2, "pointwise_convs");
    lua_pushinteger(L, (lua_Integer)posts); lua_setfield(L, -2, "pointwise_blocked");
    cpu_conv_block_counts(&calls, &posts, &mms, &nhwc);
    lua_pushinteger(L, (lua_Integer)calls); lua_setfield(L, -2, "blocked_reads");
    lua_pushinteger(L, (lua_Integer)posts); lua_setfield(L, -2, "blocked_writes");
    lua_pushinteger(L, (lua_Integer)mms); lua_setfield(L, -2, "unblocked");
    lua_pushinteger(L, (lua_Integer)nhwc); lua_setfield(L, -2, "channels_last_writes");
    lua_pushinteger(L, cpu_conv_block()); lua_setfield(L, -2, "conv_block");
  }
  push_omp_wait(L);
  lua_pushinteger(L, (lua_Integer)cpu_par_min()); lua_setfield(L, -2, "par_min");
  return 1;
}

/* fl.host_pool_info() -> {kept, limit, reuses, maps} (graph/hostpool.c) */
static int l_host_pool_info(lua_State *L) {
  hostpool_info h;
  hostpool_get_info(&h);
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, (lua_Integer)h.kept); lua_setfield(L, -2, "kept");
  lua_pushinteger(L, (lua_Integer)h.limit); lua_setfield(L, -2, "limit");
  lua_pushinteger(L, (lua_Integer)h.reuses); lua_setfield(L, -2, "reuses");
  lua_pushinteger(L, (lua_Integer)h.maps); lua_setfield(L, -2, "maps");
  return 1;
}

static int l_cache_info(lua_State *L) {
  cache_info ci;
  fl_err e;
  err_clear(&e);
  if (cache_get_info(&ci, &e) != FL_OK) return lfl_raise(L, "cache_info", &e);
  lua_createtable(L, 0, 14);
  lua_pushstring(L, ci.dir); lua_setfield(L, -2, "dir");
  lua_pushinteger(L, (lua_Integer)ci.entries); lua_setfield(L, -2, "entries");
  lua_pushinteger(L, (lua_Integer)ci.bytes); lua_setfield(L, -2, "bytes");
  lua_pushinteger(L, (lua_Integer)ci.hits); lua_setfield(L, -2, "hits");
  lua_pushinteger(L, (lua_Integer)ci.disk_hits); lua_setfield(L, -2, "disk_hits");
  lua_pushinteger(L, (lua_Integer)ci.misses); lua_setfield(L, -2, "misses");
  lua_pushinteger(L, (lua_Integer)ci.failures); lua_setfield(L, -2, "failures");
  lua_pushinteger(L, (lua_Integer)ci.timeouts); lua_setfield(L, -2, "timeouts");
  lua_pushinteger(L, (lua_Integer)ci.evictions); lua_setfield(L, -2, "evictions");
  lua_pushinteger(L, (lua_Integer)ci.loaded); lua_setfield(L, -2, "loaded");
  lua_pushinteger(L, (lua_Integer)ci.max_bytes); lua_setfield(L, -2, "max_bytes");
  lua_pushstring(L, cache_compiler()); lua_setfield(L, -2, "compiler");
  lua_pushstring(L, cache_flags()); lua_setfield(L, -2, "flags");
  lua_pushstring(L, cache_target()); lua_setfield(L, -2, "target");
  if (cache_warning()) { lua_pushstring(L, cache_warning()); lua_setfield(L, -2, "warning"); }
  /* remote: absent when FUSELAB_REMOTE_CACHE is unset */
  if (ci.remote.configured) {
    lua_createtable(L, 0, 8);
    lua_pushstring(L, ci.remote.url); lua_setfield(L, -2, "url");
    lua_pushboolean(L, ci.remote.enabled); lua_setfield(L, -2, "enabled");
    if (ci.remote.why[0]) { lua_pushstring(L, ci.remote.why); lua_setfield(L, -2, "why"); }
    lua_pushinteger(L, (lua_Integer)ci.remote.hits); lua_setfield(L, -2, "hits");
    lua_pushinteger(L, (lua_Integer)ci.remote.misses); lua_setfield(L, -2, "misses");
    lua_pushinteger(L, (lua_Integer)ci.remote.writes); lua_setfield(L, -2, "writes");
    lua_pushinteger(L, (lua_Integer)ci.remote.rejected); lua_setfield(L, -2, "rejected");
    lua_pushinteger(L, (lua_Integer)ci.remote.errors); lua_setfield(L, -2, "errors");
    lua_setfield(L, -2, "remote");
  }
  return 1;
}

static int l_cache_clear(lua_State *L) {
  fl_err e;
  err_clear(&e);
  if (cache_clear(&e) != FL_OK) return lfl_raise(L, "cache_clear", &e);
  return 0;
}

/* fl._cache_forget_memory(): the next load goes to disk, as in a new
** process (tests and the warm-start measurement use it) */
static int l_cache_forget(lua_State *L) {
  (void)L;
  cache_forget_memory();
  return 0;
}

static const luaL_Reg plan_methods[] = {
  {"decisions", p_decisions}, {"stats", p_stats}, {"kernels", p_kernels},
  {"graph", p_graph}, {"codegen", p_codegen},
  {NULL, NULL}
};

/* the C backend's own methods, beside the shared ones */
static const luaL_Reg program_methods[] = {
  {"stats", k_stats},
  {NULL, NULL}
};

/* fl._print_kernel_times(k): the last profiled run's kernels on stderr,
** as FUSELAB_DEBUG=2 shows them (other backends' programs: nothing) */
static int l_print_kernel_times(lua_State *L) {
  exec_program *pr = lfl_toprogram(L, 1);
  if (pr) exec_program_print_profile(pr, stderr, "fuselab:   ");
  return 0;
}

/* fl._bytes_str(n) -> "1.5 MiB": the cost model's format, for Lua views */
static int l_bytes_str(lua_State *L) {
  char buf[32];
  lua_pushstring(L, fuse_bytes_str((int64_t)luaL_checkinteger(L, 1), buf, sizeof buf));
  return 1;
}

/* fl.compile_batch({k1, k2, ...}): compile C programs (p:codegen("cpu"))
** as one image, one compiler run for all of them (each distinct kernel
** once): what makes compiling hundreds of small graphs affordable.  The
** pointer array lives in a userdata, so a raise leaks nothing. */
static int l_compile_batch(lua_State *L) {
  lua_Integer n, i;
  exec_program **prs;
  fl_err e;
  luaL_checktype(L, 1, LUA_TTABLE);
  n = (lua_Integer)lua_rawlen(L, 1);
  if (n == 0) return 0;
  if (n > 100000) return luaL_error(L, "compile_batch: %I programs, at most 100000", n);
  prs = (exec_program **)lua_newuserdatauv(L, (size_t)n * sizeof *prs, 0);
  for (i = 1; i <= n; i++) {
    lua_rawgeti(L, 1, i);
    prs[i - 1] = lfl_toprogram(L, -1);
    if (!prs[i - 1])
      return luaL_error(L, "compile_batch: element %I is a %s, expected a C program "
                        "(p:codegen(\"cpu\"))", i, lfl_typename(L, -1));
    lua_pop(L, 1);
  }
  err_clear(&e);
  if (exec_compile_batch(prs, (int)n, &e) != FL_OK) return lfl_raise(L, "compile_batch", &e);
  return 0;
}

/* Push a program of either backend as its Lua type (the reference moves). */
static void push_program(lua_State *L, exec_program *pr) {
  if (pr->be == &cpu_backend) *lfl_newprogram(L, &c_program) = pr;
  else lfl_pushcudaprogram(L, pr);
}

/* fl._pipeline(g, {backend = "cpu"|"cuda", passes = bool, fuse = bool})
** -> {decomposed =, optimized =, log =, plan =, program =, ok =,
** compile_log =, cause =, times = {{stage, ms}...}}: exec/pipeline.c's
** build, every stage as Lua sees it.  ok false: compiling failed,
** compile_log says why (cause: when the compiler is not what failed, as
** k:try_compile's third result).  A stage before that raises. */
static int l_pipeline(lua_State *L) {
  static const char *const keys[] = {"backend", "passes", "fuse", NULL};
  ir_graph *g = lfl_checkgraph(L, 1);
  exec_pipeline_opts o = {&cpu_backend, 1, 1};
  exec_pipeline b;
  fl_err e;
  int k;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lfl_checkkeys(L, 2, keys, "_pipeline");
    if (lua_getfield(L, 2, "backend") == LUA_TSTRING && strcmp(lua_tostring(L, -1), "cuda") == 0) {
      if (!(o.be = lfl_cuda_backend())) return luaL_error(L, "codegen: no CUDA device: fuselab was built without CUDA");
    }
    if (lua_getfield(L, 2, "passes") != LUA_TNIL) o.passes = lua_toboolean(L, -1);
    if (lua_getfield(L, 2, "fuse") != LUA_TNIL) o.fuse = lua_toboolean(L, -1);
    lua_pop(L, 3);
  }
  err_clear(&e);
  if (exec_pipeline_build(g, &o, &b, &e) != FL_OK)
    return lfl_raise(L, o.be == &cpu_backend || e.code != FL_EUNSUPPORTED ? "compile" : "codegen", &e);
  lua_createtable(L, 0, 10);
  if (b.decomposed) {
    lfl_pushgraph(L, b.decomposed);
    lfl_note_origin(L, 1, b.decomposed);
    lua_setfield(L, -2, "decomposed");
    lfl_pushgraph(L, b.optimized);
    lfl_note_origin(L, 1, b.optimized);
    lua_setfield(L, -2, "optimized");
    b.decomposed = b.optimized = NULL;
  }
  lua_pushstring(L, b.log ? b.log : "");
  lua_setfield(L, -2, "log");
  lfl_pushplan(L, b.plan);
  lfl_note_origin(L, 1, b.plan);
  lua_setfield(L, -2, "plan");
  push_program(L, b.pr);
  b.pr = NULL;
  lua_setfield(L, -2, "program");
  lua_pushboolean(L, b.compile_rc == FL_OK);
  lua_setfield(L, -2, "ok");
  if (b.compile_rc != FL_OK) {
    lua_getfield(L, -1, "program");
    lua_pushfstring(L, "%s\n%s", b.compile_err.msg, exec_program_log(lfl_toanyprogram(L, -1)));
    lua_setfield(L, -3, "compile_log");
    lua_pop(L, 1);
    if (b.compile_rc != FL_ECOMPILE) {
      lua_pushstring(L, b.compile_err.msg);
      lua_setfield(L, -2, "cause");
    }
  }
  lua_createtable(L, EXEC_NSTAGES, 0);
  for (k = 0; k < EXEC_NSTAGES; k++) {
    lua_createtable(L, 2, 0);
    lua_pushstring(L, exec_stage_names[k]);
    lua_rawseti(L, -2, 1);
    lua_pushnumber(L, b.ms[k]);
    lua_rawseti(L, -2, 2);
    lua_rawseti(L, -2, k + 1);
  }
  lua_setfield(L, -2, "times");
  exec_pipeline_clear(&b);
  return 1;
}

static const luaL_Reg plan_funcs[] = {
  {"_pipeline", l_pipeline},
  {"_print_kernel_times", l_print_kernel_times}, {"_bytes_str", l_bytes_str},
  {"compile_batch", l_compile_batch},
  {"cache_info", l_cache_info}, {"cache_clear", l_cache_clear}, {"blas_info", l_blas_info},
  {"host_pool_info", l_host_pool_info},
  {"_cache_forget_memory", l_cache_forget},
  {NULL, NULL}
};

static void new_type(lua_State *L, const char *name, lua_CFunction gc,
                     lua_CFunction tostr, const luaL_Reg *methods) {
  if (luaL_newmetatable(L, name)) {
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, tostr);
    lua_setfield(L, -2, "__tostring");
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "methods");
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
}

void lfl_open_plan(lua_State *L, int lib) {
  lib = lua_absindex(L, lib);
  new_type(L, PLAN_TYPE, p_gc, p_tostring, plan_methods);
  lfl_program_type(L, &c_program, program_methods);
  /* g:fuse joins the Graph's methods */
  luaL_getmetatable(L, "fl.Graph");
  lua_getfield(L, -1, "__index");
  lua_pushcfunction(L, g_fuse);
  lua_setfield(L, -2, "fuse");
  lua_pop(L, 2);
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, plan_funcs, 0);
  lua_pop(L, 1);
}
