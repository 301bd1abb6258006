/*
** bench/sigmoid.c -- the sigmoid of cpu/expf.h (FL_SIGMOIDF_DEFINE: exp(-|x|)
** times 2^24 with one scale factor) against the quotient it replaced
** (exp's own two-factor scaling, then e / (1 + e) or 1 / (1 + e)), in one
** run: x * sigmoid(x) over 75264 floats (EfficientNet-B0's 2 x 96 x 28 x 28,
** in L2) on one thread, vectorized as the generated kernels are, the best
** of 2000 runs each, in turns.  It also checks that both give the same
** bits on those inputs (tests/lua/transcendental.lua checks the function
** against the double reference; the two were compared on all 2^32 inputs
** once, bench/RESULTS.md).
**
**   make bench/sigmoid && ./bench/sigmoid
**
** Built with -march=native (bench only): the vector width is the CPU's,
** as in the kernels fuselab compiles for it.
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/expf.h"

#define N 75264

FL_EXPF_DEFINE(bench_expf)
FL_SIGMOIDF_DEFINE(bench_sigmoidf)

/* the quotient before: e = exp(-|x|) with exp's two factors and range masks */
static inline float quotient_sigmoidf(float x) {
  const float e = bench_expf(-fabsf(x));
  return (x < 0.0f ? e : 1.0f) / (1.0f + e);
}

__attribute__((noinline)) static void silu_quotient(const float *restrict x, float *restrict y, int64_t n) {
  int64_t i;
#pragma omp simd
  for (i = 0; i < n; i++) y[i] = x[i] * quotient_sigmoidf(x[i]);
}

__attribute__((noinline)) static void silu_scaled(const float *restrict x, float *restrict y, int64_t n) {
  int64_t i;
#pragma omp simd
  for (i = 0; i < n; i++) y[i] = x[i] * bench_sigmoidf(x[i]);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
  float *x = aligned_alloc(64, N * sizeof *x), *y0 = aligned_alloc(64, N * sizeof *y0),
        *y1 = aligned_alloc(64, N * sizeof *y1);
  double best[2] = {1e9, 1e9};
  int64_t i, differ = 0;
  int r;
  if (!x || !y0 || !y1) return 1;
  for (i = 0; i < N; i++) x[i] = (float)((i * 7919) % 24001 - 12000) / 1000.0f;   /* [-12, 12] */
  for (r = 0; r < 2000; r++) {
    double t = now();
    silu_quotient(x, y0, N);
    t = now() - t;
    if (t < best[0]) best[0] = t;
    t = now();
    silu_scaled(x, y1, N);
    t = now() - t;
    if (t < best[1]) best[1] = t;
  }
  for (i = 0; i < N; i++) differ += memcmp(&y0[i], &y1[i], sizeof *y0) != 0;
  printf("x * sigmoid(x) over %d floats, one thread, best of 2000:\n", N);
  printf("  exp's quotient (two scale factors)  %.4f ms\n", best[0] * 1e3);
  printf("  cpu/expf.h sigmoid (one, times 2^24) %.4f ms  (%.2fx)\n", best[1] * 1e3, best[0] / best[1]);
  printf("  results differing in their bits: %lld of %d\n", (long long)differ, N);
  free(x);
  free(y0);
  free(y1);
  return differ != 0;
}
