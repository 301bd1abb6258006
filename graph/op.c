/*
** op.c -- the op table built from ops.def, and the checks common to every
** op (argument count, sizes) around its own shape rule.
*/
#include <float.h>
#include <math.h>
#include <string.h>

#include "op.h"
#include "ref.h"

const op_info op_table[OP_COUNT] = {
#define OP(id, name, mn, mx, kind, flags, infer, ref, sc, expr, isc, iexpr) \
  {name, mn, mx, kind, flags, infer, ref, sc, expr, isc, iexpr},
#include "ops.def"
#undef OP
};

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
  default: break;
  }
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
