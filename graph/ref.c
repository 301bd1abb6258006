/*
** ref.c -- the reference interpreter: the oracle.
** Invariant: every kernel here walks the output in logical row-major order,
** reads each input element through ten_get (whatever its dtype or strides),
** computes and accumulates in double, and writes once through ten_set.  No
** kernel looks at strides, storage or layout, so a bug in a view, a stride
** or a fast path elsewhere cannot hide in the oracle too.  Clarity beats
** speed in every line.  The products (matmul, linear, conv2d), pooling and
** batch_norm live in ref_nn.c.
**
** Integers: an elementwise op over int64 operands (op_int_compute) reads
** them as int64 and computes in int64 arithmetic (the isc_* forms), and
** sum/amax/amin/argmax over int64 or bool do too, so every int64 result
** is exact; overflow wraps around (two's complement, computed in uint64
** where signed overflow would be undefined), as in PyTorch.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "ref_impl.h"

/* --- index arithmetic (shared with ref_nn.c) -------------------------- */

void ref_unravel(const fl_meta *m, int64_t i, int64_t *c) {
  int d;
  for (d = m->ndim - 1; d >= 0; d--) {
    int64_t n = m->shape[d];
    c[d] = n > 0 ? i % n : 0;
    i = n > 0 ? i / n : 0;
  }
}

int64_t ref_ravel(const fl_meta *m, const int64_t *c) {
  int64_t i = 0;
  int d;
  for (d = 0; d < m->ndim; d++) i = i * m->shape[d] + c[d];
  return i;
}

/* Row-major index in `in` of the element NumPy broadcasting sends to the
** output coordinates oc: dims align at the right, size-1 dims repeat. */
static int64_t bcast_index(const fl_meta *in, const fl_meta *out,
                           const int64_t *oc) {
  int lead = out->ndim - in->ndim, d;
  int64_t i = 0;
  for (d = 0; d < in->ndim; d++)
    i = i * in->shape[d] + (in->shape[d] == 1 ? 0 : oc[d + lead]);
  return i;
}

/* in broadcasts to out (checked again here: the oracle trusts no one). */
static int bcast_ok(const fl_meta *in, const fl_meta *out) {
  int lead = out->ndim - in->ndim, d;
  if (lead < 0) return 0;
  for (d = 0; d < in->ndim; d++)
    if (in->shape[d] != 1 && in->shape[d] != out->shape[d + lead]) return 0;
  return 1;
}

int64_t ref_prod(const fl_meta *m, int from, int to) {
  int64_t n = 1;
  int d;
  for (d = from; d < to; d++) n *= m->shape[d];
  return n;
}

/* Optional input k: NULL when absent or beyond nin. */
const fl_tensor *ref_opt(const fl_tensor *const *in, int nin, int k) {
  return k < nin ? in[k] : NULL;
}

int ref_check_numel(const char *op, const fl_tensor *t, int64_t want,
                    const char *what, fl_err *e) {
  char buf[96];
  if (meta_numel(&t->m) == want) return FL_OK;
  return err_set(e, FL_EINVAL, "%s: %s %s has %lld elements, expected %lld",
                 op, what, meta_shape_str(&t->m, buf, sizeof buf),
                 (long long)meta_numel(&t->m), (long long)want);
}

/* --- the entry point ---------------------------------------------------- */

#define MAX_IN 64   /* cat's max_args in ops.def */

int ref_apply(fl_op op, const fl_tensor *const *in, int nin,
              const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_meta *metas[MAX_IN];
  fl_meta om;
  int k, rc;
  memset(out, 0, sizeof *out);
  if (op < 0 || op >= OP_COUNT)
    return err_set(e, FL_EINVAL, "unknown op %d", (int)op);
  if (nin < 0 || nin > MAX_IN)
    return err_set(e, FL_EINVAL, "%s: expected %d to %d inputs, got %d",
                   op_name(op), op_table[op].min_args, op_table[op].max_args,
                   nin);
  for (k = 0; k < nin; k++) {
    metas[k] = in[k] ? &in[k]->m : NULL;
    if (in[k] && in[k]->m.device != FL_DEV_CPU)
      return err_set(e, FL_EUNSUPPORTED,
                     "%s: the reference interpreter reads CPU tensors only "
                     "(input %d is on cuda)", op_name(op), k + 1);
  }
  if ((rc = op_infer(op, metas, nin, a, &om, e)) != FL_OK) return rc;
  om.device = FL_DEV_CPU;
  om.wrapped = 0;
  if ((rc = ten_empty(out, &om, e)) != FL_OK) return rc;
  rc = op_table[op].ref(op, in, nin, a, out, e);
  if (rc != FL_OK) ten_release(out);
  return rc;
}

/* --- scalar references (PyTorch semantics, in double) ------------------- */

double sc_copy(const double *x, const op_attrs *a) { (void)a; return x[0]; }
double sc_abs(const double *x, const op_attrs *a) { (void)a; return fabs(x[0]); }
double sc_neg(const double *x, const op_attrs *a) { (void)a; return -x[0]; }
double sc_exp(const double *x, const op_attrs *a) { (void)a; return exp(x[0]); }
double sc_log(const double *x, const op_attrs *a) { (void)a; return log(x[0]); }
double sc_sqrt(const double *x, const op_attrs *a) { (void)a; return sqrt(x[0]); }
double sc_rsqrt(const double *x, const op_attrs *a) { (void)a; return 1.0 / sqrt(x[0]); }
double sc_sin(const double *x, const op_attrs *a) { (void)a; return sin(x[0]); }
double sc_cos(const double *x, const op_attrs *a) { (void)a; return cos(x[0]); }
double sc_asin(const double *x, const op_attrs *a) { (void)a; return asin(x[0]); }
double sc_acos(const double *x, const op_attrs *a) { (void)a; return acos(x[0]); }
double sc_atan(const double *x, const op_attrs *a) { (void)a; return atan(x[0]); }
double sc_tanh(const double *x, const op_attrs *a) { (void)a; return tanh(x[0]); }
double sc_erf(const double *x, const op_attrs *a) { (void)a; return erf(x[0]); }

double sc_sigmoid(const double *x, const op_attrs *a) {
  (void)a;
  return 1.0 / (1.0 + exp(-x[0]));
}

/* NaN < 0 is false, so NaN passes through, as in PyTorch. */
double sc_relu(const double *x, const op_attrs *a) {
  (void)a;
  return x[0] < 0.0 ? 0.0 : x[0];
}

/* The exact form: x * Phi(x), Phi the standard normal CDF. */
double sc_gelu(const double *x, const op_attrs *a) {
  (void)a;
  return 0.5 * x[0] * (1.0 + erf(x[0] * M_SQRT1_2));
}

/* approximate="tanh": sqrt(2/pi) = M_2_SQRTPI * M_SQRT1_2. */
double sc_gelu_tanh(const double *x, const op_attrs *a) {
  double v = x[0], k = M_2_SQRTPI * M_SQRT1_2;
  (void)a;
  return 0.5 * v * (1.0 + tanh(k * (v + 0.044715 * v * v * v)));
}

double sc_silu(const double *x, const op_attrs *a) {
  (void)a;
  return x[0] / (1.0 + exp(-x[0]));
}

/* min(max(x, lo), hi): with lo > hi every value becomes hi, as in PyTorch;
** NaN propagates (fmax/fmin would drop it). */
double sc_clamp(const double *x, const op_attrs *a) {
  double v = x[0];
  if (isnan(v)) return v;
  if (v < a->f[0]) v = a->f[0];
  if (v > a->f[1]) v = a->f[1];
  return v;
}

double sc_add(const double *x, const op_attrs *a) { (void)a; return x[0] + x[1]; }
double sc_sub(const double *x, const op_attrs *a) { (void)a; return x[0] - x[1]; }
double sc_mul(const double *x, const op_attrs *a) { (void)a; return x[0] * x[1]; }
double sc_div(const double *x, const op_attrs *a) { (void)a; return x[0] / x[1]; }
double sc_pow(const double *x, const op_attrs *a) { (void)a; return pow(x[0], x[1]); }
double sc_fmod(const double *x, const op_attrs *a) { (void)a; return fmod(x[0], x[1]); }
/* floored: fmod moved to the divisor's sign (PyTorch's float remainder) */
double sc_remainder(const double *x, const op_attrs *a) {
  double r = fmod(x[0], x[1]);
  (void)a;
  return (r != 0 && ((r < 0) != (x[1] < 0))) ? r + x[1] : r;
}

/* NaN from either side wins, as torch.maximum / torch.minimum. */
double sc_maximum(const double *x, const op_attrs *a) {
  (void)a;
  if (isnan(x[0])) return x[0];
  if (isnan(x[1])) return x[1];
  return x[0] > x[1] ? x[0] : x[1];
}

double sc_minimum(const double *x, const op_attrs *a) {
  (void)a;
  if (isnan(x[0])) return x[0];
  if (isnan(x[1])) return x[1];
  return x[0] < x[1] ? x[0] : x[1];
}

double sc_eq(const double *x, const op_attrs *a) { (void)a; return x[0] == x[1]; }
double sc_ne(const double *x, const op_attrs *a) { (void)a; return x[0] != x[1]; }
double sc_lt(const double *x, const op_attrs *a) { (void)a; return x[0] < x[1]; }
double sc_le(const double *x, const op_attrs *a) { (void)a; return x[0] <= x[1]; }
double sc_gt(const double *x, const op_attrs *a) { (void)a; return x[0] > x[1]; }
double sc_ge(const double *x, const op_attrs *a) { (void)a; return x[0] >= x[1]; }

double sc_where(const double *x, const op_attrs *a) {
  (void)a;
  return x[0] != 0.0 ? x[1] : x[2];
}

/* --- int64 forms: exact; +, -, * wrap through uint64 ------------------- */

int64_t isc_copy(const int64_t *x, const op_attrs *a) { (void)a; return x[0]; }
int64_t isc_abs(const int64_t *x, const op_attrs *a) {
  (void)a;
  return x[0] < 0 ? (int64_t)(0 - (uint64_t)x[0]) : x[0];   /* |INT64_MIN| wraps */
}
int64_t isc_neg(const int64_t *x, const op_attrs *a) {
  (void)a;
  return (int64_t)(0 - (uint64_t)x[0]);
}
int64_t isc_relu(const int64_t *x, const op_attrs *a) {
  (void)a;
  return x[0] < 0 ? 0 : x[0];
}

/* Real bounds become int64 ones: truncated, saturated, NaN or an infinite
** bound meaning none; lo > hi gives hi, as for floats. */
int64_t isc_clamp(const int64_t *x, const op_attrs *a) {
  double lo = a->f[0], hi = a->f[1];
  int64_t l, h, v = x[0];
  if (!(lo > -0x1p63)) l = INT64_MIN;
  else if (lo >= 0x1p63) l = INT64_MAX;
  else l = (int64_t)lo;
  if (!(hi < 0x1p63)) h = INT64_MAX;
  else if (hi <= -0x1p63) h = INT64_MIN;
  else h = (int64_t)hi;
  if (v < l) v = l;
  return v > h ? h : v;
}

int64_t isc_add(const int64_t *x, const op_attrs *a) {
  (void)a;
  return (int64_t)((uint64_t)x[0] + (uint64_t)x[1]);
}
int64_t isc_sub(const int64_t *x, const op_attrs *a) {
  (void)a;
  return (int64_t)((uint64_t)x[0] - (uint64_t)x[1]);
}
int64_t isc_mul(const int64_t *x, const op_attrs *a) {
  (void)a;
  return (int64_t)((uint64_t)x[0] * (uint64_t)x[1]);
}

/* Square and multiply, wrapping.  A negative exponent gives what PyTorch
** gives for an integer tensor exponent: 1 for base 1, +-1 for base -1,
** else 0 (a negative Lua number exponent is refused before this). */
int64_t isc_pow(const int64_t *x, const op_attrs *a) {
  int64_t b = x[0], e = x[1];
  uint64_t r = 1, m = (uint64_t)b;
  (void)a;
  if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;
  for (; e > 0; e >>= 1) {
    if (e & 1) r *= m;
    m *= m;
  }
  return (int64_t)r;
}

/* C's % truncates as fmod does; a divisor of 0 (and -1, whose INT64_MIN
** quotient overflows) gives 0, where C would trap */
int64_t isc_fmod(const int64_t *x, const op_attrs *a) {
  (void)a;
  return (x[1] == 0 || x[1] == -1) ? 0 : x[0] % x[1];
}

int64_t isc_remainder(const int64_t *x, const op_attrs *a) {
  int64_t r = isc_fmod(x, a);
  return (r != 0 && ((r < 0) != (x[1] < 0))) ? r + x[1] : r;
}

int64_t isc_maximum(const int64_t *x, const op_attrs *a) {
  (void)a;
  return x[0] > x[1] ? x[0] : x[1];
}
int64_t isc_minimum(const int64_t *x, const op_attrs *a) {
  (void)a;
  return x[0] < x[1] ? x[0] : x[1];
}
int64_t isc_eq(const int64_t *x, const op_attrs *a) { (void)a; return x[0] == x[1]; }
int64_t isc_ne(const int64_t *x, const op_attrs *a) { (void)a; return x[0] != x[1]; }
int64_t isc_lt(const int64_t *x, const op_attrs *a) { (void)a; return x[0] < x[1]; }
int64_t isc_le(const int64_t *x, const op_attrs *a) { (void)a; return x[0] <= x[1]; }
int64_t isc_gt(const int64_t *x, const op_attrs *a) { (void)a; return x[0] > x[1]; }
int64_t isc_ge(const int64_t *x, const op_attrs *a) { (void)a; return x[0] >= x[1]; }
int64_t isc_where(const int64_t *x, const op_attrs *a) {
  (void)a;
  return x[0] != 0 ? x[1] : x[2];
}

/* --- elementwise, any arity, NumPy broadcasting ------------------------- */

int ref_elementwise(fl_op op, const fl_tensor *const *in, int nin,
                    const op_attrs *a, fl_tensor *out, fl_err *e) {
  op_scalar_fn f = op_table[op].scalar;
  int64_t n = meta_numel(&out->m), i, oc[FL_MAX_DIMS], ix[3];
  fl_dtype dt[3];
  int exact;
  double x[3];
  int k;
  char sa[96], sb[96];
  if (!f || nin < 1 || nin > 3)
    return err_set(e, FL_EINVAL, "%s: not an elementwise op of 1 to 3 inputs",
                   op_name(op));
  for (k = 0; k < nin; k++)
    if (!in[k] || !bcast_ok(&in[k]->m, &out->m))
      return err_set(e, FL_EINVAL, "%s: input %d %s does not broadcast to %s",
                     op_name(op), k + 1,
                     in[k] ? meta_shape_str(&in[k]->m, sa, sizeof sa) : "(none)",
                     meta_shape_str(&out->m, sb, sizeof sb));
  for (k = 0; k < nin; k++) dt[k] = in[k]->m.dtype;
  exact = op_int_compute(op, dt, nin);
  /* a negative Lua number as an integer exponent is refused, as PyTorch
  ** refuses a negative scalar exponent; tensor exponents compute */
  if (exact && op == OP_POW && in[1]->m.wrapped && meta_numel(&in[1]->m) == 1 &&
      ten_get_i64(in[1], 0) < 0)
    return err_set(e, FL_EINVAL, "pow: integers to negative integer powers "
                   "are not allowed (exponent %lld)",
                   (long long)ten_get_i64(in[1], 0));
  for (i = 0; i < n; i++) {
    ref_unravel(&out->m, i, oc);
    if (exact) {
      for (k = 0; k < nin; k++)
        ix[k] = ten_get_i64(in[k], bcast_index(&in[k]->m, &out->m, oc));
      ten_set_i64(out, i, op_table[op].iscalar(ix, a));
      continue;
    }
    /* an int64 operand of a floating-point op is first converted to
    ** float32, the type PyTorch's promotion gives it, rounding once */
    for (k = 0; k < nin; k++)
      x[k] = in[k]->m.dtype == FL_I64
             ? (double)(float)ten_get_i64(in[k], bcast_index(&in[k]->m, &out->m, oc))
             : ten_get(in[k], bcast_index(&in[k]->m, &out->m, oc));
    ten_set(out, i, f(x, a));
  }
  return FL_OK;
}

/* --- reductions ----------------------------------------------------------- */

/* Which dims of m a reduction folds: attrs dims, or all when ndims is 0.
** Fills kept[]/red[] in order; returns FL_OK or an error naming the dim. */
static int split_dims(fl_op op, const fl_meta *m, const op_attrs *a,
                      int *kept, int *nk, int *red, int *nr, fl_err *e) {
  int is_red[FL_MAX_DIMS] = {0}, d, j;
  for (j = 0; j < a->ndims; j++) {
    int64_t dd = a->dims[j];
    if (m->ndim == 0 && dd == 0) continue;  /* a scalar reduces to itself */
    if (dd < 0 || dd >= m->ndim)
      return err_set(e, FL_EINVAL, "%s: dim %lld out of range for a %d-d "
                     "tensor", op_name(op), (long long)dd, m->ndim);
    is_red[dd] = 1;
  }
  *nk = *nr = 0;
  for (d = 0; d < m->ndim; d++) {
    if (a->ndims == 0 || is_red[d]) red[(*nr)++] = d;
    else kept[(*nk)++] = d;
  }
  return FL_OK;
}

/* Set the reduced coordinates of c to the r-th combination (row-major over
** the reduced dims) and return the row-major index of c in m.  When every
** dim is reduced, r is the flat index, which argmax with no dim reports. */
static int64_t reduce_at(const fl_meta *m, int64_t *c, const int *red, int nr,
                         int64_t r) {
  int j;
  for (j = nr - 1; j >= 0; j--) {
    int64_t n = m->shape[red[j]];
    c[red[j]] = r % n;
    r /= n;
  }
  return ref_ravel(m, c);
}

/* sum/amax/amin/argmax of one output element over integer input x, in
** int64: the sum wraps around, argmax reports the first maximum. */
static int64_t reduce_i64(fl_op op, const fl_tensor *x, int64_t *c,
                          const int *red, int nr, int64_t R) {
  uint64_t sum = 0;
  int64_t r, best = 0, acc, v;
  if (op == OP_SUM) {
    for (r = 0; r < R; r++)
      sum += (uint64_t)ten_get_i64(x, reduce_at(&x->m, c, red, nr, r));
    return (int64_t)sum;
  }
  acc = ten_get_i64(x, reduce_at(&x->m, c, red, nr, 0));
  for (r = 1; r < R; r++) {
    v = ten_get_i64(x, reduce_at(&x->m, c, red, nr, r));
    if (op == OP_AMIN ? v < acc : v > acc) { acc = v; best = r; }
  }
  return op == OP_ARGMAX ? best : acc;
}

int ref_reduce(fl_op op, const fl_tensor *const *in, int nin,
               const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0];
  const fl_meta *m = &x->m;
  int kept[FL_MAX_DIMS], red[FL_MAX_DIMS], nk = 0, nr = 0, j, rc, exact;
  int64_t K, R, o, r, c[FL_MAX_DIMS] = {0};
  char buf[96];
  (void)nin;
  if ((rc = split_dims(op, m, a, kept, &nk, red, &nr, e)) != FL_OK) return rc;
  for (K = 1, j = 0; j < nk; j++) K *= m->shape[kept[j]];
  for (R = 1, j = 0; j < nr; j++) R *= m->shape[red[j]];
  if ((rc = ref_check_numel(op_name(op), out, K, "output", e)) != FL_OK)
    return rc;
  if (R == 0 && K > 0 && (op == OP_AMAX || op == OP_AMIN || op == OP_ARGMAX))
    return err_set(e, FL_EINVAL, "%s: cannot reduce %s over a zero-size "
                   "dimension (no identity)", op_name(op),
                   meta_shape_str(m, buf, sizeof buf));
  exact = !dtype_is_float(m->dtype) &&
          (op == OP_SUM || op == OP_AMAX || op == OP_AMIN || op == OP_ARGMAX);
  for (o = 0; o < K; o++) {
    double acc = 0.0, v;
    int64_t t = o, best = 0;
    /* the kept coordinates: output order is row-major over kept dims */
    for (j = nk - 1; j >= 0; j--) {
      c[kept[j]] = t % m->shape[kept[j]];
      t /= m->shape[kept[j]];
    }
    if (exact) {
      ten_set_i64(out, o, reduce_i64(op, x, c, red, nr, R));
      continue;
    }
    switch (op) {
    case OP_SUM:
    case OP_MEAN:
      for (r = 0; r < R; r++) acc += ten_get(x, reduce_at(m, c, red, nr, r));
      if (op == OP_MEAN) acc /= (double)R;   /* R == 0: NaN, as PyTorch */
      break;
    case OP_AMAX:
    case OP_AMIN:
      /* NaN propagates: once seen it is the answer */
      acc = ten_get(x, reduce_at(m, c, red, nr, 0));
      for (r = 1; r < R && !isnan(acc); r++) {
        v = ten_get(x, reduce_at(m, c, red, nr, r));
        if (isnan(v) || (op == OP_AMAX ? v > acc : v < acc)) acc = v;
      }
      break;
    case OP_VAR: {
      /* two passes: the mean, then squared deviations (no cancellation) */
      double mean = 0.0, ss = 0.0;
      for (r = 0; r < R; r++) mean += ten_get(x, reduce_at(m, c, red, nr, r));
      mean /= (double)R;
      for (r = 0; r < R; r++) {
        v = ten_get(x, reduce_at(m, c, red, nr, r)) - mean;
        ss += v * v;
      }
      /* PyTorch divides by max(0, N - correction): 0/0 is NaN */
      acc = ss / fmax(0.0, (double)R - a->f[0]);
      break;
    }
    case OP_ARGMAX:
      /* the first maximum; NaN counts as larger than everything */
      acc = ten_get(x, reduce_at(m, c, red, nr, 0));
      for (r = 1; r < R && !isnan(acc); r++) {
        v = ten_get(x, reduce_at(m, c, red, nr, r));
        if (isnan(v) || v > acc) { acc = v; best = r; }
      }
      acc = (double)best;
      break;
    default:
      return err_set(e, FL_EINVAL, "%s: not a reduction", op_name(op));
    }
    ten_set(out, o, acc);
  }
  return FL_OK;
}

/* --- softmax family: rows along one dim ----------------------------------- */

/* View m as [outer, n, inner] around dim; a 0-d tensor is one row of one. */
static int rows_of(fl_op op, const fl_meta *m, int64_t dim, int64_t *outer,
                   int64_t *n, int64_t *inner, fl_err *e) {
  if (m->ndim == 0 && (dim == 0 || dim == -1)) {
    *outer = *n = *inner = 1;
    return FL_OK;
  }
  if (dim < 0 || dim >= m->ndim)
    return err_set(e, FL_EINVAL, "%s: dim %lld out of range for a %d-d tensor",
                   op_name(op), (long long)dim, m->ndim);
  *outer = ref_prod(m, 0, (int)dim);
  *n = m->shape[dim];
  *inner = ref_prod(m, (int)dim + 1, m->ndim);
  return FL_OK;
}

/* softmax(x)_k = exp(x_k - max) / sum_j exp(x_j - max): subtracting the
** max changes nothing mathematically and keeps exp from overflowing. */
static int softmax_rows(fl_op op, const fl_tensor *x, const op_attrs *a,
                        fl_tensor *out, int logform, fl_err *e) {
  int64_t outer = 0, n = 0, inner = 0, o, i, k;
  int rc = rows_of(op, &x->m, a->i[0], &outer, &n, &inner, e);
  if (rc != FL_OK) return rc;
  for (o = 0; o < outer; o++)
    for (i = 0; i < inner; i++) {
      int64_t base = o * n * inner + i;
      double mx = -INFINITY, sum = 0.0;
      for (k = 0; k < n; k++) {
        double v = ten_get(x, base + k * inner);
        if (v > mx || isnan(v)) mx = v;
      }
      for (k = 0; k < n; k++) sum += exp(ten_get(x, base + k * inner) - mx);
      for (k = 0; k < n; k++) {
        double d = ten_get(x, base + k * inner) - mx;
        ten_set(out, base + k * inner, logform ? d - log(sum) : exp(d) / sum);
      }
    }
  return FL_OK;
}

int ref_softmax(fl_op op, const fl_tensor *const *in, int nin,
                const op_attrs *a, fl_tensor *out, fl_err *e) {
  (void)nin;
  return softmax_rows(op, in[0], a, out, 0, e);
}

int ref_log_softmax(fl_op op, const fl_tensor *const *in, int nin,
                    const op_attrs *a, fl_tensor *out, fl_err *e) {
  (void)nin;
  return softmax_rows(op, in[0], a, out, 1, e);
}

/* --- normalizations over trailing dims ------------------------------------ */

/* The normalized block is the last a->i[0] dims: N elements each, rows
** consecutive in row-major order.  Weight and bias hold N elements. */
static int norm_block(fl_op op, const fl_tensor *x, const op_attrs *a,
                      const fl_tensor *w, const fl_tensor *b, int64_t *N,
                      fl_err *e) {
  int64_t nd = a->i[0];
  int rc;
  if (nd < 0 || nd > x->m.ndim)
    return err_set(e, FL_EINVAL, "%s: %lld normalized dims for a %d-d tensor",
                   op_name(op), (long long)nd, x->m.ndim);
  *N = ref_prod(&x->m, x->m.ndim - (int)nd, x->m.ndim);
  if (w && (rc = ref_check_numel(op_name(op), w, *N, "weight", e)) != FL_OK)
    return rc;
  if (b && (rc = ref_check_numel(op_name(op), b, *N, "bias", e)) != FL_OK)
    return rc;
  return FL_OK;
}

/* y = (x - mean) / sqrt(var + eps) * w + b, var the population variance. */
int ref_layer_norm(fl_op op, const fl_tensor *const *in, int nin,
                   const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0], *w = ref_opt(in, nin, 1), *b = ref_opt(in, nin, 2);
  int64_t N, rows, r, k;
  int rc = norm_block(op, x, a, w, b, &N, e);
  if (rc != FL_OK) return rc;
  rows = N > 0 ? meta_numel(&x->m) / N : 0;
  for (r = 0; r < rows; r++) {
    double mean = 0.0, var = 0.0, rstd;
    for (k = 0; k < N; k++) mean += ten_get(x, r * N + k);
    mean /= (double)N;
    for (k = 0; k < N; k++) {
      double d = ten_get(x, r * N + k) - mean;
      var += d * d;
    }
    var /= (double)N;
    rstd = 1.0 / sqrt(var + a->f[0]);
    for (k = 0; k < N; k++) {
      double y = (ten_get(x, r * N + k) - mean) * rstd;
      if (w) y *= ten_get(w, k);
      if (b) y += ten_get(b, k);
      ten_set(out, r * N + k, y);
    }
  }
  return FL_OK;
}

/* y = x * rsqrt(mean(x^2) + eps) * w */
int ref_rms_norm(fl_op op, const fl_tensor *const *in, int nin,
                 const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0], *w = ref_opt(in, nin, 1);
  int64_t N, rows, r, k;
  int rc = norm_block(op, x, a, w, NULL, &N, e);
  if (rc != FL_OK) return rc;
  rows = N > 0 ? meta_numel(&x->m) / N : 0;
  for (r = 0; r < rows; r++) {
    double ms = 0.0, rs;
    for (k = 0; k < N; k++) {
      double v = ten_get(x, r * N + k);
      ms += v * v;
    }
    rs = 1.0 / sqrt(ms / (double)N + a->f[0]);
    for (k = 0; k < N; k++) {
      double y = ten_get(x, r * N + k) * rs;
      if (w) y *= ten_get(w, k);
      ten_set(out, r * N + k, y);
    }
  }
  return FL_OK;
}

/* --- views and data movement (copies: the oracle has value semantics) ----- */

/* out[i] = src[j]: int64 values travel as int64, every bit kept. */
static void copy_elem(fl_tensor *out, int64_t i, const fl_tensor *src, int64_t j) {
  if (out->m.dtype == FL_I64 || src->m.dtype == FL_I64)
    ten_set_i64(out, i, ten_get_i64(src, j));
  else
    ten_set(out, i, ten_get(src, j));
}

/* reshape, view, unsqueeze, squeeze, contiguous: the row-major sequence of
** values is unchanged, only the shape around it. */
int ref_rowmajor(fl_op op, const fl_tensor *const *in, int nin,
                 const op_attrs *a, fl_tensor *out, fl_err *e) {
  int64_t n = meta_numel(&out->m), i;
  int rc;
  (void)nin; (void)a;
  if ((rc = ref_check_numel(op_name(op), in[0], n, "input", e)) != FL_OK)
    return rc;
  for (i = 0; i < n; i++) copy_elem(out, i, in[0], i);
  return FL_OK;
}

/* transpose, permute, expand, narrow, slice: each output coordinate names one
** input coordinate; compute it from the attributes and copy. */
int ref_gather_view(fl_op op, const fl_tensor *const *in, int nin,
                    const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_meta *im = &in[0]->m, *om = &out->m;
  int64_t n = meta_numel(om), i, oc[FL_MAX_DIMS], ic[FL_MAX_DIMS];
  int d, lead = om->ndim - im->ndim;
  char sa[96], sb[96];
  (void)nin;
  /* check the attributes against the input once, before any reads */
  switch (op) {
  case OP_TRANSPOSE:
    if (lead != 0 || (im->ndim > 0 && (a->i[0] < 0 || a->i[0] >= im->ndim ||
                                      a->i[1] < 0 || a->i[1] >= im->ndim)))
      return err_set(e, FL_EINVAL, "transpose: dims %lld, %lld out of range "
                     "for a %d-d tensor", (long long)a->i[0],
                     (long long)a->i[1], im->ndim);
    break;
  case OP_PERMUTE:
    if (lead != 0 || a->ndims != im->ndim)
      return err_set(e, FL_EINVAL, "permute: %d dims given for a %d-d tensor",
                     a->ndims, im->ndim);
    for (d = 0; d < a->ndims; d++)
      if (a->dims[d] < 0 || a->dims[d] >= im->ndim)
        return err_set(e, FL_EINVAL, "permute: dim %lld out of range",
                       (long long)a->dims[d]);
    break;
  case OP_EXPAND:
    if (!bcast_ok(im, om))
      return err_set(e, FL_EINVAL, "expand: %s cannot expand to %s",
                     meta_shape_str(im, sa, sizeof sa),
                     meta_shape_str(om, sb, sizeof sb));
    break;
  case OP_SLICE:
    if (lead != 0 || a->i[0] < 0 || a->i[0] >= im->ndim || a->i[1] < 0 || a->i[3] < 1 ||
        (om->shape[a->i[0]] > 0 &&
         a->i[1] + (om->shape[a->i[0]] - 1) * a->i[3] >= im->shape[a->i[0]]))
      return err_set(e, FL_EINVAL, "slice: %lld elements from %lld by step %lld outside "
                     "dim %lld of %s", (long long)om->shape[a->i[0]], (long long)a->i[1],
                     (long long)a->i[3], (long long)a->i[0], meta_shape_str(im, sa, sizeof sa));
    break;
  case OP_NARROW:
    if (lead != 0 || a->i[0] < 0 || a->i[0] >= im->ndim || a->i[1] < 0 ||
        a->i[1] + om->shape[a->i[0]] > im->shape[a->i[0]])
      return err_set(e, FL_EINVAL, "narrow: start %lld length %lld outside "
                     "dim %lld of %s", (long long)a->i[1], (long long)a->i[2],
                     (long long)a->i[0], meta_shape_str(im, sa, sizeof sa));
    break;
  default:
    return err_set(e, FL_EINVAL, "%s: not a gathering view", op_name(op));
  }
  for (i = 0; i < n; i++) {
    ref_unravel(om, i, oc);
    switch (op) {
    case OP_TRANSPOSE:
      memcpy(ic, oc, sizeof ic);
      if (im->ndim > 0) {
        ic[a->i[0]] = oc[a->i[1]];
        ic[a->i[1]] = oc[a->i[0]];
      }
      break;
    case OP_PERMUTE:   /* output dim d is input dim perm[d] */
      for (d = 0; d < im->ndim; d++) ic[a->dims[d]] = oc[d];
      break;
    case OP_EXPAND:
      copy_elem(out, i, in[0], bcast_index(im, om, oc));
      continue;
    case OP_SLICE:     /* input coordinate = start + step * output's */
      memcpy(ic, oc, sizeof ic);
      ic[a->i[0]] = a->i[1] + a->i[3] * oc[a->i[0]];
      break;
    default:           /* OP_NARROW */
      memcpy(ic, oc, sizeof ic);
      ic[a->i[0]] += a->i[1];
      break;
    }
    copy_elem(out, i, in[0], ref_ravel(im, ic));
  }
  return FL_OK;
}

/* Inputs laid one after another along dim.  A 1-d empty tensor is skipped
** where the others have more dims, as PyTorch's legacy rule allows. */
int ref_cat(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
            fl_tensor *out, fl_err *e) {
  const fl_meta *om = &out->m;
  int64_t dim = a->i[0], at = 0, i, n, c[FL_MAX_DIMS];
  int k, d;
  char sa[96], sb[96];
  (void)op;
  if (dim < 0 || dim >= om->ndim)
    return err_set(e, FL_EINVAL, "cat: dim %lld out of range for a %d-d "
                   "result", (long long)dim, om->ndim);
  for (k = 0; k < nin; k++) {
    const fl_meta *m;
    if (!in[k]) continue;
    m = &in[k]->m;
    if (m->ndim == 1 && m->shape[0] == 0 && om->ndim != 1) continue;
    for (d = 0; d < om->ndim; d++)
      if (m->ndim != om->ndim ||
          (d != dim && m->shape[d] != om->shape[d]) ||
          (d == dim && at + m->shape[d] > om->shape[d]))
        return err_set(e, FL_EINVAL, "cat: input %d %s does not fit result %s "
                       "along dim %lld", k + 1, meta_shape_str(m, sa, sizeof sa),
                       meta_shape_str(om, sb, sizeof sb), (long long)dim);
    n = meta_numel(m);
    for (i = 0; i < n; i++) {
      ref_unravel(m, i, c);
      c[dim] += at;
      copy_elem(out, ref_ravel(om, c), in[k], i);
    }
    at += m->shape[dim];
  }
  return FL_OK;
}

/* out[..., j] = weight[idx[...], j].  An index outside the table is the
** user's error, reported with the index and the table size. */
int ref_embedding(fl_op op, const fl_tensor *const *in, int nin,
                  const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *idx = in[0], *w = in[1];
  int64_t rows = meta_numel(&idx->m), V, D, r, j;
  int rc;
  (void)nin; (void)a;
  if (w->m.ndim != 2)
    return err_set(e, FL_EINVAL, "embedding: weight must be 2-d, got %d-d",
                   w->m.ndim);
  V = w->m.shape[0];
  D = w->m.shape[1];
  if ((rc = ref_check_numel(op_name(op), out, rows * D, "output", e)) != FL_OK)
    return rc;
  for (r = 0; r < rows; r++) {
    double v = ten_get(idx, r);
    if (!(v >= 0 && v < (double)V) || v != floor(v))
      return err_set(e, FL_EINVAL, "embedding: index %.17g out of range for "
                     "a table of %lld rows (valid 0..%lld)", v, (long long)V,
                     (long long)V - 1);
    for (j = 0; j < D; j++)
      copy_elem(out, r * D + j, w, (int64_t)v * D + j);
  }
  return FL_OK;
}

/* pad (ops.def's layout): per dim, j = the output coordinate minus the
** pad before (in the cropped input of m elements, which starts `crop`
** elements in); inside [0, m) it reads the input, else the constant, the
** edge element, or the mirror image without repeating the edge. */
int ref_pad(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
            fl_tensor *out, fl_err *e) {
  const fl_meta *im = &in[0]->m, *om = &out->m;
  int64_t n = meta_numel(om), i, oc[FL_MAX_DIMS], ic[FL_MAX_DIMS];
  int64_t crop[FL_MAX_DIMS], before[FL_MAX_DIMS], m[FL_MAX_DIMS];
  int d, rc, ints = im->dtype == FL_I64;
  (void)nin;
  if (a->ndims != im->ndim || om->ndim != im->ndim)
    return err_set(e, FL_EINVAL, "pad: %d pads per side for a %d-d tensor", a->ndims, im->ndim);
  for (d = 0; d < im->ndim; d++) {
    crop[d] = a->dims[d] < 0 ? -a->dims[d] : 0;
    before[d] = a->dims[d] > 0 ? a->dims[d] : 0;
    m[d] = im->shape[d] - crop[d] - (a->i[d] < 0 ? -a->i[d] : 0);
    if (m[d] < 0 || m[d] + before[d] + (a->i[d] > 0 ? a->i[d] : 0) != om->shape[d])
      return err_set(e, FL_EINVAL, "pad: the pads of dim %d do not give the result's size", d + 1);
  }
  if ((rc = ref_check_numel(op_name(op), out, n, "output", e)) != FL_OK) return rc;
  for (i = 0; i < n; i++) {
    int inside = 1;
    ref_unravel(om, i, oc);
    for (d = 0; d < im->ndim; d++) {
      int64_t j = oc[d] - before[d];
      if (j < 0 || j >= m[d]) {
        if (a->i[8] == 0) { inside = 0; break; }
        if (a->i[8] == 2) j = j < 0 ? 0 : m[d] - 1;         /* edge */
        else j = j < 0 ? -j : 2 * (m[d] - 1) - j;           /* reflect */
      }
      ic[d] = crop[d] + j;
    }
    if (inside) copy_elem(out, i, in[0], ref_ravel(im, ic));
    else if (ints) ten_set_i64(out, i, a->i[9]);
    else ten_set(out, i, a->f[0]);
  }
  return FL_OK;
}

/* flip: coordinate c of a flipped dim of size n reads n - 1 - c. */
int ref_flip(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
             fl_tensor *out, fl_err *e) {
  const fl_meta *im = &in[0]->m;
  int64_t n = meta_numel(im), i, c[FL_MAX_DIMS];
  int k, rc;
  (void)nin;
  if ((rc = ref_check_numel(op_name(op), out, n, "output", e)) != FL_OK) return rc;
  for (k = 0; k < a->ndims; k++)
    if (a->dims[k] < 0 || a->dims[k] >= im->ndim)
      return err_set(e, FL_EINVAL, "flip: dim %lld out of range", (long long)a->dims[k]);
  for (i = 0; i < n; i++) {
    ref_unravel(im, i, c);
    for (k = 0; k < a->ndims; k++) c[a->dims[k]] = im->shape[a->dims[k]] - 1 - c[a->dims[k]];
    copy_elem(out, i, in[0], ref_ravel(im, c));
  }
  return FL_OK;
}

/* gather (ONNX Gather): out[pre, j..., post] = x[pre, idx[j...], post]; a
** negative index counts from the end; one out of range is an error before
** anything is written. */
int ref_gather(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
               fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0], *idx = in[1];
  const fl_meta *xm = &x->m, *om = &out->m;
  int64_t dim = a->i[0], n = meta_numel(om), ni = meta_numel(&idx->m), i, size;
  int64_t oc[FL_MAX_DIMS], xc[FL_MAX_DIMS], jc[FL_MAX_DIMS];
  int d, rc, ind = idx->m.ndim;
  char sa[96];
  (void)nin;
  if (dim < 0 || dim >= xm->ndim || idx->m.dtype != FL_I64 || om->ndim != xm->ndim - 1 + ind)
    return err_set(e, FL_EINVAL, "gather: dim %lld of %s with %s indices", (long long)dim,
                   meta_shape_str(xm, sa, sizeof sa), dtype_name(idx->m.dtype));
  size = xm->shape[dim];
  for (i = 0; i < ni; i++) {
    int64_t v = ten_get_i64(idx, i);
    if (v < -size || v >= size)
      return err_set(e, FL_EINVAL, "gather: index %lld out of range for dim %lld of "
                     "size %lld (valid %lld..%lld)", (long long)v, (long long)dim + 1,
                     (long long)size, (long long)-size, (long long)size - 1);
  }
  if ((rc = ref_check_numel(op_name(op), out, n, "output", e)) != FL_OK) return rc;
  for (i = 0; i < n; i++) {
    int64_t v;
    ref_unravel(om, i, oc);
    for (d = 0; d < dim; d++) xc[d] = oc[d];
    for (d = 0; d < ind; d++) jc[d] = oc[dim + d];
    for (d = (int)dim + 1; d < xm->ndim; d++) xc[d] = oc[d - 1 + ind];
    v = ten_get_i64(idx, ref_ravel(&idx->m, jc));
    xc[dim] = v < 0 ? v + size : v;
    copy_elem(out, i, x, ref_ravel(xm, xc));
  }
  return FL_OK;
}

/* index_add: the rows of src summed into the rows idx names, in index
** order; an index outside -n..n-1 is an error. */
int ref_index_add(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                  fl_tensor *out, fl_err *e) {
  int64_t A = in[0]->m.shape[0], I = in[0]->m.shape[1], R = in[0]->m.shape[2], n = a->i[0];
  int64_t x, i, r, total = meta_numel(&out->m);
  double *acc;
  (void)nin;
  for (i = 0; i < I; i++) {
    int64_t v = ten_get_i64(in[1], i);
    if (v < -n || v >= n)
      return err_set(e, FL_EINVAL, "%s: index %lld out of range for %lld rows (valid %lld..%lld)",
                     op_name(op), (long long)v, (long long)n, (long long)-n, (long long)n - 1);
  }
  if (!(acc = calloc((size_t)(total ? total : 1), sizeof *acc)))
    return err_set(e, FL_ENOMEM, "%s: out of memory", op_name(op));
  for (x = 0; x < A; x++)
    for (i = 0; i < I; i++) {
      int64_t v = ten_get_i64(in[1], i);
      if (v < 0) v += n;
      for (r = 0; r < R; r++) acc[(x * n + v) * R + r] += ten_get(in[0], (x * I + i) * R + r);
    }
  for (i = 0; i < total; i++) ten_set(out, i, acc[i]);
  free(acc);
  return FL_OK;
}

int ref_int8_range(fl_op op, int64_t v, int is_unsigned, const char *what, fl_err *e) {
  int64_t lo = is_unsigned ? 0 : -128, hi = is_unsigned ? 255 : 127;
  if (v >= lo && v <= hi) return FL_OK;
  return err_set(e, FL_EINVAL, "%s: %s holds %lld, outside %s's range %lld..%lld", op_name(op), what,
                 (long long)v, is_unsigned ? "uint8" : "int8", (long long)lo, (long long)hi);
}

/* matmul_int8: every output element summed exactly in int64 (at most
** 255 * 255 * K per sum: no overflow below K = 2^47), after checking
** that each value lies in its 8-bit type's range. */
int ref_matmul_int8(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                    fl_tensor *out, fl_err *e) {
  static const char *const names[] = {"A", "B", "za", "zb"};
  const fl_meta *am = &in[0]->m, *bm = &in[1]->m;
  const fl_tensor *zat = ref_opt(in, nin, 2), *zbt = ref_opt(in, nin, 3);
  int64_t M = am->shape[am->ndim - 2], K = am->shape[am->ndim - 1], N = bm->shape[bm->ndim - 1];
  int64_t batches = M > 0 && N > 0 ? meta_numel(&out->m) / (M * N) : 0, bt, m, n, k;
  int j, rc;
  for (j = 0; j < nin; j++)
    for (k = 0; in[j] && k < meta_numel(&in[j]->m); k++)
      if ((rc = ref_int8_range(op, ten_get_i64(in[j], k), (int)a->i[j & 1], names[j], e)) != FL_OK) return rc;
  for (bt = 0; bt < batches; bt++)
    for (m = 0; m < M; m++)
      for (n = 0; n < N; n++) {
        int64_t za = 0, zb = 0, s = 0;
        if (zat) za = ten_get_i64(zat, meta_numel(&zat->m) == 1 ? 0 : m);
        if (zbt) zb = ten_get_i64(zbt, meta_numel(&zbt->m) == 1 ? 0 : n);
        for (k = 0; k < K; k++) {
          int64_t x = ten_get_i64(in[0], (bt * M + m) * K + k);
          int64_t y = ten_get_i64(in[1], ((bm->ndim > 2 ? bt : 0) * K + k) * N + n);
          s += (x - za) * (y - zb);
        }
        ten_set_i64(out, (bt * M + m) * N + n, s);
      }
  return FL_OK;
}

/* cumsum along i0: element k of a line is the sum of elements 0..k (i1:
** 0..k-1; i2: from the end), in double, or exactly in int64. */
int ref_cumsum(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
               fl_tensor *out, fl_err *e) {
  const fl_meta *im = &in[0]->m;
  int64_t n = meta_numel(im), i, c[FL_MAX_DIMS], dim = a->i[0], len, k;
  int rc, ints = out->m.dtype == FL_I64;
  (void)nin;
  if (im->ndim > 0 && (dim < 0 || dim >= im->ndim))
    return err_set(e, FL_EINVAL, "cumsum: dim %lld out of range", (long long)dim);
  if ((rc = ref_check_numel(op_name(op), out, n, "output", e)) != FL_OK) return rc;
  len = im->ndim ? im->shape[dim] : 1;
  for (i = 0; i < n; i++) {
    double s = 0;
    uint64_t is = 0;               /* wraps as PyTorch's int64 sums do */
    ref_unravel(im, i, c);
    {
      int64_t at = im->ndim ? c[dim] : 0;
      for (k = 0; k < len; k++) {
        int take = a->i[2] ? (a->i[1] ? k > at : k >= at) : (a->i[1] ? k < at : k <= at);
        if (!take) continue;
        if (im->ndim) c[dim] = k;
        if (ints) is += (uint64_t)ten_get_i64(in[0], ref_ravel(im, c));
        else s += ten_get(in[0], ref_ravel(im, c));
      }
    }
    if (ints) ten_set_i64(out, i, (int64_t)is);
    else ten_set(out, i, s);
  }
  return FL_OK;
}
