/*
** eager_linalg.c -- matmul, linear and conv2d through CBLAS sgemm; pooling.
** Invariant: BLAS only ever sees float32 matrices whose layout it can
** express (unit stride along rows or along columns, leading dimension at
** least the row length, every size within int); any other operand -- a
** float16 or bfloat16 one, an expanded or oddly strided one -- is first
** copied to contiguous float32.  Integer products skip BLAS and accumulate
** in int64, wrapping, as the oracle does: exact at any size.
*/
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "blas.h"
#include "mm.h"
#include "scratch.h"

#include "eager_impl.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* One operand's matrices as sgemm reads them, plus its batch dims. */
typedef struct mat {
  const float *base;                 /* element 0 */
  float *owned;                      /* a converted copy, or NULL */
  int nb;                            /* batch dims before the matrix */
  int64_t bshape[FL_MAX_DIMS], bstride[FL_MAX_DIMS];
  int64_t rows, cols;
  enum CBLAS_TRANSPOSE tr;
  int64_t ld;
} mat;

/* Can sgemm (row major) read rows x cols with strides rs, cs?  A stride of
** a size-1 dim is irrelevant, so it is replaced by whatever fits. */
static int blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                       enum CBLAS_TRANSPOSE *tr, int64_t *ld) {
  int64_t rmin = rows > 1 ? rows : 1, cmin = cols > 1 ? cols : 1;
  if ((cols == 1 || cs == 1) && (rows == 1 || rs >= cmin)) {
    *tr = CblasNoTrans;
    *ld = rows == 1 ? cmin : rs;
    return *ld <= INT_MAX;
  }
  if ((rows == 1 || rs == 1) && (cols == 1 || cs >= rmin)) {
    *tr = CblasTrans;
    *ld = cols == 1 ? rmin : cs;
    return *ld <= INT_MAX;
  }
  return 0;
}

/* t as the left (right = 0) or right operand of matmul: a 1-d left operand
** is a row [1, k], a 1-d right operand a column [k, 1] (PyTorch). */
static int mat_prepare(const fl_tensor *t, int right, mat *m,
                       const char *opname, fl_err *e) {
  const fl_meta *tm = &t->m;
  int nd = tm->ndim, d;
  int64_t rs, cs, s;
  memset(m, 0, sizeof *m);
  if (nd == 1) {
    m->rows = right ? tm->shape[0] : 1;
    m->cols = right ? 1 : tm->shape[0];
    rs = right ? t->stride[0] : 0;
    cs = right ? 0 : t->stride[0];
  } else {
    m->rows = tm->shape[nd - 2];
    m->cols = tm->shape[nd - 1];
    rs = t->stride[nd - 2];
    cs = t->stride[nd - 1];
    m->nb = nd - 2;
  }
  for (d = 0; d < m->nb; d++) {
    m->bshape[d] = tm->shape[d];
    m->bstride[d] = t->stride[d];
  }
  if (tm->dtype == FL_F32 && blas_layout(m->rows, m->cols, rs, cs, &m->tr, &m->ld)) {
    m->base = (const float *)ten_data(t);
    return FL_OK;
  }
  /* a contiguous float32 copy always fits */
  if (!(m->base = eager_f32(t, &m->owned, opname, e))) return FL_ENOMEM;
  blas_layout(m->rows, m->cols, m->cols, 1, &m->tr, &m->ld);
  for (s = m->rows * m->cols, d = m->nb - 1; d >= 0; d--) {
    m->bstride[d] = s;
    s *= m->bshape[d];
  }
  return FL_OK;
}

/* Element offset of batch bi (row-major over the broadcast batch shape bs
** of nb dims) in operand m, whose batch dims align at the right. */
static int64_t mat_batch_offset(const mat *m, const int64_t *bs, int nb,
                                int64_t bi) {
  int64_t off = 0;
  int d;
  for (d = nb - 1; d >= 0; d--) {
    int md = d - (nb - m->nb);
    int64_t i = bi % bs[d];
    bi /= bs[d];
    if (md >= 0 && m->bshape[md] != 1) off += i * m->bstride[md];
  }
  return off;
}

/* Can m's batch dims and rows be read as one matrix of (batch * rows)
** rows?  True when every batch step is exactly `rows` row steps. */
static int mat_rows_fold(const mat *m) {
  int64_t want = m->rows * m->ld;
  int d;
  if (m->tr != CblasNoTrans) return 0;
  for (d = m->nb - 1; d >= 0; d--) {
    if (m->bshape[d] != 1 && m->bstride[d] != want) return 0;
    want *= m->bshape[d];
  }
  return 1;
}


/* m as a oneDNN operand of rank nd (its batch dims aligned at the right,
** missing ones of size 1). */
static void mat_arg(const mat *m, int nd, cpu_mm_arg *o) {
  int d, off = nd - 2 - m->nb;
  o->p = m->base;
  for (d = 0; d < nd - 2; d++) {
    o->shape[d] = d < off ? 1 : m->bshape[d - off];
    o->stride[d] = d < off ? 0 : m->bstride[d - off];
  }
  o->shape[nd - 2] = m->rows;
  o->shape[nd - 1] = m->cols;
  o->stride[nd - 2] = m->tr == CblasNoTrans ? m->ld : 1;
  o->stride[nd - 1] = m->tr == CblasNoTrans ? 1 : m->ld;
}

/* The product through oneDNN: every batch in one call.  FL_EUNSUPPORTED
** when it cannot (the caller runs sgemm); posts are the caller's
** epilogue, or none.  b_st: the storage B is read from in place, or NULL
** (cpu_mm's b_st: a two-dimensional product's B may be kept packed).
** ys: y's nb + 2 strides, or NULL for contiguous. */
static int matmul_mm(const mat *A, const mat *B, fl_storage *b_st, int nb, const int64_t *bs, float *y,
                     const int64_t *ys, int fold, const cpu_mm_post *posts, int npost, fl_err *e) {
  cpu_mm m;
  int d;
  memset(&m, 0, sizeof m);
  if (nb + 2 > CPU_MM_MAXD) return err_set(e, FL_EUNSUPPORTED, "matmul: too many batch dims");
  if (fold) {
    /* [batch..., M, K] @ [K, N]: one matrix of batch * M rows */
    int64_t rows = A->rows;
    for (d = 0; d < nb; d++) rows *= bs[d];
    m.nd = 2;
    mat_arg(B, 2, &m.b);
    m.a.p = A->base;
    m.a.shape[0] = rows; m.a.shape[1] = A->cols;
    m.a.stride[0] = A->ld; m.a.stride[1] = 1;
    m.dst.shape[0] = rows;
  } else {
    m.nd = nb + 2;
    mat_arg(A, m.nd, &m.a);
    mat_arg(B, m.nd, &m.b);
    for (d = 0; d < nb; d++) m.dst.shape[d] = bs[d];
    m.dst.shape[nb] = A->rows;
  }
  if (m.nd == 2 && !B->owned) m.b_st = b_st;
  m.dst.shape[m.nd - 1] = B->cols;
  m.dst.stride[m.nd - 1] = 1;
  for (d = m.nd - 2; d >= 0; d--) m.dst.stride[d] = m.dst.stride[d + 1] * m.dst.shape[d + 1];
  if (ys) memcpy(m.dst.stride, ys, (size_t)m.nd * sizeof *ys);
  m.dst.p = y;
  for (d = 0; d < npost; d++) m.post[d] = posts[d];
  m.npost = npost;
  return cpu_mm_run(&m, e);
}

static int too_big(const char *opname, int64_t M, int64_t N, int64_t K,
                   fl_err *e) {
  if (M <= INT_MAX && N <= INT_MAX && K <= INT_MAX) return 0;
  err_set(e, FL_EUNSUPPORTED, "%s: a %lldx%lldx%lld product exceeds BLAS's "
          "int sizes", opname, (long long)M, (long long)N, (long long)K);
  return 1;
}

/* Gather t into a new row-major int64 array (*out, the caller frees). */
static int gather_i64(const fl_tensor *t, int64_t **out, const char *opname, fl_err *e) {
  int64_t n = meta_numel(&t->m);
  if (!(*out = eager_alloc((size_t)(n > 0 ? n : 1) * sizeof **out, opname, e))) return 0;
  if (n > 0) eager_gather_all(t, *out, EAGER_I64);
  return 1;
}

/* Integer matmul and linear: y[b][i][j] = bias[j] + sum_k a[i][k] * w(k, j),
** with w(k, j) = b[k][j] (matmul) or w[j][k] (linear).  Exact, wrapping
** like int64 addition (through uint64: no undefined overflow), as the
** oracle computes it. */
static int product_i64(fl_op op, const fl_tensor *const *in, int nin,
                       fl_tensor *out, fl_err *e) {
  const fl_tensor *A = in[0], *W = in[1];
  const fl_tensor *bias = op == OP_LINEAR && nin > 2 ? in[2] : NULL;
  int64_t *a = NULL, *w = NULL, *bv = NULL, *y = NULL;
  int64_t M, K, N, nb = 0, Bt = 1, bi, i, j, k;
  int64_t ab = 0, wb = 0, bs[FL_MAX_DIMS];
  int rc = FL_ENOMEM, d, anb = A->m.ndim >= 2 ? A->m.ndim - 2 : 0;
  int wnb = W->m.ndim >= 2 ? W->m.ndim - 2 : 0;
  mat am, wm;    /* shapes only: batch broadcasting as in mat_batch_offset */
  if (op == OP_LINEAR) {
    K = W->m.shape[1];
    N = W->m.shape[0];
    M = meta_numel(&out->m) / N;       /* out has elements: N > 0 */
  } else {
    K = A->m.shape[A->m.ndim - 1];
    M = A->m.ndim >= 2 ? A->m.shape[A->m.ndim - 2] : 1;
    N = W->m.ndim >= 2 ? W->m.shape[W->m.ndim - 1] : 1;
    nb = anb > wnb ? anb : wnb;
    for (d = 0; d < nb; d++) { bs[d] = out->m.shape[d]; Bt *= bs[d]; }
  }
  memset(&am, 0, sizeof am);
  memset(&wm, 0, sizeof wm);
  am.nb = op == OP_LINEAR ? 0 : anb;
  wm.nb = op == OP_LINEAR ? 0 : wnb;
  for (d = 0, ab = M * K; d < am.nb; d++) am.bshape[d] = A->m.shape[d];
  for (d = am.nb - 1; d >= 0; d--) { am.bstride[d] = ab; ab *= am.bshape[d]; }
  for (d = 0, wb = K * N; d < wm.nb; d++) wm.bshape[d] = W->m.shape[d];
  for (d = wm.nb - 1; d >= 0; d--) { wm.bstride[d] = wb; wb *= wm.bshape[d]; }
  if (!gather_i64(A, &a, op_name(op), e) || !gather_i64(W, &w, op_name(op), e) ||
      (bias && !gather_i64(bias, &bv, op_name(op), e)) ||
      !(y = eager_alloc((size_t)(Bt * M * N) * sizeof *y, op_name(op), e)))
    goto done;
  for (bi = 0; bi < Bt; bi++) {
    const int64_t *ap = a + mat_batch_offset(&am, bs, (int)nb, bi);
    const int64_t *wp = w + mat_batch_offset(&wm, bs, (int)nb, bi);
    for (i = 0; i < M; i++)
      for (j = 0; j < N; j++) {
        uint64_t acc = bv ? (uint64_t)bv[j] : 0;
        for (k = 0; k < K; k++)
          acc += (uint64_t)ap[i * K + k] *
                 (uint64_t)(op == OP_LINEAR ? wp[j * K + k] : wp[k * N + j]);
        y[(bi * M + i) * N + j] = (int64_t)acc;
      }
  }
  for (i = 0; i < Bt * M * N; i++) ten_set_i64(out, i, y[i]);
  rc = FL_OK;
done:
  free(a); free(w); free(bv); free(y);
  return rc;
}

/* With posts (npost > 0): only through oneDNN into a float32 out, else
** FL_EUNSUPPORTED with out untouched (the caller runs the epilogue). */
static int matmul_posts(fl_op op, const fl_tensor *const *in, int nin, const cpu_mm_post *posts,
                        int npost, fl_tensor *out, fl_err *e) {
  mat A, B;
  int64_t M, K, N, bs[FL_MAX_DIMS], Bt = 1, bi;
  float *y, *yo = NULL;
  int nb, d, rc, strided;
  cpu_blas_pick();                 /* the right kernels before the first product */
  if (npost && (out->m.dtype != FL_F32 || !cpu_mm_enabled()))
    return err_set(e, FL_EUNSUPPORTED, "%s: post-ops need oneDNN and a float32 result", op_name(op));
  if (!dtype_is_float(in[0]->m.dtype)) return product_i64(op, in, nin, out, e);
  if ((rc = mat_prepare(in[0], 0, &A, op_name(op), e)) != FL_OK) return rc;
  if ((rc = mat_prepare(in[1], 1, &B, op_name(op), e)) != FL_OK) {
    free(A.owned);
    return rc;
  }
  M = A.rows; K = A.cols; N = B.cols;
  nb = A.nb > B.nb ? A.nb : B.nb;
  for (d = 0; d < nb; d++) { bs[d] = out->m.shape[d]; Bt *= bs[d]; }
  rc = FL_OK;
  if (npost && K == 0) {
    rc = err_set(e, FL_EUNSUPPORTED, "%s: an empty sum takes no post-ops", op_name(op));
    goto done;
  }
  if (K == 0) {                          /* an empty sum: zeros (the buffer may be reused) */
    memset(ten_data(out), 0, (size_t)meta_numel(&out->m) * dtype_size(out->m.dtype));
    goto done;
  }
  if (too_big(op_name(op), M * (B.nb == 0 ? Bt : 1), N, K, e)) {
    rc = FL_EUNSUPPORTED;
    goto done;
  }
  /* a strided out: a layout compiled code chose for what reads the
  ** result (cpu/backend.c), which oneDNN writes with rows dense, or no one */
  strided = !ten_is_contiguous(out);
  if (strided && (out->m.dtype != FL_F32 || !cpu_mm_enabled() || out->m.ndim != nb + 2 ||
                  out->stride[nb + 1] != 1)) {
    rc = err_set(e, FL_EUNSUPPORTED, "%s: a strided result needs oneDNN", op_name(op));
    goto done;
  }
  if (!(y = eager_out_f32(out, &yo, op_name(op), e))) { rc = FL_ENOMEM; goto done; }
  if (cpu_mm_enabled()) {
    fl_err e2;
    err_clear(&e2);
    if ((rc = matmul_mm(&A, &B, in[1]->st, nb, bs, y, strided ? out->stride : NULL,
                        !strided && B.nb == 0 && mat_rows_fold(&A), posts, npost, &e2)) == FL_OK ||
        npost || strided) {
      if (rc != FL_OK) err_set(e, rc, "%s", e2.msg);
      eager_out_done(out, yo);
      goto done;
    }
    rc = FL_OK;
  }
  if (B.nb == 0 && mat_rows_fold(&A)) {
    /* [batch..., M, K] @ [K, N]: one product of batch * M rows */
    cblas_sgemm(CblasRowMajor, A.tr, B.tr, (int)(M * Bt), (int)N, (int)K, 1.0f,
                A.base, (int)A.ld, B.base, (int)B.ld, 0.0f, y, (int)N);
  } else {
    for (bi = 0; bi < Bt; bi++)
      cblas_sgemm(CblasRowMajor, A.tr, B.tr, (int)M, (int)N, (int)K, 1.0f,
                  A.base + mat_batch_offset(&A, bs, nb, bi), (int)A.ld,
                  B.base + mat_batch_offset(&B, bs, nb, bi), (int)B.ld, 0.0f,
                  y + bi * M * N, (int)N);
  }
  eager_out_done(out, yo);
done:
  free(A.owned);
  free(B.owned);
  return rc;
}

int eager_matmul(fl_op op, const fl_tensor *const *in, int nin,
                 const op_attrs *a, fl_tensor *out, fl_err *e) {
  (void)a;
  return matmul_posts(op, in, nin, NULL, 0, out, e);
}

/* y = x @ w^T + b: the bias is copied into every row first and sgemm adds
** onto it (beta = 1); oneDNN adds it itself.  With posts as matmul_posts. */
static int linear_posts(fl_op op, const fl_tensor *const *in, int nin, const cpu_mm_post *posts,
                        int npost, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0], *w = in[1], *b = nin > 2 ? in[2] : NULL;
  int64_t IN = w->m.shape[1], O = w->m.shape[0], rows, r;
  const float *xf, *bf = NULL, *wf;
  float *xo = NULL, *bo = NULL, *wo = NULL, *yo = NULL, *y;
  enum CBLAS_TRANSPOSE tr;
  int64_t ld;
  int rc = FL_ENOMEM, d;
  cpu_blas_pick();                 /* the right kernels before the first product */
  if (npost && (out->m.dtype != FL_F32 || !cpu_mm_enabled() || IN == 0))
    return err_set(e, FL_EUNSUPPORTED, "%s: post-ops need oneDNN and a float32 result", op_name(op));
  if (!dtype_is_float(x->m.dtype)) return product_i64(op, in, nin, out, e);
  rows = meta_numel(&out->m) / O;
  if (too_big(op_name(op), rows, O, IN, e)) return FL_EUNSUPPORTED;
  /* w^T is [IN, O] with strides (w's column stride, w's row stride) */
  if (w->m.dtype == FL_F32 &&
      blas_layout(IN, O, w->stride[1], w->stride[0], &tr, &ld)) {
    wf = (const float *)ten_data(w);
  } else {
    if (!(wf = eager_f32(w, &wo, op_name(op), e))) goto done;
    blas_layout(IN, O, 1, IN, &tr, &ld);
  }
  if (!(xf = eager_f32(x, &xo, op_name(op), e))) goto done;
  if (b && !(bf = eager_f32(b, &bo, op_name(op), e))) goto done;
  if (!(y = eager_out_f32(out, &yo, op_name(op), e))) goto done;
  if (IN > 0 && cpu_mm_enabled()) {
    cpu_mm m;
    fl_err e2;
    memset(&m, 0, sizeof m);
    err_clear(&e2);
    m.nd = 2;
    m.a.p = xf; m.a.shape[0] = rows; m.a.shape[1] = IN; m.a.stride[0] = IN; m.a.stride[1] = 1;
    m.b.p = wf; m.b.shape[0] = IN; m.b.shape[1] = O;
    m.b.stride[0] = tr == CblasNoTrans ? ld : 1;
    m.b.stride[1] = tr == CblasNoTrans ? 1 : ld;
    if (wf == ten_data(w)) m.b_st = w->st;   /* the weight itself: it may be kept packed */
    m.dst.p = y; m.dst.shape[0] = rows; m.dst.shape[1] = O; m.dst.stride[0] = O; m.dst.stride[1] = 1;
    m.bias = bf;
    for (d = 0; d < npost; d++) m.post[d] = posts[d];
    m.npost = npost;
    if ((rc = cpu_mm_run(&m, &e2)) == FL_OK || npost) {
      if (rc != FL_OK) err_set(e, rc, "%s", e2.msg);
      eager_out_done(out, yo);
      goto done;
    }
    rc = FL_ENOMEM;
  }
  if (bf)
    for (r = 0; r < rows; r++) memcpy(y + r * O, bf, (size_t)O * sizeof *y);
  if (!bf && IN == 0) memset(y, 0, (size_t)(rows * O) * sizeof *y);   /* may be a reused buffer */
  if (IN > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, tr, (int)rows, (int)O, (int)IN,
                1.0f, xf, (int)IN, wf, (int)ld, bf ? 1.0f : 0.0f, y, (int)O);
  eager_out_done(out, yo);
  rc = FL_OK;
done:
  free(xo); free(bo); free(wo);
  return rc;
}

int eager_linear(fl_op op, const fl_tensor *const *in, int nin,
                 const op_attrs *a, fl_tensor *out, fl_err *e) {
  (void)a;
  return linear_posts(op, in, nin, NULL, 0, out, e);
}

/* conv2d with posts (cpu_mm_post, operands laid out as out) applied
** inside oneDNN's call; without posts, im2col + sgemm where oneDNN is off
** or refuses. */
static int conv2d_posts(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                        const cpu_mm_post *posts, int npost, const eager_layouts *lay,
                        fl_tensor *out, fl_err *e);

int eager_product_posts(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                        const cpu_mm_post *posts, int npost, const eager_layouts *lay,
                        fl_tensor *out, fl_err *e) {
  if (op == OP_CONV2D) return conv2d_posts(op, in, nin, a, posts, npost, lay, out, e);
  if (lay && (lay->xblk || lay->yblk || lay->xoff))
    return err_set(e, FL_EUNSUPPORTED, "%s reads no blocked layout", op_name(op));
  if (op == OP_MATMUL) return matmul_posts(op, in, nin, posts, npost, out, e);
  if (op == OP_LINEAR) return linear_posts(op, in, nin, posts, npost, out, e);
  return err_set(e, FL_EUNSUPPORTED, "%s takes no post-ops", op_name(op));
}

/* --- conv2d: im2col + sgemm, one product per group ------------------------ */

/* cols[(c*KH + kh)*KW + kw][oh*OW + ow] =
** x[c][oh*sh - pt + kh*dh][ow*sw - pl + kw*dw], or 0 in the padding;
** x holds the group's C channels. */
static void im2col(const float *x, int64_t C, int64_t H, int64_t W,
                   const op_win2d *g, int64_t OH, int64_t OW, float *cols) {
  int64_t KH = g->kh, KW = g->kw, row, P = OH * OW;
  EAGER_PRAGMA(omp parallel for schedule(static) if (C * KH * KW * P > EAGER_PAR_MIN))
  for (row = 0; row < C * KH * KW; row++) {
    int64_t c = row / (KH * KW), kh = row / KW % KH, kw = row % KW, oh, ow;
    float *dst = cols + row * P;
    for (oh = 0; oh < OH; oh++) {
      int64_t ih = oh * g->sh - g->pt + kh * g->dh;
      const float *src = x + (c * H + ih) * W;
      float *d = dst + oh * OW;
      if (ih < 0 || ih >= H) {
        memset(d, 0, (size_t)OW * sizeof *d);
        continue;
      }
      for (ow = 0; ow < OW; ow++) {
        int64_t iw = ow * g->sw - g->pl + kw * g->dw;
        d[ow] = (iw >= 0 && iw < W) ? src[iw] : 0.0f;
      }
    }
  }
}

/* One input channel per group (depthwise, ShuffleNet's and MobileNet's
** 3x3s): a direct loop, where a product per group would be a 1-row sgemm.
** y holds the bias or zeros; the sum runs in float, as sgemm's does. */
static void conv_depthwise(const float *x, const float *w, float *y, int64_t N,
                           int64_t C, int64_t H, int64_t W, int64_t CO,
                           const op_win2d *g, int64_t OH, int64_t OW) {
  int64_t plane, OG = CO / C;
  EAGER_PRAGMA(omp parallel for schedule(static) if (N * CO * OH * OW * g->kh * g->kw > EAGER_PAR_MIN))
  for (plane = 0; plane < N * CO; plane++) {
    int64_t n = plane / CO, co = plane % CO, oh, ow, kh, kw;
    const float *xc = x + (n * C + co / OG) * H * W, *wc = w + co * g->kh * g->kw;
    float *yc = y + plane * OH * OW;
    for (oh = 0; oh < OH; oh++)
      for (ow = 0; ow < OW; ow++) {
        float acc = 0.0f;
        for (kh = 0; kh < g->kh; kh++) {
          int64_t ih = oh * g->sh - g->pt + kh * g->dh;
          if (ih < 0 || ih >= H) continue;
          for (kw = 0; kw < g->kw; kw++) {
            int64_t iw = ow * g->sw - g->pl + kw * g->dw;
            if (iw >= 0 && iw < W) acc += xc[ih * W + iw] * wc[kh * g->kw + kw];
          }
        }
        yc[oh * OW + ow] += acc;
      }
  }
}

int eager_conv2d(fl_op op, const fl_tensor *const *in, int nin,
                 const op_attrs *a, fl_tensor *out, fl_err *e) {
  return conv2d_posts(op, in, nin, a, NULL, 0, NULL, out, e);
}

static int conv2d_posts(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                        const cpu_mm_post *posts, int npost, const eager_layouts *lay,
                        fl_tensor *out, fl_err *e) {
  static const eager_layouts plain;     /* lay NULL: both plain */
  const int xblk = (lay = lay ? lay : &plain)->xblk, yblk = lay->yblk;
  const int64_t *xoff = lay->xoff;
  const fl_tensor *x = in[0], *w = in[1], *b = nin > 2 ? in[2] : NULL;
  int64_t N = x->m.shape[0], C = x->m.shape[1], H = x->m.shape[2];
  int64_t W = x->m.shape[3], CO = w->m.shape[0], KH = w->m.shape[2];
  int64_t KW = w->m.shape[3], OH = out->m.shape[2], OW = out->m.shape[3];
  int64_t G, CG, OG, CKK, P = OH * OW, n, co, gi;
  op_win2d g;
  int direct, depthwise;
  const float *xf, *wf, *bf = NULL;
  float *xo = NULL, *wo = NULL, *bo = NULL, *yo = NULL, *cols = NULL, *y;
  int rc = FL_ENOMEM;
  op_win2d_of(op, a, KH, KW, &g);
  G = g.groups > 0 ? g.groups : 1;
  CG = C / G; OG = CO / G; CKK = CG * KH * KW;
  /* a 1x1 stride-1 unpadded kernel reads the image as it is */
  direct = KH == 1 && KW == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 &&
           g.pl == 0 && g.pb == 0 && g.pr == 0;
  depthwise = G > 1 && CG == 1;
  cpu_blas_pick();                 /* the right kernels before the first product */
  if ((npost || xblk || yblk || xoff) && (out->m.dtype != FL_F32 || !cpu_conv_enabled()))
    return err_set(e, FL_EUNSUPPORTED, "%s: post-ops and blocked layouts need oneDNN and a float32 result",
                   op_name(op));
  if (((xblk || xoff) && (x->m.dtype != FL_F32 || !ten_is_contiguous(x))) ||
      (yblk && !ten_is_contiguous(out)))
    return err_set(e, FL_EUNSUPPORTED, "%s: a blocked layout in a strided or converted tensor", op_name(op));
  if (too_big(op_name(op), CO, P, CKK * G, e)) return FL_EUNSUPPORTED;
  if (!(xf = eager_f32(x, &xo, op_name(op), e)) ||
      !(wf = eager_f32(w, &wo, op_name(op), e)) ||
      (b && !(bf = eager_f32(b, &bo, op_name(op), e))) ||
      !(y = eager_out_f32(out, &yo, op_name(op), e)))
    goto done;
  if (cpu_conv_enabled()) {
    cpu_conv c;
    fl_err e2;
    memset(&c, 0, sizeof c);
    err_clear(&e2);
    c.n = N; c.c = C; c.h = H; c.w = W; c.co = CO; c.kh = KH; c.kw = KW; c.oh = OH; c.ow = OW;
    c.groups = G; c.sh = g.sh; c.sw = g.sw; c.dh = g.dh; c.dw = g.dw;
    c.pt = g.pt; c.pl = g.pl; c.pb = g.pb; c.pr = g.pr;
    c.x = xf; c.wt = wf; c.bias = bf; c.y = y;
    if (wf == ten_data(w)) c.w_st = w->st;   /* the weights themselves: they may be kept */
    for (n = 0; n < npost; n++) c.post[n] = posts[n];
    c.npost = npost;
    c.xblk = xblk;
    c.yblk = yblk;
    c.xoff = xoff;
    c.wrote = yblk && !yo ? lay->wrote : NULL;   /* into blocks, y itself the caller's buffer */
    if ((rc = cpu_conv_run(&c, &e2)) == FL_OK || npost || xblk || yblk || xoff) {
      if (rc != FL_OK) err_set(e, rc, "%s", e2.msg);
      eager_out_done(out, yo);
      goto done;
    }
    rc = FL_ENOMEM;
  }
  if (depthwise) {
    for (n = 0; n < N * CO; n++) {
      int64_t i;
      float v = bf ? bf[n % CO] : 0.0f;
      for (i = 0; i < P; i++) y[n * P + i] = v;
    }
    conv_depthwise(xf, wf, y, N, C, H, W, CO, &g, OH, OW);
    goto finish;
  }
  if (!direct && CKK > 0 &&
      !(cols = eager_alloc(sz_mul(CKK, P * (int64_t)sizeof *cols, &n) ?
                           (size_t)n : SIZE_MAX, op_name(op), e)))
    goto done;
  for (n = 0; n < N; n++) {
    float *yn = y + n * CO * P;
    const float *xn = xf + n * C * H * W;
    if (bf)
      for (co = 0; co < CO; co++) {
        int64_t i;
        for (i = 0; i < P; i++) yn[co * P + i] = bf[co];
      }
    if (CKK == 0) {
      if (!bf) memset(yn, 0, (size_t)(CO * P) * sizeof *yn);   /* may be a reused buffer */
      continue;
    }
    for (gi = 0; gi < G; gi++) {
      const float *xg = xn + gi * CG * H * W;
      if (!direct) im2col(xg, CG, H, W, &g, OH, OW, cols);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)OG, (int)P,
                  (int)CKK, 1.0f, wf + gi * OG * CKK, (int)CKK, direct ? xg : cols,
                  (int)P, bf ? 1.0f : 0.0f, yn + gi * OG * P, (int)P);
    }
  }
finish:
  eager_out_done(out, yo);
  rc = FL_OK;
done:
  free(xo); free(wo); free(bo); free(cols);
  return rc;
}

/* --- pooling ------------------------------------------------------------- */

/* Max over the dilated window (NaN wins, padding never does) or the
** average, dividing by the window clipped to the padded input
** (count_include_pad, PyTorch's rule) or by the input elements it covers.
** Row by row, one window offset (kh, kw) at a time across all the row's
** outputs: in the columns whose window lies inside the input (pool_cols)
** that loop has no bounds checks and vectorizes; the few border columns
** check.  The per-output loop this replaces compared one element at a time
** with data-dependent branches (Inception-v1's 13 max pools took 28 ms). */

/* the output columns [lo, hi) whose window (k taps, d apart, from
** o*s - p) lies inside [0, n) */
static void pool_cols(int64_t n, int64_t out, int64_t k, int64_t s, int64_t p, int64_t d,
                      int64_t *lo, int64_t *hi) {
  int64_t last = n - 1 - (k - 1) * d + p;    /* o*s <= last */
  *hi = last < 0 ? 0 : last / s + 1;
  if (*hi > out) *hi = out;
  *lo = (p + s - 1) / s;                     /* o*s - p >= 0 */
  if (*lo > *hi) *lo = *hi;
}

#define POOL_MAX(a, v) do { float v_ = (v), a_ = (a); (a) = v_ > a_ || v_ != v_ ? v_ : a_; } while (0)

/* the border columns [from, to) of one tap, each read checked */
static inline void max_cols(float *yr, const float *xr, int64_t W, int64_t sw, int64_t off,
                            int64_t from, int64_t to) {
  int64_t ow;
  for (ow = from; ow < to; ow++) {
    int64_t iw = ow * sw + off;
    if (iw >= 0 && iw < W) POOL_MAX(yr[ow], xr[iw]);
  }
}

/* the same for an average's sums: acc[ow - c0] */
static inline void sum_cols(double *acc, int64_t c0, const float *xr, int64_t W, int64_t sw,
                            int64_t off, int64_t from, int64_t to) {
  int64_t ow;
  for (ow = from; ow < to; ow++) {
    int64_t iw = ow * sw + off;
    if (iw >= 0 && iw < W) acc[ow - c0] += xr[iw];
  }
}

static inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

EAGER_WIDE
static void max_row(const float *x, float *yr, int64_t H, int64_t W, int64_t OW, int64_t h0,
                    const op_win2d *g, int64_t lo, int64_t hi) {
  int64_t ow, kh, kw, sw = g->sw;
  EAGER_SIMD
  for (ow = 0; ow < OW; ow++) yr[ow] = -INFINITY;
  for (kh = 0; kh < g->kh; kh++) {
    int64_t ih = h0 + kh * g->dh;
    const float *xr;
    if (ih < 0 || ih >= H) continue;
    xr = x + ih * W;
    for (kw = 0; kw < g->kw; kw++) {
      int64_t off = kw * g->dw - g->pl;
      max_cols(yr, xr, W, sw, off, 0, lo);
      /* strides 1 and 2 spelled out: a constant stride vectorizes as
      ** contiguous loads (and for 2, a shuffle of two), a variable one as a
      ** gather of single elements */
      if (sw == 1) {
        EAGER_SIMD
        for (ow = lo; ow < hi; ow++) POOL_MAX(yr[ow], xr[ow + off]);
      } else if (sw == 2) {
        EAGER_SIMD
        for (ow = lo; ow < hi; ow++) POOL_MAX(yr[ow], xr[2 * ow + off]);
      } else {
        EAGER_SIMD
        for (ow = lo; ow < hi; ow++) POOL_MAX(yr[ow], xr[ow * sw + off]);
      }
      max_cols(yr, xr, W, sw, off, hi, OW);
    }
  }
}

/* The 2x2, stride-2 max pool without padding (every CNN's downsampling):
** whole planes in one loop, the four taps in max_row's order.  Row by
** row, a 16-wide output row cost more in loop setup than in work: 0.7 ms
** for a [32, 16, 32, 32] batch, now a tenth of it. */
EAGER_WIDE
static void max2x2_plane(const float *restrict x, float *restrict y, int64_t W, int64_t OH,
                         int64_t OW) {
  int64_t oh, ow;
  for (oh = 0; oh < OH; oh++) {
    const float *restrict r0 = x + 2 * oh * W, *restrict r1 = r0 + W;
    float *restrict yr = y + oh * OW;
    EAGER_SIMD
    for (ow = 0; ow < OW; ow++) {
      float acc = -INFINITY;
      POOL_MAX(acc, r0[2 * ow]);
      POOL_MAX(acc, r0[2 * ow + 1]);
      POOL_MAX(acc, r1[2 * ow]);
      POOL_MAX(acc, r1[2 * ow + 1]);
      yr[ow] = acc;
    }
  }
}

static int is_max2x2(const op_win2d *g) {
  return g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->dh == 1 && g->dw == 1 &&
         g->pt == 0 && g->pb == 0 && g->pl == 0 && g->pr == 0;
}

/* Stride-1 max pools (Inception's 3x3 branches): a group of planes is
** copied, end to end, into -inf borders as wide as the padding, so every
** output of the group is one flat run per tap, Y[i] = max(Y[i], P[i + tap
** offset]), computed as if an output row were as wide as a padded row;
** the extra columns are dropped when the group is copied out.  No bounds
** checks and no short rows: GoogLeNet's 832 planes of 7x7 cost a few
** vector steps per tap, where row by row their borders were most of the
** work.  P holds np padded planes and the slack the last taps read past
** them; Y np padded planes. */
#define POOL_GROUP 16384          /* floats of P per group: L2-resident */

static int64_t pool_s1_slack(const op_win2d *g, int64_t Wp) {
  return (g->kh - 1) * g->dh * Wp + (g->kw - 1) * g->dw;
}

EAGER_WIDE
static void max_s1_group(const float *x, float *y, int64_t np, int64_t H, int64_t W, int64_t OH,
                         int64_t OW, const op_win2d *g, float *P, float *Y) {
  int64_t Wp = W + g->pl + g->pr, plane = (H + g->pt + g->pb) * Wp, n = np * plane;
  int64_t end = n + pool_s1_slack(g, Wp), p, r, i, kh, kw;
  EAGER_SIMD
  for (i = 0; i < end; i++) P[i] = -INFINITY;
  for (p = 0; p < np; p++)
    for (r = 0; r < H; r++)
      memcpy(P + p * plane + (r + g->pt) * Wp + g->pl, x + (p * H + r) * W, (size_t)W * sizeof *x);
  EAGER_SIMD
  for (i = 0; i < n; i++) Y[i] = -INFINITY;
  for (kh = 0; kh < g->kh; kh++)
    for (kw = 0; kw < g->kw; kw++) {
      const float *ps = P + kh * g->dh * Wp + kw * g->dw;
      EAGER_SIMD
      for (i = 0; i < n; i++) POOL_MAX(Y[i], ps[i]);
    }
  for (p = 0; p < np; p++)
    for (r = 0; r < OH; r++)
      memcpy(y + (p * OH + r) * OW, Y + p * plane + r * Wp, (size_t)OW * sizeof *y);
}

/* The average's window at (h0, w0): the input rows [*hs, *he) and columns
** [*ws, *we) it covers, and its divisor, the window clipped to the padded
** input (count_include_pad) or the elements it covers. */
static inline int64_t avg_window(const op_win2d *g, int64_t H, int64_t W, int64_t h0, int64_t w0,
                                 int64_t *hs, int64_t *he, int64_t *ws, int64_t *we) {
  int64_t h1 = h0 + g->kh < H + g->pb ? h0 + g->kh : H + g->pb;
  int64_t w1 = w0 + g->kw < W + g->pr ? w0 + g->kw : W + g->pr;
  *hs = h0 < 0 ? 0 : h0; *he = h1 < H ? h1 : H;
  *ws = w0 < 0 ? 0 : w0; *we = w1 < W ? w1 : W;
  return g->count_include_pad ? (h1 - h0) * (w1 - w0) : (*he - *hs) * (*we - *ws);
}

/* the average's sums are kept in double, POOL_BLOCK columns at a time */
#define POOL_BLOCK 256

EAGER_WIDE
static void avg_row(const float *x, float *yr, int64_t H, int64_t W, int64_t OW, int64_t h0,
                    const op_win2d *g, int64_t lo, int64_t hi) {
  int64_t hs, he, ws, we, sw = g->sw, c0, ow, ih, kw;
  avg_window(g, H, W, h0, 0, &hs, &he, &ws, &we);
  for (c0 = 0; c0 < OW; c0 += POOL_BLOCK) {
    double acc[POOL_BLOCK];                    /* acc[ow - c0] */
    int64_t c1 = c0 + POOL_BLOCK < OW ? c0 + POOL_BLOCK : OW;
    int64_t a = clamp64(lo, c0, c1), b = clamp64(hi, a, c1);
    for (ow = c0; ow < c1; ow++) acc[ow - c0] = 0.0;
    for (ih = hs; ih < he; ih++) {
      const float *xr = x + ih * W;
      for (kw = 0; kw < g->kw; kw++) {
        int64_t off = kw - g->pl;
        sum_cols(acc, c0, xr, W, sw, off, c0, a);
        if (sw == 2) {           /* as in max_row */
          EAGER_SIMD
          for (ow = a; ow < b; ow++) acc[ow - c0] += xr[2 * ow + off];
        } else {
          EAGER_SIMD
          for (ow = a; ow < b; ow++) acc[ow - c0] += xr[ow * sw + off];
        }
        sum_cols(acc, c0, xr, W, sw, off, b, c1);
      }
    }
    for (ow = c0; ow < c1; ow++)
      yr[ow] = (float)(acc[ow - c0] / (double)avg_window(g, H, W, h0, ow * sw - g->pl, &hs, &he, &ws, &we));
  }
}

/* Integer images have only the max (avg_pool2d refuses them): compared as
** int64, so values beyond 2^53 keep every bit. */
static void max_plane_i64(const int64_t *x, int64_t *y, int64_t H, int64_t W, int64_t OH,
                          int64_t OW, const op_win2d *g) {
  int64_t oh, ow, kh, kw;
  for (oh = 0; oh < OH; oh++)
    for (ow = 0; ow < OW; ow++) {
      int64_t h0 = oh * g->sh - g->pt, w0 = ow * g->sw - g->pl, acc = INT64_MIN;
      for (kh = 0; kh < g->kh; kh++) {
        int64_t ih = h0 + kh * g->dh;
        if (ih < 0 || ih >= H) continue;
        for (kw = 0; kw < g->kw; kw++) {
          int64_t iw = w0 + kw * g->dw;
          if (iw >= 0 && iw < W && x[ih * W + iw] > acc) acc = x[ih * W + iw];
        }
      }
      y[oh * OW + ow] = acc;
    }
}

/* The same pools of float32 images in oneDNN's nChw<b>c (a convolution's
** result kept in blocks for the next, cpu/backend.c), into the same
** layout: a window reads the channels of each pixel at once, 8 at a time
** in explicit vectors (where a loop over them left its sums and maxima in
** memory): the max a compare and blend that lets NaN win, the average's
** sums two vectors of doubles, divided as eager_pool2d divides; windows
** wholly inside the image skip the bounds tests.  xb and yr point at the
** 8 channels of a block of B (a pixel's stride). */
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f_u __attribute__((vector_size(16), aligned(4)));

static inline __attribute__((always_inline)) void max_nan(v8f *m, const float *px) {
  v8f p = *(const v8f_u *)px;
  v8i take = (p > *m) | (p != p);
  *m = (v8f)(((v8i)p & take) | ((v8i)*m & ~take));
}

static inline __attribute__((always_inline))
void pool_row8(const float *xb, float *yr, int64_t H, int64_t W, int64_t OW, int64_t h0,
               const op_win2d *g, int is_max, const int B) {
  int64_t ow, kh, kw, ih, iw, rs = g->dh * W * B, cs = g->dw * B;
  int hin = h0 >= 0 && h0 + (g->kh - 1) * g->dh < H;
  for (ow = 0; ow < OW; ow++) {
    int64_t w0 = ow * g->sw - g->pl;
    if (is_max && hin && ow + 4 <= OW && w0 >= 0 && w0 + 3 * g->sw + (g->kw - 1) * g->dw < W) {
      /* four windows inside the image at once, each in its taps' order:
      ** four chains of compare and blend, where one waited on itself
      ** (ShuffleNet's first max pool: 0.19 -> 0.08 ms) */
      const v8f ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
      v8f m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
      const float *p0 = xb + (h0 * W + w0) * B;
      int64_t ps = g->sw * B;
      for (kh = 0; kh < g->kh; kh++)
        for (kw = 0; kw < g->kw; kw++) {
          const float *pk = p0 + kh * rs + kw * cs;
          max_nan(&m0, pk);
          max_nan(&m1, pk + ps);
          max_nan(&m2, pk + 2 * ps);
          max_nan(&m3, pk + 3 * ps);
        }
      *(v8f_u *)(yr + ow * B) = m0;
      *(v8f_u *)(yr + (ow + 1) * B) = m1;
      *(v8f_u *)(yr + (ow + 2) * B) = m2;
      *(v8f_u *)(yr + (ow + 3) * B) = m3;
      ow += 3;
      continue;
    }
    if (!is_max && hin && ow + 2 <= OW && w0 >= 0 && w0 + g->sw + g->kw - 1 < W && h0 + g->kh <= H) {
      /* the average likewise, two windows at a time (four sums of
      ** doubles), each in avg_window's order, divided by the whole window */
      v4d l0 = {0, 0, 0, 0}, h0s = l0, l1 = l0, h1s = l0, d = (v4d){1, 1, 1, 1} * (double)(g->kh * g->kw);
      const float *p0 = xb + (h0 * W + w0) * B;
      int64_t ps = g->sw * B;
      for (kh = 0; kh < g->kh; kh++)
        for (kw = 0; kw < g->kw; kw++) {
          const float *pk = p0 + (kh * W + kw) * B;
          l0 += __builtin_convertvector(*(const v4f_u *)pk, v4d);
          h0s += __builtin_convertvector(*(const v4f_u *)(pk + 4), v4d);
          l1 += __builtin_convertvector(*(const v4f_u *)(pk + ps), v4d);
          h1s += __builtin_convertvector(*(const v4f_u *)(pk + ps + 4), v4d);
        }
      *(v4f_u *)(yr + ow * B) = __builtin_convertvector(l0 / d, v4f_u);
      *(v4f_u *)(yr + ow * B + 4) = __builtin_convertvector(h0s / d, v4f_u);
      *(v4f_u *)(yr + (ow + 1) * B) = __builtin_convertvector(l1 / d, v4f_u);
      *(v4f_u *)(yr + (ow + 1) * B + 4) = __builtin_convertvector(h1s / d, v4f_u);
      ow += 1;
      continue;
    }
    if (is_max) {
      v8f m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
      if (hin && w0 >= 0 && w0 + (g->kw - 1) * g->dw < W) {
        const float *p0 = xb + (h0 * W + w0) * B;
        for (kh = 0; kh < g->kh; kh++)
          for (kw = 0; kw < g->kw; kw++) max_nan(&m, p0 + kh * rs + kw * cs);
      } else {
        for (kh = 0; kh < g->kh; kh++) {
          if ((ih = h0 + kh * g->dh) < 0 || ih >= H) continue;
          for (kw = 0; kw < g->kw; kw++)
            if ((iw = w0 + kw * g->dw) >= 0 && iw < W) max_nan(&m, xb + (ih * W + iw) * B);
        }
      }
      *(v8f_u *)(yr + ow * B) = m;
    } else {
      v4d lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0}, d;
      int64_t hs, he, ws, we, cnt = avg_window(g, H, W, h0, w0, &hs, &he, &ws, &we);
      for (ih = hs; ih < he; ih++)
        for (iw = ws; iw < we; iw++) {
          const float *px = xb + (ih * W + iw) * B;
          lo += __builtin_convertvector(*(const v4f_u *)px, v4d);
          hi += __builtin_convertvector(*(const v4f_u *)(px + 4), v4d);
        }
      d = (v4d){1, 1, 1, 1} * (double)cnt;
      *(v4f_u *)(yr + ow * B) = __builtin_convertvector(lo / d, v4f_u);
      *(v4f_u *)(yr + ow * B + 4) = __builtin_convertvector(hi / d, v4f_u);
    }
  }
}

/* An average's output row of blocks of B channels through column sums:
** V [W][B] holds each input column's sum over the window's rows, in
** double, and each window is the sum of its columns of V -- kh + kw
** additions an output where the window took kh * kw, each input converted
** once, and windows over the border on the same loop as the rest (they
** took a quarter of Inception v2's 3x3 pools over 14x14, one tap at a
** time), divided through the divisor's reciprocal.  The sums' order
** differs from avg_row's, in double: the float result the same but for
** a rounding at most. */
#define AVG_COLS_MAX 4096    /* doubles of V: W * B */

typedef double v8d __attribute__((vector_size(64)));

/* 8 floats from any address as doubles: one vector of 8 (AVX-512's
** width; the narrower builds split it) where two of 4 took twice the
** instructions */
#define LOAD8D(p) ({ v8f t_; memcpy(&t_, (p), sizeof t_); __builtin_convertvector(t_, v8d); })

static inline __attribute__((always_inline))
void avg_cols_row(const float *xb, float *yr, int64_t H, int64_t W, int64_t OW, int64_t h0,
                  const op_win2d *g, const int B) {
  const int L = B / 8;                        /* v8d a pixel: 1 or 2 */
  v8d V[AVG_COLS_MAX / 8], d;
  int64_t hs, he, ws, we, ih, i, ow, cnt;
  avg_window(g, H, W, h0, 0, &hs, &he, &ws, &we);
  for (i = 0; i < W * L; i++) V[i] = (v8d){0, 0, 0, 0, 0, 0, 0, 0};
  for (ih = hs; ih < he; ih++) {
    const float *xr = xb + ih * W * B;
    for (i = 0; i < W * L; i++) V[i] += LOAD8D(xr + i * 8);
  }
  for (ow = 0; ow < OW; ow++) {
    v8d a0 = {0, 0, 0, 0, 0, 0, 0, 0}, a1 = a0;      /* in registers */
    v8f r;
    cnt = avg_window(g, H, W, h0, ow * g->sw - g->pl, &hs, &he, &ws, &we);
    for (i = ws; i < we; i++) {
      a0 += V[i * L];
      if (L > 1) a1 += V[i * L + 1];
    }
    d = (v8d){1, 1, 1, 1, 1, 1, 1, 1} * (1.0 / (double)cnt);   /* one division, not one a lane */
    r = __builtin_convertvector(a0 * d, v8f);
    memcpy(yr + ow * B, &r, sizeof r);
    if (L > 1) {
      r = __builtin_convertvector(a1 * d, v8f);
      memcpy(yr + ow * B + 8, &r, sizeof r);
    }
  }
}

/* One output row of blocks of B channels (8 or 16), 8 lanes at a time. */
static inline __attribute__((always_inline))
void pool_blocked_row(const float *xb, float *yr, int64_t H, int64_t W, int64_t OW, int64_t h0,
                      const op_win2d *g, int is_max, const int B) {
  int v;
  if (!is_max && g->dh == 1 && g->dw == 1 && W * B <= AVG_COLS_MAX) {
    avg_cols_row(xb, yr, H, W, OW, h0, g, B);
    return;
  }
  for (v = 0; v < B; v += 8) pool_row8(xb + v, yr + v, H, W, OW, h0, g, is_max, B);
}

/* The pools whose windows are many short rows (a global average over
** 7x7, a 3x3 stride-2 window over 28x28: one output column or a few per
** row) through the same loop: 8 planes at a time are transposed into a
** pixel-major scratch T[pixel][8], pooled there one vector per tap, and
** transposed back.  Row by row, each tap was a loop of one to a few
** iterations (ShuffleNet's global pool over 544 planes of 7x7: 280 us,
** 10 ns per add; 14 us now).  A last group of fewer planes pads its
** lanes with zeros that are never written back.  Rows of more than 64
** outputs, fewer than 8 planes or planes larger than POOL_BY8_MAX keep
** the row loop, which is as fast there (bench/RESULTS.md).  Few groups
** of large planes (ShuffleNet's first max pool: 3 groups of 112x112) are
** cut into bands of output rows, each transposing the input rows its
** windows read, so that every thread has work and its scratch stays in
** L2 (one group a thread left one of two idle a third of the time). */
#define POOL_BY8_MAX 16384   /* pixels of a plane: T is at most 512 KB a thread */

EAGER_WIDE
static int pool_by8(const float *x, float *y, int64_t planes, int64_t H, int64_t W, int64_t OH,
                    int64_t OW, const op_win2d *g, int is_max) {
  int64_t groups = (planes + 7) / 8, HW = H * W, OHW = OH * OW, bands = 1;
  int ok = 1, threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  /* at least 8 items a thread, bands of at least 4 output rows */
  if (groups < 8 * threads) bands = (8 * threads + groups - 1) / groups;
  if (bands > OH / 4) bands = OH / 4 > 1 ? OH / 4 : 1;
  EAGER_PRAGMA(omp parallel if (planes * HW * g->kh * g->kw > EAGER_PAR_MIN))
  {
    float *T = cpu_scratch(0, (size_t)(HW + OHW) * 8 * sizeof *T);
    int64_t q, oh;
    if (!T) {
      EAGER_PRAGMA(omp atomic write)
      ok = 0;
    }
    EAGER_PRAGMA(omp barrier)
    if (ok) {
      EAGER_PRAGMA(omp for schedule(static))
      for (q = 0; q < groups * bands; q++) {
        int64_t gi = q / bands, b = q % bands, o0 = b * OH / bands, o1 = (b + 1) * OH / bands;
        /* the input rows the band's windows read, clipped to the plane */
        int64_t r0 = o0 * g->sh - g->pt, r1 = (o1 - 1) * g->sh - g->pt + (g->kh - 1) * g->dh + 1;
        int n = planes - gi * 8 < 8 ? (int)(planes - gi * 8) : 8;
        r0 = r0 < 0 ? 0 : r0;
        r1 = r1 > H ? H : r1;
        if (r1 > r0) planes_to8(x + gi * 8 * HW + r0 * W, HW, T + r0 * W * 8, (r1 - r0) * W, n);
        for (oh = o0; oh < o1; oh++)
          pool_blocked_row(T, T + (HW + oh * OW) * 8, H, W, OW, oh * g->sh - g->pt, g, is_max, 8);
        planes_from8(T + (HW + o0 * OW) * 8, y + gi * 8 * OHW + o0 * OW, OHW, (o1 - o0) * OW, n);
      }
    }
    cpu_scratch_done(0, T);
  }
  return ok;
}

int eager_pool2d(fl_op op, const fl_tensor *const *in, int nin,
                 const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0];
  int64_t H = x->m.shape[2], W = x->m.shape[3], OH = out->m.shape[2];
  int64_t OW = out->m.shape[3], planes = x->m.shape[0] * x->m.shape[1], p;
  op_win2d g0, *g = &g0;
  int is_max = op == OP_MAX_POOL2D;
  (void)nin;
  op_win2d_of(op, a, 0, 0, g);
  if (dtype_is_float(x->m.dtype)) {
    float *xo, *yo, *y;
    const float *xf = eager_f32(x, &xo, op_name(op), e);
    if (!xf) return FL_ENOMEM;
    if (!(y = eager_out_f32(out, &yo, op_name(op), e))) { free(xo); return FL_ENOMEM; }
    int64_t lo, hi;
    pool_cols(W, OW, g->kw, g->sw, g->pl, is_max ? g->dw : 1, &lo, &hi);
    /* stride-1 max pools of planes that fit a group through the padded
    ** copy (max_s1_group), the rest one output row per iteration: a single
    ** plane (a channel pooling over [1, 1, C, HW]) still uses every thread */
    int64_t Wp = W + g->pl + g->pr, plane = (H + g->pt + g->pb) * Wp;
    if (is_max && g->sh == 1 && g->sw == 1 && OH + (g->kh - 1) * g->dh == H + g->pt + g->pb &&
        OW + (g->kw - 1) * g->dw == Wp && plane <= POOL_GROUP) {
      int64_t np = POOL_GROUP / plane, groups = (planes + np - 1) / np;
      EAGER_PRAGMA(omp parallel if (planes * H * W > EAGER_PAR_MIN))
      {
        float *P = cpu_scratch(0, (size_t)(np * plane + pool_s1_slack(g, Wp)) * sizeof *P);
        float *Y = cpu_scratch(1, (size_t)(np * plane) * sizeof *Y);
        int64_t q, j;
        EAGER_PRAGMA(omp for schedule(static))
        for (q = 0; q < groups; q++) {
          int64_t p0 = q * np, n = p0 + np < planes ? np : planes - p0;
          if (P && Y) {
            max_s1_group(xf + p0 * H * W, y + p0 * OH * OW, n, H, W, OH, OW, g, P, Y);
            continue;
          }
          for (j = p0 * OH; j < (p0 + n) * OH; j++)   /* no scratch: row by row */
            max_row(xf + j / OH * H * W, y + j * OW, H, W, OW, j % OH - g->pt, g, lo, hi);
        }
        cpu_scratch_done(0, P);
        cpu_scratch_done(1, Y);
      }
    } else if (is_max && is_max2x2(g) && 2 * OH <= H && 2 * OW <= W) {
      EAGER_PRAGMA(omp parallel for schedule(static) if (planes * H * W > EAGER_PAR_MIN))
      for (p = 0; p < planes; p++) max2x2_plane(xf + p * H * W, y + p * OH * OW, W, OH, OW);
    } else if (!(planes >= 8 && H * W <= POOL_BY8_MAX && OW <= 64 &&
                 pool_by8(xf, y, planes, H, W, OH, OW, g, is_max))) {   /* else the row loop */
      EAGER_PRAGMA(omp parallel for schedule(static) if (planes * H * W > EAGER_PAR_MIN))
      for (p = 0; p < planes * OH; p++) {
        const float *xp = xf + p / OH * H * W;
        float *yr = y + p * OW;
        int64_t h0 = p % OH * g->sh - g->pt;
        if (is_max) max_row(xp, yr, H, W, OW, h0, g, lo, hi);
        else avg_row(xp, yr, H, W, OW, h0, g, lo, hi);
      }
    }
    eager_out_done(out, yo);
    free(xo);
  } else {
    int64_t *xd, *yd;
    if (!gather_i64(x, &xd, op_name(op), e)) return FL_ENOMEM;
    if (!(yd = eager_alloc((size_t)(planes * OH * OW) * sizeof *yd, op_name(op), e))) {
      free(xd);
      return FL_ENOMEM;
    }
    for (p = 0; p < planes; p++)
      max_plane_i64(xd + p * H * W, yd + p * OH * OW, H, W, OH, OW, g);
    for (p = 0; p < planes * OH * OW; p++) ten_set_i64(out, p, yd[p]);
    free(xd);
    free(yd);
  }
  return FL_OK;
}

EAGER_WIDE
int eager_pool2d_blocked(fl_op op, const op_attrs *a, const float *x, float *y, int64_t N, int64_t C,
                         int64_t H, int64_t W, int64_t OH, int64_t OW, int b) {
  op_win2d g;
  int64_t q, nq;
  int is_max = op == OP_MAX_POOL2D;
  if ((op != OP_MAX_POOL2D && op != OP_AVG_POOL2D) || (b != 8 && b != 16) || C % b) return FL_EUNSUPPORTED;
  op_win2d_of(op, a, 0, 0, &g);
  nq = N * (C / b) * OH;
  EAGER_PRAGMA(omp parallel for schedule(static) if (nq * OW * b * g.kh * g.kw > EAGER_PAR_MIN))
  for (q = 0; q < nq; q++) {
    const float *xb = x + q / OH * H * W * b;
    float *yr = y + q * OW * b;
    int64_t h0 = q % OH * g.sh - g.pt;
    if (b == 8) pool_blocked_row(xb, yr, H, W, OW, h0, &g, is_max, 8);
    else pool_blocked_row(xb, yr, H, W, OW, h0, &g, is_max, 16);
  }
  return FL_OK;
}

/* One output row of a 2x2, stride-2 max pool's gradient: each window's
** gradient onto its first largest element, or its last NaN, as the
** general loop below; selects, not branches, so that the loop vectorizes. */
EAGER_WIDE
static void max2x2_backward_row(const float *restrict r0, const float *restrict gr,
                                float *restrict y0, int64_t W, int64_t OW) {
  const float *restrict r1 = r0 + W;
  float *restrict y1 = y0 + W;
  int64_t ow;
  EAGER_SIMD
  for (ow = 0; ow < OW; ow++) {
    float a0 = r0[2 * ow], a1 = r0[2 * ow + 1], a2 = r1[2 * ow], a3 = r1[2 * ow + 1];
    float mx = a0, gv = gr[ow], pick = 0.0f;
    int c;
    c = (a1 > mx) | (a1 != a1); mx = c ? a1 : mx; pick = c ? 1.0f : pick;
    c = (a2 > mx) | (a2 != a2); mx = c ? a2 : mx; pick = c ? 2.0f : pick;
    c = (a3 > mx) | (a3 != a3); pick = c ? 3.0f : pick;
    y0[2 * ow] = pick == 0.0f ? gv : 0.0f;
    y0[2 * ow + 1] = pick == 1.0f ? gv : 0.0f;
    y1[2 * ow] = pick == 2.0f ? gv : 0.0f;
    y1[2 * ow + 1] = pick == 3.0f ? gv : 0.0f;
  }
}

/* max_pool2d_backward(g, x), the oracle's rule (ref_max_pool2d_backward):
** a plane per iteration, each window's gradient added onto the element it
** picked; planes are disjoint, so threads never share an element. */
int eager_max_pool2d_backward(fl_op op, const fl_tensor *const *in, int nin,
                              const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *gt = in[0], *x = in[1];
  int64_t H = x->m.shape[2], W = x->m.shape[3], OH = gt->m.shape[2], OW = gt->m.shape[3];
  int64_t planes = x->m.shape[0] * x->m.shape[1], p;
  op_win2d g;
  float *xo = NULL, *go = NULL, *yo = NULL, *y;
  const float *xf, *gf;
  int tiled;
  (void)nin;
  op_win2d_of(OP_MAX_POOL2D, a, 0, 0, &g);
  /* windows that tile the plane exactly (the common 2x2, stride 2) */
  tiled = g.sh == g.kh && g.sw == g.kw && g.dh == 1 && g.dw == 1 && !g.pt && !g.pl &&
          OH * g.kh == H && OW * g.kw == W;
  if (!(xf = eager_f32(x, &xo, op_name(op), e))) return FL_ENOMEM;
  if (!(gf = eager_f32(gt, &go, op_name(op), e))) { free(xo); return FL_ENOMEM; }
  if (!(y = eager_out_f32(out, &yo, op_name(op), e))) { free(xo); free(go); return FL_ENOMEM; }
  EAGER_PRAGMA(omp parallel for schedule(static) if (planes * H * W > EAGER_PAR_MIN))
  for (p = 0; p < planes; p++) {
    const float *xp = xf + p * H * W, *gp = gf + p * OH * OW;
    float *yp = y + p * H * W;
    int64_t oh, ow, kh, kw;
    if (tiled && g.kh == 2 && g.kw == 2) {   /* the common 2x2 */
      for (oh = 0; oh < OH; oh++)
        max2x2_backward_row(xp + 2 * oh * W, gp + oh * OW, yp + 2 * oh * W, W, OW);
      continue;
    }
    if (tiled) {             /* each element in one window: one pass, no memset */
      for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++) {
          int64_t pick = -1, at;
          float mx = 0;
          for (kh = 0; kh < g.kh; kh++)
            for (kw = 0; kw < g.kw; kw++) {
              float v;
              at = (oh * g.kh + kh) * W + ow * g.kw + kw;
              v = xp[at];
              yp[at] = 0.0f;
              if (pick < 0 || v > mx || v != v) { mx = v; pick = at; }
            }
          yp[pick] = gp[oh * OW + ow];
        }
      continue;
    }
    memset(yp, 0, (size_t)(H * W) * sizeof *yp);
    for (oh = 0; oh < OH; oh++)
      for (ow = 0; ow < OW; ow++) {
        int64_t pick = -1, h0 = oh * g.sh - g.pt, w0 = ow * g.sw - g.pl;
        float mx = 0;
        for (kh = 0; kh < g.kh; kh++) {
          int64_t ih = h0 + kh * g.dh;
          if (ih < 0 || ih >= H) continue;
          for (kw = 0; kw < g.kw; kw++) {
            int64_t iw = w0 + kw * g.dw;
            float v;
            if (iw < 0 || iw >= W) continue;
            v = xp[ih * W + iw];
            if (pick < 0 || v > mx || v != v) { mx = v; pick = ih * W + iw; }
          }
        }
        if (pick >= 0) yp[pick] += gp[oh * OW + ow];
      }
  }
  eager_out_done(out, yo);
  free(xo);
  free(go);
  return FL_OK;
}
