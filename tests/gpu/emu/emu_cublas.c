/*
** emu_cublas.c -- libcublas.so.13 for the emulator: the few entry points
** gpu/cublas.c and bench/gpu.c dlopen, column-major as cuBLAS, summed in
** double.  Work goes through emu_stream_work, so a product queued while
** a stream captures a graph runs at each replay, and every operand is
** checked to lie in device memory.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"

enum { OK = 0, NOT_INITIALIZED = 1, INVALID_VALUE = 7, EXECUTION_FAILED = 13 };

typedef struct handle { void *stream; } handle;

int cublasCreate_v2(void **h) {
  if (!h || !(*h = calloc(1, sizeof(handle)))) return NOT_INITIALIZED;
  return OK;
}
int cublasDestroy_v2(void *h) { free(h); return OK; }
int cublasSetStream_v2(void *h, void *s) { if (!h) return NOT_INITIALIZED; ((handle *)h)->stream = s; return OK; }
int cublasGetStream_v2(void *h, void **s) { if (!h) return NOT_INITIALIZED; *s = ((handle *)h)->stream; return OK; }
int cublasSetMathMode(void *h, int m) { (void)h; (void)m; return OK; }
int cublasGetVersion_v2(void *h, int *v) { (void)h; *v = 130000; return OK; }

typedef struct gemm {
  int ta, tb, m, n, k, lda, ldb, ldc, batch;
  long long sa, sb, sc;
  float alpha, beta;
  const float *A, *B;
  float *C;
} gemm;

/* the bytes an operand of rows x cols (as stored), ld, stride, batch spans */
static size_t extent(int rows, int cols, int ld, long long stride, int batch) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return 0;
  return ((size_t)(batch - 1) * (size_t)stride + (size_t)(cols - 1) * (size_t)ld + (size_t)rows) * sizeof(float);
}

static int run_gemm(void *ctx, char *msg, size_t mn) {
  const gemm *g = ctx;
  int z, i, j, l;
  const int ar = g->ta ? g->k : g->m, ac = g->ta ? g->m : g->k;
  const int br = g->tb ? g->n : g->k, bc = g->tb ? g->k : g->n;
  if ((g->k > 0 && g->alpha != 0 &&
       (emu_check_range(g->A, extent(ar, ac, g->lda, g->sa, g->batch), "cublasSgemm A", msg, mn) ||
        emu_check_range(g->B, extent(br, bc, g->ldb, g->sb, g->batch), "cublasSgemm B", msg, mn))) ||
      emu_check_range(g->C, extent(g->m, g->n, g->ldc, g->sc, g->batch), "cublasSgemm C", msg, mn))
    return -1;
  for (z = 0; z < g->batch; z++) {
    const float *A = g->A + z * g->sa, *B = g->B + z * g->sb;
    float *C = g->C + z * g->sc;
    for (j = 0; j < g->n; j++)
      for (i = 0; i < g->m; i++) {
        double s = 0;
        for (l = 0; l < g->k; l++) {
          const double a = g->ta ? A[l + (size_t)i * g->lda] : A[i + (size_t)l * g->lda];
          const double b = g->tb ? B[j + (size_t)l * g->ldb] : B[l + (size_t)j * g->ldb];
          s += a * b;
        }
        /* beta 0: C is not read (it may be uninitialized, NaN) */
        C[i + (size_t)j * g->ldc] = (float)(g->alpha * s + (g->beta != 0 ? g->beta * C[i + (size_t)j * g->ldc] : 0));
      }
  }
  return 0;
}

int cublasSgemmStridedBatched(void *h, int ta, int tb, int m, int n, int k, const float *alpha,
                              const float *A, int lda, long long sa, const float *B, int ldb,
                              long long sb, const float *beta, float *C, int ldc, long long sc,
                              int batch) {
  gemm g;
  if (!h) return NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || (ta != 0 && ta != 1) || (tb != 0 && tb != 1) ||
      lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1)) || ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1)) ||
      ldc < (m > 1 ? m : 1))
    return INVALID_VALUE;
  if (!m || !n || !batch) return OK;
  g.ta = ta; g.tb = tb; g.m = m; g.n = n; g.k = k; g.lda = lda; g.ldb = ldb; g.ldc = ldc;
  g.batch = batch; g.sa = sa; g.sb = sb; g.sc = sc; g.alpha = *alpha; g.beta = *beta;
  g.A = A; g.B = B; g.C = C;
  return emu_stream_work(((handle *)h)->stream, run_gemm, &g, sizeof g) == 0 ? OK : EXECUTION_FAILED;
}

int cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *A,
                   int lda, const float *B, int ldb, const float *beta, float *C, int ldc) {
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}
