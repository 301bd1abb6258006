/*
** shape.c -- the shape and dtype rule of every op in ops.def.
** Invariant: a rule either fills *out with exactly what PyTorch would
** produce for the same inputs (shape, dtype; device of the first real
** tensor; never wrapped) or returns an error naming the op, the shapes
** involved as [a,b] and what was expected -- it never trusts its inputs,
** so a bad dim or shape from any caller is an error, not a crash.
*/
#include <stdio.h>
#include <string.h>

#include "op.h"

/* shape text for messages; each use needs its own buffer */
#define SH(m, buf) meta_shape_str((m), (buf), sizeof(buf))

typedef char shbuf[160];

/* "[a,b,c]" for a raw list of dims (a requested shape or permutation) */
static char *dims_str(const int64_t *d, int n, char *buf, size_t len) {
  fl_meta m;
  int k;
  memset(&m, 0, sizeof m);
  m.ndim = n < 0 ? 0 : n > FL_MAX_DIMS ? FL_MAX_DIMS : n;
  for (k = 0; k < m.ndim; k++) m.shape[k] = d[k];
  return meta_shape_str(&m, buf, len);
}

/* Checks every present input is sane metadata and that the tensors live on
** one device.  0-dim inputs may sit on the CPU beside CUDA tensors, as in
** PyTorch (a Lua number is such a scalar). */
static int check_inputs(fl_op op, const fl_meta *const *in, int nin,
                        fl_err *e) {
  const fl_meta *first = NULL;
  int k;
  for (k = 0; k < nin; k++) {
    const fl_meta *m = in[k];
    if (!m) continue;
    if (m->ndim < 0 || m->ndim > FL_MAX_DIMS || m->dtype < 0 ||
        m->dtype >= FL_NDTYPES)
      return err_set(e, FL_EINVAL, "%s: input %d has invalid metadata",
                     op_name(op), k + 1);
    if (m->ndim == 0) continue;
    if (!first) first = m;
    else if (m->device != first->device)
      return err_set(e, FL_EINVAL, "%s: expected all tensors on the same "
                     "device, got %s and %s", op_name(op),
                     first->device == FL_DEV_CPU ? "cpu" : "cuda",
                     m->device == FL_DEV_CPU ? "cpu" : "cuda");
  }
  return FL_OK;
}

/* out gets dtype dt and the device of the first input that has dims (so
** `2 + x` lands where x is); among 0-dim inputs alone, a device's wins
** over the host's, as in PyTorch (1 / loss stays where the loss is). */
static void init_out(fl_meta *out, const fl_meta *const *in, int nin,
                     fl_dtype dt) {
  int k;
  memset(out, 0, sizeof *out);
  out->dtype = dt;
  out->device = in[0]->device;
  for (k = 0; k < nin; k++)
    if (in[k] && in[k]->ndim > 0) { out->device = in[k]->device; return; }
  for (k = 0; k < nin; k++)
    if (in[k] && in[k]->device != FL_DEV_CPU) { out->device = in[k]->device; return; }
}

static void copy_shape(fl_meta *out, const fl_meta *x) {
  out->ndim = x->ndim;
  memcpy(out->shape, x->shape, sizeof out->shape);
}

/* d must name a dim of x; a 0-dim tensor accepts dim 0 as PyTorch accepts
** 0 and -1 for it. */
static int check_dim(fl_op op, const fl_meta *x, int64_t d, fl_err *e) {
  shbuf s;
  int64_t hi = x->ndim ? x->ndim : 1;
  if (d < 0 || d >= hi)
    return err_set(e, FL_EINVAL, "%s: dim %lld out of range for %d-D input %s",
                   op_name(op), (long long)d, x->ndim, SH(x, s));
  return FL_OK;
}

static int need_float(fl_op op, const fl_meta *x, const char *what,
                      fl_err *e) {
  shbuf s;
  if (dtype_is_float(x->dtype)) return FL_OK;
  return err_set(e, FL_EINVAL, "%s: expected a floating-point %s, got %s %s",
                 op_name(op), what, dtype_name(x->dtype), SH(x, s));
}

static int same_dtype(fl_op op, const fl_meta *a, const char *an,
                      const fl_meta *b, const char *bn, fl_err *e) {
  if (a->dtype == b->dtype) return FL_OK;
  return err_set(e, FL_EINVAL, "%s: expected %s and %s of the same dtype, got "
                 "%s and %s", op_name(op), an, bn, dtype_name(a->dtype),
                 dtype_name(b->dtype));
}

/* p must be a 1-D [n] (a per-channel or per-feature parameter) */
static int check_vec(fl_op op, const fl_meta *p, const char *what, int64_t n,
                     const char *why, const fl_meta *x, fl_err *e) {
  shbuf s, sx;
  if (p->ndim == 1 && p->shape[0] == n) return FL_OK;
  return err_set(e, FL_EINVAL, "%s: %s has shape %s, expected [%lld] (%s %s)",
                 op_name(op), what, SH(p, s), (long long)n, why, SH(x, sx));
}

/* --- broadcasting ------------------------------------------------------- */

static int broadcast(const fl_meta *a, const fl_meta *b, fl_meta *out) {
  int n = a->ndim > b->ndim ? a->ndim : b->ndim, d;
  int64_t sh[FL_MAX_DIMS];
  for (d = 0; d < n; d++) {
    int da = d - (n - a->ndim), db = d - (n - b->ndim);
    int64_t x = da >= 0 ? a->shape[da] : 1, y = db >= 0 ? b->shape[db] : 1;
    if (x == y || y == 1) sh[d] = x;
    else if (x == 1) sh[d] = y;   /* 1 vs 0 gives 0, as NumPy does */
    else return -1;
  }
  out->ndim = n;
  memcpy(out->shape, sh, (size_t)n * sizeof sh[0]);
  return 0;
}

int op_broadcast_shapes(const char *opname, const fl_meta *a,
                        const fl_meta *b, fl_meta *out, fl_err *e) {
  shbuf sa, sb;
  int n = a->ndim > b->ndim ? a->ndim : b->ndim, d;
  if (broadcast(a, b, out) == 0) return FL_OK;
  for (d = 0; d < n; d++) {
    int da = d - (n - a->ndim), db = d - (n - b->ndim);
    int64_t x = da >= 0 ? a->shape[da] : 1, y = db >= 0 ? b->shape[db] : 1;
    if (x != y && x != 1 && y != 1)
      /* a negative dim reads the same 0- or 1-based: -1 is the last */
      return err_set(e, FL_EINVAL, "%s: shapes %s and %s cannot be broadcast "
                     "(size %lld vs %lld at dim %d)", opname, SH(a, sa),
                     SH(b, sb), (long long)x, (long long)y, d - n);
  }
  return err_set(e, FL_EINVAL, "%s: shapes %s and %s cannot be broadcast",
                 opname, SH(a, sa), SH(b, sb));
}

/* --- elementwise -------------------------------------------------------- */

int infer_cast(fl_op op, const fl_meta *const *in, int nin, const op_attrs *a,
               fl_meta *out, fl_err *e) {
  int rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  if (a->dtype < 0 || a->dtype >= FL_NDTYPES)
    return err_set(e, FL_EINVAL, "%s: unknown dtype %d", op_name(op),
                   (int)a->dtype);
  init_out(out, in, nin, a->dtype);
  copy_shape(out, in[0]);
  return FL_OK;
}

int infer_unary(fl_op op, const fl_meta *const *in, int nin, const op_attrs *a,
                fl_meta *out, fl_err *e) {
  shbuf s;
  int rc = check_inputs(op, in, nin, e);
  (void)a;
  if (rc) return rc;
  if (op == OP_NEG && in[0]->dtype == FL_BOOL)
    return err_set(e, FL_EINVAL, "neg: negation of a bool tensor %s is not "
                   "supported", SH(in[0], s));
  init_out(out, in, nin, in[0]->dtype);
  copy_shape(out, in[0]);
  return FL_OK;
}

/* exp, log, sigmoid...: integers and bools compute in the default float */
int infer_unary_float(fl_op op, const fl_meta *const *in, int nin,
                      const op_attrs *a, fl_meta *out, fl_err *e) {
  int rc = check_inputs(op, in, nin, e);
  (void)a;
  if (rc) return rc;
  init_out(out, in, nin, dtype_is_float(in[0]->dtype) ? in[0]->dtype : FL_F32);
  copy_shape(out, in[0]);
  return FL_OK;
}

static fl_dtype promote_metas(const fl_meta *x, const fl_meta *y) {
  return dtype_promote(x->dtype, x->ndim == 0, x->wrapped, y->dtype,
                       y->ndim == 0, y->wrapped);
}

/* the shared part of every two-input elementwise rule */
static int binary_common(fl_op op, const fl_meta *const *in, int nin,
                         fl_dtype dt, fl_meta *out, fl_err *e) {
  int rc = check_inputs(op, in, nin, e);
  fl_meta shape;
  if (rc) return rc;
  if (!in[1])
    return err_set(e, FL_EINVAL, "%s: second input is missing", op_name(op));
  memset(&shape, 0, sizeof shape);
  if ((rc = op_broadcast_shapes(op_name(op), in[0], in[1], &shape, e)))
    return rc;
  init_out(out, in, nin, dt);
  copy_shape(out, &shape);
  return FL_OK;
}

int infer_binary(fl_op op, const fl_meta *const *in, int nin,
                 const op_attrs *a, fl_meta *out, fl_err *e) {
  (void)a;
  if (nin < 2 || !in[1])
    return err_set(e, FL_EINVAL, "%s: second input is missing", op_name(op));
  if (op == OP_SUB && in[0]->dtype == FL_BOOL && in[1]->dtype == FL_BOOL)
    return err_set(e, FL_EINVAL, "sub: subtraction of two bool tensors is "
                   "not supported");
  return binary_common(op, in, nin, promote_metas(in[0], in[1]), out, e);
}

/* true division: int / int is float32, as in PyTorch */
int infer_binary_float(fl_op op, const fl_meta *const *in, int nin,
                       const op_attrs *a, fl_meta *out, fl_err *e) {
  fl_dtype dt;
  (void)a;
  if (nin < 2 || !in[1])
    return err_set(e, FL_EINVAL, "%s: second input is missing", op_name(op));
  dt = promote_metas(in[0], in[1]);
  return binary_common(op, in, nin, dtype_is_float(dt) ? dt : FL_F32, out, e);
}

int infer_compare(fl_op op, const fl_meta *const *in, int nin,
                  const op_attrs *a, fl_meta *out, fl_err *e) {
  (void)a;
  if (nin < 2 || !in[1])
    return err_set(e, FL_EINVAL, "%s: second input is missing", op_name(op));
  return binary_common(op, in, nin, FL_BOOL, out, e);
}

int infer_where(fl_op op, const fl_meta *const *in, int nin,
                const op_attrs *a, fl_meta *out, fl_err *e) {
  shbuf s;
  fl_meta ab, all;
  int rc = check_inputs(op, in, nin, e);
  (void)a;
  if (rc) return rc;
  if (nin < 3 || !in[1] || !in[2])
    return err_set(e, FL_EINVAL, "where: expected a condition and two values");
  if (in[0]->dtype != FL_BOOL)
    return err_set(e, FL_EINVAL, "where: expected a bool condition, got %s %s",
                   dtype_name(in[0]->dtype), SH(in[0], s));
  memset(&ab, 0, sizeof ab);
  memset(&all, 0, sizeof all);
  if ((rc = op_broadcast_shapes("where", in[1], in[2], &ab, e))) return rc;
  if ((rc = op_broadcast_shapes("where", in[0], &ab, &all, e))) {
    shbuf s0, s1, s2;
    return err_set(e, FL_EINVAL, "where: condition %s does not broadcast with "
                   "values %s and %s", SH(in[0], s0), SH(in[1], s1),
                   SH(in[2], s2));
  }
  init_out(out, in, nin, promote_metas(in[1], in[2]));
  copy_shape(out, &all);
  return FL_OK;
}

/* --- reductions ---------------------------------------------------------- */

int infer_reduce(fl_op op, const fl_meta *const *in, int nin,
                 const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  int red[FL_MAX_DIMS] = {0};
  shbuf s;
  fl_dtype dt;
  int rc = check_inputs(op, in, nin, e), d, k;
  if (rc) return rc;
  if (a->ndims < 0 || a->ndims > FL_MAX_DIMS)
    return err_set(e, FL_EINVAL, "%s: %d reduction dims", op_name(op), a->ndims);
  if (op == OP_ARGMAX && a->ndims > 1)
    return err_set(e, FL_EINVAL, "argmax: expected at most one dim, got %d",
                   a->ndims);
  for (k = 0; k < a->ndims; k++) {
    if ((rc = check_dim(op, x, a->dims[k], e))) return rc;
    if (x->ndim == 0) continue;
    if (red[a->dims[k]])
      return err_set(e, FL_EINVAL, "%s: dim %lld appears more than once in "
                     "the reduction dims of %s", op_name(op),
                     (long long)a->dims[k], SH(x, s));
    red[a->dims[k]] = 1;
  }
  if (a->ndims == 0)
    for (d = 0; d < x->ndim; d++) red[d] = 1;

  switch (op) {
  case OP_SUM: dt = dtype_is_float(x->dtype) ? x->dtype : FL_I64; break;
  case OP_MEAN: case OP_VAR:
    if ((rc = need_float(op, x, "input", e))) return rc;
    dt = x->dtype;
    break;
  case OP_ARGMAX:
    if (x->dtype == FL_BOOL)
      return err_set(e, FL_EINVAL, "argmax: bool input %s is not supported",
                     SH(x, s));
    dt = FL_I64;
    break;
  default: dt = x->dtype; break;   /* amax, amin */
  }

  /* max-like reductions have no identity: reducing over nothing is an
  ** error, where sum gives 0 and mean NaN */
  if (op == OP_AMAX || op == OP_AMIN || op == OP_ARGMAX) {
    if (x->ndim == 0) {
      /* a scalar reduces to itself */
    } else if (a->ndims == 0 && meta_numel(x) == 0) {
      return err_set(e, FL_EINVAL, "%s: cannot reduce the empty input %s "
                     "(no identity); give a dim", op_name(op), SH(x, s));
    } else {
      for (d = 0; d < x->ndim; d++)
        if (red[d] && x->shape[d] == 0)
          return err_set(e, FL_EINVAL, "%s: cannot reduce over dim %d of size "
                         "0 in %s (no identity)", op_name(op), d, SH(x, s));
    }
  }

  init_out(out, in, nin, dt);
  for (d = 0; d < x->ndim; d++) {
    if (!red[d]) out->shape[out->ndim++] = x->shape[d];
    else if (a->keepdim) out->shape[out->ndim++] = 1;
  }
  return FL_OK;
}

int infer_softmax(fl_op op, const fl_meta *const *in, int nin,
                  const op_attrs *a, fl_meta *out, fl_err *e) {
  int rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  if ((rc = check_dim(op, in[0], a->i[0], e))) return rc;
  if ((rc = need_float(op, in[0], "input", e))) return rc;
  init_out(out, in, nin, in[0]->dtype);
  copy_shape(out, in[0]);
  return FL_OK;
}

/* layer_norm(x, weight?, bias?) and rms_norm(x, weight?) over the last i0
** dims; the parameters must have exactly that normalized shape. */
int infer_layer_norm(fl_op op, const fl_meta *const *in, int nin,
                     const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  static const char *const names[] = {"input", "weight", "bias"};
  shbuf s, sp, sn;
  fl_meta norm;
  int64_t k = a->i[0];
  int rc = check_inputs(op, in, nin, e), p, d;
  if (rc) return rc;
  if (k < 1 || k > x->ndim)
    return err_set(e, FL_EINVAL, "%s: cannot normalize the last %lld dims of "
                   "input %s (expected 1 to %d)", op_name(op), (long long)k,
                   SH(x, s), x->ndim);
  if ((rc = need_float(op, x, "input", e))) return rc;
  memset(&norm, 0, sizeof norm);
  norm.ndim = (int)k;
  for (d = 0; d < k; d++) norm.shape[d] = x->shape[x->ndim - k + d];
  for (p = 1; p < nin && p < 3; p++) {
    const fl_meta *w = in[p];
    if (!w) continue;
    if (!meta_same_shape(w, &norm))
      return err_set(e, FL_EINVAL, "%s: %s has shape %s, expected %s (the "
                     "normalized shape of input %s)", op_name(op), names[p],
                     SH(w, sp), SH(&norm, sn), SH(x, s));
    if ((rc = need_float(op, w, names[p], e))) return rc;
  }
  init_out(out, in, nin, x->dtype);
  copy_shape(out, x);
  return FL_OK;
}

/* --- matrix products ------------------------------------------------------ */

/* PyTorch's matmul: 1-D @ 1-D is a dot product; a 1-D left operand is a
** row (its dim dropped after), a 1-D right operand a column; otherwise the
** last two dims multiply and the leading (batch) dims broadcast. */
int infer_matmul(fl_op op, const fl_meta *const *in, int nin,
                 const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0], *y = in[1];
  shbuf sx, sy, bx, by;
  fl_meta xb, yb, batch;
  int64_t kx, ky;
  int rc = check_inputs(op, in, nin, e), d;
  (void)a;
  if (rc) return rc;
  if (x->ndim == 0 || y->ndim == 0)
    return err_set(e, FL_EINVAL, "matmul: %s @ %s: both arguments need at "
                   "least 1 dimension", SH(x, sx), SH(y, sy));
  if (x->dtype != y->dtype)
    return err_set(e, FL_EINVAL, "matmul: %s @ %s: expected the same dtype, "
                   "got %s and %s", SH(x, sx), SH(y, sy), dtype_name(x->dtype),
                   dtype_name(y->dtype));
  if (x->dtype == FL_BOOL)
    return err_set(e, FL_EINVAL, "matmul: %s @ %s: bool tensors are not "
                   "supported", SH(x, sx), SH(y, sy));
  kx = x->shape[x->ndim - 1];
  ky = y->ndim == 1 ? y->shape[0] : y->shape[y->ndim - 2];
  if (kx != ky)
    return err_set(e, FL_EINVAL, "matmul: %s @ %s: inner dimensions differ "
                   "(%lld vs %lld)", SH(x, sx), SH(y, sy), (long long)kx,
                   (long long)ky);
  memset(&xb, 0, sizeof xb);
  memset(&yb, 0, sizeof yb);
  memset(&batch, 0, sizeof batch);
  xb.ndim = x->ndim >= 2 ? x->ndim - 2 : 0;
  yb.ndim = y->ndim >= 2 ? y->ndim - 2 : 0;
  memcpy(xb.shape, x->shape, (size_t)xb.ndim * sizeof x->shape[0]);
  memcpy(yb.shape, y->shape, (size_t)yb.ndim * sizeof y->shape[0]);
  if (broadcast(&xb, &yb, &batch) != 0)
    return err_set(e, FL_EINVAL, "matmul: %s @ %s: batch dimensions %s and %s "
                   "cannot be broadcast", SH(x, sx), SH(y, sy), SH(&xb, bx),
                   SH(&yb, by));
  init_out(out, in, nin, x->dtype);
  copy_shape(out, &batch);
  d = out->ndim;
  if (x->ndim >= 2) out->shape[d++] = x->shape[x->ndim - 2];
  if (y->ndim >= 2) out->shape[d++] = y->shape[y->ndim - 1];
  out->ndim = d;
  return FL_OK;
}

/* matmul_int8 (ops.def's layout): A [..., M, K] @ B [K, N] or [..., K, N]
** with A's batch dims (callers expand), za [] or [M], zb [] or [N]; all
** int64 -> [..., M, N] int64 */
int infer_matmul_int8(fl_op op, const fl_meta *const *in, int nin,
                      const op_attrs *a, fl_meta *out, fl_err *e) {
  static const char *const names[] = {"A", "B", "za", "zb"};
  const fl_meta *x = in[0], *y = in[1];
  shbuf sx, sy;
  int rc = check_inputs(op, in, nin, e), k, d;
  (void)a;
  if (rc) return rc;
  for (k = 0; k < nin; k++)
    if (in[k] && in[k]->dtype != FL_I64)
      return err_set(e, FL_EINVAL, "%s: %s must be int64 (8-bit values held wide), got %s",
                     op_name(op), names[k], dtype_name(in[k]->dtype));
  if (x->ndim < 2 || (y->ndim != 2 && y->ndim != x->ndim))
    return err_set(e, FL_EINVAL, "%s: %s @ %s: A needs at least 2 dims and B 2 or A's number",
                   op_name(op), SH(x, sx), SH(y, sy));
  if (x->shape[x->ndim - 1] != y->shape[y->ndim - 2])
    return err_set(e, FL_EINVAL, "%s: %s @ %s: inner dimensions differ", op_name(op), SH(x, sx),
                   SH(y, sy));
  if (y->ndim > 2)
    for (d = 0; d < x->ndim - 2; d++)
      if (x->shape[d] != y->shape[d])
        return err_set(e, FL_EINVAL, "%s: %s @ %s: batch dimensions differ (expand them first)",
                       op_name(op), SH(x, sx), SH(y, sy));
  for (k = 2; k < nin; k++) {
    const fl_meta *z = in[k];
    int64_t want = k == 2 ? x->shape[x->ndim - 2] : y->shape[y->ndim - 1];
    if (z && !(meta_numel(z) == 1 && z->ndim <= 1) && !(z->ndim == 1 && z->shape[0] == want))
      return err_set(e, FL_EINVAL, "%s: zero point %s must be one value or [%lld], got %s",
                     op_name(op), names[k], (long long)want, SH(z, sx));
  }
  init_out(out, in, nin, FL_I64);
  copy_shape(out, x);
  out->shape[x->ndim - 1] = y->shape[y->ndim - 1];
  return FL_OK;
}

/* linear(x [..., in], weight [out, in], bias [out]?) -> [..., out] */
int infer_linear(fl_op op, const fl_meta *const *in, int nin,
                 const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0], *w = in[1], *b = nin > 2 ? in[2] : NULL;
  shbuf sx, sw;
  int rc = check_inputs(op, in, nin, e);
  (void)a;
  if (rc) return rc;
  if (!w) return err_set(e, FL_EINVAL, "linear: weight is missing");
  if (x->ndim < 1)
    return err_set(e, FL_EINVAL, "linear: input %s needs at least 1 dimension",
                   SH(x, sx));
  if (w->ndim != 2)
    return err_set(e, FL_EINVAL, "linear: weight %s must be 2-D [out,in]",
                   SH(w, sw));
  if (x->shape[x->ndim - 1] != w->shape[1])
    return err_set(e, FL_EINVAL, "linear: input %s and weight %s: in_features "
                   "differ (input has %lld, weight expects %lld)", SH(x, sx),
                   SH(w, sw), (long long)x->shape[x->ndim - 1],
                   (long long)w->shape[1]);
  if ((rc = same_dtype(op, x, "input", w, "weight", e))) return rc;
  if (x->dtype == FL_BOOL)
    return err_set(e, FL_EINVAL, "linear: bool tensors are not supported");
  if (b) {
    if ((rc = check_vec(op, b, "bias", w->shape[0], "the out_features of "
                        "weight", w, e)))
      return rc;
    if ((rc = same_dtype(op, x, "input", b, "bias", e))) return rc;
  }
  init_out(out, in, nin, x->dtype);
  copy_shape(out, x);
  out->shape[out->ndim - 1] = w->shape[0];
  return FL_OK;
}

/* The pads, strides and dilations of a window, checked; the message names
** the op and the values. */
static int check_win(fl_op op, const op_win2d *g, fl_err *e) {
  if (g->sh < 1 || g->sw < 1)
    return err_set(e, FL_EINVAL, "%s: stride must be positive, got [%lld,%lld]",
                   op_name(op), (long long)g->sh, (long long)g->sw);
  if (g->dh < 1 || g->dw < 1)
    return err_set(e, FL_EINVAL, "%s: dilation must be positive, got [%lld,%lld]",
                   op_name(op), (long long)g->dh, (long long)g->dw);
  if (g->pt < 0 || g->pl < 0 || g->pb < 0 || g->pr < 0)
    return err_set(e, FL_EINVAL, "%s: padding must be non-negative, got "
                   "[%lld,%lld,%lld,%lld] (top, left, bottom, right)", op_name(op),
                   (long long)g->pt, (long long)g->pl, (long long)g->pb,
                   (long long)g->pr);
  return FL_OK;
}

int infer_conv2d(fl_op op, const fl_meta *const *in, int nin,
                 const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0], *w = in[1], *b = nin > 2 ? in[2] : NULL;
  shbuf sx, sw;
  op_win2d g;
  int64_t ho, wo;
  int rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  if (!w) return err_set(e, FL_EINVAL, "conv2d: weight is missing");
  if (x->ndim != 4)
    return err_set(e, FL_EINVAL, "conv2d: expected a 4-D input [N,C,H,W], got "
                   "%s", SH(x, sx));
  if (w->ndim != 4)
    return err_set(e, FL_EINVAL, "conv2d: expected a 4-D weight [Co,Ci/groups,kh,kw], "
                   "got %s", SH(w, sw));
  op_win2d_of(op, a, w->shape[2], w->shape[3], &g);
  if (g.groups < 1)
    return err_set(e, FL_EINVAL, "conv2d: groups must be positive, got %lld",
                   (long long)g.groups);
  if (x->shape[1] % g.groups != 0 || w->shape[0] % g.groups != 0)
    return err_set(e, FL_EINVAL, "conv2d: groups=%lld must divide both the input "
                   "channels (input %s) and the output channels (weight %s)",
                   (long long)g.groups, SH(x, sx), SH(w, sw));
  if (w->shape[1] != x->shape[1] / g.groups) {
    if (g.groups == 1)
      return err_set(e, FL_EINVAL, "conv2d: weight %s expects %lld input "
                     "channels, but input %s has %lld", SH(w, sw),
                     (long long)w->shape[1], SH(x, sx), (long long)x->shape[1]);
    return err_set(e, FL_EINVAL, "conv2d: weight %s expects %lld input "
                   "channels per group, but input %s has %lld channels in %lld "
                   "groups (%lld each)", SH(w, sw), (long long)w->shape[1],
                   SH(x, sx), (long long)x->shape[1], (long long)g.groups,
                   (long long)(x->shape[1] / g.groups));
  }
  if (w->shape[2] < 1 || w->shape[3] < 1)
    return err_set(e, FL_EINVAL, "conv2d: weight %s has an empty kernel",
                   SH(w, sw));
  if ((rc = check_win(op, &g, e))) return rc;
  ho = op_win_out(x->shape[2], g.kh, g.sh, g.pt, g.pb, g.dh, 0);
  wo = op_win_out(x->shape[3], g.kw, g.sw, g.pl, g.pr, g.dw, 0);
  if (ho <= 0 || wo <= 0)
    return err_set(e, FL_EINVAL, "conv2d: padded input size %lldx%lld is "
                   "smaller than the %skernel %lldx%lld (input %s, weight %s, "
                   "padding [%lld,%lld,%lld,%lld], dilation [%lld,%lld])",
                   (long long)(x->shape[2] + g.pt + g.pb),
                   (long long)(x->shape[3] + g.pl + g.pr),
                   g.dh > 1 || g.dw > 1 ? "dilated " : "",
                   (long long)((g.kh - 1) * g.dh + 1), (long long)((g.kw - 1) * g.dw + 1),
                   SH(x, sx), SH(w, sw), (long long)g.pt, (long long)g.pl,
                   (long long)g.pb, (long long)g.pr, (long long)g.dh, (long long)g.dw);
  if ((rc = need_float(op, x, "input", e))) return rc;
  if ((rc = same_dtype(op, x, "input", w, "weight", e))) return rc;
  if (b) {
    if ((rc = check_vec(op, b, "bias", w->shape[0], "the out channels of "
                        "weight", w, e)))
      return rc;
    if ((rc = same_dtype(op, x, "input", b, "bias", e))) return rc;
  }
  init_out(out, in, nin, x->dtype);
  out->ndim = 4;
  out->shape[0] = x->shape[0];
  out->shape[1] = w->shape[0];
  out->shape[2] = ho;
  out->shape[3] = wo;
  return FL_OK;
}

/* --- views and data movement ------------------------------------------------ */

/* reshape and view: dims = target, one -1 inferred, numel preserved */
int infer_reshape(fl_op op, const fl_meta *const *in, int nin,
                  const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  shbuf s;
  int64_t numel, known = 1;
  int infer_at = -1, rc = check_inputs(op, in, nin, e), d, big = 0, zero = 0;
  if (rc) return rc;
  if (a->ndims < 0 || a->ndims > FL_MAX_DIMS)
    return err_set(e, FL_EINVAL, "%s: %d dims requested, at most %d are "
                   "supported", op_name(op), a->ndims, FL_MAX_DIMS);
  numel = meta_numel(x);
  for (d = 0; d < a->ndims; d++) {
    int64_t v = a->dims[d];
    if (v == -1) {
      if (infer_at >= 0)
        return err_set(e, FL_EINVAL, "%s: only one dimension can be inferred, "
                       "got shape %s", op_name(op),
                       dims_str(a->dims, a->ndims, s, sizeof s));
      infer_at = d;
    } else if (v < 0) {
      return err_set(e, FL_EINVAL, "%s: invalid size %lld in shape %s",
                     op_name(op), (long long)v,
                     dims_str(a->dims, a->ndims, s, sizeof s));
    } else if (v == 0) {
      zero = 1;
    } else if (known > INT64_MAX / v) {
      big = 1;
    } else {
      known *= v;
    }
  }
  if (zero) { known = 0; big = 0; }
  if (infer_at >= 0 && known == 0 && !big)
    return err_set(e, FL_EINVAL, "%s: cannot reshape a tensor of %lld "
                   "elements into shape %s: the -1 could be any size",
                   op_name(op), (long long)numel,
                   dims_str(a->dims, a->ndims, s, sizeof s));
  if (big || (infer_at < 0 && known != numel) ||
      (infer_at >= 0 && numel % known != 0))
    return err_set(e, FL_EINVAL, "%s: shape %s is invalid for input of size "
                   "%lld", op_name(op), dims_str(a->dims, a->ndims, s, sizeof s),
                   (long long)numel);
  init_out(out, in, nin, x->dtype);
  out->ndim = a->ndims;
  for (d = 0; d < a->ndims; d++)
    out->shape[d] = d == infer_at ? numel / known : a->dims[d];
  return FL_OK;
}

int infer_transpose(fl_op op, const fl_meta *const *in, int nin,
                    const op_attrs *a, fl_meta *out, fl_err *e) {
  int64_t t;
  int rc = check_inputs(op, in, nin, e);
  if (rc || (rc = check_dim(op, in[0], a->i[0], e)) ||
      (rc = check_dim(op, in[0], a->i[1], e)))
    return rc;
  init_out(out, in, nin, in[0]->dtype);
  copy_shape(out, in[0]);
  if (out->ndim == 0) return FL_OK;
  t = out->shape[a->i[0]];
  out->shape[a->i[0]] = out->shape[a->i[1]];
  out->shape[a->i[1]] = t;
  return FL_OK;
}

int infer_permute(fl_op op, const fl_meta *const *in, int nin,
                  const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  shbuf s, sp;
  int seen[FL_MAX_DIMS] = {0};
  int rc = check_inputs(op, in, nin, e), d;
  if (rc) return rc;
  if (a->ndims != x->ndim)
    return err_set(e, FL_EINVAL, "permute: input %s has %d dims but the "
                   "permutation %s has %d", SH(x, s), x->ndim,
                   dims_str(a->dims, a->ndims, sp, sizeof sp), a->ndims);
  for (d = 0; d < a->ndims; d++) {
    int64_t p = a->dims[d];
    if (p < 0 || p >= x->ndim || seen[p])
      return err_set(e, FL_EINVAL, "permute: %s is not a permutation of the "
                     "dims of %s", dims_str(a->dims, a->ndims, sp, sizeof sp),
                     SH(x, s));
    seen[p] = 1;
  }
  init_out(out, in, nin, x->dtype);
  out->ndim = x->ndim;
  for (d = 0; d < x->ndim; d++) out->shape[d] = x->shape[a->dims[d]];
  return FL_OK;
}

int infer_unsqueeze(fl_op op, const fl_meta *const *in, int nin,
                    const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  shbuf s;
  int64_t u = a->i[0];
  int rc = check_inputs(op, in, nin, e), d;
  if (rc) return rc;
  if (u < 0 || u > x->ndim)
    return err_set(e, FL_EINVAL, "unsqueeze: dim %lld out of range for "
                   "input %s (expected 0 to %d)", (long long)u, SH(x, s),
                   x->ndim);
  if (x->ndim + 1 > FL_MAX_DIMS)
    return err_set(e, FL_EINVAL, "unsqueeze: input %s already has the "
                   "maximum of %d dims", SH(x, s), FL_MAX_DIMS);
  init_out(out, in, nin, x->dtype);
  out->ndim = x->ndim + 1;
  for (d = 0; d < out->ndim; d++)
    out->shape[d] = d < u ? x->shape[d] : d == u ? 1 : x->shape[d - 1];
  return FL_OK;
}

/* squeeze: i1 set -> only dim i0 (if it is 1), else every size-1 dim */
int infer_squeeze(fl_op op, const fl_meta *const *in, int nin,
                  const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  int rc = check_inputs(op, in, nin, e), d;
  if (rc) return rc;
  if (a->i[1] && (rc = check_dim(op, x, a->i[0], e))) return rc;
  init_out(out, in, nin, x->dtype);
  for (d = 0; d < x->ndim; d++)
    if (x->shape[d] != 1 || (a->i[1] && a->i[0] != d))
      out->shape[out->ndim++] = x->shape[d];
  return FL_OK;
}

/* expand: -1 keeps a size, only size-1 dims grow, new dims go in front */
int infer_expand(fl_op op, const fl_meta *const *in, int nin,
                 const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  shbuf s, t;
  int rc = check_inputs(op, in, nin, e), d, lead;
  if (rc) return rc;
  if (a->ndims < x->ndim || a->ndims > FL_MAX_DIMS)
    return err_set(e, FL_EINVAL, "expand: cannot expand %s to %s: the target "
                   "needs at least %d dims", SH(x, s),
                   dims_str(a->dims, a->ndims, t, sizeof t), x->ndim);
  lead = a->ndims - x->ndim;
  init_out(out, in, nin, x->dtype);
  out->ndim = a->ndims;
  for (d = 0; d < a->ndims; d++) {
    int64_t want = a->dims[d], have = d >= lead ? x->shape[d - lead] : -1;
    if (want == -1 && d < lead)
      return err_set(e, FL_EINVAL, "expand: cannot expand %s to %s: -1 is not "
                     "allowed in a new leading dim", SH(x, s),
                     dims_str(a->dims, a->ndims, t, sizeof t));
    if (want < -1)
      return err_set(e, FL_EINVAL, "expand: invalid size %lld in %s",
                     (long long)want, dims_str(a->dims, a->ndims, t, sizeof t));
    if (want == -1) want = have;
    if (d >= lead && have != want && have != 1)
      return err_set(e, FL_EINVAL, "expand: cannot expand %s to %s: size %lld "
                     "must match the existing size %lld (only size-1 dims can "
                     "grow)", SH(x, s), dims_str(a->dims, a->ndims, t, sizeof t),
                     (long long)want, (long long)have);
    out->shape[d] = want;
  }
  return FL_OK;
}

int infer_narrow(fl_op op, const fl_meta *const *in, int nin,
                 const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  shbuf s;
  int64_t dim = a->i[0], start = a->i[1], len = a->i[2], size;
  int rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  if (x->ndim == 0)
    return err_set(e, FL_EINVAL, "narrow: cannot narrow a 0-dim tensor");
  if ((rc = check_dim(op, x, dim, e))) return rc;
  size = x->shape[dim];
  if (start < 0 || start > size)
    return err_set(e, FL_EINVAL, "narrow: start %lld out of range for a "
                   "dimension of size %lld in %s", (long long)start,
                   (long long)size, SH(x, s));
  if (len < 0 || len > size - start)
    return err_set(e, FL_EINVAL, "narrow: start (%lld) + length (%lld) "
                   "exceeds dimension size (%lld) of %s", (long long)start,
                   (long long)len, (long long)size, SH(x, s));
  init_out(out, in, nin, x->dtype);
  copy_shape(out, x);
  out->shape[dim] = len;
  return FL_OK;
}

int infer_same(fl_op op, const fl_meta *const *in, int nin,
               const op_attrs *a, fl_meta *out, fl_err *e) {
  int rc = check_inputs(op, in, nin, e);
  (void)a;
  if (rc) return rc;
  init_out(out, in, nin, in[0]->dtype);
  copy_shape(out, in[0]);
  return FL_OK;
}

/* cat(t1..tn, dim): same rank, equal sizes except along dim, dtypes
** promoted.  Tensors are numbered from 1 in messages, as in the Lua list. */
int infer_cat(fl_op op, const fl_meta *const *in, int nin, const op_attrs *a,
              fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  shbuf s0, s1;
  int64_t dim = a->i[0], total = 0;
  fl_dtype dt = x->dtype;
  int rc = check_inputs(op, in, nin, e), k, d;
  if (rc) return rc;
  for (k = 0; k < nin; k++) {
    const fl_meta *t = in[k];
    if (!t) return err_set(e, FL_EINVAL, "cat: tensor %d is missing", k + 1);
    if (t->ndim == 0)
      return err_set(e, FL_EINVAL, "cat: tensor %d is 0-dim and cannot be "
                     "concatenated", k + 1);
    if (t->ndim != x->ndim)
      return err_set(e, FL_EINVAL, "cat: tensors must have the same number of "
                     "dims: tensor 1 is %s, tensor %d is %s", SH(x, s0), k + 1,
                     SH(t, s1));
    if (k == 0 && (rc = check_dim(op, x, dim, e))) return rc;
    for (d = 0; d < x->ndim; d++)
      if (d != dim && t->shape[d] != x->shape[d])
        return err_set(e, FL_EINVAL, "cat: sizes must match except in dim "
                       "%lld: tensor 1 is %s, tensor %d is %s", (long long)dim,
                       SH(x, s0), k + 1, SH(t, s1));
    if (!sz_add(total, t->shape[dim], &total))
      return err_set(e, FL_EINVAL, "cat: the result is too large along the "
                     "joined dim (tensor %d %s takes its size past 2^63)",
                     k + 1, SH(t, s1));
    if (k > 0) dt = dtype_promote(dt, 0, 0, t->dtype, 0, 0);
  }
  init_out(out, in, nin, dt);
  copy_shape(out, x);
  out->shape[dim] = total;
  return FL_OK;
}

/* embedding(idx int64 [...], weight [n, d]) -> [..., d] */
int infer_embedding(fl_op op, const fl_meta *const *in, int nin,
                    const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *idx = in[0], *w = in[1];
  shbuf s;
  int rc = check_inputs(op, in, nin, e);
  (void)a;
  if (rc) return rc;
  if (!w) return err_set(e, FL_EINVAL, "embedding: weight is missing");
  if (idx->dtype != FL_I64)
    return err_set(e, FL_EINVAL, "embedding: indices must be int64, got %s %s",
                   dtype_name(idx->dtype), SH(idx, s));
  if (w->ndim != 2)
    return err_set(e, FL_EINVAL, "embedding: weight must be 2-D [num,dim], "
                   "got %s", SH(w, s));
  if (idx->ndim + 1 > FL_MAX_DIMS)
    return err_set(e, FL_EINVAL, "embedding: indices %s have too many dims",
                   SH(idx, s));
  init_out(out, in, nin, w->dtype);
  out->device = w->device;
  copy_shape(out, idx);
  out->shape[out->ndim++] = w->shape[1];
  return FL_OK;
}

/* slice: i0 dim, i1 start, i2 length, i3 step >= 1; the last element
** taken must lie inside the dim */
int infer_slice(fl_op op, const fl_meta *const *in, int nin,
                const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  shbuf s;
  int64_t dim = a->i[0], start = a->i[1], len = a->i[2], step = a->i[3], size, last;
  int rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  if (x->ndim == 0)
    return err_set(e, FL_EINVAL, "slice: cannot slice a 0-dim tensor");
  if ((rc = check_dim(op, x, dim, e))) return rc;
  size = x->shape[dim];
  if (step < 1)
    return err_set(e, FL_EINVAL, "slice: step must be >= 1 here, got %lld",
                   (long long)step);
  if (start < 0 || start > size || len < 0 ||
      (len > 0 && (!sz_mul(len - 1, step, &last) || !sz_add(last, start, &last) ||
                   last >= size)))
    return err_set(e, FL_EINVAL, "slice: %lld elements from %lld by step %lld "
                   "run past dimension %lld of %s", (long long)len, (long long)start,
                   (long long)step, (long long)dim, SH(x, s));
  init_out(out, in, nin, x->dtype);
  copy_shape(out, x);
  out->shape[dim] = len;
  return FL_OK;
}

/* pad (ops.def's layout): per dim, crop the negative pads, then pad; the
** result's size is size + before + after */
int infer_pad(fl_op op, const fl_meta *const *in, int nin,
              const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  shbuf s;
  int d, rc = check_inputs(op, in, nin, e);
  int64_t mode = a->i[8];
  if (rc) return rc;
  if (a->ndims != x->ndim)
    return err_set(e, FL_EINVAL, "pad: %d pads per side for a %d-d tensor %s "
                   "(expected one per dim)", a->ndims, x->ndim, SH(x, s));
  if (mode < 0 || mode > 2)
    return err_set(e, FL_EINVAL, "pad: unknown mode %lld", (long long)mode);
  init_out(out, in, nin, x->dtype);
  copy_shape(out, x);
  for (d = 0; d < x->ndim; d++) {
    int64_t n = x->shape[d], b = a->dims[d], f = a->i[d], cb, cf, m, o;
    if (b < -FL_MAX_NUMEL || f < -FL_MAX_NUMEL || b > FL_MAX_NUMEL || f > FL_MAX_NUMEL)
      return err_set(e, FL_EINVAL, "pad: pads %lld, %lld of dim %d are too large",
                     (long long)b, (long long)f, d + 1);
    cb = b < 0 ? -b : 0;
    cf = f < 0 ? -f : 0;
    if (cb + cf > n)
      return err_set(e, FL_EINVAL, "pad: pads %lld, %lld crop %lld elements from dim %d "
                     "of %s, which has %lld", (long long)b, (long long)f,
                     (long long)(cb + cf), d + 1, SH(x, s), (long long)n);
    m = n - cb - cf;
    if (mode == 1 && ((b > 0 && b >= m) || (f > 0 && f >= m)))
      return err_set(e, FL_EINVAL, "pad: reflect pads %lld, %lld of dim %d must be "
                     "smaller than its size %lld (after cropping) in %s", (long long)b,
                     (long long)f, d + 1, (long long)m, SH(x, s));
    if (mode == 2 && m == 0 && (b > 0 || f > 0))
      return err_set(e, FL_EINVAL, "pad: edge padding of dim %d, which is empty in %s",
                     d + 1, SH(x, s));
    o = m + (b > 0 ? b : 0) + (f > 0 ? f : 0);
    out->shape[d] = o;
  }
  return FL_OK;
}

/* flip: dims[ndims] distinct and in range */
int infer_flip(fl_op op, const fl_meta *const *in, int nin,
               const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  int d, k, rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  if (a->ndims < 0 || a->ndims > x->ndim)
    return err_set(e, FL_EINVAL, "flip: %d dims for a %d-d tensor", a->ndims, x->ndim);
  for (d = 0; d < a->ndims; d++) {
    if ((rc = check_dim(op, x, a->dims[d], e))) return rc;
    for (k = 0; k < d; k++)
      if (a->dims[k] == a->dims[d])
        return err_set(e, FL_EINVAL, "flip: dim %lld appears twice", (long long)a->dims[d] + 1);
  }
  init_out(out, in, nin, x->dtype);
  copy_shape(out, x);
  return FL_OK;
}

/* gather(x, idx) along i0 (ONNX Gather): x.shape[:dim] ++ idx.shape ++
** x.shape[dim+1:]; the indices are int64 */
int infer_gather(fl_op op, const fl_meta *const *in, int nin,
                 const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0], *idx = in[1];
  shbuf s, s2;
  int64_t dim = a->i[0];
  int d, k = 0, rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  if (!idx) return err_set(e, FL_EINVAL, "gather: indices are missing");
  if (x->ndim == 0)
    return err_set(e, FL_EINVAL, "gather: cannot gather from a 0-dim tensor");
  if ((rc = check_dim(op, x, dim, e))) return rc;
  if (idx->dtype != FL_I64)
    return err_set(e, FL_EINVAL, "gather: indices must be int64, got %s %s",
                   dtype_name(idx->dtype), SH(idx, s));
  if (x->ndim - 1 + idx->ndim > FL_MAX_DIMS)
    return err_set(e, FL_EINVAL, "gather: the result of %s indexed by %s would have "
                   "%d dims (at most %d)", SH(x, s), SH(idx, s2), x->ndim - 1 + idx->ndim,
                   FL_MAX_DIMS);
  init_out(out, in, nin, x->dtype);
  out->device = x->device;
  for (d = 0; d < dim; d++) out->shape[k++] = x->shape[d];
  for (d = 0; d < idx->ndim; d++) out->shape[k++] = idx->shape[d];
  for (d = (int)dim + 1; d < x->ndim; d++) out->shape[k++] = x->shape[d];
  out->ndim = k;
  return FL_OK;
}

/* index_add(src [A, I, R], idx [I]) -> [A, n, R], src's float dtype. */
int infer_index_add(fl_op op, const fl_meta *const *in, int nin,
                    const op_attrs *a, fl_meta *out, fl_err *e) {
  shbuf s1, s2;
  int rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  if (in[0]->ndim != 3 || !dtype_is_float(in[0]->dtype))
    return err_set(e, FL_EINVAL, "%s: src must be a 3-d float tensor [A, I, R], got %s %s",
                   op_name(op), dtype_name(in[0]->dtype), SH(in[0], s1));
  if (in[1]->ndim != 1 || in[1]->dtype != FL_I64 || in[1]->shape[0] != in[0]->shape[1])
    return err_set(e, FL_EINVAL, "%s: idx must be int64 [%lld] (src %s), got %s %s", op_name(op),
                   (long long)in[0]->shape[1], SH(in[0], s1), dtype_name(in[1]->dtype),
                   SH(in[1], s2));
  if (a->i[0] < 0)
    return err_set(e, FL_EINVAL, "%s: the size n must be >= 0, got %lld", op_name(op),
                   (long long)a->i[0]);
  init_out(out, in, nin, in[0]->dtype);
  copy_shape(out, in[0]);
  out->shape[1] = a->i[0];
  return FL_OK;
}

/* cumsum: the input's shape; float or int64 (a bool or int64 input sums in
** int64, as PyTorch's) */
int infer_cumsum(fl_op op, const fl_meta *const *in, int nin,
                 const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  int rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  if ((rc = check_dim(op, x, a->i[0], e))) return rc;
  init_out(out, in, nin, x->dtype == FL_BOOL ? FL_I64 : x->dtype);
  copy_shape(out, x);
  return FL_OK;
}

/* --- recurrent cells --------------------------------------------------- */

/* An optional rnn input must be absent or exactly [d0, d1, d2] (n dims). */
static int rnn_input(fl_op op, const fl_meta *m, const char *what, int n, int64_t d0,
                     int64_t d1, int64_t d2, fl_err *e) {
  shbuf s, w;
  fl_meta want;
  if (!m) return FL_OK;
  memset(&want, 0, sizeof want);
  want.ndim = n;
  want.shape[0] = d0; want.shape[1] = d1; want.shape[2] = d2;
  if (m->ndim == n && meta_same_shape(m, &want)) return FL_OK;
  return err_set(e, FL_EINVAL, "%s: %s has shape %s, expected %s", op_name(op), what,
                 SH(m, s), SH(&want, w));
}

/* rnn (ops.def's layout): X [T, B, I], W [D, G*H, I], R [D, G*H, H] and the
** optional inputs of ONNX's RNN/GRU/LSTM -> [S + T, D, B, H], X's dtype. */
int infer_rnn(fl_op op, const fl_meta *const *in, int nin,
              const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0], *w = in[1], *r = in[2];
  op_rnn c;
  shbuf s1, s2;
  int64_t T, B, I, D, GH, H;
  int k, rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  if (a->i[0] < 0 || a->i[0] > OP_RNN_CELL_LSTM || a->i[1] < 0 || a->i[1] > 2)
    return err_set(e, FL_EINVAL, "%s: cell %lld, direction %lld (expected 0..2 each)", op_name(op),
                   (long long)a->i[0], (long long)a->i[1]);
  for (k = 4; k < 10; k++)
    if (a->i[k] < 0 || a->i[k] >= OP_RNN_ACT_COUNT)
      return err_set(e, FL_EINVAL, "%s: activation code %lld (expected 0..%d)", op_name(op),
                     (long long)a->i[k], OP_RNN_ACT_COUNT - 1);
  if (a->i[3] && !(a->f[0] >= 0))
    return err_set(e, FL_EINVAL, "%s: clip must be >= 0, got %g", op_name(op), a->f[0]);
  op_rnn_of(a, &c);
  if (!x || !w || !r) return err_set(e, FL_EINVAL, "%s: X, W and R are required", op_name(op));
  if ((rc = need_float(op, x, "X", e))) return rc;
  if (x->ndim != 3)
    return err_set(e, FL_EINVAL, "%s: X must be [seq, batch, input], got %s", op_name(op), SH(x, s1));
  T = x->shape[0]; B = x->shape[1]; I = x->shape[2];
  if (r->ndim != 3 || r->shape[0] != c.dirs || r->shape[1] % c.gates != 0 ||
      r->shape[1] / c.gates != r->shape[2])
    return err_set(e, FL_EINVAL, "%s: R must be [%d, %d*H, H] (%d direction(s), %d gate(s)), got %s",
                   op_name(op), c.dirs, c.gates, c.dirs, c.gates, SH(r, s1));
  D = c.dirs; H = r->shape[2]; GH = r->shape[1];
  if ((rc = rnn_input(op, w, "W", 3, D, GH, I, e))) return rc;
  if ((rc = rnn_input(op, nin > 3 ? in[3] : NULL, "B", 2, D, 2 * GH, 0, e))) return rc;
  if (nin > 4 && in[4] && (in[4]->dtype != FL_I64 || in[4]->ndim != 1 || in[4]->shape[0] != B))
    return err_set(e, FL_EINVAL, "%s: sequence_lens must be int64 [%lld] (X %s), got %s %s",
                   op_name(op), (long long)B, SH(x, s1), dtype_name(in[4]->dtype), SH(in[4], s2));
  if ((rc = rnn_input(op, nin > 5 ? in[5] : NULL, "initial_h", 3, D, B, H, e))) return rc;
  if (nin > 6 && in[6] && c.cell != OP_RNN_CELL_LSTM)
    return err_set(e, FL_EINVAL, "%s: initial_c is for LSTM cells only", op_name(op));
  if ((rc = rnn_input(op, nin > 6 ? in[6] : NULL, "initial_c", 3, D, B, H, e))) return rc;
  if (nin > 7 && in[7] && c.cell != OP_RNN_CELL_LSTM)
    return err_set(e, FL_EINVAL, "%s: peepholes P are for LSTM cells only", op_name(op));
  if ((rc = rnn_input(op, nin > 7 ? in[7] : NULL, "P", 2, D, 3 * H, 0, e))) return rc;
  for (k = 1; k < nin; k++)
    if (k != 4 && in[k] && in[k]->dtype != x->dtype)
      return err_set(e, FL_EINVAL, "%s: input %d is %s, X is %s (one float dtype)", op_name(op),
                     k + 1, dtype_name(in[k]->dtype), dtype_name(x->dtype));
  init_out(out, in, nin, x->dtype);
  out->ndim = 4;
  out->shape[0] = c.states + T;
  out->shape[1] = D;
  out->shape[2] = B;
  out->shape[3] = H;
  return FL_OK;
}

/* --- vision ----------------------------------------------------------------- */

/* max/avg_pool2d (ops.def's layout): each pad below the (dilated) kernel,
** as ONNX requires, so every window holds an input element unless a max
** pool's dilation steps over all of them (then its value is -inf). */
int infer_pool2d(fl_op op, const fl_meta *const *in, int nin,
                 const op_attrs *a, fl_meta *out, fl_err *e) {
  const fl_meta *x = in[0];
  shbuf s;
  op_win2d g;
  int64_t ho, wo, eh, ew;
  int rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  op_win2d_of(op, a, 0, 0, &g);
  if (x->ndim != 4)
    return err_set(e, FL_EINVAL, "%s: expected a 4-D input [N,C,H,W], got %s",
                   op_name(op), SH(x, s));
  if (g.kh < 1 || g.kw < 1)
    return err_set(e, FL_EINVAL, "%s: kernel size must be positive, got "
                   "[%lld,%lld]", op_name(op), (long long)g.kh, (long long)g.kw);
  if ((rc = check_win(op, &g, e))) return rc;
  if (op == OP_AVG_POOL2D && (g.dh != 1 || g.dw != 1))
    return err_set(e, FL_EINVAL, "avg_pool2d: dilation is not supported (got "
                   "[%lld,%lld])", (long long)g.dh, (long long)g.dw);
  if (g.kh > INT64_MAX / g.dh || g.kw > INT64_MAX / g.dw)
    return err_set(e, FL_EINVAL, "%s: kernel [%lld,%lld] with dilation "
                   "[%lld,%lld] is too large", op_name(op), (long long)g.kh,
                   (long long)g.kw, (long long)g.dh, (long long)g.dw);
  eh = (g.kh - 1) * g.dh + 1;
  ew = (g.kw - 1) * g.dw + 1;
  if (g.pt >= eh || g.pb >= eh || g.pl >= ew || g.pr >= ew)
    return err_set(e, FL_EINVAL, "%s: padding [%lld,%lld,%lld,%lld] (top, left, "
                   "bottom, right) must be smaller than the %skernel [%lld,%lld]",
                   op_name(op), (long long)g.pt, (long long)g.pl,
                   (long long)g.pb, (long long)g.pr,
                   g.dh > 1 || g.dw > 1 ? "dilated " : "", (long long)eh,
                   (long long)ew);
  if (x->dtype == FL_BOOL || (op == OP_AVG_POOL2D && x->dtype == FL_I64))
    return err_set(e, FL_EINVAL, "%s: %s input %s is not supported",
                   op_name(op), dtype_name(x->dtype), SH(x, s));
  ho = op_win_out(x->shape[2], g.kh, g.sh, g.pt, g.pb, g.dh, g.ceil_mode);
  wo = op_win_out(x->shape[3], g.kw, g.sw, g.pl, g.pr, g.dw, g.ceil_mode);
  if (ho <= 0 || wo <= 0)
    return err_set(e, FL_EINVAL, "%s: input %s is too small for kernel "
                   "[%lld,%lld] with padding [%lld,%lld,%lld,%lld]", op_name(op),
                   SH(x, s), (long long)eh, (long long)ew, (long long)g.pt,
                   (long long)g.pl, (long long)g.pb, (long long)g.pr);
  init_out(out, in, nin, x->dtype);
  out->ndim = 4;
  out->shape[0] = x->shape[0];
  out->shape[1] = x->shape[1];
  out->shape[2] = ho;
  out->shape[3] = wo;
  return FL_OK;
}

/* max_pool2d_backward(g, x): x's shape and dtype; g must have the shape of
** max_pool2d(x) under the same attributes. */
int infer_max_pool2d_backward(fl_op op, const fl_meta *const *in, int nin,
                              const op_attrs *a, fl_meta *out, fl_err *e) {
  fl_meta pm;
  shbuf s1, s2;
  int rc = check_inputs(op, in, nin, e);
  if (rc) return rc;
  if ((rc = infer_pool2d(OP_MAX_POOL2D, in + 1, 1, a, &pm, e))) return rc;
  if (!dtype_is_float(in[1]->dtype) || in[0]->dtype != in[1]->dtype)
    return err_set(e, FL_EINVAL, "%s: gradient %s and input %s must share a float dtype",
                   op_name(op), dtype_name(in[0]->dtype), dtype_name(in[1]->dtype));
  if (!meta_same_shape(in[0], &pm))
    return err_set(e, FL_EINVAL, "%s: gradient %s differs from the pool's output %s",
                   op_name(op), SH(in[0], s1), SH(&pm, s2));
  init_out(out, in, nin, in[1]->dtype);
  copy_shape(out, in[1]);
  return FL_OK;
}

/* batch_norm(x [N,C,...], mean [C], var [C], weight [C]?, bias [C]?) */
int infer_batch_norm(fl_op op, const fl_meta *const *in, int nin,
                     const op_attrs *a, fl_meta *out, fl_err *e) {
  static const char *const names[] = {"input", "running_mean", "running_var",
                                      "weight", "bias"};
  const fl_meta *x = in[0];
  shbuf s;
  int rc = check_inputs(op, in, nin, e), p;
  (void)a;
  if (rc) return rc;
  if (x->ndim < 2)
    return err_set(e, FL_EINVAL, "batch_norm: expected input [N,C,...] with at "
                   "least 2 dims, got %s", SH(x, s));
  if ((rc = need_float(op, x, "input", e))) return rc;
  for (p = 1; p < nin && p < 5; p++) {
    if (!in[p]) {
      if (p <= 2)
        return err_set(e, FL_EINVAL, "batch_norm: %s is missing", names[p]);
      continue;
    }
    if ((rc = check_vec(op, in[p], names[p], x->shape[1], "the channels of input", x,
                        e)) ||
        (rc = need_float(op, in[p], names[p], e)))
      return rc;
  }
  init_out(out, in, nin, x->dtype);
  copy_shape(out, x);
  return FL_OK;
}
