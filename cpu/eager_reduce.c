/*
** eager_reduce.c -- reductions (sum mean amax amin var argmax), softmax and
** log_softmax, layer_norm and rms_norm, batch_norm.
** Invariant: every result equals the oracle's definition (graph/ref.c) up
** to float32 rounding of the inputs and outputs: sums and variances
** accumulate in double, NaN propagates through amax/amin/argmax/softmax
** exactly as there, and argmax reports the first maximum.  Float32 inputs
** are read in place as [outer, n, inner] blocks; anything else is first
** converted (float dtypes to float32, integers to double).
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eager_impl.h"

#define IC 256           /* columns per task in the column kernels */
#define PCHUNK 65536     /* elements per task when one long row is split */

/* --- one row: partial results that merge in order -------------------- */

typedef struct part {
  double s;              /* sum (sum/mean), sum of squared deviations (var) */
  float m;               /* extreme value (amax/amin/argmax) */
  int64_t at;            /* its index (argmax) */
} part;

/* max (or min) of x[0..n), NaN if any element is NaN. */
static float extreme(const float *x, int64_t n, int is_min) {
  float m = x[0];
  int nan = 0;
  int64_t i;
  if (is_min) {
    EAGER_PRAGMA(omp simd reduction(min:m) reduction(|:nan))
    for (i = 0; i < n; i++) { float v = x[i]; m = v < m ? v : m; nan |= v != v; }
  } else {
    EAGER_PRAGMA(omp simd reduction(max:m) reduction(|:nan))
    for (i = 0; i < n; i++) { float v = x[i]; m = v > m ? v : m; nan |= v != v; }
  }
  return nan ? NAN : m;
}

static part row_part(fl_op op, const float *x, int64_t n, int64_t base,
                     double mean) {
  part p = {0.0, 0.0f, base};
  double s = 0.0;
  int64_t i;
  switch (op) {
  case OP_VAR:
    EAGER_PRAGMA(omp simd reduction(+:s))
    for (i = 0; i < n; i++) { double d = x[i] - mean; s += d * d; }
    p.s = s;
    break;
  case OP_AMAX: case OP_AMIN:
    if (n > 0) p.m = extreme(x, n, op == OP_AMIN);
    break;
  case OP_ARGMAX:
    /* the first maximum; the first NaN beats everything */
    p.m = n > 0 ? x[0] : -INFINITY;
    for (i = 1; i < n && p.m == p.m; i++)
      if (x[i] > p.m || x[i] != x[i]) { p.m = x[i]; p.at = base + i; }
    break;
  case OP_SUM: case OP_MEAN:
    EAGER_PRAGMA(omp simd reduction(+:s))
    for (i = 0; i < n; i++) s += x[i];
    p.s = s;
    break;
  default:   /* a reduction without its case: NaN, which test_eager's
              ** comparison with the oracle fails loudly, never a sum */
    p.s = NAN;
    p.m = NAN;
    break;
  }
  return p;
}

/* acc := acc then b (b covers later elements). */
static void merge(fl_op op, part *acc, const part *b) {
  switch (op) {
  case OP_AMAX:
    if (acc->m == acc->m && (b->m != b->m || b->m > acc->m)) acc->m = b->m;
    break;
  case OP_AMIN:
    if (acc->m == acc->m && (b->m != b->m || b->m < acc->m)) acc->m = b->m;
    break;
  case OP_ARGMAX:
    if (acc->m == acc->m && (b->m != b->m || b->m > acc->m)) *acc = *b;
    break;
  default: acc->s += b->s; break;
  }
}

/* One row, split across threads when it is long and alone. */
static part row_split(fl_op op, const float *x, int64_t n, double mean,
                      int par) {
  int64_t ch = n / 256 + 1 > PCHUNK ? n / 256 + 1 : PCHUNK;
  int64_t nch = (n + ch - 1) / ch, c;
  part acc, parts[256];
  if (!par || nch < 2) return row_part(op, x, n, 0, mean);
  EAGER_PRAGMA(omp parallel for schedule(static))
  for (c = 0; c < nch; c++) {
    int64_t s = c * ch, len = n - s < ch ? n - s : ch;
    parts[c] = row_part(op, x + s, len, s, mean);
  }
  acc = parts[0];
  for (c = 1; c < nch; c++) merge(op, &acc, &parts[c]);
  return acc;
}

/* The reduction of one row of n floats, as ref_reduce defines it. */
static double reduce_row(fl_op op, const float *x, int64_t n, double corr,
                         int par) {
  part p;
  double mean;
  switch (op) {
  case OP_SUM: return row_split(op, x, n, 0, par).s;
  case OP_MEAN: return row_split(op, x, n, 0, par).s / (double)n;
  case OP_VAR:
    mean = row_split(OP_SUM, x, n, 0, par).s / (double)n;
    p = row_split(op, x, n, mean, par);
    return p.s / fmax(0.0, (double)n - corr);
  case OP_ARGMAX: return (double)row_split(op, x, n, 0, par).at;
  case OP_AMAX: case OP_AMIN: return row_split(op, x, n, 0, par).m;
  default: return NAN;                  /* no case: as row_part */
  }
}

/* Columns [i0, i0+len) of the block x[R][I]: res[i] for each. */
static void reduce_cols(fl_op op, const float *x, int64_t R, int64_t I,
                        int64_t len, double corr, double *res) {
  double s[IC], q[IC];
  float m[IC];
  int64_t at[IC], r, i;
  switch (op) {
  case OP_SUM: case OP_MEAN: case OP_VAR:
    for (i = 0; i < len; i++) s[i] = 0.0;
    for (r = 0; r < R; r++) {
      const float *row = x + r * I;
      EAGER_SIMD
      for (i = 0; i < len; i++) s[i] += row[i];
    }
    if (op == OP_SUM) { memcpy(res, s, (size_t)len * sizeof *s); return; }
    for (i = 0; i < len; i++) s[i] /= (double)R;
    if (op == OP_MEAN) { memcpy(res, s, (size_t)len * sizeof *s); return; }
    for (i = 0; i < len; i++) q[i] = 0.0;
    for (r = 0; r < R; r++) {
      const float *row = x + r * I;
      EAGER_SIMD
      for (i = 0; i < len; i++) { double d = row[i] - s[i]; q[i] += d * d; }
    }
    for (i = 0; i < len; i++) res[i] = q[i] / fmax(0.0, (double)R - corr);
    return;
  case OP_AMAX: case OP_AMIN: case OP_ARGMAX:   /* R >= 1 (the shape rule refuses 0) */
    for (i = 0; i < len; i++) { m[i] = x[i]; at[i] = 0; }
    for (r = 1; r < R; r++) {
      const float *row = x + r * I;
      for (i = 0; i < len; i++) {
        float v = row[i], c = m[i];
        int take = c == c && ((op == OP_AMIN ? v < c : v > c) || v != v);
        m[i] = take ? v : c;
        at[i] = take ? r : at[i];
      }
    }
    for (i = 0; i < len; i++) res[i] = op == OP_ARGMAX ? (double)at[i] : m[i];
    return;
  default:                               /* no case: as row_part */
    for (i = 0; i < len; i++) res[i] = NAN;
    return;
  }
}

/* Integer (and bool) inputs: rows of int64, exact; the sum wraps around
** (through uint64), as in PyTorch. */
static int64_t reduce_row_i64(fl_op op, const int64_t *x, int64_t n) {
  uint64_t sum = 0;
  int64_t i, best = 0, acc;
  if (op == OP_SUM) {
    for (i = 0; i < n; i++) sum += (uint64_t)x[i];
    return (int64_t)sum;
  }
  acc = x[0];
  for (i = 1; i < n; i++)
    if (op == OP_AMIN ? x[i] < acc : x[i] > acc) { acc = x[i]; best = i; }
  return op == OP_ARGMAX ? best : acc;
}

/* Split x's dims into kept and reduced.  When x is float32 and contiguous
** and the reduced dims (ignoring size-1 dims) are adjacent, x is read in
** place as [O, R, I]; otherwise a copy of x is made with the kept dims
** first, which is [K, R, 1]. */
int eager_reduce(fl_op op, const fl_tensor *const *in, int nin,
                 const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0];
  const fl_meta *m = &x->m;
  int red[FL_MAX_DIMS] = {0}, d, j, seen = 0, prev = 0, block = 1;
  int64_t O = 1, R = 1, I = 1, K = meta_numel(&out->m), t;
  double *res, corr = a->f[0];
  fl_tensor perm;
  void *buf = NULL;
  const float *xf;
  int rc = FL_OK, f64 = !dtype_is_float(m->dtype), np = 0;
  (void)nin;
  for (j = 0; j < a->ndims; j++) {
    if (m->ndim == 0) continue;
    if (a->dims[j] < 0 || a->dims[j] >= m->ndim)
      return err_set(e, FL_EINVAL, "%s: dim %lld out of range for a %d-d "
                     "tensor", op_name(op), (long long)a->dims[j], m->ndim);
    red[a->dims[j]] = 1;
  }
  for (d = 0; d < m->ndim; d++) {
    if (a->ndims == 0) red[d] = 1;
    if (red[d]) R *= m->shape[d];
    if (m->shape[d] == 1) continue;       /* size-1 dims never break a block */
    if (red[d]) {
      if (seen && !prev) block = 0;       /* a kept dim between reduced ones */
      seen = 1;
    } else if (seen) {
      I *= m->shape[d];
    } else {
      O *= m->shape[d];
    }
    prev = red[d];
  }
  if (!(res = eager_alloc((size_t)K * sizeof *res, op_name(op), e)))
    return FL_ENOMEM;
  if (!f64 && m->dtype == FL_F32 && ten_is_contiguous(x) && block) {
    xf = (const float *)ten_data(x);
  } else {
    /* the kept dims first, then the reduced: rows of R */
    perm = *x;
    for (d = 0; d < m->ndim; d++)
      if (!red[d]) { perm.m.shape[np] = m->shape[d]; perm.stride[np++] = x->stride[d]; }
    for (d = 0; d < m->ndim; d++)
      if (red[d]) { perm.m.shape[np] = m->shape[d]; perm.stride[np++] = x->stride[d]; }
    O = K; I = 1;
    /* a wrapped count would be a small buffer the gather overruns */
    buf = eager_alloc(sz_mul(K, R, &t) && sz_mul(t, f64 ? 8 : 4, &t) ?
                      (size_t)t : SIZE_MAX, op_name(op), e);
    if (!buf) { free(res); return FL_ENOMEM; }
    if (K * R > 0) eager_gather_all(&perm, buf, f64 ? EAGER_I64 : EAGER_F32);
    xf = buf;
  }
  if (f64) {
    int64_t *ires = (int64_t *)(void *)res;   /* same size as double */
    EAGER_PRAGMA(omp parallel for schedule(static) if (K * R > EAGER_PAR_MIN))
    for (t = 0; t < K; t++)
      ires[t] = reduce_row_i64(op, (const int64_t *)buf + t * R, R);
    for (t = 0; t < K; t++)
      dtype_store_i64(out->m.dtype, (char *)ten_data(out) +
                      t * (int64_t)dtype_size(out->m.dtype), ires[t]);
    free(res);
    free(buf);
    return rc;
  } else if (I == 1) {
    if (O == 1) {
      res[0] = reduce_row(op, xf, R, corr, R > 2 * EAGER_PAR_MIN);
    } else {
      EAGER_PRAGMA(omp parallel for schedule(static) if (O * R > EAGER_PAR_MIN))
      for (t = 0; t < O; t++) res[t] = reduce_row(op, xf + t * R, R, corr, 0);
    }
  } else {
    int64_t nic = (I + IC - 1) / IC;
    EAGER_PRAGMA(omp parallel for schedule(static) if (O * R * I > EAGER_PAR_MIN))
    for (t = 0; t < O * nic; t++) {
      int64_t o = t / nic, i0 = (t % nic) * IC;
      reduce_cols(op, xf + o * R * I + i0, R, I, I - i0 < IC ? I - i0 : IC,
                  corr, res + o * I + i0);
    }
  }
  eager_store_f64(out, 0, res, K);
  free(res);
  free(buf);
  return rc;
}

/* --- softmax, log_softmax -------------------------------------------- */

/* exp(x - max) / sum, or (x - max) - log(sum): the sum accumulates in
** double, and a NaN (or an all -inf row) makes the whole row NaN exactly
** as the oracle's formula does. */
EAGER_WIDE
static void softmax_row(const float *x, float *y, int64_t n, int logform) {
  float mx = extreme(x, n, 0);
  double s = 0.0;
  int64_t i;
  if (logform) {
    EAGER_PRAGMA(omp simd reduction(+:s))
    for (i = 0; i < n; i++) s += eager_expf(x[i] - mx);
    {
      float ls = (float)log(s);
      EAGER_SIMD
      for (i = 0; i < n; i++) y[i] = (x[i] - mx) - ls;
    }
  } else {
    EAGER_PRAGMA(omp simd reduction(+:s))
    for (i = 0; i < n; i++) { float v = eager_expf(x[i] - mx); y[i] = v; s += v; }
    {
      float inv = (float)(1.0 / s);
      EAGER_SIMD
      for (i = 0; i < n; i++) y[i] *= inv;
    }
  }
}

/* The same along a strided dim: columns [0, len) of blocks x[R][I]. */
EAGER_WIDE
static void softmax_cols(const float *x, float *y, int64_t R, int64_t I,
                         int64_t len, int logform) {
  float mx[IC];
  double s[IC];
  int64_t r, i;
  for (i = 0; i < len; i++) { mx[i] = -INFINITY; s[i] = 0.0; }
  for (r = 0; r < R; r++) {
    const float *xr = x + r * I;
    EAGER_SIMD
    for (i = 0; i < len; i++) {
      float v = xr[i], m = mx[i];
      mx[i] = (v > m || v != v) ? v : m;
    }
  }
  for (r = 0; r < R; r++) {
    const float *xr = x + r * I;
    float *yr = y + r * I;
    EAGER_SIMD
    for (i = 0; i < len; i++) {
      float v = eager_expf(xr[i] - mx[i]);
      yr[i] = v;
      s[i] += v;
    }
  }
  for (i = 0; i < len; i++) s[i] = logform ? log(s[i]) : 1.0 / s[i];
  for (r = 0; r < R; r++) {
    const float *xr = x + r * I;
    float *yr = y + r * I;
    if (logform) {
      EAGER_SIMD
      for (i = 0; i < len; i++) yr[i] = (xr[i] - mx[i]) - (float)s[i];
    } else {
      EAGER_SIMD
      for (i = 0; i < len; i++) yr[i] *= (float)s[i];
    }
  }
}

int eager_softmax(fl_op op, const fl_tensor *const *in, int nin,
                  const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0];
  int64_t dim = a->i[0], O = 1, R = 1, I = 1, t;
  int logform = op == OP_LOG_SOFTMAX, d;
  float *xo, *yo, *y;
  const float *xf;
  (void)nin;
  if (x->m.ndim > 0 && (dim < 0 || dim >= x->m.ndim))
    return err_set(e, FL_EINVAL, "%s: dim %lld out of range for a %d-d tensor",
                   op_name(op), (long long)dim, x->m.ndim);
  for (d = 0; d < x->m.ndim; d++) {
    if (d < dim) O *= x->m.shape[d];
    else if (d == dim) R = x->m.shape[d];
    else I *= x->m.shape[d];
  }
  if (!(xf = eager_f32(x, &xo, op_name(op), e))) return FL_ENOMEM;
  if (!(y = eager_out_f32(out, &yo, op_name(op), e))) { free(xo); return FL_ENOMEM; }
  if (I == 1) {
    EAGER_PRAGMA(omp parallel for schedule(static) if (O * R > EAGER_PAR_MIN))
    for (t = 0; t < O; t++) softmax_row(xf + t * R, y + t * R, R, logform);
  } else {
    int64_t nic = (I + IC - 1) / IC;
    EAGER_PRAGMA(omp parallel for schedule(static) if (O * R * I > EAGER_PAR_MIN))
    for (t = 0; t < O * nic; t++) {
      int64_t o = t / nic, i0 = (t % nic) * IC;
      softmax_cols(xf + o * R * I + i0, y + o * R * I + i0, R, I,
                   I - i0 < IC ? I - i0 : IC, logform);
    }
  }
  eager_out_done(out, yo);
  free(xo);
  return FL_OK;
}

/* --- layer_norm, rms_norm, batch_norm -------------------------------- */

/* One pass per row of N (the trailing normalized dims): statistics in
** double, then the affine transform in float32. */
int eager_norm(fl_op op, const fl_tensor *const *in, int nin,
               const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0];
  const fl_tensor *wt = nin > 1 ? in[1] : NULL;
  const fl_tensor *bt = (op == OP_LAYER_NORM && nin > 2) ? in[2] : NULL;
  int64_t nd = a->i[0], N = 1, rows, r;
  const float *xf, *w = NULL, *b = NULL;
  float *xo = NULL, *wo = NULL, *bo = NULL, *yo = NULL, *y;
  double eps = a->f[0];
  int d, rc = FL_ENOMEM;
  if (nd < 1 || nd > x->m.ndim)
    return err_set(e, FL_EINVAL, "%s: %lld normalized dims for a %d-d tensor",
                   op_name(op), (long long)nd, x->m.ndim);
  for (d = x->m.ndim - (int)nd; d < x->m.ndim; d++) N *= x->m.shape[d];
  if ((wt && meta_numel(&wt->m) != N) || (bt && meta_numel(&bt->m) != N))
    return err_set(e, FL_EINVAL, "%s: weight or bias does not have the %lld "
                   "elements of the normalized shape", op_name(op), (long long)N);
  rows = meta_numel(&x->m) / N;
  if (!(xf = eager_f32(x, &xo, op_name(op), e))) goto done;
  if (wt && !(w = eager_f32(wt, &wo, op_name(op), e))) goto done;
  if (bt && !(b = eager_f32(bt, &bo, op_name(op), e))) goto done;
  if (!(y = eager_out_f32(out, &yo, op_name(op), e))) goto done;
  EAGER_PRAGMA(omp parallel for schedule(static) if (rows * N > EAGER_PAR_MIN))
  for (r = 0; r < rows; r++) {
    const float *xr = xf + r * N;
    float *yr = y + r * N, mf = 0.0f, rf;
    double s = 0.0, q = 0.0;
    int64_t i;
    if (op == OP_LAYER_NORM) {
      double mean;
      EAGER_PRAGMA(omp simd reduction(+:s))
      for (i = 0; i < N; i++) s += xr[i];
      mean = s / (double)N;
      EAGER_PRAGMA(omp simd reduction(+:q))
      for (i = 0; i < N; i++) { double dv = xr[i] - mean; q += dv * dv; }
      mf = (float)mean;
      rf = (float)(1.0 / sqrt(q / (double)N + eps));
    } else {
      EAGER_PRAGMA(omp simd reduction(+:q))
      for (i = 0; i < N; i++) { double v = xr[i]; q += v * v; }
      rf = (float)(1.0 / sqrt(q / (double)N + eps));
    }
    EAGER_SIMD
    for (i = 0; i < N; i++) yr[i] = (xr[i] - mf) * rf;
    if (w) {
      EAGER_SIMD
      for (i = 0; i < N; i++) yr[i] *= w[i];
    }
    if (b) {
      EAGER_SIMD
      for (i = 0; i < N; i++) yr[i] += b[i];
    }
  }
  eager_out_done(out, yo);
  rc = FL_OK;
done:
  free(xo); free(wo); free(bo);
  return rc;
}

/* Inference batch norm over dim 1: per channel c,
** y = (x - mean[c]) * (w[c] / sqrt(var[c] + eps)) + b[c]. */
int eager_batch_norm(fl_op op, const fl_tensor *const *in, int nin,
                     const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0];
  int64_t N, C, inner = 1, p;
  const float *xf, *pv[4] = {NULL, NULL, NULL, NULL};
  float *xo = NULL, *po[4] = {NULL, NULL, NULL, NULL}, *yo = NULL, *y;
  float *scale = NULL;
  int d, k, rc = FL_ENOMEM;
  if (x->m.ndim < 2)
    return err_set(e, FL_EINVAL, "batch_norm: expected [N, C, ...], got %d-d",
                   x->m.ndim);
  N = x->m.shape[0];
  C = x->m.shape[1];
  for (d = 2; d < x->m.ndim; d++) inner *= x->m.shape[d];
  for (k = 0; k < 4; k++) {
    const fl_tensor *t = k + 1 < nin ? in[k + 1] : NULL;
    if (!t) continue;
    if (meta_numel(&t->m) != C) {
      rc = err_set(e, FL_EINVAL, "batch_norm: parameter %d has %lld elements, "
                   "expected %lld channels", k + 1,
                   (long long)meta_numel(&t->m), (long long)C);
      goto done;
    }
    if (!(pv[k] = eager_f32(t, &po[k], op_name(op), e))) goto done;
  }
  if (!pv[0] || !pv[1]) {
    rc = err_set(e, FL_EINVAL, "batch_norm: running mean and var are required");
    goto done;
  }
  if (!(scale = eager_alloc((size_t)C * sizeof *scale, op_name(op), e))) goto done;
  for (k = 0; k < C; k++)
    scale[k] = (float)((pv[2] ? pv[2][k] : 1.0) / sqrt(pv[1][k] + a->f[0]));
  if (!(xf = eager_f32(x, &xo, op_name(op), e))) goto done;
  if (!(y = eager_out_f32(out, &yo, op_name(op), e))) goto done;
  EAGER_PRAGMA(omp parallel for schedule(static) if (N * C * inner > EAGER_PAR_MIN))
  for (p = 0; p < N * C; p++) {
    int64_t c = p % C, i;
    const float *xr = xf + p * inner;
    float *yr = y + p * inner, mu = pv[0][c], sc = scale[c];
    float sh = pv[3] ? pv[3][c] : 0.0f;
    EAGER_SIMD
    for (i = 0; i < inner; i++) yr[i] = (xr[i] - mu) * sc + sh;
  }
  eager_out_done(out, yo);
  rc = FL_OK;
done:
  free(xo); free(scale);
  for (k = 0; k < 4; k++) free(po[k]);
  return rc;
}
