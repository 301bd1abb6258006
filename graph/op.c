/*
** op.c -- the op table built from ops.def, and the checks common to every
** op (argument count, sizes) around its own shape rule.
*/
#include <float.h>
#include <math.h>
#include <string.h>

#include "op.h"
#include "ref.h"
#include "size.h"

const op_info op_table[OP_COUNT] = {
#define NONE NULL        /* an op without a scalar or int64 form */
#define OP(id, name, mn, mx, kind, flags, infer, ref, sc, expr, isc, iexpr, grad, saves) \
  {name, mn, mx, kind, flags, infer, ref, sc, expr, isc, iexpr, grad, saves},
#include "ops.def"
#undef OP
#undef NONE
};

int op_differentiable(fl_op op) {
  return op >= 0 && op < OP_COUNT && op_table[op].grad != gr_none;
}

int op_is_reduce(fl_op op) {
  return op >= 0 && op < OP_COUNT && op_table[op].kind == OPK_REDUCTION &&
         !(op_table[op].flags & OPF_COMPOSITE);
}

int op_int_compute(fl_op op, const fl_dtype *dt, int nin) {
  int k, any = 0;
  if (op < 0 || op >= OP_COUNT || !op_table[op].iscalar) return 0;
  for (k = op == OP_WHERE ? 1 : 0; k < nin; k++) {
    if (dt[k] == FL_I64) any = 1;
    else if (dt[k] != FL_BOOL) return 0;
  }
  return any;
}

const char *op_name(fl_op op) {
  return (op >= 0 && op < OP_COUNT) ? op_table[op].name : "?";
}

const char *op_kind_name(op_kind k) {
  static const char *const names[] = {"elementwise", "broadcast", "injective",
                                      "reduction", "out-fusable", "opaque"};
  return (k >= 0 && k <= OPK_OPAQUE) ? names[k] : "?";
}

fl_op op_by_name(const char *name) {
  int i;
  for (i = 0; i < OP_COUNT; i++)
    if (strcmp(op_table[i].name, name) == 0) return (fl_op)i;
  return OP_COUNT;
}

void op_attrs_init(fl_op op, op_attrs *a) {
  memset(a, 0, sizeof *a);
  a->dtype = FL_F32;
  switch (op) {
  case OP_CLAMP: a->f[0] = -INFINITY; a->f[1] = INFINITY; break;
  case OP_LAYER_NORM: case OP_BATCH_NORM: a->f[0] = 1e-5; break;
  case OP_RMS_NORM: a->f[0] = FLT_EPSILON; break;
  case OP_VAR: a->f[0] = 1.0; break;
  case OP_DROPOUT: a->f[0] = 0.5; break;   /* PyTorch's default p */
  case OP_CONV2D: a->i[0] = a->i[1] = 1; a->i[6] = a->i[7] = 1; a->i[8] = 1; break;
  case OP_MAX_POOL2D: case OP_AVG_POOL2D: case OP_MAX_POOL2D_BACKWARD:
    a->i[8] = a->i[9] = 1;
    a->i[11] = 1;                           /* count_include_pad, PyTorch's default */
    break;
  default: break;
  }
}

void op_win2d_of(fl_op op, const op_attrs *a, int64_t kh, int64_t kw, op_win2d *w) {
  memset(w, 0, sizeof *w);
  if (op == OP_CONV2D) {
    w->kh = kh; w->kw = kw;
    w->sh = a->i[0]; w->sw = a->i[1];
    w->pt = a->i[2]; w->pl = a->i[3]; w->pb = a->i[4]; w->pr = a->i[5];
    w->dh = a->i[6]; w->dw = a->i[7]; w->groups = a->i[8];
    return;
  }
  w->kh = a->i[0]; w->kw = a->i[1];
  w->sh = a->i[2] ? a->i[2] : w->kh;
  w->sw = a->i[3] ? a->i[3] : w->kw;
  w->pt = a->i[4]; w->pl = a->i[5]; w->pb = a->i[6]; w->pr = a->i[7];
  w->dh = a->i[8]; w->dw = a->i[9]; w->groups = 1;
  w->ceil_mode = a->i[10] != 0;
  w->count_include_pad = a->i[11] != 0;
}

int64_t op_win_out(int64_t n, int64_t k, int64_t s, int64_t pb, int64_t pe,
                   int64_t d, int ceil_mode) {
  int64_t span, ext, o;
  if (s < 1 || k < 1 || d < 1) return 0;
  /* the padded size and the dilated kernel's extent, overflow-checked: an
  ** absurd padding leaves a result no allocation can hold */
  if (!sz_add(n, pb, &span) || !sz_add(span, pe, &span)) return INT64_MAX;
  if (!sz_mul(k - 1, d, &ext) || !sz_add(ext, 1, &ext)) return 0;
  span -= ext;
  if (span < 0) return 0;
  o = (ceil_mode ? span / s + (span % s != 0) : span / s) + 1;
  /* PyTorch: the last window must start inside the input or the left
  ** padding, else it is dropped */
  if (ceil_mode && (o - 1) * s >= n + pb) o--;
  return o;
}

int op_infer(fl_op op, const fl_meta *const *in, int nin, const op_attrs *a,
             fl_meta *out, fl_err *e) {
  const op_info *oi;
  int k, rc;
  if (op < 0 || op >= OP_COUNT)
    return err_set(e, FL_EINVAL, "unknown op %d", (int)op);
  oi = &op_table[op];
  if (nin < oi->min_args || nin > oi->max_args || (nin > 0 && !in[0])) {
    if (oi->min_args == oi->max_args)
      return err_set(e, FL_EINVAL, "%s: expected %d input(s), got %d",
                     oi->name, oi->min_args, nin);
    return err_set(e, FL_EINVAL, "%s: expected %d to %d inputs, got %d",
                   oi->name, oi->min_args, oi->max_args, nin);
  }
  /* views only rewrite metadata; anything else visits every element of
  ** its inputs, which an expanded view may name far too many of */
  for (k = 0; k < nin; k++) {
    const fl_meta *m = in[k];
    char sh[160];
    int64_t n;
    if (!m || m->ndim < 0 || m->ndim > FL_MAX_DIMS) continue;  /* the rule says */
    if ((rc = meta_check_extent(m, oi->name, e)) != FL_OK) return rc;
    if (oi->flags & OPF_VIEW || (n = meta_numel(m)) <= FL_MAX_NUMEL) continue;
    return err_set(e, FL_EINVAL, "%s: input %d %s is too large to compute on: "
                   "%lld elements, at most 2^40 = %lld", oi->name, k + 1,
                   meta_shape_str(m, sh, sizeof sh), (long long)n,
                   (long long)FL_MAX_NUMEL);
  }
  memset(out, 0, sizeof *out);
  if ((rc = oi->infer(op, in, nin, a, out, e)) != FL_OK) return rc;
  return meta_check_extent(out, oi->name, e);
}

/* --- rnn ----------------------------------------------------------------- */

static const char *const rnn_act_names[OP_RNN_ACT_COUNT] = {
  "default", "Sigmoid", "Tanh", "Relu", "Softsign", "Softplus"};

void op_rnn_of(const op_attrs *a, op_rnn *r) {
  /* ONNX's defaults: f = Sigmoid, g = h = Tanh (an RNN's one f is Tanh) */
  static const int dflt[3][3] = {
    {OP_RNN_ACT_TANH, OP_RNN_ACT_TANH, OP_RNN_ACT_TANH},
    {OP_RNN_ACT_SIGMOID, OP_RNN_ACT_TANH, OP_RNN_ACT_TANH},
    {OP_RNN_ACT_SIGMOID, OP_RNN_ACT_TANH, OP_RNN_ACT_TANH}};
  int d, k, cell = a->i[0] >= 0 && a->i[0] <= OP_RNN_CELL_LSTM ? (int)a->i[0] : 0;
  memset(r, 0, sizeof *r);
  r->cell = cell;
  r->gates = cell == OP_RNN_CELL_RNN ? 1 : cell == OP_RNN_CELL_GRU ? 3 : 4;
  r->dirs = a->i[1] == 2 ? 2 : 1;
  r->reverse = a->i[1] == 1;
  r->states = cell == OP_RNN_CELL_LSTM ? 2 : 1;
  r->lbr = a->i[2] != 0;
  r->clip_on = a->i[3] != 0;
  r->clip = a->f[0];
  for (d = 0; d < 2; d++)
    for (k = 0; k < 3; k++) {
      int64_t v = a->i[4 + 3 * d + k];
      r->act[d][k] = v > 0 && v < OP_RNN_ACT_COUNT ? (int)v : dflt[cell][k];
    }
}

double op_rnn_act(int act, double x) {
  switch (act) {
  case OP_RNN_ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
  case OP_RNN_ACT_TANH: return tanh(x);
  case OP_RNN_ACT_RELU: return x < 0 ? 0 : x;
  case OP_RNN_ACT_SOFTSIGN: return x / (1.0 + fabs(x));
  case OP_RNN_ACT_SOFTPLUS: return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
  default: return x;
  }
}

const char *op_rnn_act_name(int act) {
  return act >= 0 && act < OP_RNN_ACT_COUNT ? rnn_act_names[act] : "?";
}

int op_rnn_act_by_name(const char *name) {
  int k;
  for (k = 1; k < OP_RNN_ACT_COUNT; k++)
    if (strcmp(rnn_act_names[k], name) == 0) return k;
  return OP_RNN_ACT_DEFAULT;
}
