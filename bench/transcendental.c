/*
** bench/transcendental.c -- the eager transcendental kernels (tanh, exp,
** log, sin, cos, erf, sigmoid, silu, gelu, sqrt, rsqrt) against the libm
** loop they replaced, in one run: "libm" is the scalar loop the eager
** kernel ran before (y[i] = tanhf(x[i]), one thread), "eager 1T" the
** eager_apply call on one OpenMP thread, "eager" on all of them.  The
** ratio columns divide by the libm loop, so before/after is read off one
** run on one machine.  Each time is the median of reps runs (one untimed
** warm-up), bytes count one read and one write per element; the max
** error column is the largest distance in float32 ulps from the double
** result of libm, over the same inputs (values in [-8, 8], plus 0), for
** the eager kernel and for the libm loop.
**
**   make bench/transcendental && ./bench/transcendental [reps]
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/eager.h"
#include "exec/measure.h"

#define N (4 * 1024 * 1024)   /* elements: 16 MiB a tensor */

static int reps = 9;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* The loops the eager kernels were before: libm, one element at a time. */
static float ref_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static float ref_silu(float x) { return x / (1.0f + expf(-x)); }
static float ref_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
static float ref_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
static float ref_rsqrt(float x) { return 1.0f / sqrtf(x); }

static double d_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double d_silu(double x) { return x / (1.0 + exp(-x)); }
/* 1 + erf(v) = erfc(-v) and 1 + tanh(u) = 2 / (1 + e^-2u): the exact
** values keep their digits where GELU is tiny (x < -3), which the libm
** formula, even in double, rounds to 0 */
static double d_gelu(double x) { return 0.5 * x * erfc(-x * M_SQRT1_2); }
static double d_gelu_tanh(double x) {
  return x / (1.0 + exp(-2.0 * 0.79788456080286536 * (x + 0.044715 * x * x * x)));
}
static double d_rsqrt(double x) { return 1.0 / sqrt(x); }

static const struct {
  const char *name;
  fl_op op;
  float (*libm)(float);
  double (*exact)(double);
  int positive;            /* log, sqrt, rsqrt: inputs |x| */
} ops[] = {
  {"tanh", OP_TANH, tanhf, tanh, 0},
  {"exp", OP_EXP, expf, exp, 0},
  {"log", OP_LOG, logf, log, 1},
  {"sin", OP_SIN, sinf, sin, 0},
  {"cos", OP_COS, cosf, cos, 0},
  {"erf", OP_ERF, erff, erf, 0},
  {"sigmoid", OP_SIGMOID, ref_sigmoid, d_sigmoid, 0},
  {"silu", OP_SILU, ref_silu, d_silu, 0},
  {"gelu", OP_GELU, ref_gelu, d_gelu, 0},
  {"gelu (tanh)", OP_GELU_TANH, ref_gelu_tanh, d_gelu_tanh, 0},
  {"sqrt", OP_SQRT, sqrtf, sqrt, 1},
  {"rsqrt", OP_RSQRT, ref_rsqrt, d_rsqrt, 1},
};

/* Distance in float32 ulps between a and the float nearest b. */
static double ulps(float a, double b) {
  float r = (float)b;
  int32_t ia, ib;
  if (isnan(a) && isnan(r)) return 0;
  if (isnan(a) || isnan(r)) return 1e9;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &r, 4);
  if (ia < 0) ia = INT32_MIN - ia;
  if (ib < 0) ib = INT32_MIN - ib;
  return fabs((double)ia - (double)ib);
}

static double time_libm(float (*f)(float), float *y, const float *x) {
  double t[64];
  int r, k;
  for (r = 0; r <= reps; r++) {
    double t0 = meas_now();
    for (k = 0; k < N; k++) y[k] = f(x[k]);
    if (r > 0) t[r - 1] = meas_now() - t0;
  }
  return median(t, reps);
}

static double time_eager(fl_op op, const fl_tensor *in, const op_attrs *a,
                         fl_tensor *keep) {
  double t[64];
  int r;
  for (r = 0; r <= reps; r++) {
    fl_tensor out;
    fl_err e = {0};
    const fl_tensor *ins[1] = {in};
    double t0 = meas_now();
    if (eager_apply(op, ins, 1, a, &out, &e) != FL_OK) {
      fprintf(stderr, "bench/transcendental: %s: %s\n", op_name(op), e.msg);
      exit(1);
    }
    if (r > 0) t[r - 1] = meas_now() - t0;
    if (r == reps) *keep = out; else ten_release(&out);
  }
  return median(t, reps);
}

int main(int argc, char **argv) {
  fl_tensor x, xp, out;
  fl_meta m;
  fl_err e = {0};
  float *px, *pp, *y;
  int i, k, threads = 1;
  if (argc > 1 && atoi(argv[1]) > 0) reps = atoi(argv[1]) < 64 ? atoi(argv[1]) : 63;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  memset(&m, 0, sizeof m);
  m.dtype = FL_F32;
  m.ndim = 1;
  m.shape[0] = N;
  if (ten_empty(&x, &m, &e) != FL_OK || ten_empty(&xp, &m, &e) != FL_OK ||
      (y = malloc((size_t)N * sizeof *y)) == NULL) {
    fprintf(stderr, "bench/transcendental: out of memory\n");
    return 1;
  }
  px = ten_data(&x);
  pp = ten_data(&xp);
  for (k = 0; k < N; k++) {
    px[k] = (float)(((int64_t)k * 7919) % 16001 - 8000) / 1000.0f;
    pp[k] = fabsf(px[k]) + 1e-3f;
  }
  printf("fuselab eager transcendentals: median of %d runs, %d float32 elements, "
         "%ld CPUs online, %d OpenMP threads\n", reps, N, sysconf(_SC_NPROCESSORS_ONLN),
         threads);
  printf("GB/s counts one read and one write per element; x: eager / libm loop; "
         "err: max float32 ulps from double libm (libm err: of the libm loop)\n\n");
  printf("%-12s %10s %10s %10s %8s %8s %8s %8s\n", "op", "libm GB/s", "eager 1T",
         "eager", "x (1T)", "x", "libm err", "err");
  for (i = 0; i < (int)(sizeof ops / sizeof ops[0]); i++) {
    const float *in = ops[i].positive ? pp : px;
    op_attrs a;
    double tl, t1, tn, err = 0, lerr = 0, gb = 2.0 * N * 4 / 1e9;
    const float *r;
    op_attrs_init(ops[i].op, &a);
    tl = time_libm(ops[i].libm, y, in);
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    t1 = time_eager(ops[i].op, ops[i].positive ? &xp : &x, &a, &out);
    ten_release(&out);
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    tn = time_eager(ops[i].op, ops[i].positive ? &xp : &x, &a, &out);
    r = ten_data(&out);
    for (k = 0; k < N; k += 7) {
      double want = ops[i].exact((double)in[k]), d = ulps(r[k], want);
      if (d > err) err = d;
      d = ulps(ops[i].libm(in[k]), want);
      if (d > lerr) lerr = d;
    }
    ten_release(&out);
    printf("%-12s %10.2f %10.2f %10.2f %8.1f %8.1f %8.0f %8.0f\n", ops[i].name, gb / tl,
           gb / t1, gb / tn, tl / t1, tl / tn, lerr, err);
  }
  ten_release(&x);
  ten_release(&xp);
  free(y);
  return 0;
}
