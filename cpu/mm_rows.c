/*
** mm_rows.c -- float32 products of a few rows (up to CPU_MM_ROWS_MAX): a
** classifier over a batch of two images, a decoding step of a few
** sequences, squeeze-and-excitation's 1x1 convolutions over a 1x1 map
** (cpu/mm.c, conv_as_rows); with their bias and epilogue.
**
** Why not oneDNN here: 2.6's gemm:jit runs a product of one row as a
** matrix-vector product at the memory's speed (a linear of 1024 -> 1000:
** 0.07 ms on two threads), but two rows as a general product at a quarter
** of it (0.30 ms; 4096 -> 4096: 5.4 ms against 1.5 for one row).  A
** product of a few rows is bound by reading the weight once.  Here the
** columns of the result are cut into chunks, one thread each; a chunk
** streams its part of the weight once, each vector of it multiplied into
** the sums of every row, all held in registers: a linear's weight (b
** read as [N, K] rows), a few columns' dot products over K at a time.
** The bias and the epilogue run over the chunk's rows while they are in
** cache.  A weight laid out [K, N] stays on oneDNN: read a strip of
** columns at a time, its rows far apart, this loop was no faster at 1024
** x 1000 and twice as slow at 4096 x 4096.
*/
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "mm.h"
#include "mm_post.h"

#include "eager_impl.h"

/* the loops over rows and tiles unrolled before the sums are given
** registers (an array indexed in a loop would stay in memory) */
#define UNROLL _Pragma("GCC unroll 8")

/* columns of the result a thread takes at a time */
#define ROWS_CHUNK 64
/* weights of at least this many floats are read by every thread */
#define ROWS_PAR_WEIGHT (1 << 14)

static int64_t nrows_calls, nrows_posts;   /* atomic */

int cpu_mm_rows_fits(const cpu_mm *m) {
  int nd = m->nd, d, i;
  int64_t M, K, N;
  if (nd < 2 || !m->dst.p || !m->a.p || !m->b.p) return 0;
  M = m->dst.shape[nd - 2], K = m->a.shape[nd - 1], N = m->dst.shape[nd - 1];
  if (M < 1 || M > CPU_MM_ROWS_MAX || K < 1 || N < 1) return 0;
  for (d = 0; d < nd - 2; d++) if (m->dst.shape[d] != 1) return 0;
  /* b a linear's weight, [N, K] rows read as [K, N] with strides (1, K) */
  if (m->a.stride[nd - 1] != 1 || m->dst.stride[nd - 1] != 1 || (m->b.stride[nd - 2] != 1 && K > 1))
    return 0;
  for (i = 0; i < m->npost; i++) {
    const cpu_mm_post *po = &m->post[i];
    if (po->kind == CPU_MM_ADD_C || po->kind == CPU_MM_MUL_C) return 0;
    /* a residual in the result's own memory would be read after its
    ** chunk is written */
    if ((po->kind == CPU_MM_ADD || po->kind == CPU_MM_MUL) && po->src.p == m->dst.p) return 0;
  }
  return 1;
}

static inline __attribute__((always_inline)) float hsum8(v8f v) {
  float s = 0.0f;
  int l;
  for (l = 0; l < 8; l++) s += v[l];
  return s;
}

/* b read as rows of K (a linear's weight, [N, K] with row stride ldw):
** y[r][n + t] for t < NT, each a dot product of row r of a with weight
** row n + t; M and NT constant, so the M x NT sums stay in registers. */
static inline __attribute__((always_inline))
void dots(const float *a, int64_t lda, const float *w, int64_t ldw, int64_t K, float *y, int64_t ldy,
          int64_t n, const int M, const int NT) {
  v8f acc[8][4];
  int r, t;
  int64_t k;
  UNROLL for (r = 0; r < M; r++)
    UNROLL for (t = 0; t < NT; t++) acc[r][t] = (v8f){0};
  for (k = 0; k + 8 <= K; k += 8) {
    v8f wv[4];
    UNROLL for (t = 0; t < NT; t++) wv[t] = *(const v8f_u *)(w + (n + t) * ldw + k);
    UNROLL for (r = 0; r < M; r++) {
      v8f av = *(const v8f_u *)(a + r * lda + k);
      UNROLL for (t = 0; t < NT; t++) acc[r][t] += av * wv[t];
    }
  }
  UNROLL for (r = 0; r < M; r++)
    UNROLL for (t = 0; t < NT; t++) {
      float s = hsum8(acc[r][t]);
      int64_t j;
      for (j = k; j < K; j++) s += a[r * lda + j] * w[(n + t) * ldw + j];
      y[r * ldy + n + t] = s;
    }
}

/* Columns [c0, c1) of every row, M constant: tiles of a few columns,
** the last few one at a time.  (Summing K in blocks, so that the rows'
** part stays in L1, read the weight in short runs of many rows at once,
** and ran slower: 8 rows of 4096 -> 4096 6.2-7.8 ms against 5.2-5.7.) */
static inline __attribute__((always_inline))
void chunk(const cpu_mm *m, int64_t c0, int64_t c1, const int M) {
  int nd = m->nd;
  int64_t K = m->a.shape[nd - 1], lda = m->a.stride[nd - 2], ldy = m->dst.stride[nd - 2];
  int64_t ldw = m->b.stride[nd - 1], n = c0;
  const int NT = M <= 2 ? 4 : M <= 4 ? 2 : 1;
  for (; n + NT <= c1; n += NT) dots(m->a.p, lda, m->b.p, ldw, K, (float *)m->dst.p, ldy, n, M, NT);
  for (; n < c1; n++) dots(m->a.p, lda, m->b.p, ldw, K, (float *)m->dst.p, ldy, n, M, 1);
}

/* The bias and the post-ops over row r's columns [c0, c0 + len). */
static inline __attribute__((always_inline))
void epilogue(const cpu_mm *m, int64_t r, int64_t c0, int64_t len) {
  int nd = m->nd, i;
  float *restrict y = (float *)m->dst.p + r * m->dst.stride[nd - 2] + c0;
  int64_t j;
  if (m->bias) {
    const float *restrict bs = m->bias + c0;
    EAGER_SIMD for (j = 0; j < len; j++) y[j] += bs[j];
  }
  for (i = 0; i < m->npost; i++) {
    const cpu_mm_post *po = &m->post[i];
    int64_t sr, sc;
    const float *restrict s;
    if (cpu_mm_post_elem(po, y, len)) continue;
    /* a tensor broadcast to the result: size-1 dims read one element */
    sr = po->src.shape[nd - 2] == 1 ? 0 : po->src.stride[nd - 2];
    sc = po->src.shape[nd - 1] == 1 ? 0 : po->src.stride[nd - 1];
    s = po->src.p + r * sr + c0 * sc;
    if (po->kind == CPU_MM_ADD) {
      if (sc == 1) { EAGER_SIMD for (j = 0; j < len; j++) y[j] += s[j]; }
      else for (j = 0; j < len; j++) y[j] += s[j * sc];
    } else if (po->kind == CPU_MM_MUL) {
      if (sc == 1) { EAGER_SIMD for (j = 0; j < len; j++) y[j] *= s[j]; }
      else for (j = 0; j < len; j++) y[j] *= s[j * sc];
    }
  }
}

EAGER_WIDE_FMA
int cpu_mm_rows(const cpu_mm *m) {
  int nd = m->nd;
  int64_t M, N, K, nc, cw, q;
  int par, threads = 1;
  if (!cpu_mm_rows_fits(m)) return FL_EUNSUPPORTED;
  M = m->dst.shape[nd - 2], N = m->dst.shape[nd - 1], K = m->a.shape[nd - 1];
  /* bound by reading the weight: threads share it from 64 KB on (each
  ** reads its part), even chunks of at most ROWS_CHUNK columns, as many
  ** for each thread (squeeze-and-excitation's 144 columns: 4 of 36, not
  ** 64 + 64 against 16) */
  par = M * K * N >= CPU_MM_PAR_MIN || K * N >= ROWS_PAR_WEIGHT;
#ifdef _OPENMP
  if (par) threads = omp_get_max_threads();
#endif
  nc = (N + ROWS_CHUNK - 1) / ROWS_CHUNK;
  nc = (nc + threads - 1) / threads * threads;
  cw = ((N + nc - 1) / nc + 3) / 4 * 4;
  nc = (N + cw - 1) / cw;
  EAGER_PRAGMA(omp parallel for schedule(static) if (par))
  for (q = 0; q < nc; q++) {
    int64_t c0 = q * cw, c1 = c0 + cw < N ? c0 + cw : N, r;
    switch (M) {
    case 1: chunk(m, c0, c1, 1); break;
    case 2: chunk(m, c0, c1, 2); break;
    case 3: chunk(m, c0, c1, 3); break;
    case 4: chunk(m, c0, c1, 4); break;
    case 5: chunk(m, c0, c1, 5); break;
    case 6: chunk(m, c0, c1, 6); break;
    case 7: chunk(m, c0, c1, 7); break;
    default: chunk(m, c0, c1, 8); break;
    }
    if (m->bias || m->npost)
      for (r = 0; r < M; r++) epilogue(m, r, c0, c1 - c0);
  }
  __atomic_fetch_add(&nrows_calls, 1, __ATOMIC_RELAXED);
  if (m->npost) __atomic_fetch_add(&nrows_posts, 1, __ATOMIC_RELAXED);
  return FL_OK;
}

void cpu_mm_rows_counts(int64_t *calls, int64_t *with_posts) {
  *calls = __atomic_load_n(&nrows_calls, __ATOMIC_RELAXED);
  *with_posts = __atomic_load_n(&nrows_posts, __ATOMIC_RELAXED);
}
