/*
** bench/eager.c -- how fast eager execution is, measured against the
** machine's own ceilings in the same run: memcpy bandwidth for
** memory-bound ops, OpenBLAS sgemm called directly for matmul.
** Invariant: every number printed is the best of N repetitions of the
** full eager_apply call (output allocation included, as a user pays it),
** and bytes count each input read and each output written once.
**
**   make bench/eager && ./bench/eager [reps]
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/eager.h"
#include "exec/measure.h"

#define N (16 * 1024 * 1024)       /* elements of the elementwise tensors */

static int reps = 10;

static void die(const char *what, const fl_err *e) {
  fprintf(stderr, "bench/eager: %s: %s\n", what, e->msg);
  exit(1);
}

static fl_tensor make(fl_dtype dt, int ndim, int64_t d0, int64_t d1) {
  fl_tensor t;
  fl_meta m;
  fl_err e = {0};
  int64_t i, n;
  memset(&m, 0, sizeof m);
  m.dtype = dt;
  m.ndim = ndim;
  m.shape[0] = d0;
  m.shape[1] = d1;
  if (ten_empty(&t, &m, &e) != FL_OK) die("allocate", &e);
  n = meta_numel(&m);
  if (dt == FL_F32) {
    float *p = ten_data(&t);
    for (i = 0; i < n; i++) p[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
  } else {
    unsigned char *p = ten_data(&t);
    for (i = 0; i < n; i++) p[i] = (unsigned char)((i * 7919) % 3 == 0);
  }
  return t;
}

/* Best time of one eager op over reps runs (one untimed warm-up). */
static double time_op(fl_op op, const fl_tensor *const *in, int nin,
                      const op_attrs *a) {
  double best = 1e30;
  int r;
  for (r = 0; r <= reps; r++) {
    fl_tensor out;
    fl_err e = {0};
    double t0 = meas_now(), dt;
    if (eager_apply(op, in, nin, a, &out, &e) != FL_OK) die(op_name(op), &e);
    dt = meas_now() - t0;
    ten_release(&out);
    if (r > 0 && dt < best) best = dt;
  }
  return best;
}

static double time_memcpy(float *dst, const float *src, int parallel) {
  double best = 1e30;
  int r;
  for (r = 0; r <= reps; r++) {
    double t0 = meas_now(), dt;
    if (parallel) {
      int64_t c, nch = 64, ch = N / 64;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
      for (c = 0; c < nch; c++)
        memcpy(dst + c * ch, src + c * ch, (size_t)ch * sizeof *dst);
    } else {
      memcpy(dst, src, (size_t)N * sizeof *dst);
    }
    dt = meas_now() - t0;
    if (r > 0 && dt < best) best = dt;
  }
  return best;
}

static void row(const char *name, double bytes, double t, double ref1,
                double refp) {
  double gbs = bytes / t / 1e9;
  printf("%-28s %9.2f ms %9.2f GB/s %8.2f %8.2f\n", name, t * 1e3, gbs,
         gbs / ref1, gbs / refp);
}

int main(int argc, char **argv) {
  fl_tensor x, y, c, s, m1, m2;
  const fl_tensor *in[3];
  op_attrs a;
  float *src, *dst;
  double t, mc1, mcp, bw1, bwp, flops, t_blas, t_eager;
  int threads = 1;
  if (argc > 1) reps = atoi(argv[1]) > 0 ? atoi(argv[1]) : reps;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  printf("fuselab eager benchmark: best of %d runs, %ld CPUs online, "
         "%d OpenMP threads\n\n", reps, sysconf(_SC_NPROCESSORS_ONLN), threads);

  /* --- the memory ceiling ---------------------------------------------- */
  src = malloc((size_t)N * sizeof *src);
  dst = malloc((size_t)N * sizeof *dst);
  if (!src || !dst) { fprintf(stderr, "bench/eager: out of memory\n"); return 1; }
  memset(src, 1, (size_t)N * sizeof *src);
  memset(dst, 0, (size_t)N * sizeof *dst);
  mc1 = time_memcpy(dst, src, 0);
  mcp = time_memcpy(dst, src, 1);
  bw1 = 2.0 * N * 4 / mc1 / 1e9;
  bwp = 2.0 * N * 4 / mcp / 1e9;
  free(src);
  free(dst);
  printf("%-28s %12s %14s %8s %8s\n", "16M float32 (bytes r+w)", "time",
         "bandwidth", "/memcpy", "/memcpy-par");
  row("memcpy (1 thread)", 2.0 * N * 4, mc1, bw1, bwp);
  row("memcpy (OpenMP threads)", 2.0 * N * 4, mcp, bw1, bwp);

  /* --- elementwise --------------------------------------------------------- */
  x = make(FL_F32, 1, N, 0);
  y = make(FL_F32, 1, N, 0);
  c = make(FL_BOOL, 1, N, 0);
  in[0] = &x; in[1] = &y;
  op_attrs_init(OP_ADD, &a);
  row("eager add", 3.0 * N * 4, time_op(OP_ADD, in, 2, &a), bw1, bwp);
  row("eager mul", 3.0 * N * 4, time_op(OP_MUL, in, 2, &a), bw1, bwp);
  row("eager exp", 2.0 * N * 4, time_op(OP_EXP, in, 1, &a), bw1, bwp);
  row("eager relu", 2.0 * N * 4, time_op(OP_RELU, in, 1, &a), bw1, bwp);
  in[0] = &c; in[1] = &x; in[2] = &y;
  row("eager where", 3.0 * N * 4 + N, time_op(OP_WHERE, in, 3, &a), bw1, bwp);
  ten_release(&x);
  ten_release(&y);
  ten_release(&c);

  /* --- rows ---------------------------------------------------------------- */
  s = make(FL_F32, 2, 4096, 1024);
  in[0] = &s;
  op_attrs_init(OP_SOFTMAX, &a);
  a.i[0] = 1;
  row("eager softmax 4096x1024", 2.0 * 4096 * 1024 * 4,
      time_op(OP_SOFTMAX, in, 1, &a), bw1, bwp);
  ten_release(&s);
  s = make(FL_F32, 2, 16384, 1024);
  in[0] = &s;
  op_attrs_init(OP_SUM, &a);
  a.ndims = 1;
  a.dims[0] = 1;
  t = time_op(OP_SUM, in, 1, &a);
  row("eager sum(-1) 16384x1024", 4.0 * 16384 * 1024 + 4.0 * 16384, t, bw1, bwp);
  ten_release(&s);

  /* --- matmul ---------------------------------------------------------------- */
  m1 = make(FL_F32, 2, 1024, 1024);
  m2 = make(FL_F32, 2, 1024, 1024);
  flops = 2.0 * 1024 * 1024 * 1024;
  {
    fl_tensor out;
    fl_err e = {0};
    double best = 1e30;
    int r;
    if (ten_empty(&out, &m1.m, &e) != FL_OK) die("allocate", &e);
    for (r = 0; r <= reps; r++) {
      double t0 = meas_now(), dt;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1024, 1024, 1024,
                  1.0f, ten_data(&m1), 1024, ten_data(&m2), 1024, 0.0f,
                  ten_data(&out), 1024);
      dt = meas_now() - t0;
      if (r > 0 && dt < best) best = dt;
    }
    ten_release(&out);
    t_blas = best;
  }
  in[0] = &m1; in[1] = &m2;
  op_attrs_init(OP_MATMUL, &a);
  t_eager = time_op(OP_MATMUL, in, 2, &a);
  printf("\n%-28s %12s %14s %8s\n", "matmul 1024^3", "time", "GFLOP/s",
         "/sgemm");
  printf("%-28s %9.2f ms %9.2f      %8.2f\n", "cblas_sgemm direct",
         t_blas * 1e3, flops / t_blas / 1e9, 1.0);
  printf("%-28s %9.2f ms %9.2f      %8.2f\n", "eager matmul", t_eager * 1e3,
         flops / t_eager / 1e9, t_blas / t_eager);
  ten_release(&m1);
  ten_release(&m2);
  return 0;
}
