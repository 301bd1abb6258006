/*
** test_nvrtc.c -- every generated CUDA kernel compiles, with or without a
** GPU: for every op of ops.def as a single-op graph (float32, and float16
** and bfloat16 where the op takes them; with an elementwise consumer too,
** so extern epilogues are generated), and for random graphs from the
** differential test's generator, fused and unfused, p:codegen("cuda") plus
** an NVRTC compile succeeds.  Then the disk cache (memory hit, disk hit,
** corrupt blob rebuilt), the NVRTC log on a failing source, and, without a
** device, the clean "no CUDA device: <runtime's reason>" from a run.
**
** Programs are compiled in batches (one NVRTC program for many graphs,
** kernel symbols prefixed per graph), two batches at a time on two
** threads.  Exits 77 only when NVRTC itself cannot be used.
** Environment: FUSELAB_NVRTC_GRAPHS (default 300), FUSELAB_NVRTC_SEED
** (default 1).
*/
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"
#include "random_graph.h"
#include "fuse/plan.h"
#include "gpu/cuda.h"
#include "gpu/cuda_program.h"
#include "gpu/cublas.h"
#include "graph/pass.h"
#include "exec/cache.h"

#define PER_BATCH 50       /* graphs per NVRTC program (x2: fused, unfused) */

/* --- single-op graphs ------------------------------------------------------ */

typedef struct opcase {
  char what[96];
  ir_graph *g;
  exec_program *pr;
  int tried;
} opcase;

#define MAX_CASES 1024   /* one per op, dtype and epilogue: 8 per row of ops.def at most */
static opcase cases[MAX_CASES];
typedef char cases_fit[OP_COUNT * 8 <= MAX_CASES ? 1 : -1];   /* a new op row cannot overflow it */
static int ncases;

/* Plan g (decomposing first when the planner refuses a composite) and
** generate CUDA with a unique prefix. */
static exec_program *cuda_for(ir_graph *g, int fuse, const char *prefix, char *why, size_t nwhy) {
  fuse_opts o;
  fuse_plan *p;
  exec_program *pr;
  fl_err e;
  fuse_opts_default(&o);
  o.fuse = fuse;
  err_clear(&e);
  if (!(p = fuse_plan_build(g, &o, &e))) {
    ir_graph *d = pass_decompose(g, NULL, &e);
    if (d) { p = fuse_plan_build(d, &o, &e); ir_free(d); }
    if (!p) { snprintf(why, nwhy, "plan: %s", e.msg); return NULL; }
  }
  pr = exec_codegen(&cuda_backend, p, prefix, &e);
  fuse_plan_free(p);
  if (!pr) snprintf(why, nwhy, "codegen: %s", e.msg);
  return pr;
}

/* compile a batch; on failure find the culprits one by one */
static int compile_all(exec_program **prs, char **names, int n, int *bad) {
  fl_err e;
  int i, nbad = 0;
  if (n == 0) return 0;
  if (exec_compile_batch(prs, n, &e) == FL_OK) return 0;
  printf("# batch of %d failed: %.300s\n", n, e.msg);
  for (i = 0; i < n; i++) {
    if (exec_program_compile(prs[i], &e) == FL_OK) continue;
    printf("# %s: %.2000s\n", names[i], e.msg);
    bad[i] = 1;
    nbad++;
  }
  return nbad ? nbad : -1;
}

typedef struct job {
  exec_program **prs;
  char **names;
  int *bad;
  int n, rc;
} job;

static void *run_job(void *arg) {
  job *j = arg;
  j->rc = compile_all(j->prs, j->names, j->n, j->bad);
  return NULL;
}

static void test_every_op(void) {
  static const fl_dtype dts[] = {FL_F32, FL_F16, FL_BF16, FL_I64};
  exec_program *prs[MAX_CASES];
  char *names[MAX_CASES];
  int bad[MAX_CASES];
  int op, d, epi, n = 0, i, ngraphs = 0, nops = 0;
  char why[1200];
  for (op = 0; op < OP_COUNT; op++) {
    int any = 0;
    for (d = 0; d < 4; d++)
      for (epi = 0; epi < 2; epi++) {
        opcase *c = &cases[ncases];
        ir_graph *g = fg_op_graph((fl_op)op, dts[d], epi);
        char prefix[32];
        if (!g) continue;   /* the dtype is not legal for the op */
        snprintf(c->what, sizeof c->what, "%s %s%s", op_name((fl_op)op), dtype_name(dts[d]),
                 epi ? " + relu" : "");
        snprintf(prefix, sizeof prefix, "o%d_%d_%d_", op, d, epi);
        c->g = g;
        c->pr = cuda_for(g, 1, prefix, why, sizeof why);
        ok(c->pr != NULL, "codegen(\"cuda\"): %s", c->what);
        if (!c->pr) printf("#   %s\n", why);
        else { prs[n] = c->pr; names[n] = c->what; bad[n] = 0; n++; any = 1; }
        ncases++;
        ngraphs++;
      }
    nops += any;
  }
  ok(nops == OP_COUNT, "every op of ops.def has a CUDA program (%d of %d ops, %d graphs)",
     nops, OP_COUNT, ngraphs);
  {
    /* two NVRTC programs, compiled side by side */
    job jb[2];
    pthread_t th;
    int h = n / 2, started;
    jb[0].prs = prs; jb[0].names = names; jb[0].bad = bad; jb[0].n = h;
    jb[1].prs = prs + h; jb[1].names = names + h; jb[1].bad = bad + h; jb[1].n = n - h;
    started = pthread_create(&th, NULL, run_job, &jb[1]) == 0;
    if (!started) run_job(&jb[1]);
    run_job(&jb[0]);
    if (started) pthread_join(th, NULL);
    ok(jb[0].rc == 0 && jb[1].rc == 0, "NVRTC compiles the %d single-op programs", n);
    for (i = 0; i < n; i++)
      if (bad[i]) ok(0, "NVRTC compiles %s", names[i]);
  }
  for (i = 0; i < ncases; i++) { exec_program_free(cases[i].pr); ir_free(cases[i].g); }
}

/* --- random graphs ------------------------------------------------------------- */

static void test_random(void) {
  const char *eg = getenv("FUSELAB_NVRTC_GRAPHS"), *es = getenv("FUSELAB_NVRTC_SEED");
  long total = eg ? atol(eg) : 300, done = 0, programs = 0, failures = 0, skipped = 0;
  uint64_t seed = es ? strtoull(es, NULL, 10) : 1, next = seed;
  time_t t0 = time(NULL);
  while (done < total) {
    /* two batches, compiled side by side */
    exec_program *prs[2][2 * PER_BATCH];
    char *names[2][2 * PER_BATCH];
    char namebuf[2][2 * PER_BATCH][48];
    int bad[2][2 * PER_BATCH];
    ir_graph *gs[2 * PER_BATCH];
    int ng = 0, np[2] = {0, 0}, h, i, f;
    job jb[2];
    pthread_t th;
    int started;
    while (ng < 2 * PER_BATCH && done + ng < total) {
      ir_graph *g = rg_random_graph(next);
      char why[1200];
      h = ng / PER_BATCH;
      if (!g) { skipped++; next++; continue; }
      gs[ng] = g;
      for (f = 0; f < 2; f++) {
        char prefix[32];
        exec_program *pr;
        snprintf(prefix, sizeof prefix, "g%llu%c_", (unsigned long long)next, f ? 'u' : 'f');
        pr = cuda_for(g, !f, prefix, why, sizeof why);
        if (!pr) {
          failures++;
          printf("# graph seed %llu (%s): %s\n", (unsigned long long)next, f ? "unfused" : "fused", why);
          continue;
        }
        snprintf(namebuf[h][np[h]], 48, "graph seed %llu %s", (unsigned long long)next,
                 f ? "unfused" : "fused");
        names[h][np[h]] = namebuf[h][np[h]];
        bad[h][np[h]] = 0;
        prs[h][np[h]++] = pr;
      }
      ng++;
      next++;
    }
    for (h = 0; h < 2; h++) {
      jb[h].prs = prs[h]; jb[h].names = names[h]; jb[h].bad = bad[h]; jb[h].n = np[h]; jb[h].rc = 0;
    }
    started = pthread_create(&th, NULL, run_job, &jb[1]) == 0;
    if (!started) run_job(&jb[1]);
    run_job(&jb[0]);
    if (started) pthread_join(th, NULL);
    for (h = 0; h < 2; h++) {
      if (jb[h].rc) {
        failures += jb[h].rc > 0 ? jb[h].rc : 1;
        for (i = 0; i < np[h]; i++)
          if (bad[h][i])
            printf("# failed: %s (reproduce: FUSELAB_NVRTC_SEED=<seed> FUSELAB_NVRTC_GRAPHS=1)\n",
                   names[h][i]);
      }
      for (i = 0; i < np[h]; i++) exec_program_free(prs[h][i]);
      programs += np[h];
    }
    for (i = 0; i < ng; i++) ir_free(gs[i]);
    done += ng;
    nvrtc_forget_memory();
  }
  ok(failures == 0, "%ld random graphs (seeds %llu..%llu): %ld CUDA programs, fused and unfused, "
     "generate and compile with NVRTC in %.0f s", done, (unsigned long long)seed,
     (unsigned long long)(next - 1), programs, difftime(time(NULL), t0));
  if (skipped) printf("# %ld seeds gave no graph\n", skipped);
}

/* --- the cache, the log, the no-device error ------------------------------------------ */

static void test_cache_and_errors(void) {
  const char *src = "extern \"C\" __global__ void fl_probe(float *p) { p[threadIdx.x] *= 2.0f; }\n";
  const char *bad = "extern \"C\" __global__ void fl_broken(float *p) { p[0] = undeclared_name; }\n";
  nvrtc_image img;
  char *log = NULL;
  fl_err e;
  int rc;
  nvrtc_cache_clear();
  rc = nvrtc_compile(src, "probe.cu", 90, &img, NULL, &e);
  ok(rc == FL_OK && img.how == CACHE_COMPILED && img.cubin_n > 0 && strstr(img.ptx, "fl_probe"),
     "cold compile: a CUBIN and the PTX (%s)", rc == FL_OK ? img.arch : e.msg);
  nvrtc_image_free(&img);
  rc = nvrtc_compile(src, "probe.cu", 90, &img, NULL, &e);
  ok(rc == FL_OK && img.how == CACHE_MEMORY, "second request: from memory");
  nvrtc_image_free(&img);
  nvrtc_forget_memory();
  rc = nvrtc_compile(src, "probe.cu", 90, &img, NULL, &e);
  ok(rc == FL_OK && img.how == CACHE_DISK && img.cubin_n > 0, "after forgetting memory: from disk");
  nvrtc_image_free(&img);
  {
    /* corrupt every blob on disk: it must be rebuilt, not used */
    cache_info ci;
    char cmd[1200];
    cache_get_info(&ci, &e);
    snprintf(cmd, sizeof cmd, "for f in '%s'/*.cubin; do printf garbage > \"$f\"; done", ci.dir);
    ok(system(cmd) == 0, "corrupted the cached blobs");
    nvrtc_forget_memory();
    rc = nvrtc_compile(src, "probe.cu", 90, &img, NULL, &e);
    ok(rc == FL_OK && img.how == CACHE_COMPILED && img.cubin_n > 0, "a corrupt blob is rebuilt");
    nvrtc_image_free(&img);
  }
  rc = nvrtc_compile(bad, "broken.cu", 90, &img, &log, &e);
  ok(rc == FL_ECOMPILE && log && strstr(log, "undeclared_name"), "a failing source: FL_ECOMPILE with NVRTC's log");
  ok(strstr(e.msg, "undeclared_name") != NULL, "the error message carries the log");
  free(log);
  {
    /* a program run without a device: the runtime's reason */
    ir_graph *g = rg_random_graph(7);
    char why[1200];
    exec_program *pr = g ? cuda_for(g, 1, "nd_", why, sizeof why) : NULL;
    fl_tensor in[RG_MAXN], out[8];
    const fl_tensor *inp[RG_MAXN];
    int i;
    memset(in, 0, sizeof in);
    memset(out, 0, sizeof out);
    if (pr && g) {
      rg_fill_inputs(g, in, 7);
      for (i = 0; i < g->ninputs; i++) inp[i] = &in[i];
      err_clear(&e);
      if (!cuda_available(NULL)) {
        rc = cuda_program_run(pr, inp, g->ninputs, out, &e);
        ok(rc == FL_ENODEV && strncmp(e.msg, "no CUDA device: ", 16) == 0,
           "run without a device: %s", e.msg);
        ok(pr->image || exec_program_compile(pr, &e) == FL_OK, "the program still compiles");
        err_clear(&e);
        ok(!cublas_ready(&e) && strncmp(e.msg, "no CUDA device: ", 16) == 0,
           "cuBLAS without a device: not offered, and why (%s)", e.msg);
        err_clear(&e);
        ok(cuda_program_autotune(pr, inp, g->ninputs, &e) == FL_ENODEV,
           "max-autotune without a device: the no-device error (%s)", e.msg);
      } else {
        rc = cuda_program_run(pr, inp, g->ninputs, out, &e);
        ok(rc == FL_OK, "a device is present: the program runs (%s)", rc ? e.msg : "ok");
      }
    } else {
      ok(0, "a program for the no-device check");
    }
    for (i = 0; i < RG_MAXN; i++) ten_release(&in[i]);
    for (i = 0; i < 8; i++) ten_release(&out[i]);
    exec_program_free(pr);
    ir_free(g);
  }
}

int main(void) {
  fl_err e;
  char tmpl[] = "/tmp/fl-nvrtc-XXXXXX";
  if (!nvrtc_available(&e)) {
    printf("1..0 # SKIP NVRTC cannot be used: %s\n", e.msg);
    return 77;
  }
  /* a private cache: clearing it must not touch the shared one */
  if (mkdtemp(tmpl)) { setenv("FUSELAB_CACHE_DIR", tmpl, 1); cache_reset_dir(); }
  printf("# NVRTC %s, compiling for sm_%d\n", nvrtc_version_str(), nvrtc_default_arch());
  test_every_op();
  test_random();
  test_cache_and_errors();
  nvrtc_cache_clear();
  rmdir(tmpl);
  return tap_done();
}
