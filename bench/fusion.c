/*
** bench/fusion.c -- what fusion and C code generation buy, as ratios
** measured in one run against this machine's own ceilings: copy bandwidth
** (the best of memcpy and a two-thread copy loop) for memory-bound
** kernels, eager execution (cpu/eager.c, one kernel per op) as the
** baseline (and PyTorch eager for the models, when python3-torch loads),
** and compile latency cold (empty cache) and warm (disk cache, memory
** forgotten as in a new process).
** Invariant: every time is the best of `reps` runs after one warm-up run;
** bytes count each kernel input read and each output written once.
**
**   make bench/fusion && ./bench/fusion [reps [section]]
** where section (default: all) is one of elementwise, rows, models, latency.
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu/eager.h"
#include "exec/measure.h"
#include "cpu/backend.h"
#include "exec/cache.h"
#include "tests/unit/fuse_graphs.h"

#define N (16 * 1024 * 1024)

static int reps = 7;
static char *evict;          /* 64 MiB read before a cold run: the L3 is 32 MiB */
static int cold;
static volatile uint64_t evict_sink;

/* Evict the caches by *reading* 64 MiB: the lines left behind are clean,
** so the timed run pays no write-back of someone else's data (a memset
** here left up to 32 MiB dirty in L3 and charged it to the kernel). */
static void flush_caches(void) {
  const uint64_t *w = (const uint64_t *)evict;
  uint64_t acc = 0;
  size_t i, n = ((size_t)64 << 20) / sizeof *w;
  if (!cold || !evict) return;
#pragma omp parallel for reduction(^:acc)
  for (i = 0; i < n; i += 8) acc ^= w[i];
  evict_sink = acc;
}

static void die(const char *what, const fl_err *e) {
  fprintf(stderr, "bench/fusion: %s: %s\n", what, e->msg);
  exit(1);
}

static fl_tensor make(const fl_meta *m) {
  fl_tensor t;
  fl_err e;
  int64_t i, n = meta_numel(m);
  float *p;
  if (ten_empty(&t, m, &e)) die("allocate", &e);
  p = ten_data(&t);
  for (i = 0; i < n; i++) p[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
  return t;
}

/* inputs for every graph input, from the graph's own shapes */
static void inputs_for(const ir_graph *g, fl_tensor *in, const fl_tensor **inp) {
  int i;
  for (i = 0; i < g->n; i++)
    if (g->nodes[i].kind == IR_INPUT) {
      in[g->nodes[i].index] = make(&g->nodes[i].meta);
      inp[g->nodes[i].index] = &in[g->nodes[i].index];
    }
}

static exec_program *compiled(const ir_graph *g, int fuse) {
  fuse_opts o;
  fl_err e;
  fuse_plan *p;
  exec_program *pr;
  fuse_opts_default(&o);
  o.fuse = fuse;
  if (!(p = fuse_plan_build(g, &o, &e))) die("plan", &e);
  if (!(pr = exec_codegen(&cpu_backend, p, NULL, &e))) die("codegen", &e);
  fuse_plan_free(p);
  if (exec_program_compile(pr, &e)) { fprintf(stderr, "%s\n", exec_program_log(pr)); die("compile", &e); }
  return pr;
}

/* best time of a compiled run; out=1 writes into preallocated outputs */
static double time_prog(exec_program *pr, const fl_tensor **inp, int nin, int out) {
  fl_tensor o[4];
  fl_err e;
  double best = 1e30, t;
  int r, i, nout = pr->plan->g->nout;
  memset(o, 0, sizeof o);
  if (exec_program_run(pr, inp, nin, o, &e)) die("run", &e);
  for (r = 0; r < reps; r++) {
    if (!out) for (i = 0; i < nout; i++) ten_release(&o[i]);
    flush_caches();
    t = meas_now();
    if ((out ? exec_program_run_out : exec_program_run)(pr, inp, nin, o, &e)) die("run", &e);
    t = meas_now() - t;
    if (t < best) best = t;
  }
  for (i = 0; i < nout; i++) ten_release(&o[i]);
  return best;
}

static double time_eager(const ir_graph *g, const fl_tensor **inp, int nin) {
  fl_tensor o[4];
  fl_err e;
  double best = 1e30, t;
  int r, i;
  for (r = 0; r <= reps; r++) {
    memset(o, 0, sizeof o);
    t = meas_now();
    if (ir_run(g, eager_apply, inp, nin, o, &e)) die("eager", &e);
    t = meas_now() - t;
    if (r && t < best) best = t;
    for (i = 0; i < g->nout; i++) ten_release(&o[i]);
  }
  return best;
}

/* read + write GB/s of the best copy of n bytes */
static double copy_bw_of(size_t n) {
  char *a = malloc(n), *b = malloc(n);
  double best = 1e30, t;
  int r;
  memset(a, 1, n);
  memset(b, 2, n);
  for (r = 0; r < reps; r++) {
    t = meas_now();
    memcpy(b, a, n);
    t = meas_now() - t;
    if (t < best) best = t;
  }
  for (r = 0; r < reps; r++) {
    float *restrict fa = (float *)a, *restrict fb = (float *)b;
    int64_t i, m = (int64_t)(n / 4);
    t = meas_now();
#pragma omp parallel for simd schedule(static)
    for (i = 0; i < m; i++) fb[i] = fa[i];
    t = meas_now() - t;
    if (t < best) best = t;
  }
  free(a);
  free(b);
  return 2.0 * n / best / 1e9;   /* read + write */
}

static double copy_bw(void) { return copy_bw_of((size_t)N * 4); }

/* add, mul, sub, maximum, relu, abs, gt, where over x, y [N] */
static ir_graph *chain8(int transcendental) {
  ir_graph *g = ir_new();
  int x = fg_input(g, fg_meta(FL_F32, 1, (int64_t)N)), y = fg_input(g, fg_meta(FL_F32, 1, (int64_t)N));
  int a, b, c, d, f;
  if (!transcendental) {
    a = fg_bin(g, OP_ADD, x, y);
    b = fg_bin(g, OP_MUL, a, x);
    c = fg_bin(g, OP_SUB, b, y);
    d = fg_bin(g, OP_MAXIMUM, c, x);
    d = fg_un(g, OP_RELU, d);
    f = fg_un(g, OP_ABS, fg_bin(g, OP_SUB, d, y));
    f = fg_op(g, OP_WHERE, fg_bin(g, OP_GT, f, x), f, y);
  } else {
    a = fg_un(g, OP_TANH, fg_bin(g, OP_MUL, x, y));
    b = fg_bin(g, OP_MUL, a, fg_un(g, OP_SIGMOID, x));
    c = fg_un(g, OP_EXP, fg_un(g, OP_NEG, fg_un(g, OP_ABS, b)));
    f = fg_bin(g, OP_ADD, c, y);
  }
  ir_add_output(g, f, NULL);
  return g;
}

static void row(const char *what, double t, double bytes, double bw, double eager) {
  printf("%-34s %8.2f ms  %6.2f GB/s  %5.2f of copy", what, t * 1e3, bytes / t / 1e9, bytes / t / 1e9 / bw);
  if (eager > 0) printf("  %5.2fx eager", eager / t);
  printf("\n");
}

static void elementwise(void) {
  double bw;
  int tr;
  for (tr = 0; tr < 2; tr++) {
    ir_graph *g = chain8(tr);
    fl_tensor in[2];
    const fl_tensor *inp[2];
    exec_program *f = compiled(g, 1), *u = compiled(g, 0);
    double tf, tfa, tu, te, bytes = 3.0 * N * 4;
    inputs_for(g, in, inp);
    te = time_eager(g, inp, 2);
    bw = copy_bw();            /* the ceiling, measured next to what it bounds */
    tf = time_prog(f, inp, 2, 1);
    tfa = time_prog(f, inp, 2, 0);
    tu = time_prog(u, inp, 2, 0);
    printf("\n%s chain, %d ops, 16M float32 (fused: %d kernel, unfused: %d); copy %.1f GB/s\n",
           tr ? "transcendental (mul tanh sigmoid exp ...)" : "arithmetic (add mul sub max relu abs gt where)",
           ir_op_count(g), f->plan->nkernels, u->plan->nkernels, bw);
    row("fused, into preallocated output", tf, bytes, bw, te);
    row("fused, allocating its output", tfa, bytes, bw, te);
    row("unfused (one kernel per op)", tu, bytes, bw, te);
    row("eager (cpu/eager.c)", te, bytes, bw, te);
    if (tr) {
      /* the math alone: the same kernel on 64K elements that stay in L2 */
      ir_graph *gs = ir_new();
      fl_tensor sin_[2];
      const fl_tensor *sinp[2];
      exec_program *fs;
      double ts;
      int x = fg_input(gs, fg_meta(FL_F32, 1, (int64_t)65536)), y = fg_input(gs, fg_meta(FL_F32, 1, (int64_t)65536));
      int a = fg_un(gs, OP_TANH, fg_bin(gs, OP_MUL, x, y));
      int b = fg_bin(gs, OP_MUL, a, fg_un(gs, OP_SIGMOID, x));
      int c = fg_un(gs, OP_EXP, fg_un(gs, OP_NEG, fg_un(gs, OP_ABS, b)));
      ir_add_output(gs, fg_bin(gs, OP_ADD, c, y), NULL);
      fs = compiled(gs, 1);
      inputs_for(gs, sin_, sinp);
      {
        /* 256 back-to-back runs per sample: thread wake-ups amortized */
        fl_tensor so[1];
        fl_err e;
        double t0;
        int r, q;
        memset(so, 0, sizeof so);
        if (exec_program_run(fs, sinp, 2, so, &e)) die("run", &e);
        ts = 1e30;
        for (r = 0; r < reps; r++) {
          t0 = meas_now();
          for (q = 0; q < 256; q++) exec_program_run_out(fs, sinp, 2, so, &e);
          t0 = meas_now() - t0;
          if (t0 < ts) ts = t0;
        }
        ten_release(&so[0]);
      }
      printf("%-34s %8.2f ms  (same kernel, cache-resident input, scaled to 16M): fused is %.2f of it\n",
             "math alone", ts * 1e3, ts / tf);
      exec_program_free(fs);
      ten_release(&sin_[0]); ten_release(&sin_[1]);
      ir_free(gs);
    }
    exec_program_free(f);
    exec_program_free(u);
    ten_release(&in[0]); ten_release(&in[1]);
    ir_free(g);
  }
}

static void rows_kernel(const char *what, ir_graph *g) {
  double bw, bw16;
  fl_tensor in[2];
  const fl_tensor *inp[2];
  exec_program *f = compiled(g, 1);
  double t, tc, te, bytes = 2.0 * 4096 * 1024 * 4;
  int saved = reps;
  inputs_for(g, in, inp);
  te = time_eager(g, inp, 1);
  reps = 5 * saved;            /* ~1 ms runs on a shared machine: more samples */
  bw16 = copy_bw_of((size_t)4096 * 1024 * 4);   /* ceilings measured next to the runs */
  t = time_prog(f, inp, 1, 1);
  bw = copy_bw();
  cold = 1;
  tc = time_prog(f, inp, 1, 1);
  cold = 0;
  reps = saved;
  printf("%-30s cold %5.2f ms %5.1f GB/s %4.2f of DRAM copy (%4.1f) | warm %5.2f ms %5.1f GB/s %4.2f of 16 MiB copy (%4.1f) | %5.2fx eager\n",
         what, tc * 1e3, bytes / tc / 1e9, bytes / tc / 1e9 / bw, bw, t * 1e3, bytes / t / 1e9,
         bytes / t / 1e9 / bw16, bw16, te / t);
  exec_program_free(f);
  ten_release(&in[0]);
  ir_free(g);
}

/* PyTorch eager on the same models (bench/torch_models.py, when Debian's
** python3-torch loads): per model its best time and the sum of its output */
typedef struct torch_row { char name[16]; double ms, sum; } torch_row;
static torch_row torch_rows[8];
static int ntorch;

static void torch_times(void) {
  char cmd[1400], line[256];
  FILE *f;
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/bench/torch_models.py' %d 2>/dev/null", FL_SRCDIR, reps);
  if (!(f = popen(cmd, "r"))) return;
  while (ntorch < 8 && fgets(line, sizeof line, f)) {
    torch_row *r = &torch_rows[ntorch];
    if (sscanf(line, "%15s %lf %lf", r->name, &r->ms, &r->sum) == 3) ntorch++;
  }
  pclose(f);
}

static double out_sum(const fl_tensor *t) {
  int64_t i, n = meta_numel(&t->m);
  double s = 0;
  for (i = 0; i < n; i++) s += ten_get(t, i);
  return s;
}

static void model(const char *what, const char *torch_name, ir_graph *g) {
  fl_tensor in[2], o[1];
  const fl_tensor *inp[2];
  exec_program *f = compiled(g, 1);
  fl_err e;
  double t, te, sum;
  int i;
  inputs_for(g, in, inp);
  te = time_eager(g, inp, 1);
  t = time_prog(f, inp, 1, 0);
  memset(o, 0, sizeof o);
  if (exec_program_run(f, inp, 1, o, &e)) die("run", &e);
  sum = out_sum(&o[0]);
  ten_release(&o[0]);
  printf("%-34s %8.2f ms compiled, %8.2f ms eager: %5.2fx  (%d kernels for %d ops)\n",
         what, t * 1e3, te * 1e3, te / t, f->plan->nkernels, ir_op_count(g));
  for (i = 0; i < ntorch; i++) {
    const torch_row *r = &torch_rows[i];
    if (strcmp(r->name, torch_name) != 0) continue;
    printf("%-34s %8.2f ms PyTorch eager: compiled %5.2fx its speed; output sums %.6g vs %.6g (%s)\n",
           "", r->ms, r->ms / (t * 1e3), sum, r->sum,
           fabs(sum - r->sum) <= 1e-4 * (1 + fabs(r->sum)) ? "same model" : "DIFFERENT: not comparable");
  }
  exec_program_free(f);
  ten_release(&in[0]);
  ir_free(g);
}

static void latency(const char *what, ir_graph *g) {
  char tmpl[] = "/tmp/fl-bench-cache-XXXXXX";
  fuse_plan *p;
  exec_program *pr;
  fl_err e;
  double t0, cold, warm, plan_ms;
  if (!mkdtemp(tmpl)) return;
  setenv("FUSELAB_CACHE_DIR", tmpl, 1);
  cache_reset_dir();
  cache_forget_memory();
  t0 = meas_now();
  p = fuse_plan_build(g, NULL, &e);
  pr = exec_codegen(&cpu_backend, p, NULL, &e);
  plan_ms = (meas_now() - t0) * 1e3;
  t0 = meas_now();
  if (exec_program_compile(pr, &e)) die("compile", &e);
  cold = (meas_now() - t0) * 1e3;
  exec_program_free(pr);
  cache_forget_memory();
  t0 = meas_now();
  pr = exec_codegen(&cpu_backend, p, NULL, &e);
  if (exec_program_compile(pr, &e)) die("compile", &e);
  warm = (meas_now() - t0) * 1e3;
  printf("%-34s plan+codegen %.1f ms, cold compile %.0f ms, warm (disk, new process) %.1f ms\n",
         what, plan_ms, cold, warm);
  exec_program_free(pr);
  fuse_plan_free(p);
  cache_clear(&e);
  rmdir(tmpl);
  ir_free(g);
}

int main(int argc, char **argv) {
  char tmpl[] = "/tmp/fl-bench-XXXXXX";
  const char *only = argc > 2 ? argv[2] : NULL;
#define SECTION(name) (!only || strcmp(only, name) == 0)
  if (argc > 1) reps = atoi(argv[1]) > 0 ? atoi(argv[1]) : reps;
  if (only && !SECTION("elementwise") && !SECTION("rows") && !SECTION("models") && !SECTION("latency")) {
    fprintf(stderr, "bench/fusion: unknown section '%s' (elementwise, rows, models, latency)\n", only);
    return 2;
  }
  if (mkdtemp(tmpl)) setenv("FUSELAB_CACHE_DIR", tmpl, 1);
  printf("fuselab bench/fusion: best of %d, %ld cores\n", reps, sysconf(_SC_NPROCESSORS_ONLN));
  if (SECTION("elementwise")) {
    printf("copy bandwidth (read + write): %.2f GB/s\n", copy_bw());
    elementwise();
  }
  if (SECTION("rows")) {
    if ((evict = malloc((size_t)64 << 20))) memset(evict, 1, (size_t)64 << 20);
    printf("\nrow kernels, 4096x1024 float32: read 16 MiB + write 16 MiB.  cold: caches flushed before\n"
           "each run (input from DRAM), against a 64 MiB copy (GB/s in brackets); warm: repeated runs,\n"
           "the data partly in the 32 MiB L3, against a 16 MiB copy.  Ceilings measured next to each row.\n");
    rows_kernel("softmax", fg_softmax(4096, 1024, 0, 0));
    rows_kernel("softmax (decomposed, 5 ops)", fg_softmax(4096, 1024, 1, 0));
    rows_kernel("layer_norm", fg_norm(4096, 1024, 0, 0));
    rows_kernel("layer_norm (decomposed, 9 ops)", fg_norm(4096, 1024, 1, 0));
    free(evict);
  }
  if (SECTION("models")) {
    torch_times();
    printf("\nmodels%s\n", ntorch ? " (and PyTorch eager, 2 threads, same weights and inputs)"
                                  : " (PyTorch not compared: python3-torch does not load)");
    model("MLP 1024x256 -> 1024 -> 256", "mlp", fg_mlp(1024, 256, 1024));
    model("transformer block 8x128x256", "block", fg_block(8, 128, 256));
    model("the same with 4 heads", "block4", fg_block_heads(8, 128, 256, 4));
  }
  if (SECTION("latency")) {
    printf("\ncompile latency\n");
    latency("softmax", fg_softmax(4096, 1024, 1, 0));
    latency("transformer block", fg_block(8, 128, 256));
  }
  {
    fl_err e;
    setenv("FUSELAB_CACHE_DIR", tmpl, 1);
    cache_reset_dir();
    cache_clear(&e);
    rmdir(tmpl);
  }
  return 0;
}
