/*
** ref_nn.c -- the reference products, pooling and batch_norm.
** Invariant: as in ref.c, every value is read through ten_get at a
** logical row-major index, accumulated in double and written once with
** ten_set; the loops are the textbook definitions (a dot product per output
** element, a direct seven-loop convolution), never a blocked or transposed
** rewrite, so they can be checked by eye.
*/
#include <math.h>
#include <string.h>

#include "ref.h"
#include "ref_impl.h"

/* --- matmul ----------------------------------------------------------- */

/* The operand's matrix view [rows, cols] and its batch dims, PyTorch's way:
** a 1-d left operand is a row [1, k], a 1-d right operand a column [k, 1];
** the added dim is dropped from the result again. */
typedef struct mat_view {
  int64_t rows, cols;
  int nbatch;                       /* leading dims before the matrix */
} mat_view;

static mat_view mat_of(const fl_meta *m, int right) {
  mat_view v;
  if (m->ndim == 1) {
    v.rows = right ? m->shape[0] : 1;
    v.cols = right ? 1 : m->shape[0];
    v.nbatch = 0;
  } else {
    v.rows = m->shape[m->ndim - 2];
    v.cols = m->shape[m->ndim - 1];
    v.nbatch = m->ndim - 2;
  }
  return v;
}

/* Batch offset (in matrices) of operand m for broadcast batch coords bc of
** a batch shape with nb dims: dims align at the right, size 1 repeats. */
static int64_t batch_index(const fl_meta *m, int mb, const int64_t *bc,
                           int nb) {
  int64_t i = 0;
  int d;
  for (d = 0; d < mb; d++)
    i = i * m->shape[d] + (m->shape[d] == 1 ? 0 : bc[d + nb - mb]);
  return i;
}

int ref_matmul(fl_op op, const fl_tensor *const *in, int nin,
               const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_meta *am = &in[0]->m, *bm = &in[1]->m;
  mat_view av, bv;
  fl_meta bshape;                   /* the broadcast batch shape */
  int64_t B, M, K, N, bi, i, j, k, bc[FL_MAX_DIMS];
  int d, rc, ints = !dtype_is_float(out->m.dtype);
  char sa[96], sb[96];
  (void)op; (void)nin; (void)a;
  if (am->ndim < 1 || bm->ndim < 1)
    return err_set(e, FL_EINVAL, "matmul: both operands need at least one "
                   "dimension, got %s @ %s", meta_shape_str(am, sa, sizeof sa),
                   meta_shape_str(bm, sb, sizeof sb));
  av = mat_of(am, 0);
  bv = mat_of(bm, 1);
  M = av.rows; K = av.cols; N = bv.cols;
  if (bv.rows != K)
    return err_set(e, FL_EINVAL, "matmul: %s @ %s: inner dimensions differ "
                   "(%lld vs %lld)", meta_shape_str(am, sa, sizeof sa),
                   meta_shape_str(bm, sb, sizeof sb), (long long)K,
                   (long long)bv.rows);
  memset(&bshape, 0, sizeof bshape);
  bshape.ndim = av.nbatch > bv.nbatch ? av.nbatch : bv.nbatch;
  for (d = 0; d < bshape.ndim; d++) {
    int da = d - (bshape.ndim - av.nbatch), db = d - (bshape.ndim - bv.nbatch);
    int64_t x = da >= 0 ? am->shape[da] : 1, y = db >= 0 ? bm->shape[db] : 1;
    if (x != y && x != 1 && y != 1)
      return err_set(e, FL_EINVAL, "matmul: %s @ %s: batch dimensions do not "
                     "broadcast", meta_shape_str(am, sa, sizeof sa),
                     meta_shape_str(bm, sb, sizeof sb));
    bshape.shape[d] = x == 1 ? y : x;
  }
  B = meta_numel(&bshape);
  if ((rc = ref_check_numel("matmul", out, B * M * N, "output", e)) != FL_OK)
    return rc;
  /* dropping the size-1 dims of 1-d operands leaves row-major order as
  ** [batch..., M, N], so output index (bi*M + i)*N + j */
  for (bi = 0; bi < B; bi++) {
    int64_t abase, bbase;
    ref_unravel(&bshape, bi, bc);
    abase = batch_index(am, av.nbatch, bc, bshape.ndim) * M * K;
    bbase = batch_index(bm, bv.nbatch, bc, bshape.ndim) * K * N;
    for (i = 0; i < M; i++)
      for (j = 0; j < N; j++) {
        double acc = 0.0;
        uint64_t iacc = 0;       /* integer products: exact, wrapping */
        if (ints) {
          for (k = 0; k < K; k++)
            iacc += (uint64_t)ten_get_i64(in[0], abase + i * K + k) *
                    (uint64_t)ten_get_i64(in[1], bbase + k * N + j);
          ten_set_i64(out, (bi * M + i) * N + j, (int64_t)iacc);
          continue;
        }
        for (k = 0; k < K; k++)
          acc += ten_get(in[0], abase + i * K + k) *
                 ten_get(in[1], bbase + k * N + j);
        ten_set(out, (bi * M + i) * N + j, acc);
      }
  }
  return FL_OK;
}

/* y[..., o] = sum_k x[..., k] * w[o, k] + b[o]   (x @ w^T + b) */
int ref_linear(fl_op op, const fl_tensor *const *in, int nin,
               const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0], *w = in[1], *b = ref_opt(in, nin, 2);
  int64_t IN, O, rows, r, o, k;
  int rc, ints = !dtype_is_float(out->m.dtype);
  char sa[96], sb[96];
  (void)a;
  if (x->m.ndim < 1 || w->m.ndim < 1 || w->m.ndim > 2)
    return err_set(e, FL_EINVAL, "linear: input %s, weight %s: expected "
                   "input [..., in] and weight [out, in]",
                   meta_shape_str(&x->m, sa, sizeof sa),
                   meta_shape_str(&w->m, sb, sizeof sb));
  IN = x->m.shape[x->m.ndim - 1];
  O = w->m.ndim == 2 ? w->m.shape[0] : 1;   /* a 1-d weight gives [...] */
  if (w->m.shape[w->m.ndim - 1] != IN)
    return err_set(e, FL_EINVAL, "linear: input %s, weight %s: in features "
                   "differ (%lld vs %lld)", meta_shape_str(&x->m, sa, sizeof sa),
                   meta_shape_str(&w->m, sb, sizeof sb), (long long)IN,
                   (long long)w->m.shape[w->m.ndim - 1]);
  rows = ref_prod(&x->m, 0, x->m.ndim - 1);
  if ((rc = ref_check_numel(op_name(op), out, rows * O, "output", e)) != FL_OK)
    return rc;
  if (b && (rc = ref_check_numel(op_name(op), b, O, "bias", e)) != FL_OK)
    return rc;
  for (r = 0; r < rows; r++)
    for (o = 0; o < O; o++) {
      double acc = b ? ten_get(b, o) : 0.0;
      if (ints) {                /* exact, wrapping */
        uint64_t iacc = b ? (uint64_t)ten_get_i64(b, o) : 0;
        for (k = 0; k < IN; k++)
          iacc += (uint64_t)ten_get_i64(x, r * IN + k) * (uint64_t)ten_get_i64(w, o * IN + k);
        ten_set_i64(out, r * O + o, (int64_t)iacc);
        continue;
      }
      for (k = 0; k < IN; k++)
        acc += ten_get(x, r * IN + k) * ten_get(w, o * IN + k);
      ten_set(out, r * O + o, acc);
    }
  return FL_OK;
}

/* --- images: [N, C, H, W], or unbatched [C, H, W] -------------------------- */

/* Batch, channels, height, width of a 3-d or 4-d image; an unbatched image
** has the same row-major layout as a batch of one. */
static int image_dims(const char *op, const fl_meta *m, int64_t *n,
                      int64_t *c, int64_t *h, int64_t *w, fl_err *e) {
  char buf[96];
  if (m->ndim != 3 && m->ndim != 4)
    return err_set(e, FL_EINVAL, "%s: expected a 3-d or 4-d image, got %s",
                   op, meta_shape_str(m, buf, sizeof buf));
  *n = m->ndim == 4 ? m->shape[0] : 1;
  *c = m->shape[m->ndim - 3];
  *h = m->shape[m->ndim - 2];
  *w = m->shape[m->ndim - 1];
  return FL_OK;
}

/* out size of a sliding window: floor((in + 2 pad - k) / stride) + 1 */
static int64_t window_out(int64_t in, int64_t k, int64_t stride, int64_t pad) {
  return (in + 2 * pad - k) / stride + 1;
}

/* Direct convolution (cross-correlation, as PyTorch): for each output
** element, the dot product of the kernel with the zero-padded window. */
int ref_conv2d(fl_op op, const fl_tensor *const *in, int nin,
               const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0], *w = in[1], *b = ref_opt(in, nin, 2);
  int64_t N, C, H, W, CO, KH, KW, OH, OW, n, co, oh, ow, ci, kh, kw;
  int64_t sh = a->i[0], sw = a->i[1], ph = a->i[2], pw = a->i[3];
  int rc;
  char sa[96], sb[96];
  (void)op;
  if ((rc = image_dims("conv2d", &x->m, &N, &C, &H, &W, e)) != FL_OK)
    return rc;
  if (w->m.ndim != 4 || w->m.shape[1] != C || sh < 1 || sw < 1 || ph < 0 ||
      pw < 0)
    return err_set(e, FL_EINVAL, "conv2d: input %s, weight %s: expected "
                   "weight [co, %lld, kh, kw], stride >= 1, padding >= 0",
                   meta_shape_str(&x->m, sa, sizeof sa),
                   meta_shape_str(&w->m, sb, sizeof sb), (long long)C);
  CO = w->m.shape[0]; KH = w->m.shape[2]; KW = w->m.shape[3];
  OH = window_out(H, KH, sh, ph);
  OW = window_out(W, KW, sw, pw);
  if (OH < 1 || OW < 1)
    return err_set(e, FL_EINVAL, "conv2d: kernel %lldx%lld larger than the "
                   "padded input %lldx%lld", (long long)KH, (long long)KW,
                   (long long)(H + 2 * ph), (long long)(W + 2 * pw));
  if ((rc = ref_check_numel("conv2d", out, N * CO * OH * OW, "output", e)))
    return rc;
  if (b && (rc = ref_check_numel("conv2d", b, CO, "bias", e)) != FL_OK)
    return rc;
  for (n = 0; n < N; n++)
    for (co = 0; co < CO; co++)
      for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++) {
          double acc = b ? ten_get(b, co) : 0.0;
          for (ci = 0; ci < C; ci++)
            for (kh = 0; kh < KH; kh++)
              for (kw = 0; kw < KW; kw++) {
                int64_t ih = oh * sh - ph + kh, iw = ow * sw - pw + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += ten_get(x, ((n * C + ci) * H + ih) * W + iw) *
                       ten_get(w, ((co * C + ci) * KH + kh) * KW + kw);
              }
          ten_set(out, ((n * CO + co) * OH + oh) * OW + ow, acc);
        }
  return FL_OK;
}

/* A pooling window's geometry: kernel i0,i1; stride i2,i3 (0 means the
** kernel size, PyTorch's default); padding i4,i5. */
typedef struct pool_geom {
  int64_t planes;                 /* N * C images of H x W */
  int64_t H, W, OH, OW;           /* input and output sizes */
  int64_t kh, kw, sh, sw, ph, pw; /* kernel, stride, padding */
} pool_geom;

static int pool_geometry(fl_op op, const fl_tensor *x, const op_attrs *a,
                         const fl_tensor *out, pool_geom *g, fl_err *e) {
  int64_t N, C;
  int rc;
  if ((rc = image_dims(op_name(op), &x->m, &N, &C, &g->H, &g->W, e)) != FL_OK)
    return rc;
  g->kh = a->i[0]; g->kw = a->i[1];
  g->sh = a->i[2] > 0 ? a->i[2] : g->kh;
  g->sw = a->i[3] > 0 ? a->i[3] : g->kw;
  g->ph = a->i[4]; g->pw = a->i[5];
  /* PyTorch: padding at most half the kernel, so no window is all pad */
  if (g->kh < 1 || g->kw < 1 || g->ph < 0 || g->pw < 0 ||
      2 * g->ph > g->kh || 2 * g->pw > g->kw)
    return err_set(e, FL_EINVAL, "%s: kernel %lldx%lld with padding %lld,%lld:"
                   " expected kernel >= 1 and padding at most half the kernel",
                   op_name(op), (long long)g->kh, (long long)g->kw,
                   (long long)g->ph, (long long)g->pw);
  g->OH = window_out(g->H, g->kh, g->sh, g->ph);
  g->OW = window_out(g->W, g->kw, g->sw, g->pw);
  if (g->OH < 1 || g->OW < 1)
    return err_set(e, FL_EINVAL, "%s: kernel %lldx%lld larger than the padded "
                   "input %lldx%lld", op_name(op), (long long)g->kh,
                   (long long)g->kw, (long long)(g->H + 2 * g->ph),
                   (long long)(g->W + 2 * g->pw));
  g->planes = N * C;
  return ref_check_numel(op_name(op), out, g->planes * g->OH * g->OW,
                         "output", e);
}

/* The max over the in-bounds part of each window (the padding is -inf, so
** it never wins); NaN wins, as in PyTorch. */
int ref_max_pool2d(fl_op op, const fl_tensor *const *in, int nin,
                   const op_attrs *a, fl_tensor *out, fl_err *e) {
  pool_geom g;
  int64_t p, oh, ow, kh, kw;
  int rc, ints = !dtype_is_float(in[0]->m.dtype);
  (void)nin;
  if ((rc = pool_geometry(op, in[0], a, out, &g, e)) != FL_OK) return rc;
  for (p = 0; p < g.planes; p++)
    for (oh = 0; oh < g.OH; oh++)
      for (ow = 0; ow < g.OW; ow++) {
        double mx = -INFINITY;
        int64_t imx = INT64_MIN;  /* integer images: compared exactly */
        for (kh = 0; kh < g.kh; kh++)
          for (kw = 0; kw < g.kw; kw++) {
            int64_t ih = oh * g.sh - g.ph + kh, iw = ow * g.sw - g.pw + kw, at;
            double v;
            if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
            at = (p * g.H + ih) * g.W + iw;
            if (ints) {
              if (ten_get_i64(in[0], at) > imx) imx = ten_get_i64(in[0], at);
              continue;
            }
            v = ten_get(in[0], at);
            if (v > mx || isnan(v)) mx = v;
          }
        if (ints) ten_set_i64(out, (p * g.OH + oh) * g.OW + ow, imx);
        else ten_set(out, (p * g.OH + oh) * g.OW + ow, mx);
      }
  return FL_OK;
}

/* The sum over the window divided by the window's size counting padding
** (count_include_pad=True, PyTorch's default): zeros are averaged in. */
int ref_avg_pool2d(fl_op op, const fl_tensor *const *in, int nin,
                   const op_attrs *a, fl_tensor *out, fl_err *e) {
  pool_geom g;
  int64_t p, oh, ow, ih, iw;
  int rc;
  (void)nin;
  if ((rc = pool_geometry(op, in[0], a, out, &g, e)) != FL_OK) return rc;
  for (p = 0; p < g.planes; p++)
    for (oh = 0; oh < g.OH; oh++)
      for (ow = 0; ow < g.OW; ow++) {
        /* PyTorch clips the window to the padded input before counting */
        int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
        int64_t h1 = h0 + g.kh < g.H + g.ph ? h0 + g.kh : g.H + g.ph;
        int64_t w1 = w0 + g.kw < g.W + g.pw ? w0 + g.kw : g.W + g.pw;
        double sum = 0.0, count = (double)((h1 - h0) * (w1 - w0));
        for (ih = h0; ih < h1; ih++)
          for (iw = w0; iw < w1; iw++)
            if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W)
              sum += ten_get(in[0], (p * g.H + ih) * g.W + iw);
        ten_set(out, (p * g.OH + oh) * g.OW + ow, sum / count);
      }
  return FL_OK;
}

/* Inference batch norm over channel dim 1:
** y = (x - mean[c]) / sqrt(var[c] + eps) * w[c] + b[c]. */
int ref_batch_norm(fl_op op, const fl_tensor *const *in, int nin,
                   const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0], *mean = in[1], *var = in[2];
  const fl_tensor *w = ref_opt(in, nin, 3), *b = ref_opt(in, nin, 4);
  int64_t C, inner, n, i;
  int rc;
  char buf[96];
  if (x->m.ndim < 2)
    return err_set(e, FL_EINVAL, "batch_norm: expected [N, C, ...], got %s",
                   meta_shape_str(&x->m, buf, sizeof buf));
  C = x->m.shape[1];
  inner = ref_prod(&x->m, 2, x->m.ndim);
  if ((rc = ref_check_numel(op_name(op), mean, C, "running mean", e)) ||
      (rc = ref_check_numel(op_name(op), var, C, "running var", e)) ||
      (w && (rc = ref_check_numel(op_name(op), w, C, "weight", e))) ||
      (b && (rc = ref_check_numel(op_name(op), b, C, "bias", e))))
    return rc;
  n = meta_numel(&x->m);
  for (i = 0; i < n; i++) {
    int64_t c = inner > 0 ? (i / inner) % C : 0;
    double y = (ten_get(x, i) - ten_get(mean, c)) /
               sqrt(ten_get(var, c) + a->f[0]);
    if (w) y *= ten_get(w, c);
    if (b) y += ten_get(b, c);
    ten_set(out, i, y);
  }
  return FL_OK;
}
