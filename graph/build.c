/*
** build.c -- the graph constructors of build.h.
*/
#include <string.h>

#include "build.h"

void gb_init(gbuild *b, ir_graph *g, fl_err *e) {
  memset(b, 0, sizeof *b);
  b->g = g;
  b->e = e;
}

const fl_meta *gb_meta(const gbuild *b, int x) {
  return &b->g->nodes[x].meta;
}

int gb_op_sym(gbuild *b, fl_op op, const op_attrs *a, int nin, const int *in,
              const int *asym) {
  int id;
  if (b->rc) return -1;
  id = ir_add_op_sym(b->g, op, in, nin, a, asym, b->where, b->scope, b->e);
  if (id < 0) { b->rc = id; return -1; }
  return id;
}

int gb_op(gbuild *b, fl_op op, const op_attrs *a, int nin, const int *in) {
  return gb_op_sym(b, op, a, nin, in, NULL);
}

int gb_op1(gbuild *b, fl_op op, int x) {
  op_attrs a;
  op_attrs_init(op, &a);
  return gb_op(b, op, &a, 1, &x);
}

int gb_op2(gbuild *b, fl_op op, int x, int y) {
  op_attrs a;
  int in[2];
  in[0] = x;
  in[1] = y;
  op_attrs_init(op, &a);
  return gb_op(b, op, &a, 2, in);
}

int gb_op3(gbuild *b, fl_op op, int x, int y, int z) {
  op_attrs a;
  int in[3];
  in[0] = x;
  in[1] = y;
  in[2] = z;
  op_attrs_init(op, &a);
  return gb_op(b, op, &a, 3, in);
}

int gb_tensor(gbuild *b, const fl_tensor *t) {
  int id;
  if (b->rc) return -1;
  id = ir_add_const(b->g, t, b->e);
  if (id < 0) { b->rc = id; return -1; }
  return id;
}

static int scalar(gbuild *b, fl_dtype dt, double v, int64_t iv) {
  fl_tensor t = {0};
  fl_meta m;
  int id, rc;
  if (b->rc) return -1;
  memset(&m, 0, sizeof m);
  m.dtype = dt;
  m.wrapped = 1;
  rc = ten_empty(&t, &m, b->e);
  if (rc) { b->rc = rc; return -1; }
  if (dt == FL_I64) ten_set_i64(&t, 0, iv);
  else ten_set(&t, 0, v);
  id = gb_tensor(b, &t);
  ten_release(&t);
  return id;
}

int gb_const(gbuild *b, double v) { return scalar(b, b->wide ? FL_F64 : FL_F32, v, 0); }
int gb_iconst(gbuild *b, int64_t v) { return scalar(b, FL_I64, 0, v); }

int gb_reduce(gbuild *b, fl_op op, int x, const int *dims, int nd, int keepdim) {
  op_attrs a;
  int k;
  if (b->rc) return -1;
  op_attrs_init(op, &a);
  for (k = 0; k < nd; k++) a.dims[a.ndims++] = dims[k];
  a.keepdim = keepdim;
  return gb_op(b, op, &a, 1, &x);
}

int gb_reduce_tail(gbuild *b, fl_op op, int x, int from) {
  op_attrs a;
  int d, nd;
  if (b->rc) return -1;
  nd = gb_meta(b, x)->ndim;
  op_attrs_init(op, &a);
  for (d = from; d < nd; d++) a.dims[a.ndims++] = d;
  a.keepdim = 1;
  if (op == OP_VAR) a.f[0] = 0;
  return gb_op(b, op, &a, 1, &x);
}

int gb_reduce_dim(gbuild *b, fl_op op, int x, int dim) {
  return gb_reduce(b, op, x, &dim, 1, 1);
}

static int shaped(gbuild *b, fl_op op, int x, int ndim, const int64_t *shape) {
  op_attrs a;
  if (b->rc) return -1;
  op_attrs_init(op, &a);
  a.ndims = ndim;
  memcpy(a.dims, shape, (size_t)ndim * sizeof *shape);
  return gb_op(b, op, &a, 1, &x);
}

int gb_reshape(gbuild *b, int x, int ndim, const int64_t *shape) {
  return shaped(b, OP_RESHAPE, x, ndim, shape);
}

int gb_expand(gbuild *b, int x, int ndim, const int64_t *shape) {
  return shaped(b, OP_EXPAND, x, ndim, shape);
}

int gb_transpose(gbuild *b, int x, int d0, int d1) {
  op_attrs a;
  op_attrs_init(OP_TRANSPOSE, &a);
  a.i[0] = d0;
  a.i[1] = d1;
  return gb_op(b, OP_TRANSPOSE, &a, 1, &x);
}

int gb_permute(gbuild *b, int x, int ndim, const int *perm) {
  op_attrs a;
  int d;
  op_attrs_init(OP_PERMUTE, &a);
  a.ndims = ndim;
  for (d = 0; d < ndim; d++) a.dims[d] = perm[d];
  return gb_op(b, OP_PERMUTE, &a, 1, &x);
}

int gb_device_ones(gbuild *b, int like, fl_dtype dt, int ndim, const int64_t *shape) {
  int64_t ones[FL_MAX_DIMS];
  int v = like, d, one, n;
  op_attrs a;
  if (b->rc) return -1;
  n = gb_meta(b, like)->ndim;
  for (d = 0; d < n && v >= 0; d++) {
    op_attrs_init(OP_NARROW, &a);
    a.i[0] = d; a.i[1] = 0; a.i[2] = 1;
    v = gb_op(b, OP_NARROW, &a, 1, &v);
  }
  for (d = 0; d < ndim; d++) ones[d] = 1;
  v = gb_reshape(b, v, ndim, ones);
  one = gb_cast(b, gb_const(b, 1.0), dt);
  return gb_expand(b, gb_op3(b, OP_WHERE, gb_op2(b, OP_EQ, v, v), one, one), ndim, shape);
}

int gb_cast(gbuild *b, int x, fl_dtype dt) {
  op_attrs a;
  if (b->rc) return -1;
  if (gb_meta(b, x)->dtype == dt) return x;
  op_attrs_init(OP_TO, &a);
  a.dtype = dt;
  return gb_op(b, OP_TO, &a, 1, &x);
}

int gb_sum_to(gbuild *b, int x, const fl_meta *to) {
  const fl_meta *xm;
  fl_meta m;
  int dims[FL_MAX_DIMS], nd = 0, lead, d;
  if (b->rc) return -1;
  m = *to;          /* a copy: `to` may be a node's, and new nodes move them */
  xm = gb_meta(b, x);
  if (meta_same_shape(xm, &m)) return x;
  lead = xm->ndim - m.ndim;
  for (d = 0; d < xm->ndim; d++)
    if (d < lead || (m.shape[d - lead] == 1 && xm->shape[d] != 1)) dims[nd++] = d;
  if (nd) x = gb_reduce(b, OP_SUM, x, dims, nd, 1);
  return gb_reshape(b, x, m.ndim, m.shape);
}
