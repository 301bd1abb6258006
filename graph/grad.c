/*
** grad.c -- the derivative rules of the op table (grad.h).  Each states
** the vector-Jacobian product of one op with the ops of the table itself,
** so eager autograd runs it with the eager kernels and a compiled backward
** fuses it like any graph.  Formulas and tie rules are PyTorch's
** (derivatives.yaml and FunctionsManual): where they differ from the
** textbook it is said.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad.h"

#define B (c->b)

static int mul(const gr_ctx *c, int x, int y) { return gb_op2(B, OP_MUL, x, y); }
static int add(const gr_ctx *c, int x, int y) { return gb_op2(B, OP_ADD, x, y); }
static int sub(const gr_ctx *c, int x, int y) { return gb_op2(B, OP_SUB, x, y); }
static int dvd(const gr_ctx *c, int x, int y) { return gb_op2(B, OP_DIV, x, y); }
static int k(const gr_ctx *c, double v) { return gb_const(B, v); }
static int where(const gr_ctx *c, int cond, int x, int y) {
  return gb_op3(B, OP_WHERE, cond, x, y);
}
/* x cast to the float dtype of the gradient (masks are bool) */
static int as_g(const gr_ctx *c, int x) {
  return B->rc ? -1 : gb_cast(B, x, gb_meta(B, c->g)->dtype);
}

void gr_none(const gr_ctx *c, int *gin) {
  (void)gin;
  if (!B->rc)
    B->rc = err_set(B->e, FL_EINVAL, "%s has no derivative", op_name(c->op));
}

/* rnn runs ONNX's recurrent cells for inference: its result requires
** grad when an input does, so that asking for a gradient through it is
** this error rather than a silent zero (gr_none's results never require
** grad). */
void gr_rnn(const gr_ctx *c, int *gin) {
  (void)gin;
  if (!B->rc)
    B->rc = err_set(B->e, FL_EUNSUPPORTED, "%s has no derivative: recurrent cells (ONNX's "
                    "RNN, GRU, LSTM) run forward only", op_name(c->op));
}

/* --- elementwise, one input ------------------------------------------- */

void gr_to(const gr_ctx *c, int *gin) {
  gin[0] = gb_cast(B, c->g, c->in_meta[0].dtype);
}
/* sgn(x): 0 at 0 */
void gr_abs(const gr_ctx *c, int *gin) {
  int x = c->in[0];
  int s = sub(c, as_g(c, gb_op2(B, OP_GT, x, k(c, 0))), as_g(c, gb_op2(B, OP_LT, x, k(c, 0))));
  gin[0] = mul(c, c->g, s);
}
void gr_neg(const gr_ctx *c, int *gin) { gin[0] = gb_op1(B, OP_NEG, c->g); }
void gr_exp(const gr_ctx *c, int *gin) { gin[0] = mul(c, c->g, c->out); }
void gr_log(const gr_ctx *c, int *gin) { gin[0] = dvd(c, c->g, c->in[0]); }
void gr_sqrt(const gr_ctx *c, int *gin) { gin[0] = dvd(c, c->g, mul(c, c->out, k(c, 2))); }
/* d rsqrt = -1/2 y^3 */
void gr_rsqrt(const gr_ctx *c, int *gin) {
  int y = c->out;
  gin[0] = mul(c, c->g, mul(c, mul(c, mul(c, y, y), y), k(c, -0.5)));
}
void gr_sin(const gr_ctx *c, int *gin) { gin[0] = mul(c, c->g, gb_op1(B, OP_COS, c->in[0])); }
void gr_cos(const gr_ctx *c, int *gin) {
  gin[0] = gb_op1(B, OP_NEG, mul(c, c->g, gb_op1(B, OP_SIN, c->in[0])));
}
/* d asin = 1/sqrt(1 - x^2), d acos = its negation, d atan = 1/(1 + x^2):
** infinite at |x| = 1, as PyTorch's */
void gr_asin(const gr_ctx *c, int *gin) {
  int x = c->in[0];
  gin[0] = mul(c, c->g, gb_op1(B, OP_RSQRT, sub(c, k(c, 1), mul(c, x, x))));
}
void gr_acos(const gr_ctx *c, int *gin) {
  int x = c->in[0];
  gin[0] = gb_op1(B, OP_NEG, mul(c, c->g, gb_op1(B, OP_RSQRT, sub(c, k(c, 1), mul(c, x, x)))));
}
void gr_atan(const gr_ctx *c, int *gin) {
  int x = c->in[0];
  gin[0] = dvd(c, c->g, add(c, mul(c, x, x), k(c, 1)));
}
void gr_tanh(const gr_ctx *c, int *gin) {
  gin[0] = mul(c, c->g, sub(c, k(c, 1), mul(c, c->out, c->out)));
}
void gr_sigmoid(const gr_ctx *c, int *gin) {
  gin[0] = mul(c, c->g, mul(c, c->out, sub(c, k(c, 1), c->out)));
}
/* threshold_backward(grad, result, 0): zero where the result is <= 0, so
** a NaN (relu keeps it) passes its gradient, as in PyTorch; "> 0" would
** stop it */
void gr_relu(const gr_ctx *c, int *gin) {
  gin[0] = where(c, gb_op2(B, OP_LE, c->out, k(c, 0)), k(c, 0), c->g);
}
/* Phi(x) + x phi(x) */
void gr_gelu(const gr_ctx *c, int *gin) {
  int x = c->in[0];
  int cdf = mul(c, add(c, gb_op1(B, OP_ERF, mul(c, x, k(c, M_SQRT1_2))), k(c, 1)), k(c, 0.5));
  int pdf = mul(c, gb_op1(B, OP_EXP, mul(c, mul(c, x, x), k(c, -0.5))), k(c, 0.39894228040143267794));
  gin[0] = mul(c, c->g, add(c, cdf, mul(c, x, pdf)));
}
/* PyTorch's GeluBackward for approximate='tanh' */
void gr_gelu_tanh(const gr_ctx *c, int *gin) {
  const double beta = 0.79788456080286535588, kappa = 0.044715;
  int x = c->in[0];
  int x2 = mul(c, x, x);
  int inner = mul(c, add(c, x, mul(c, mul(c, x2, x), k(c, kappa))), k(c, beta));
  int t = gb_op1(B, OP_TANH, inner);
  int left = mul(c, add(c, t, k(c, 1)), k(c, 0.5));
  int right = mul(c, mul(c, mul(c, x, k(c, 0.5)), sub(c, k(c, 1), mul(c, t, t))),
                  mul(c, add(c, mul(c, x2, k(c, 3 * kappa)), k(c, 1)), k(c, beta)));
  gin[0] = mul(c, c->g, add(c, left, right));
}
/* s (1 + x (1 - s)) */
void gr_silu(const gr_ctx *c, int *gin) {
  int x = c->in[0], s = gb_op1(B, OP_SIGMOID, x);
  gin[0] = mul(c, c->g, mul(c, s, add(c, mul(c, x, sub(c, k(c, 1), s)), k(c, 1))));
}
void gr_erf(const gr_ctx *c, int *gin) {
  int x = c->in[0];
  gin[0] = mul(c, c->g, mul(c, gb_op1(B, OP_EXP, gb_op1(B, OP_NEG, mul(c, x, x))),
                            k(c, 1.12837916709551257390)));
}
/* the gradient passes where lo <= x <= hi (bounds included, NaN not) */
void gr_clamp(const gr_ctx *c, int *gin) {
  int x = c->in[0];
  int le = gb_op2(B, OP_LE, x, k(c, c->a->f[1]));
  int in = where(c, le, gb_op2(B, OP_GE, x, k(c, c->a->f[0])), le);
  gin[0] = where(c, in, c->g, k(c, 0));
}

/* --- elementwise over broadcast operands ------------------------------ */

void gr_add(const gr_ctx *c, int *gin) { gin[0] = gin[1] = c->g; }
void gr_sub(const gr_ctx *c, int *gin) {
  gin[0] = c->g;
  if (c->need[1]) gin[1] = gb_op1(B, OP_NEG, c->g);
}
void gr_mul(const gr_ctx *c, int *gin) {
  if (c->need[0]) gin[0] = mul(c, c->g, c->in[1]);
  if (c->need[1]) gin[1] = mul(c, c->g, c->in[0]);
}
/* d/dy (x / y) = -x / y^2 = -out / y */
void gr_div(const gr_ctx *c, int *gin) {
  if (c->need[0]) gin[0] = dvd(c, c->g, c->in[1]);
  if (c->need[1]) gin[1] = gb_op1(B, OP_NEG, mul(c, c->g, dvd(c, c->out, c->in[1])));
}
/* PyTorch: 0 for the base where the exponent is 0; 0 for the exponent
** where the base is 0 and the exponent >= 0 (not NaN from log 0). */
void gr_pow(const gr_ctx *c, int *gin) {
  int x = c->in[0], y = c->in[1];
  if (c->need[0]) {
    int d = mul(c, y, gb_op2(B, OP_POW, x, sub(c, y, k(c, 1))));
    gin[0] = where(c, gb_op2(B, OP_EQ, y, k(c, 0)), k(c, 0), mul(c, c->g, d));
  }
  if (c->need[1]) {
    int zero = gb_op2(B, OP_EQ, x, k(c, 0));
    zero = where(c, zero, gb_op2(B, OP_GE, y, k(c, 0)), zero);
    gin[1] = where(c, zero, k(c, 0), mul(c, c->g, mul(c, c->out, gb_op1(B, OP_LOG, x))));
  }
}
/* ties share the gradient evenly (PyTorch's max/min of two tensors) */
static void minmax(const gr_ctx *c, int *gin, fl_op lose0, fl_op lose1) {
  int x = c->in[0], y = c->in[1];
  int split = where(c, gb_op2(B, OP_EQ, x, y), mul(c, c->g, k(c, 0.5)), c->g);
  if (c->need[0]) gin[0] = where(c, gb_op2(B, lose0, x, y), k(c, 0), split);
  if (c->need[1]) gin[1] = where(c, gb_op2(B, lose1, x, y), k(c, 0), split);
}
void gr_maximum(const gr_ctx *c, int *gin) { minmax(c, gin, OP_LT, OP_GT); }
void gr_minimum(const gr_ctx *c, int *gin) { minmax(c, gin, OP_GT, OP_LT); }
/* fmod(x, y) = x - trunc(x/y) y, remainder the same with floor: the
** quotient is (x - out) / y without a trunc or floor op */
void gr_fmod(const gr_ctx *c, int *gin) {
  gin[0] = c->g;
  if (c->need[1])
    gin[1] = gb_op1(B, OP_NEG, mul(c, c->g, dvd(c, sub(c, c->in[0], c->out), c->in[1])));
}
void gr_where(const gr_ctx *c, int *gin) {
  int cond = c->in[0];
  if (c->need[1]) gin[1] = where(c, cond, c->g, k(c, 0));
  if (c->need[2]) gin[2] = where(c, cond, k(c, 0), c->g);
}

/* --- reductions ------------------------------------------------------- */

/* The reduced dims of a reduction over x (ndims 0: all) into red[]. */
static int reduced_dims(const gr_ctx *c, unsigned char *red) {
  int d, n = c->in_meta[0].ndim;
  memset(red, 0, FL_MAX_DIMS);
  if (c->a->ndims == 0) memset(red, 1, (size_t)n);
  for (d = 0; d < c->a->ndims; d++) red[c->a->dims[d]] = 1;
  return n;
}
/* An output-shaped value back at its kept-dims shape, then expanded to x's. */
static int unreduce(const gr_ctx *c, int v, int expand) {
  unsigned char red[FL_MAX_DIMS];
  int64_t shape[FL_MAX_DIMS];
  int d, n = reduced_dims(c, red);
  for (d = 0; d < n; d++) shape[d] = red[d] ? 1 : c->in_meta[0].shape[d];
  v = gb_reshape(B, v, n, shape);
  return expand ? gb_expand(B, v, n, c->in_meta[0].shape) : v;
}
static int64_t reduced_count(const gr_ctx *c) {
  unsigned char red[FL_MAX_DIMS];
  int64_t cnt = 1;
  int d, n = reduced_dims(c, red);
  for (d = 0; d < n; d++) if (red[d]) cnt *= c->in_meta[0].shape[d];
  return cnt;
}

void gr_sum(const gr_ctx *c, int *gin) { gin[0] = unreduce(c, c->g, 1); }
/* PyTorch's mean_backward: the expanded gradient divided by the count */
void gr_mean(const gr_ctx *c, int *gin) {
  gin[0] = dvd(c, unreduce(c, c->g, 1), k(c, (double)reduced_count(c)));
}
/* ties share the gradient evenly, as PyTorch's amax/amin */
void gr_amax(const gr_ctx *c, int *gin) {
  int hit = as_g(c, gb_op2(B, OP_EQ, c->in[0], unreduce(c, c->out, 0)));
  op_attrs a = *c->a;
  int cnt;
  a.keepdim = 1;
  cnt = gb_op(B, OP_SUM, &a, 1, &hit);
  gin[0] = mul(c, dvd(c, hit, cnt), unreduce(c, c->g, 0));
}
/* 2 (x - mean) / (N - correction) */
void gr_var(const gr_ctx *c, int *gin) {
  op_attrs a = *c->a;
  int x = c->in[0], mu;
  a.keepdim = 1;
  mu = gb_op(B, OP_MEAN, &a, 1, &x);
  /* PyTorch's order: (2 / dof) * grad on the reduced gradient, then one
  ** product over x */
  gin[0] = mul(c, mul(c, k(c, 2.0 / ((double)reduced_count(c) - c->a->f[0])), unreduce(c, c->g, 0)),
               sub(c, x, mu));
}

/* --- composites ------------------------------------------------------- */

void gr_softmax(const gr_ctx *c, int *gin) {
  int y = c->out, d = (int)c->a->i[0];
  gin[0] = mul(c, y, sub(c, c->g, gb_reduce_dim(B, OP_SUM, mul(c, c->g, y), d)));
}
void gr_log_softmax(const gr_ctx *c, int *gin) {
  int d = (int)c->a->i[0];
  gin[0] = sub(c, c->g, mul(c, gb_op1(B, OP_EXP, c->out), gb_reduce_dim(B, OP_SUM, c->g, d)));
}
/* xhat = (x - mu) rstd; dx = rstd (gw - mean(gw) - xhat mean(gw xhat)) */
void gr_layer_norm(const gr_ctx *c, int *gin) {
  int x = c->in[0], w = c->nin > 1 ? c->in[1] : -1;
  int from = c->in_meta[0].ndim - (int)c->a->i[0];
  int mu = gb_reduce_tail(B, OP_MEAN, x, from);
  int xc = sub(c, x, mu);
  int rstd = gb_op1(B, OP_RSQRT, add(c, gb_reduce_tail(B, OP_MEAN, mul(c, xc, xc), from),
                                     k(c, c->a->f[0])));
  int xhat = mul(c, xc, rstd);
  int gw = w >= 0 ? mul(c, c->g, w) : c->g;
  if (c->need[0]) {
    int m1 = gb_reduce_tail(B, OP_MEAN, gw, from);
    int m2 = gb_reduce_tail(B, OP_MEAN, mul(c, gw, xhat), from);
    gin[0] = mul(c, rstd, sub(c, sub(c, gw, m1), mul(c, xhat, m2)));
  }
  if (c->nin > 1 && c->need[1]) gin[1] = mul(c, c->g, xhat);
  if (c->nin > 2 && c->need[2]) gin[2] = c->g;
}
/* r = rsqrt(mean(x^2) + eps): dx = r (gw - x r^2 mean(gw x)) */
void gr_rms_norm(const gr_ctx *c, int *gin) {
  int x = c->in[0], w = c->nin > 1 ? c->in[1] : -1;
  int from = c->in_meta[0].ndim - (int)c->a->i[0];
  int r = gb_op1(B, OP_RSQRT, add(c, gb_reduce_tail(B, OP_MEAN, mul(c, x, x), from),
                                  k(c, c->a->f[0])));
  int gw = w >= 0 ? mul(c, c->g, w) : c->g;
  if (c->need[0]) {
    int m = gb_reduce_tail(B, OP_MEAN, mul(c, gw, x), from);
    gin[0] = mul(c, r, sub(c, gw, mul(c, mul(c, x, mul(c, r, r)), m)));
  }
  if (c->nin > 1 && c->need[1]) gin[1] = mul(c, c->g, mul(c, x, r));
}

/* Per-channel sum of an [N, C, ...] value: every dim but 1, to [C]. */
static int chan_sum(const gr_ctx *c, int v) {
  int dims[FL_MAX_DIMS], nd = 0, d;
  for (d = 0; d < c->in_meta[0].ndim; d++) if (d != 1) dims[nd++] = d;
  return gb_reduce(B, OP_SUM, v, dims, nd, 0);
}
/* With batch_stats (m and v are x's own mean and population variance):
** xc = x - m, s1 = sum g, s2 = sum g xc per channel, a = w r;
** dx = a g + xc (-a r^2 s2 / M) + (-a s1 / M), dw = r s2, db = s1: the
** gradient through m and v folded in, two reductions and six passes over
** x where differentiating m and v as ops of their own takes five and ten. */
static void batch_norm_stats(const gr_ctx *c, int *gin, const int *ch, int rc,
                             const int64_t *shape) {
  int n = c->in_meta[0].ndim;
  double cnt = 1;
  int d, xc, s1, s2, a;
  for (d = 0; d < n; d++) if (d != 1) cnt *= (double)c->in_meta[0].shape[d];
  xc = sub(c, c->in[0], ch[1]);
  s1 = chan_sum(c, c->g);
  s2 = chan_sum(c, mul(c, c->g, xc));
  a = ch[3] >= 0 ? mul(c, c->in[3], rc) : rc;
  if (c->need[0]) {
    int ka = gb_reshape(B, a, n, shape);
    int kb = gb_reshape(B, mul(c, mul(c, a, mul(c, rc, rc)), mul(c, s2, k(c, -1.0 / cnt))), n, shape);
    int kc = gb_reshape(B, mul(c, a, mul(c, s1, k(c, -1.0 / cnt))), n, shape);
    gin[0] = add(c, add(c, mul(c, c->g, ka), mul(c, xc, kb)), kc);
  }
  if (c->nin > 3 && c->need[3]) gin[3] = mul(c, s2, rc);
  if (c->nin > 4 && c->need[4]) gin[4] = s1;
}

/* y = (x - m) rsqrt(v + eps) w + b with m, v, w, b per channel: the
** gradients of all five, so batch norm with statistics computed from x
** by mean and var differentiates through them as any other ops. */
void gr_batch_norm(const gr_ctx *c, int *gin) {
  int n = c->in_meta[0].ndim, ch[5], kk;
  int64_t shape[FL_MAX_DIMS];
  int r, rc, xc = -1, gw;
  for (kk = 0; kk < n; kk++) shape[kk] = kk == 1 ? c->in_meta[0].shape[1] : 1;
  for (kk = 1; kk < 5; kk++)
    ch[kk] = kk < c->nin && c->in[kk] >= 0 ? gb_reshape(B, c->in[kk], n, shape) : -1;
  /* r per channel ([C] and [1, C, 1, ...]): the sums below are per channel
  ** too, so r multiplies their [C] results, not the whole tensor */
  rc = gb_op1(B, OP_RSQRT, add(c, c->in[2], k(c, c->a->f[0])));
  r = gb_reshape(B, rc, n, shape);
  if (c->a->i[0]) { batch_norm_stats(c, gin, ch, rc, shape); return; }
  gw = ch[3] >= 0 ? mul(c, c->g, ch[3]) : c->g;
  if (c->need[2] || (c->nin > 3 && c->need[3])) xc = sub(c, c->in[0], ch[1]);
  if (c->need[0]) gin[0] = mul(c, gw, r);
  if (c->need[1]) gin[1] = gb_op1(B, OP_NEG, mul(c, chan_sum(c, gw), rc));
  if (c->need[2])
    gin[2] = mul(c, chan_sum(c, mul(c, gw, xc)), mul(c, mul(c, mul(c, rc, rc), rc), k(c, -0.5)));
  if (c->nin > 3 && c->need[3]) gin[3] = mul(c, chan_sum(c, mul(c, c->g, xc)), rc);
  if (c->nin > 4 && c->need[4]) gin[4] = chan_sum(c, c->g);
}

/* --- products --------------------------------------------------------- */

static int mT(const gr_ctx *c, int x) {
  int n = gb_meta(B, x)->ndim;
  return gb_transpose(B, x, n - 2, n - 1);
}
/* 1-d operands are [1, k] on the left and [k, 1] on the right, as matmul
** treats them; the gradient is reshaped to the product of those. */
void gr_matmul(const gr_ctx *c, int *gin) {
  const fl_meta *ma = &c->in_meta[0], *mb = &c->in_meta[1];
  int a = c->in[0], b = c->in[1], g = c->g;
  if (ma->ndim == 1 && mb->ndim == 1) {      /* a dot product */
    if (c->need[0]) gin[0] = mul(c, g, b);
    if (c->need[1]) gin[1] = mul(c, g, a);
    return;
  }
  if (ma->ndim == 1) { int64_t s[2] = {1, ma->shape[0]}; a = gb_reshape(B, a, 2, s); }
  if (mb->ndim == 1) { int64_t s[2] = {mb->shape[0], 1}; b = gb_reshape(B, b, 2, s); }
  if (B->rc) return;
  {
    const fl_meta *ab[2];
    fl_meta m2;
    op_attrs a0;
    ab[0] = gb_meta(B, a);
    ab[1] = gb_meta(B, b);
    op_attrs_init(OP_MATMUL, &a0);
    if ((B->rc = op_infer(OP_MATMUL, ab, 2, &a0, &m2, B->e)) != FL_OK) return;
    g = gb_reshape(B, g, m2.ndim, m2.shape);
  }
  {
    /* copies, taken before the products: a new node may move the nodes
    ** (and the order C evaluates arguments in is not fixed) */
    fl_meta am = *gb_meta(B, a), bm = *gb_meta(B, b);
    if (c->need[0]) gin[0] = gb_sum_to(B, gb_op2(B, OP_MATMUL, g, mT(c, b)), &am);
    if (c->need[1]) gin[1] = gb_sum_to(B, gb_op2(B, OP_MATMUL, mT(c, a), g), &bm);
  }
  /* back to 1-d here: the caller's sum to [k] would take a [k, 1]
  ** gradient's k for a broadcast leading dim and sum it away */
  if (ma->ndim == 1 && gin[0] >= 0) gin[0] = gb_reshape(B, gin[0], 1, ma->shape);
  if (mb->ndim == 1 && gin[1] >= 0) gin[1] = gb_reshape(B, gin[1], 1, mb->shape);
}
/* linear(x, w, b) = x w^T + b: dw = g^T x over all batch rows at once */
void gr_linear(const gr_ctx *c, int *gin) {
  const fl_meta *mx = &c->in_meta[0], *mw = &c->in_meta[1];
  int64_t rows = 1, s[2];
  int d;
  if (c->need[0]) gin[0] = gb_op2(B, OP_MATMUL, c->g, c->in[1]);
  if (c->need[1]) {
    for (d = 0; d + 1 < mx->ndim; d++) rows *= mx->shape[d];
    s[0] = rows;
    s[1] = mw->shape[0];
    {
      int g2 = gb_reshape(B, c->g, 2, s);
      s[1] = mw->shape[1];
      gin[1] = gb_op2(B, OP_MATMUL, gb_transpose(B, g2, 0, 1), gb_reshape(B, c->in[0], 2, s));
    }
  }
  if (c->nin > 2 && c->need[2]) gin[2] = c->g;
}

/* --- convolution and pools -------------------------------------------- */

static int pad_dims(const gr_ctx *c, int x, const int64_t *before, const int64_t *after, int n) {
  op_attrs a;
  int d, any = 0;
  op_attrs_init(OP_PAD, &a);
  a.ndims = n;
  for (d = 0; d < n; d++) {
    a.dims[d] = before[d];
    a.i[d] = after[d];
    any |= before[d] || after[d];
  }
  return any ? gb_op(B, OP_PAD, &a, 1, &x) : x;   /* nothing to pad: no copy */
}
/* s - 1 zeros between the elements of dims 2 and 3 of [N, C, H, W] */
static int stuff(const gr_ctx *c, int x, int64_t sh, int64_t sw) {
  const fl_meta *m;
  int64_t s6[6], pb[6] = {0}, pe[6] = {0}, s4[4];
  if (B->rc || (sh == 1 && sw == 1)) return x;
  m = gb_meta(B, x);
  s6[0] = m->shape[0]; s6[1] = m->shape[1]; s6[2] = m->shape[2]; s6[3] = 1;
  s6[4] = m->shape[3]; s6[5] = 1;
  pe[3] = sh - 1;
  pe[5] = sw - 1;
  x = pad_dims(c, gb_reshape(B, x, 6, s6), pb, pe, 6);
  s4[0] = s6[0]; s4[1] = s6[1]; s4[2] = s6[2] * sh; s4[3] = s6[4] * sw;
  x = gb_reshape(B, x, 4, s4);
  {   /* the trailing zeros after the last element go */
    int64_t b4[4] = {0}, e4[4] = {0};
    e4[2] = -(sh - 1);
    e4[3] = -(sw - 1);
    return pad_dims(c, x, b4, e4, 4);
  }
}
/* The input gradient of a convolution of x (meta mx) by w [Co, C/g, kh,
** kw] under window wn: the transposed convolution of g, as a stride-1
** convolution of g with zeros stuffed between its elements, padded by
** the dilated kernel less the forward pads (the bottom and right also by
** what the forward's floor dropped; negative crops), by w flipped with
** its in and out channels swapped within each group. */
static int conv_input_grad(const gr_ctx *c, int g, int w, const fl_meta *mx, const op_win2d *wn) {
  const fl_meta *mw = gb_meta(B, w), *mg = gb_meta(B, g);
  int64_t G = wn->groups, Co = mw->shape[0], Cg = mw->shape[1], kh = mw->shape[2], kw = mw->shape[3];
  int64_t OH = mg->shape[2], OW = mg->shape[3], H = mx->shape[2], W = mx->shape[3];
  int64_t pb[4] = {0}, pe[4] = {0}, s5[5], s4[4];
  int perm[5] = {0, 2, 1, 3, 4}, wt, y;
  op_attrs a;
  g = stuff(c, g, wn->sh, wn->sw);
  pb[2] = wn->dh * (kh - 1) - wn->pt;
  pb[3] = wn->dw * (kw - 1) - wn->pl;
  pe[2] = H - ((OH - 1) * wn->sh + 1) - pb[2] + wn->dh * (kh - 1);
  pe[3] = W - ((OW - 1) * wn->sw + 1) - pb[3] + wn->dw * (kw - 1);
  /* the convolution pads (no copy of g); a negative pad crops first */
  op_attrs_init(OP_CONV2D, &a);
  a.i[2] = pb[2] > 0 ? pb[2] : 0;
  a.i[3] = pb[3] > 0 ? pb[3] : 0;
  a.i[4] = pe[2] > 0 ? pe[2] : 0;
  a.i[5] = pe[3] > 0 ? pe[3] : 0;
  pb[2] -= a.i[2]; pb[3] -= a.i[3]; pe[2] -= a.i[4]; pe[3] -= a.i[5];
  g = pad_dims(c, g, pb, pe, 4);
  s5[0] = G; s5[1] = Co / G; s5[2] = Cg; s5[3] = kh; s5[4] = kw;
  wt = gb_permute(B, gb_reshape(B, w, 5, s5), 5, perm);
  s4[0] = G * Cg; s4[1] = Co / G; s4[2] = kh; s4[3] = kw;
  wt = gb_reshape(B, wt, 4, s4);
  {
    op_attrs f;
    op_attrs_init(OP_FLIP, &f);
    f.ndims = 2;
    f.dims[0] = 2;
    f.dims[1] = 3;
    wt = gb_op(B, OP_FLIP, &f, 1, &wt);
  }
  a.i[0] = a.i[1] = 1;
  a.i[6] = wn->dh;
  a.i[7] = wn->dw;
  a.i[8] = G;
  {
    int in[2];
    in[0] = g;
    in[1] = wt;
    y = gb_op(B, OP_CONV2D, &a, 2, in);
  }
  return y;
}
/* dW[co, ci, a, b] = sum g[n, co, oh, ow] x[n, ci, oh sh + a dh, ...]:
** a convolution of x with g in which the batch is the channel (per
** group: input [C/g, g N, H, W], weight [Co, N, OH, OW]), at the forward's
** dilation as stride and stride as dilation; what lies past the kernel
** (the forward's floor) is cut. */
static int conv_weight_grad(const gr_ctx *c, int g, int x, const fl_meta *mw, const op_win2d *wn) {
  const fl_meta *mx = gb_meta(B, x);
  int64_t G = wn->groups, N = mx->shape[0], C = mx->shape[1], H = mx->shape[2], W = mx->shape[3];
  int64_t s5[5], s4[4], pb[4] = {0}, pe[4] = {0};
  int perm5[5] = {2, 1, 0, 3, 4}, perm4[4] = {1, 0, 2, 3}, xt, gt, y, in[2];
  op_attrs a;
  s5[0] = N; s5[1] = G; s5[2] = C / G; s5[3] = H; s5[4] = W;
  xt = gb_permute(B, gb_reshape(B, x, 5, s5), 5, perm5);      /* [C/g, g, N, H, W] */
  s4[0] = C / G; s4[1] = G * N; s4[2] = H; s4[3] = W;
  xt = gb_reshape(B, xt, 4, s4);
  gt = gb_permute(B, g, 4, perm4);                            /* [Co, N, OH, OW] */
  op_attrs_init(OP_CONV2D, &a);
  a.i[0] = wn->dh; a.i[1] = wn->dw;
  a.i[2] = wn->pt; a.i[3] = wn->pl; a.i[4] = wn->pb; a.i[5] = wn->pr;
  a.i[6] = wn->sh; a.i[7] = wn->sw;
  a.i[8] = G;
  in[0] = xt;
  in[1] = gt;
  y = gb_op(B, OP_CONV2D, &a, 2, in);                          /* [C/g, Co, kh', kw'] */
  y = gb_permute(B, y, 4, perm4);
  if (B->rc) return -1;
  pe[2] = mw->shape[2] - gb_meta(B, y)->shape[2];
  pe[3] = mw->shape[3] - gb_meta(B, y)->shape[3];
  return pad_dims(c, y, pb, pe, 4);
}
void gr_conv2d(const gr_ctx *c, int *gin) {
  op_win2d wn;
  op_win2d_of(OP_CONV2D, c->a, c->in_meta[1].shape[2], c->in_meta[1].shape[3], &wn);
  if (c->need[0]) gin[0] = conv_input_grad(c, c->g, c->in[1], &c->in_meta[0], &wn);
  if (c->need[1]) gin[1] = conv_weight_grad(c, c->g, c->in[0], &c->in_meta[1], &wn);
  if (c->nin > 2 && c->need[2]) {
    int dims[3] = {0, 2, 3};
    gin[2] = gb_reduce(B, OP_SUM, c->g, dims, 3, 0);
  }
}

/* A [1, 1, kh, kw] tensor of ones, C times: the depthwise weight of a
** window sum. */
static int ones_weight(const gr_ctx *c, int64_t C, int64_t kh, int64_t kw) {
  fl_tensor t = {0};
  fl_meta m;
  int id;
  memset(&m, 0, sizeof m);
  m.dtype = gb_meta(B, c->g)->dtype;
  m.ndim = 4;
  m.shape[0] = C; m.shape[1] = 1; m.shape[2] = kh; m.shape[3] = kw;
  if (B->rc) return -1;
  if (gb_meta(B, c->g)->device != FL_DEV_CPU) return gb_device_ones(B, c->g, m.dtype, 4, m.shape);
  if ((B->rc = ten_empty(&t, &m, B->e)) != FL_OK) return -1;
  ten_fill(&t, 1.0);
  id = gb_tensor(B, &t);
  ten_release(&t);
  return id;
}
/* Every window's divisor, whatever count_include_pad and ceil_mode make
** it, read off the pool itself: avg_pool(ones) / sum_pool(ones) = 1 /
** divisor (0 where a window holds no input element). */
void gr_avg_pool2d(const gr_ctx *c, int *gin) {
  const fl_meta *mx = &c->in_meta[0];
  op_win2d wn;
  fl_tensor t = {0};
  fl_meta m1 = *mx;
  int ones, w, avg, cnt, scale, in[2];
  op_attrs a;
  op_win2d_of(OP_AVG_POOL2D, c->a, 0, 0, &wn);
  m1.shape[0] = m1.shape[1] = 1;
  if (B->rc) return;
  if (mx->device != FL_DEV_CPU) {
    ones = gb_device_ones(B, c->g, m1.dtype, 4, m1.shape);
  } else {
    if ((B->rc = ten_empty(&t, &m1, B->e)) != FL_OK) return;
    ten_fill(&t, 1.0);
    ones = gb_tensor(B, &t);
    ten_release(&t);
  }
  avg = gb_op(B, OP_AVG_POOL2D, c->a, 1, &ones);
  w = ones_weight(c, 1, wn.kh, wn.kw);
  op_attrs_init(OP_CONV2D, &a);
  a.i[0] = wn.sh; a.i[1] = wn.sw;
  a.i[2] = wn.pt; a.i[3] = wn.pl; a.i[4] = wn.pb; a.i[5] = wn.pr;
  a.i[6] = a.i[7] = a.i[8] = 1;
  if (!B->rc && wn.ceil_mode) {      /* a ceil-mode window past the end */
    const fl_meta *ma = gb_meta(B, avg);
    a.i[4] += (ma->shape[2] - 1) * wn.sh + wn.kh - (mx->shape[2] + wn.pt + wn.pb) > 0
              ? (ma->shape[2] - 1) * wn.sh + wn.kh - (mx->shape[2] + wn.pt + wn.pb) : 0;
    a.i[5] += (ma->shape[3] - 1) * wn.sw + wn.kw - (mx->shape[3] + wn.pl + wn.pr) > 0
              ? (ma->shape[3] - 1) * wn.sw + wn.kw - (mx->shape[3] + wn.pl + wn.pr) : 0;
  }
  in[0] = ones;
  in[1] = w;
  cnt = gb_op(B, OP_CONV2D, &a, 2, in);
  scale = where(c, gb_op2(B, OP_GT, cnt, k(c, 0)), dvd(c, avg, cnt), k(c, 0));
  wn.groups = mx->shape[1];
  wn.dh = wn.dw = 1;
  gin[0] = conv_input_grad(c, mul(c, c->g, scale), ones_weight(c, mx->shape[1], wn.kh, wn.kw),
                           mx, &wn);
}
/* Each window's gradient goes to the element the pool picked (its first
** largest, its last NaN when the max is NaN), as PyTorch's
** max_pool2d_with_indices records it: one op of the table does it. */
void gr_max_pool2d(const gr_ctx *c, int *gin) {
  int in[2];
  in[0] = c->g;
  in[1] = c->in[0];
  gin[0] = gb_op(B, OP_MAX_POOL2D_BACKWARD, c->a, 2, in);
}

/* --- views and data movement ------------------------------------------ */

/* reshape, view, squeeze, unsqueeze, contiguous: back to x's shape */
void gr_reshape(const gr_ctx *c, int *gin) {
  gin[0] = gb_reshape(B, c->g, c->in_meta[0].ndim, c->in_meta[0].shape);
}
void gr_transpose(const gr_ctx *c, int *gin) {
  gin[0] = gb_transpose(B, c->g, (int)c->a->i[0], (int)c->a->i[1]);
}
void gr_permute(const gr_ctx *c, int *gin) {
  int inv[FL_MAX_DIMS], d;
  for (d = 0; d < c->a->ndims; d++) inv[c->a->dims[d]] = d;
  gin[0] = gb_permute(B, c->g, c->a->ndims, inv);
}
/* expand: the caller's sum down to x's shape is the whole rule */
void gr_expand(const gr_ctx *c, int *gin) { gin[0] = c->g; }
/* narrow and slice: zeros around (and, with a step, between) */
void gr_slice(const gr_ctx *c, int *gin) {
  const fl_meta *mx = &c->in_meta[0];
  int n = mx->ndim, dim = (int)c->a->i[0], g = c->g;
  int64_t start = c->a->i[1], len = c->a->i[2], step = c->op == OP_SLICE ? c->a->i[3] : 1;
  int64_t pb[FL_MAX_DIMS] = {0}, pe[FL_MAX_DIMS] = {0}, taken;
  if (step > 1 && len > 0) {       /* [.., len, 1, ..] padded to step, merged */
    int64_t s[FL_MAX_DIMS + 1];
    int d;
    for (d = 0; d < n; d++) s[d < dim + 1 ? d : d + 1] = gb_meta(B, g)->shape[d];
    s[dim + 1] = 1;
    {
      int64_t b1[FL_MAX_DIMS + 1] = {0}, e1[FL_MAX_DIMS + 1] = {0};
      e1[dim + 1] = step - 1;
      g = pad_dims(c, gb_reshape(B, g, n + 1, s), b1, e1, n + 1);
    }
    s[dim] = len * step;
    for (d = dim + 1; d < n; d++) s[d] = s[d + 1];
    g = gb_reshape(B, g, n, s);
    taken = len * step;
  } else {
    taken = len;
  }
  pb[dim] = start;
  pe[dim] = mx->shape[dim] - start - taken;   /* negative: the stuffed tail cut */
  gin[0] = pad_dims(c, g, pb, pe, n);
}
static int narrow_dim(const gr_ctx *c, int x, int dim, int64_t start, int64_t len) {
  op_attrs a;
  op_attrs_init(OP_NARROW, &a);
  a.i[0] = dim; a.i[1] = start; a.i[2] = len;
  return gb_op(B, OP_NARROW, &a, 1, &x);
}
/* x placed along dim with before and after zeros around it */
static int pad_dim(const gr_ctx *c, int x, int dim, int64_t before, int64_t after) {
  int64_t pb[FL_MAX_DIMS] = {0}, pe[FL_MAX_DIMS] = {0};
  if (B->rc) return -1;
  pb[dim] = before;
  pe[dim] = after;
  return pad_dims(c, x, pb, pe, gb_meta(B, x)->ndim);
}
/* The gradient of a padding strip of len elements folded back onto the m
** elements it copied (the strip before the data when !after): reflect
** copies source k to the k-th element outward (the edge itself is not
** repeated), so the strip, flipped, lands on sources 1..len (m-1-len..m-2
** after); edge copies the first (last) element into all of it, so it sums
** there. */
static int fold_strip(const gr_ctx *c, int strip, int dim, int64_t len, int64_t m,
                      int reflect, int after) {
  if (reflect) {
    op_attrs a;
    op_attrs_init(OP_FLIP, &a);
    a.ndims = 1;
    a.dims[0] = dim;
    strip = gb_op(B, OP_FLIP, &a, 1, &strip);
    return after ? pad_dim(c, strip, dim, m - 1 - len, 1) : pad_dim(c, strip, dim, 1, m - 1 - len);
  }
  strip = gb_reduce_dim(B, OP_SUM, strip, dim);
  return after ? pad_dim(c, strip, dim, m - 1, 0) : pad_dim(c, strip, dim, 0, m - 1);
}
/* The forward crops (negative pads) first, then pads.  Constant padding:
** the padded region cut away, the cropped one padded back with zeros.
** Reflect and edge pad each dim independently of the others (corners are
** copies of copies), so their gradient folds each padded dim's strips
** back onto the elements they copied, dim after dim, then pads the crop
** back. */
void gr_pad(const gr_ctx *c, int *gin) {
  int64_t pb[FL_MAX_DIMS], pe[FL_MAX_DIMS];
  int d, n = c->a->ndims, mode = (int)c->a->i[8], g = c->g;
  if (mode == 0) {
    for (d = 0; d < n; d++) { pb[d] = -c->a->dims[d]; pe[d] = -c->a->i[d]; }
    gin[0] = pad_dims(c, g, pb, pe, n);
    return;
  }
  for (d = 0; d < n && !B->rc; d++) {
    int64_t b = c->a->dims[d] > 0 ? c->a->dims[d] : 0, e = c->a->i[d] > 0 ? c->a->i[d] : 0;
    int64_t m = gb_meta(B, g)->shape[d] - b - e;       /* the cropped size */
    int core;
    pb[d] = c->a->dims[d] < 0 ? -c->a->dims[d] : 0;
    pe[d] = c->a->i[d] < 0 ? -c->a->i[d] : 0;
    if (!b && !e) continue;
    core = narrow_dim(c, g, d, b, m);
    if (b) core = add(c, core, fold_strip(c, narrow_dim(c, g, d, 0, b), d, b, m, mode == 1, 0));
    if (e) core = add(c, core, fold_strip(c, narrow_dim(c, g, d, b + m, e), d, e, m, mode == 1, 1));
    g = core;
  }
  gin[0] = pad_dims(c, g, pb, pe, n);
}
void gr_flip(const gr_ctx *c, int *gin) { gin[0] = gb_op(B, OP_FLIP, c->a, 1, &c->g); }
void gr_cat(const gr_ctx *c, int *gin) {
  int dim = (int)c->a->i[0], kk;
  int64_t off = 0;
  for (kk = 0; kk < c->nin; kk++) {
    int64_t len = c->in_meta[kk].shape[dim];
    if (c->need[kk]) {
      op_attrs a;
      op_attrs_init(OP_NARROW, &a);
      a.i[0] = dim; a.i[1] = off; a.i[2] = len;
      gin[kk] = gb_op(B, OP_NARROW, &a, 1, &c->g);
    }
    off += len;
  }
}
/* rows of g ([A, I, R]) summed into the n rows idx names: repeated
** indices accumulate (one op, index_add, not a one-hot product) */
static int rows_added(const gr_ctx *c, int g3, int idx, int64_t n) {
  op_attrs a;
  int64_t s1[1];
  int in[2];
  if (B->rc) return -1;
  s1[0] = meta_numel(gb_meta(B, idx));
  in[0] = g3;
  in[1] = gb_reshape(B, idx, 1, s1);
  op_attrs_init(OP_INDEX_ADD, &a);
  a.i[0] = n;
  return gb_op(B, OP_INDEX_ADD, &a, 2, in);
}
void gr_embedding(const gr_ctx *c, int *gin) {
  const fl_meta *mw = &c->in_meta[1];
  int64_t s3[3], s2[2];
  s3[0] = 1;
  s3[1] = meta_numel(&c->in_meta[0]);
  s3[2] = mw->shape[1];
  s2[0] = mw->shape[0];
  s2[1] = mw->shape[1];
  gin[1] = gb_reshape(B, rows_added(c, gb_reshape(B, c->g, 3, s3), c->in[0], mw->shape[0]), 2, s2);
}
/* out = x.shape[:dim] ++ idx.shape ++ x.shape[dim+1:]: as [A, I, R], the
** gradient is its rows added into [A, n, R] */
void gr_gather(const gr_ctx *c, int *gin) {
  const fl_meta *mx = &c->in_meta[0];
  int dim = (int)c->a->i[0], d;
  int64_t A = 1, R = 1, s3[3];
  for (d = 0; d < dim; d++) A *= mx->shape[d];
  for (d = dim + 1; d < mx->ndim; d++) R *= mx->shape[d];
  s3[0] = A;
  s3[1] = meta_numel(&c->in_meta[1]);
  s3[2] = R;
  gin[0] = gb_reshape(B, rows_added(c, gb_reshape(B, c->g, 3, s3), c->in[1], mx->shape[dim]),
                      mx->ndim, mx->shape);
}
/* the sum of the gradients at and after each element: the same scan reversed */
void gr_cumsum(const gr_ctx *c, int *gin) {
  op_attrs a = *c->a;
  a.i[2] = !a.i[2];
  gin[0] = gb_op(B, OP_CUMSUM, &a, 1, &c->g);
}
/* the mask the forward drew, already scaled by 1/(1-p) */
void gr_dropout(const gr_ctx *c, int *gin) { gin[0] = mul(c, c->g, c->extra); }

int gr_apply(const gr_ctx *c, int *gin, const char *who) {
  gbuild *b = c->b;
  size_t n = strlen(who);
  int k;
  int wide = b->wide;
  /* a float64 op's rule works in double: its constants too */
  b->wide = c->out_meta->dtype == FL_F64;
  for (k = 0; k < c->nin; k++) {
    gin[k] = -1;
    if (c->in_meta[k].ndim >= 0 && c->in_meta[k].dtype == FL_F64) b->wide = 1;
  }
  op_info_of(c->op)->grad(c, gin);
  for (k = 0; k < c->nin && !b->rc; k++)
    if (c->need[k] && gin[k] >= 0)
      gin[k] = gb_cast(b, gb_sum_to(b, gin[k], &c->in_meta[k]), c->in_meta[k].dtype);
    else
      gin[k] = -1;
  b->wide = wide;
  if (b->rc && b->e->msg[0] && strncmp(b->e->msg, who, n) != 0) {
    char msg[FL_ERR_MSG];
    snprintf(msg, sizeof msg, "%s", b->e->msg);
    err_set(b->e, b->rc, "%s of %s: %s", who, op_name(c->op), msg);
  }
  return b->rc;
}
