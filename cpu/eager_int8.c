/*
** eager_int8.c -- matmul_int8: the exact integer product of 8-bit values
** (ONNX's MatMulInteger and QLinearMatMul) through oneDNN's u8 x s8 -> s32
** product (cpu_mm_int8), or an int64 loop where that cannot run.
**
** Why the operands are rewritten first: without VNNI, oneDNN's int8
** kernels add pairs of u8 x s8 products in 16 bits and saturate (measured
** with oneDNN 2.6 on an AVX2 EPYC: random full-range inputs gave wrong sums
** in 3039 of 3072 outputs), so ONNX's exact int32 would be lost.  Every
** input is made to fit what those kernels sum exactly:
**   - A is read as uint8: an int8 A is shifted by 128, taken off after
**     as part of its zero point;
**   - B is split as B = 64 * hi + lo with lo in 0..63 and hi in -2..3, and
**     run as two products, A hi and A lo, each exact (|pair| <= 2*255*63);
**     a B whose values already lie in -64..64 runs as one;
**   - the zero points are taken off after, from the row sums of A and the
**     column sums of B: sum (a - za)(b - zb) = sum ab - zb rowA - za colB
**     + K za zb.
** The sums are int64; oneDNN's int32 sums hold for K below LOOP_K.
*/
#include <stdlib.h>
#include <string.h>

#include "../graph/ref.h"
#include "mm.h"

#include "eager_impl.h"

/* past this K an int32 sum of 255 * 64 products could overflow */
#define LOOP_K 100000

typedef struct i8mm {
  int64_t batch, M, K, N;
  int b_batched;               /* B has A's batch dims (else one [K, N]) */
  const int64_t *a, *b;        /* the values, row-major */
  const int64_t *za, *zb;      /* NULL, or nza / nzb values */
  int64_t nza, nzb;
} i8mm;

/* sum over k of a[m][k] b[k][n] for every output, exactly, in int64 */
static void product_loop(const i8mm *p, int64_t *out) {
  int64_t bt;
#pragma omp parallel for schedule(static) if (p->batch * p->M * p->N * p->K >= (1 << 20))
  for (bt = 0; bt < p->batch; bt++) {
    const int64_t *b = p->b + (p->b_batched ? bt * p->K * p->N : 0);
    int64_t m, n, k;
    for (m = 0; m < p->M; m++) {
      const int64_t *a = p->a + (bt * p->M + m) * p->K;
      int64_t *o = out + (bt * p->M + m) * p->N;
      for (n = 0; n < p->N; n++) o[n] = 0;
      for (k = 0; k < p->K; k++)
        for (n = 0; n < p->N; n++) o[n] += a[k] * b[k * p->N + n];
    }
  }
}

/* B's column sums of batch bt into col[N] */
static void col_sums(const i8mm *p, int64_t bt, int64_t *col) {
  const int64_t *b = p->b + (p->b_batched ? bt * p->K * p->N : 0);
  int64_t n, k;
  for (n = 0; n < p->N; n++) col[n] = 0;
  for (k = 0; k < p->K; k++)
    for (n = 0; n < p->N; n++) col[n] += b[k * p->N + n];
}

/* The same of A + shift (0, or 128 for an int8 A: see the top) through
** oneDNN; FL_EUNSUPPORTED where it cannot. */
static int product_dnnl(const i8mm *p, int64_t shift, int64_t *out, fl_err *e) {
  int64_t na = p->batch * p->M * p->K, nb = (p->b_batched ? p->batch : 1) * p->K * p->N;
  int64_t no = p->batch * p->M * p->N, i;
  int split = 0, rc = FL_OK;
  uint8_t *a8;
  int8_t *hi, *lo;
  int32_t *chi, *clo;
  for (i = 0; i < nb && !split; i++) split = p->b[i] < -64 || p->b[i] > 64;
  a8 = eager_alloc((size_t)na, "matmul_int8", e);
  hi = a8 ? eager_alloc((size_t)nb * (split ? 2 : 1), "matmul_int8", e) : NULL;
  chi = hi ? eager_alloc((size_t)no * (split ? 2 : 1) * sizeof *chi, "matmul_int8", e) : NULL;
  if (!chi) { rc = FL_ENOMEM; goto out; }
  lo = split ? hi + nb : NULL;
  clo = split ? chi + no : NULL;
  for (i = 0; i < na; i++) a8[i] = (uint8_t)(p->a[i] + shift);
  for (i = 0; i < nb; i++) {
    if (split) {
      hi[i] = (int8_t)(p->b[i] >> 6);          /* floor division: lo >= 0 */
      lo[i] = (int8_t)(p->b[i] & 63);
    } else {
      hi[i] = (int8_t)p->b[i];
    }
  }
  if ((rc = cpu_mm_int8(p->batch, p->M, p->K, p->N, a8, hi, p->b_batched, chi, e)) != FL_OK ||
      (split && (rc = cpu_mm_int8(p->batch, p->M, p->K, p->N, a8, lo, p->b_batched, clo, e)) != FL_OK))
    goto out;
  for (i = 0; i < no; i++) out[i] = split ? 64 * (int64_t)chi[i] + clo[i] : chi[i];
out:
  free(chi);
  free(hi);
  free(a8);
  return rc;
}

/* out holds the sums of (A + shift) B: less zb rowA' + za' colB - K za' zb
** per output, for A' = A + shift and za' = za + shift, gives the sums of
** (A - za)(B - zb) */
static int take_zero_points(const i8mm *p, int64_t shift, int64_t *out, fl_err *e) {
  int64_t bt, m, n, k, *col;
  if (!p->za && !p->zb && !shift) return FL_OK;
  if (!(col = eager_alloc((size_t)p->N * sizeof *col, "matmul_int8", e))) return FL_ENOMEM;
  for (bt = 0; bt < p->batch; bt++) {
    if ((p->za || shift) && (bt == 0 || p->b_batched)) col_sums(p, bt, col);
    for (m = 0; m < p->M; m++) {
      const int64_t *a = p->a + (bt * p->M + m) * p->K;
      int64_t za = (p->za ? p->za[p->nza == 1 ? 0 : m] : 0) + shift, row = p->K * shift;
      int64_t *o = out + (bt * p->M + m) * p->N;
      for (k = 0; k < p->K; k++) row += a[k];
      for (n = 0; n < p->N; n++) {
        int64_t zb = p->zb ? p->zb[p->nzb == 1 ? 0 : n] : 0;
        o[n] -= zb * row + (za ? za * col[n] : 0) - p->K * za * zb;
      }
    }
  }
  free(col);
  return FL_OK;
}

int eager_matmul_int8(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                      fl_tensor *out, fl_err *e) {
  static const char *const names[] = {"A", "B", "za", "zb"};
  const int64_t *v[4] = {NULL, NULL, NULL, NULL};
  int64_t *owned[4] = {NULL, NULL, NULL, NULL}, nv[4] = {0, 0, 0, 0}, i, shift;
  const fl_meta *am = &in[0]->m, *bm = &in[1]->m;
  int j, rc = FL_OK;
  i8mm p;
  for (j = 0; j < nin && j < 4; j++) {
    int64_t lo = a->i[j & 1] ? 0 : -128, hi = lo + 255;
    if (!in[j]) continue;
    nv[j] = meta_numel(&in[j]->m);
    if (ten_is_contiguous(in[j])) {          /* read in place */
      v[j] = (const int64_t *)ten_data(in[j]);
    } else {
      if (!(owned[j] = eager_alloc((size_t)nv[j] * sizeof(int64_t), op_name(op), e))) { rc = FL_ENOMEM; goto out; }
      eager_gather_all(in[j], owned[j], EAGER_I64);
      v[j] = owned[j];
    }
    for (i = 0; i < nv[j]; i++)
      if (v[j][i] < lo || v[j][i] > hi) {
        rc = ref_int8_range(op, v[j][i], (int)a->i[j & 1], names[j], e);
        goto out;
      }
  }
  memset(&p, 0, sizeof p);
  p.M = am->shape[am->ndim - 2];
  p.K = am->shape[am->ndim - 1];
  p.N = bm->shape[bm->ndim - 1];
  p.batch = p.M > 0 && p.N > 0 ? meta_numel(&out->m) / (p.M * p.N) : 0;
  p.b_batched = bm->ndim > 2;
  p.a = v[0]; p.b = v[1]; p.za = v[2]; p.zb = v[3]; p.nza = nv[2]; p.nzb = nv[3];
  if (p.batch == 0) goto out;
  shift = a->i[0] ? 0 : 128;
  if (p.K == 0 || p.K >= LOOP_K || product_dnnl(&p, shift, (int64_t *)ten_data(out), e) != FL_OK) {
    err_clear(e);
    product_loop(&p, (int64_t *)ten_data(out));
    shift = 0;
  }
  rc = take_zero_points(&p, shift, (int64_t *)ten_data(out), e);
out:
  for (j = 0; j < 4; j++) free(owned[j]);
  return rc;
}
