/*
** ref_nn.c -- the reference products, pooling and batch_norm.
** Invariant: as in ref.c, every value is read through ten_get at a
** logical row-major index, accumulated in double and written once with
** ten_set; the loops are the textbook definitions (a dot product per output
** element, a direct seven-loop convolution), never a blocked or transposed
** rewrite, so they can be checked by eye.
*/
#include <math.h>
#include <stdlib.h>
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

/* Direct convolution (cross-correlation, as PyTorch): for each output
** element, the dot product of its group's kernel with the zero-padded,
** dilated window over that group's input channels. */
int ref_conv2d(fl_op op, const fl_tensor *const *in, int nin,
               const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0], *w = in[1], *b = ref_opt(in, nin, 2);
  int64_t N = 0, C = 0, H = 0, W = 0, CO, CG, OG, KH, KW, OH, OW, n, co, oh, ow, ci, kh, kw;
  op_win2d g;
  int rc;
  char sa[96], sb[96];
  if ((rc = image_dims("conv2d", &x->m, &N, &C, &H, &W, e)) != FL_OK)
    return rc;
  if (w->m.ndim != 4)
    return err_set(e, FL_EINVAL, "conv2d: weight %s is not 4-d",
                   meta_shape_str(&w->m, sb, sizeof sb));
  op_win2d_of(op, a, w->m.shape[2], w->m.shape[3], &g);
  CO = w->m.shape[0]; KH = g.kh; KW = g.kw;
  if (g.groups < 1 || C % g.groups || CO % g.groups ||
      w->m.shape[1] != C / g.groups || g.sh < 1 || g.sw < 1 || g.dh < 1 ||
      g.dw < 1 || g.pt < 0 || g.pl < 0 || g.pb < 0 || g.pr < 0)
    return err_set(e, FL_EINVAL, "conv2d: input %s, weight %s, groups %lld: "
                   "expected weight [co, C/groups, kh, kw], stride and "
                   "dilation >= 1, padding >= 0",
                   meta_shape_str(&x->m, sa, sizeof sa),
                   meta_shape_str(&w->m, sb, sizeof sb), (long long)g.groups);
  CG = C / g.groups;               /* input channels per group */
  OG = CO / g.groups;              /* output channels per group */
  OH = (H + g.pt + g.pb - g.dh * (KH - 1) - 1) / g.sh + 1;
  OW = (W + g.pl + g.pr - g.dw * (KW - 1) - 1) / g.sw + 1;
  if (H + g.pt + g.pb < g.dh * (KH - 1) + 1 || W + g.pl + g.pr < g.dw * (KW - 1) + 1)
    return err_set(e, FL_EINVAL, "conv2d: kernel %lldx%lld larger than the "
                   "padded input", (long long)KH, (long long)KW);
  if ((rc = ref_check_numel("conv2d", out, N * CO * OH * OW, "output", e)))
    return rc;
  if (b && (rc = ref_check_numel("conv2d", b, CO, "bias", e)) != FL_OK)
    return rc;
  for (n = 0; n < N; n++)
    for (co = 0; co < CO; co++)
      for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++) {
          double acc = b ? ten_get(b, co) : 0.0;
          int64_t c0 = co / OG * CG;   /* the group's first input channel */
          for (ci = 0; ci < CG; ci++)
            for (kh = 0; kh < KH; kh++)
              for (kw = 0; kw < KW; kw++) {
                int64_t ih = oh * g.sh - g.pt + kh * g.dh;
                int64_t iw = ow * g.sw - g.pl + kw * g.dw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += ten_get(x, ((n * C + c0 + ci) * H + ih) * W + iw) *
                       ten_get(w, ((co * CG + ci) * KH + kh) * KW + kw);
              }
          ten_set(out, ((n * CO + co) * OH + oh) * OW + ow, acc);
        }
  return FL_OK;
}

/* A pooling window's geometry (op_win2d_of) and the plane count; the
** output size is the one shape inference gave the result. */
typedef struct pool_geom {
  int64_t planes;                 /* N * C images of H x W */
  int64_t H, W, OH, OW;           /* input and output sizes */
  op_win2d w;
} pool_geom;

static int pool_geometry(fl_op op, const fl_tensor *x, const op_attrs *a,
                         const fl_tensor *out, pool_geom *g, fl_err *e) {
  int64_t N = 0, C = 0;
  int rc;
  if ((rc = image_dims(op_name(op), &x->m, &N, &C, &g->H, &g->W, e)) != FL_OK)
    return rc;
  op_win2d_of(op, a, 0, 0, &g->w);
  if (g->w.kh < 1 || g->w.kw < 1 || g->w.sh < 1 || g->w.sw < 1 ||
      g->w.dh < 1 || g->w.dw < 1 || g->w.pt < 0 || g->w.pl < 0 ||
      g->w.pb < 0 || g->w.pr < 0 || out->m.ndim != x->m.ndim)
    return err_set(e, FL_EINVAL, "%s: expected kernel, stride and dilation >= "
                   "1 and padding >= 0", op_name(op));
  g->OH = out->m.shape[out->m.ndim - 2];
  g->OW = out->m.shape[out->m.ndim - 1];
  g->planes = N * C;
  return ref_check_numel(op_name(op), out, g->planes * g->OH * g->OW,
                         "output", e);
}

/* The max over the in-bounds elements of each dilated window (the padding
** is -inf, so it never wins; a window of padding only is -inf); NaN wins,
** as in PyTorch. */
/* The element window (oh, ow) of plane p picks, as PyTorch's kernel scans
** it: from the first element in the input, each later one that is larger
** or NaN (so the first largest, or the last NaN); its index into x, or -1
** when the window holds none.  *mx gets its value (-inf for none). */
static int64_t window_pick(const fl_tensor *x, const pool_geom *g, int64_t p, int64_t oh,
                           int64_t ow, double *mx) {
  int64_t kh, kw, pick = -1;
  *mx = -INFINITY;
  for (kh = 0; kh < g->w.kh; kh++)
    for (kw = 0; kw < g->w.kw; kw++) {
      int64_t ih = oh * g->w.sh - g->w.pt + kh * g->w.dh;
      int64_t iw = ow * g->w.sw - g->w.pl + kw * g->w.dw, at;
      double v;
      if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) continue;
      at = (p * g->H + ih) * g->W + iw;
      v = ten_get(x, at);
      if (pick < 0 || v > *mx || isnan(v)) { *mx = v; pick = at; }
    }
  return pick;
}

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
        if (!ints) window_pick(in[0], &g, p, oh, ow, &mx);
        for (kh = 0; kh < g.w.kh && ints; kh++)
          for (kw = 0; kw < g.w.kw; kw++) {
            int64_t ih = oh * g.w.sh - g.w.pt + kh * g.w.dh;
            int64_t iw = ow * g.w.sw - g.w.pl + kw * g.w.dw, at;
            if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
            at = (p * g.H + ih) * g.W + iw;
            if (ten_get_i64(in[0], at) > imx) imx = ten_get_i64(in[0], at);
          }
        if (ints) ten_set_i64(out, (p * g.OH + oh) * g.OW + ow, imx);
        else ten_set(out, (p * g.OH + oh) * g.OW + ow, mx);
      }
  return FL_OK;
}

/* max_pool2d_backward(g, x): each window's gradient onto the element the
** pool picked: the first in scan order that is larger than all before it,
** or the last NaN (PyTorch's `val > max || isnan(val)` from the window's
** first element). */
int ref_max_pool2d_backward(fl_op op, const fl_tensor *const *in, int nin,
                            const op_attrs *a, fl_tensor *out, fl_err *e) {
  pool_geom g;
  int64_t p, oh, ow, i, n = meta_numel(&out->m);
  double *acc;
  int rc;
  (void)nin;
  if ((rc = pool_geometry(OP_MAX_POOL2D, in[1], a, in[0], &g, e)) != FL_OK) return rc;
  if (!(acc = calloc((size_t)(n ? n : 1), sizeof *acc)))
    return err_set(e, FL_ENOMEM, "%s: out of memory", op_name(op));
  for (p = 0; p < g.planes; p++)
    for (oh = 0; oh < g.OH; oh++)
      for (ow = 0; ow < g.OW; ow++) {
        double mx;
        int64_t pick = window_pick(in[1], &g, p, oh, ow, &mx);
        if (pick >= 0) acc[pick] += ten_get(in[0], (p * g.OH + oh) * g.OW + ow);
      }
  for (i = 0; i < n; i++) ten_set(out, i, acc[i]);
  free(acc);
  return FL_OK;
}

/* The sum over the window's input elements divided by, with
** count_include_pad (PyTorch's default), the window's size clipped to the
** padded input (PyTorch's rule: a ceil_mode window past the end padding
** counts only up to it), else the number of input elements it covers. */
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
        int64_t h0 = oh * g.w.sh - g.w.pt, w0 = ow * g.w.sw - g.w.pl;
        int64_t h1 = h0 + g.w.kh, w1 = w0 + g.w.kw, inside = 0;
        double sum = 0.0, count;
        if (h1 > g.H + g.w.pb) h1 = g.H + g.w.pb;
        if (w1 > g.W + g.w.pr) w1 = g.W + g.w.pr;
        for (ih = h0; ih < h1; ih++)
          for (iw = w0; iw < w1; iw++)
            if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) {
              sum += ten_get(in[0], (p * g.H + ih) * g.W + iw);
              inside++;
            }
        count = (double)(g.w.count_include_pad ? (h1 - h0) * (w1 - w0) : inside);
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

/* --- rnn ---------------------------------------------------------------- */

/* ONNX's RNN, GRU and LSTM (ops.def's layout), one batch row and one step
** at a time, straight from the operator's equations: every gate's dot
** products summed in double, the clip on each activation's input.  Gates
** in ONNX's order (RNN i; GRU z r h; LSTM i o f c), peepholes i o f. */
typedef struct rnn_args {
  const fl_tensor *x, *w, *r, *b, *lens, *h0, *c0, *p;
  op_rnn c;
  int64_t T, B, I, H, G;
} rnn_args;

static double rnn_clip(const rnn_args *ra, double v) {
  if (!ra->c.clip_on || v != v) return v;
  return v < -ra->c.clip ? -ra->c.clip : v > ra->c.clip ? ra->c.clip : v;
}

/* gate k, unit j of direction d at step t for batch row bt: X_t W^T + Wb
** (wx) and hin R^T + Rb (rh), hin the row the recurrent product reads */
static void rnn_dots(const rnn_args *ra, int d, int64_t t, int64_t bt, int k, int64_t j,
                     const double *hin, double *wx, double *rh) {
  int64_t row = d * ra->G * ra->H + k * ra->H + j, i;
  double sx = 0, sh = 0;
  for (i = 0; i < ra->I; i++)
    sx += ten_get(ra->x, (t * ra->B + bt) * ra->I + i) * ten_get(ra->w, row * ra->I + i);
  for (i = 0; i < ra->H; i++) sh += hin[i] * ten_get(ra->r, row * ra->H + i);
  if (ra->b) {
    sx += ten_get(ra->b, d * 2 * ra->G * ra->H + k * ra->H + j);
    sh += ten_get(ra->b, d * 2 * ra->G * ra->H + (ra->G + k) * ra->H + j);
  }
  *wx = sx;
  *rh = sh;
}

static double rnn_act(const rnn_args *ra, int d, int which, double v) {
  return op_rnn_act(ra->c.act[d][which], v);
}

/* One step of one row: h, c (H each) in, hn, cn out; tmp holds 2 H. */
static void rnn_cell(const rnn_args *ra, int d, int64_t t, int64_t bt, const double *h,
                     const double *c, double *hn, double *cn, double *tmp) {
  int64_t j, H = ra->H;
  double wx, rh, wx2, rh2;
  if (ra->c.cell == OP_RNN_CELL_RNN) {
    for (j = 0; j < H; j++) {
      rnn_dots(ra, d, t, bt, 0, j, h, &wx, &rh);
      hn[j] = rnn_act(ra, d, 0, rnn_clip(ra, wx + rh));
    }
  } else if (ra->c.cell == OP_RNN_CELL_GRU) {
    double *z = tmp, *rr = tmp + H;
    for (j = 0; j < H; j++) {
      rnn_dots(ra, d, t, bt, 0, j, h, &wx, &rh);
      z[j] = rnn_act(ra, d, 0, rnn_clip(ra, wx + rh));
      rnn_dots(ra, d, t, bt, 1, j, h, &wx, &rh);
      rr[j] = rnn_act(ra, d, 0, rnn_clip(ra, wx + rh));
    }
    for (j = 0; j < H; j++) {
      double hh;
      if (ra->c.lbr) {                 /* r (h Rh^T + Rbh) */
        rnn_dots(ra, d, t, bt, 2, j, h, &wx, &rh);
        hh = rnn_act(ra, d, 1, rnn_clip(ra, wx + rr[j] * rh));
      } else {                         /* (r h) Rh^T + Rbh */
        double sh = 0;
        int64_t m, row = d * ra->G * H + 2 * H + j;
        rnn_dots(ra, d, t, bt, 2, j, h, &wx, &rh);
        for (m = 0; m < H; m++) sh += rr[m] * h[m] * ten_get(ra->r, row * H + m);
        if (ra->b) sh += ten_get(ra->b, d * 2 * ra->G * H + (ra->G + 2) * H + j);
        hh = rnn_act(ra, d, 1, rnn_clip(ra, wx + sh));
      }
      hn[j] = (1 - z[j]) * hh + z[j] * h[j];
    }
  } else {
    for (j = 0; j < H; j++) {
      double pi = 0, po = 0, pf = 0, gi, gf, gc, go;
      if (ra->p) {
        pi = ten_get(ra->p, d * 3 * H + j);
        po = ten_get(ra->p, d * 3 * H + H + j);
        pf = ten_get(ra->p, d * 3 * H + 2 * H + j);
      }
      rnn_dots(ra, d, t, bt, 0, j, h, &wx, &rh);
      gi = rnn_act(ra, d, 0, rnn_clip(ra, wx + rh + pi * c[j]));
      rnn_dots(ra, d, t, bt, 2, j, h, &wx, &rh);
      gf = rnn_act(ra, d, 0, rnn_clip(ra, wx + rh + pf * c[j]));
      rnn_dots(ra, d, t, bt, 3, j, h, &wx, &rh);
      gc = rnn_act(ra, d, 1, rnn_clip(ra, wx + rh));
      cn[j] = gf * c[j] + gi * gc;
      rnn_dots(ra, d, t, bt, 1, j, h, &wx2, &rh2);
      go = rnn_act(ra, d, 0, rnn_clip(ra, wx2 + rh2 + po * cn[j]));
      hn[j] = go * rnn_act(ra, d, 2, cn[j]);
    }
  }
}

int ref_rnn(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a, fl_tensor *out,
            fl_err *e) {
  rnn_args ra;
  int64_t S, D, t, step, bt, j, H;
  double *h, *c, *hn, *cn, *tmp;
  int d;
  memset(&ra, 0, sizeof ra);
  ra.x = in[0]; ra.w = in[1]; ra.r = in[2];
  ra.b = nin > 3 ? in[3] : NULL;
  ra.lens = nin > 4 ? in[4] : NULL;
  ra.h0 = nin > 5 ? in[5] : NULL;
  ra.c0 = nin > 6 ? in[6] : NULL;
  ra.p = nin > 7 ? in[7] : NULL;
  op_rnn_of(a, &ra.c);
  ra.T = ra.x->m.shape[0]; ra.B = ra.x->m.shape[1]; ra.I = ra.x->m.shape[2];
  ra.H = H = ra.r->m.shape[2]; ra.G = ra.c.gates;
  S = ra.c.states; D = ra.c.dirs;
  h = calloc((size_t)(6 * H + 1), sizeof *h);
  if (!h) return err_set(e, FL_ENOMEM, "%s: out of memory", op_name(op));
  c = h + H; hn = c + H; cn = hn + H; tmp = cn + H;
  for (d = 0; d < D; d++) {
    int rev = D == 2 ? d == 1 : ra.c.reverse;
    for (bt = 0; bt < ra.B; bt++) {
      double len = ra.lens ? ten_get(ra.lens, bt) : (double)ra.T;
      for (j = 0; j < H; j++) {
        h[j] = ra.h0 ? ten_get(ra.h0, (d * ra.B + bt) * H + j) : 0;
        c[j] = ra.c0 ? ten_get(ra.c0, (d * ra.B + bt) * H + j) : 0;
      }
      for (step = 0; step < ra.T; step++) {
        int64_t yat;
        t = rev ? ra.T - 1 - step : step;
        yat = ((S + t) * D + d) * ra.B + bt;
        if ((double)t >= len) {        /* past this row's length: Y 0, state kept */
          for (j = 0; j < H; j++) ten_set(out, yat * H + j, 0);
          continue;
        }
        rnn_cell(&ra, d, t, bt, h, c, hn, cn, tmp);
        memcpy(h, hn, (size_t)H * sizeof *h);
        if (ra.c.cell == OP_RNN_CELL_LSTM) memcpy(c, cn, (size_t)H * sizeof *c);
        for (j = 0; j < H; j++) ten_set(out, yat * H + j, h[j]);
      }
      for (j = 0; j < H; j++) {
        ten_set(out, (d * ra.B + bt) * H + j, h[j]);
        if (S == 2) ten_set(out, ((D + d) * ra.B + bt) * H + j, c[j]);
      }
    }
  }
  free(h);
  return FL_OK;
}
