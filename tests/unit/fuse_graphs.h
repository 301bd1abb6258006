/*
** fuse_graphs.h -- small graph builders shared by the fusion, codegen and
** differential tests and the fusion benchmark: softmax, layer_norm and
** rms_norm in composite and decomposed forms, an MLP, a conv-bn-relu block
** and a transformer-style block.  Every builder returns a graph the caller
** frees, or NULL.
*/
#ifndef FL_FUSE_GRAPHS_H
#define FL_FUSE_GRAPHS_H

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "graph/ir.h"
#include "graph/rng.h"

static inline fl_meta fg_meta(fl_dtype dt, int nd, ...) {
  fl_meta m;
  va_list ap;
  int d;
  memset(&m, 0, sizeof m);
  m.dtype = dt;
  m.ndim = nd;
  va_start(ap, nd);
  for (d = 0; d < nd; d++) m.shape[d] = va_arg(ap, int64_t);
  va_end(ap);
  return m;
}

#define FG_SHAPE(...) __VA_ARGS__

static inline int fg_input(ir_graph *g, fl_meta m) {
  fl_err e;
  return ir_add_input(g, &m, "x", &e);
}

/* a parameter filled with values in [-1, 1) from a fixed pattern */
static inline int fg_param(ir_graph *g, fl_meta m, const char *name, double scale, double shift) {
  fl_tensor t;
  fl_err e;
  int64_t i, n;
  int id;
  if (ten_empty(&t, &m, &e)) return -1;
  n = meta_numel(&m);
  for (i = 0; i < n; i++) ten_set(&t, i, shift + scale * (double)((i * 7919 + 13) % 2003 - 1001) / 1001.0);
  id = ir_add_param(g, &t, name, &e);
  ten_release(&t);
  return id;
}

static inline int fg_scalar(ir_graph *g, double v) {
  fl_meta m = fg_meta(FL_F32, 0);
  fl_tensor t;
  fl_err e;
  int id;
  if (ten_empty(&t, &m, &e)) return -1;
  ten_set(&t, 0, v);
  id = ir_add_const(g, &t, &e);
  ten_release(&t);
  return id;
}

static inline int fg_op(ir_graph *g, fl_op op, int a, int b, int c) {
  op_attrs at;
  int in[3] = {a, b, c}, n = c != -2 ? 3 : b != -2 ? 2 : 1;
  fl_err e;
  op_attrs_init(op, &at);
  return ir_add_op(g, op, in, n, &at, NULL, NULL, &e);
}
#define fg_un(g, op, a) fg_op(g, op, a, -2, -2)
#define fg_bin(g, op, a, b) fg_op(g, op, a, b, -2)

static inline int fg_red(ir_graph *g, fl_op op, int x, int dim, int keep) {
  op_attrs at;
  fl_err e;
  op_attrs_init(op, &at);
  at.ndims = 1;
  at.dims[0] = dim;
  at.keepdim = keep;
  return ir_add_op(g, op, &x, 1, &at, NULL, NULL, &e);
}

static inline int fg_attr(ir_graph *g, fl_op op, const int *in, int nin, const op_attrs *at) {
  fl_err e;
  return ir_add_op(g, op, in, nin, at, NULL, NULL, &e);
}

static inline int fg_transpose(ir_graph *g, int x, int a, int b) {
  op_attrs at;
  op_attrs_init(OP_TRANSPOSE, &at);
  at.i[0] = a;
  at.i[1] = b;
  return fg_attr(g, OP_TRANSPOSE, &x, 1, &at);
}

/* softmax over the last dim of [rows, cols], composite or decomposed */
static inline ir_graph *fg_softmax(int64_t rows, int64_t cols, int decomposed, int logform) {
  ir_graph *g = ir_new();
  int x = fg_input(g, fg_meta(FL_F32, 2, rows, cols)), y;
  if (!decomposed) {
    op_attrs at;
    op_attrs_init(OP_SOFTMAX, &at);
    at.i[0] = 1;
    y = fg_attr(g, logform ? OP_LOG_SOFTMAX : OP_SOFTMAX, &x, 1, &at);
  } else {
    int m = fg_red(g, OP_AMAX, x, 1, 1);
    int d = fg_bin(g, OP_SUB, x, m);
    int ex = fg_un(g, OP_EXP, d);
    int s = fg_red(g, OP_SUM, ex, 1, 1);
    y = logform ? fg_bin(g, OP_SUB, d, fg_un(g, OP_LOG, s)) : fg_bin(g, OP_DIV, ex, s);
  }
  ir_add_output(g, y, NULL);
  return g;
}

/* layer_norm (rms=0) or rms_norm (rms=1) over the last dim, with weight
** (and bias for layer_norm) */
static inline ir_graph *fg_norm(int64_t rows, int64_t cols, int decomposed, int rms) {
  ir_graph *g = ir_new();
  int x = fg_input(g, fg_meta(FL_F32, 2, rows, cols));
  int w = fg_param(g, fg_meta(FL_F32, 1, cols), "w", 0.5, 1.0);
  int b = rms ? -1 : fg_param(g, fg_meta(FL_F32, 1, cols), "b", 0.5, 0.0);
  int y;
  if (!decomposed) {
    op_attrs at;
    int in[3] = {x, w, b};
    op_attrs_init(rms ? OP_RMS_NORM : OP_LAYER_NORM, &at);
    at.i[0] = 1;
    y = fg_attr(g, rms ? OP_RMS_NORM : OP_LAYER_NORM, in, rms ? 2 : 3, &at);
  } else if (!rms) {
    int m = fg_red(g, OP_MEAN, x, 1, 1);
    int d = fg_bin(g, OP_SUB, x, m);
    int q = fg_bin(g, OP_MUL, d, d);
    int v = fg_red(g, OP_MEAN, q, 1, 1);
    int ve = fg_bin(g, OP_ADD, v, fg_scalar(g, 1e-5));
    int r = fg_un(g, OP_RSQRT, ve);
    int n = fg_bin(g, OP_MUL, d, r);
    y = fg_bin(g, OP_ADD, fg_bin(g, OP_MUL, n, w), b);
  } else {
    int q = fg_bin(g, OP_MUL, x, x);
    int ms = fg_red(g, OP_MEAN, q, 1, 1);
    int r = fg_un(g, OP_RSQRT, fg_bin(g, OP_ADD, ms, fg_scalar(g, 1.1920928955078125e-07)));
    y = fg_bin(g, OP_MUL, fg_bin(g, OP_MUL, x, r), w);
  }
  ir_add_output(g, y, NULL);
  return g;
}

static inline int fg_linear(ir_graph *g, int x, int64_t in, int64_t out, const char *name) {
  int w = fg_param(g, fg_meta(FL_F32, 2, out, in), name, 0.5 / 8, 0.0);
  int b = fg_param(g, fg_meta(FL_F32, 1, out), name, 0.1, 0.0);
  int args[3] = {x, w, b};
  op_attrs at;
  op_attrs_init(OP_LINEAR, &at);
  return fg_attr(g, OP_LINEAR, args, 3, &at);
}

/* linear -> gelu -> linear */
static inline ir_graph *fg_mlp(int64_t batch, int64_t d, int64_t hidden) {
  ir_graph *g = ir_new();
  int x = fg_input(g, fg_meta(FL_F32, 2, batch, d));
  int h = fg_un(g, OP_GELU, fg_linear(g, x, d, hidden, "fc1"));
  ir_add_output(g, fg_linear(g, h, hidden, d, "fc2"), NULL);
  return g;
}

/* conv2d(3x3, padding 1) -> batch_norm -> relu */
static inline ir_graph *fg_conv_bn_relu(int64_t n, int64_t ci, int64_t co, int64_t hw) {
  ir_graph *g = ir_new();
  int x = fg_input(g, fg_meta(FL_F32, 4, n, ci, hw, hw));
  int w = fg_param(g, fg_meta(FL_F32, 4, co, ci, (int64_t)3, (int64_t)3), "conv.weight", 0.3, 0.0);
  int mean = fg_param(g, fg_meta(FL_F32, 1, co), "bn.mean", 0.1, 0.0);
  int var = fg_param(g, fg_meta(FL_F32, 1, co), "bn.var", 0.2, 1.0);
  int bw = fg_param(g, fg_meta(FL_F32, 1, co), "bn.weight", 0.3, 1.0);
  int bb = fg_param(g, fg_meta(FL_F32, 1, co), "bn.bias", 0.1, 0.0);
  int args[5], c, bn;
  op_attrs at;
  op_attrs_init(OP_CONV2D, &at);
  at.i[0] = at.i[1] = 1;
  at.i[2] = at.i[3] = at.i[4] = at.i[5] = 1;
  args[0] = x; args[1] = w;
  c = fg_attr(g, OP_CONV2D, args, 2, &at);
  op_attrs_init(OP_BATCH_NORM, &at);
  args[0] = c; args[1] = mean; args[2] = var; args[3] = bw; args[4] = bb;
  bn = fg_attr(g, OP_BATCH_NORM, args, 5, &at);
  ir_add_output(g, fg_un(g, OP_RELU, bn), NULL);
  return g;
}

static inline int fg_ln(ir_graph *g, int x, int64_t d, const char *name) {
  int w = fg_param(g, fg_meta(FL_F32, 1, d), name, 0.2, 1.0);
  int b = fg_param(g, fg_meta(FL_F32, 1, d), name, 0.1, 0.0);
  int in[3] = {x, w, b};
  op_attrs at;
  op_attrs_init(OP_LAYER_NORM, &at);
  at.i[0] = 1;
  return fg_attr(g, OP_LAYER_NORM, in, 3, &at);
}

static inline int fg_reshape(ir_graph *g, int x, int nd, const int64_t *shape) {
  op_attrs at;
  int d;
  op_attrs_init(OP_RESHAPE, &at);
  at.ndims = nd;
  for (d = 0; d < nd; d++) at.dims[d] = shape[d];
  return fg_attr(g, OP_RESHAPE, &x, 1, &at);
}

/* [batch, seq, d] -> [batch, heads, seq, d / heads] */
static inline int fg_split_heads(ir_graph *g, int x, int64_t batch, int64_t seq, int64_t d, int64_t heads) {
  const int64_t sh[4] = {batch, seq, heads, d / heads};
  return fg_transpose(g, fg_reshape(g, x, 4, sh), 1, 2);
}

/* GPT-style block: x + attn(ln1(x)), then + mlp(ln2(.)), on [batch, seq,
** d] with `heads` attention heads (1: no head split, the graph the kernel
** counts in the tests are for). */
static inline ir_graph *fg_block_heads(int64_t batch, int64_t seq, int64_t d, int64_t heads) {
  ir_graph *g = ir_new();
  int x = fg_input(g, fg_meta(FL_F32, 3, batch, seq, d));
  int h = fg_ln(g, x, d, "ln1");
  int q = fg_linear(g, h, d, d, "q"), k = fg_linear(g, h, d, d, "k"), v = fg_linear(g, h, d, d, "v");
  int last = heads > 1 ? 3 : 2;
  op_attrs at;
  int s, sc, p, a, o, x2, f;
  if (heads > 1) {
    q = fg_split_heads(g, q, batch, seq, d, heads);
    k = fg_split_heads(g, k, batch, seq, d, heads);
    v = fg_split_heads(g, v, batch, seq, d, heads);
  }
  s = fg_bin(g, OP_MATMUL, q, fg_transpose(g, k, last - 1, last));
  sc = fg_bin(g, OP_MUL, s, fg_scalar(g, 1.0 / sqrt((double)(d / heads))));
  op_attrs_init(OP_SOFTMAX, &at);
  at.i[0] = last;
  p = fg_attr(g, OP_SOFTMAX, &sc, 1, &at);
  a = fg_bin(g, OP_MATMUL, p, v);
  if (heads > 1) {
    const int64_t sh[3] = {batch, seq, d};
    a = fg_reshape(g, fg_transpose(g, a, 1, 2), 3, sh);
  }
  o = fg_linear(g, a, d, d, "o");
  x2 = fg_bin(g, OP_ADD, x, o);
  f = fg_un(g, OP_GELU, fg_linear(g, fg_ln(g, x2, d, "ln2"), d, 4 * d, "fc1"));
  ir_add_output(g, fg_bin(g, OP_ADD, x2, fg_linear(g, f, 4 * d, d, "fc2")), NULL);
  return g;
}

static inline ir_graph *fg_block(int64_t batch, int64_t seq, int64_t d) {
  return fg_block_heads(batch, seq, d, 1);
}

/* --- one op at a time ----------------------------------------------------- */

static inline int fg_op_in(ir_graph *g, fl_dtype dt, int nd, int64_t a, int64_t b, int64_t c, int64_t d) {
  fl_meta m;
  fl_err e;
  memset(&m, 0, sizeof m);
  m.dtype = dt; m.ndim = nd;
  m.shape[0] = a; m.shape[1] = b; m.shape[2] = c; m.shape[3] = d;
  return ir_add_input(g, &m, "x", &e);
}

static inline int fg_op_par(ir_graph *g, fl_dtype dt, int nd, int64_t a, int64_t b, int64_t c, int64_t d) {
  fl_meta m;
  memset(&m, 0, sizeof m);
  m.dtype = dt; m.ndim = nd;
  m.shape[0] = a; m.shape[1] = b; m.shape[2] = c; m.shape[3] = d;
  return fg_param(g, m, "w", 0.5, 0.0);
}

/* One graph per op and dtype (NULL where the dtype is not legal for the
** op): the op over small inputs (integer inputs index dims of 4 or more:
** give them values in [0, 3]), then (epi) relu of its result.  The
** every-op tests of both code generators walk ops.def with it. */
static inline ir_graph *fg_op_graph(fl_op op, fl_dtype dt, int epi) {
  ir_graph *g = ir_new();
  op_attrs a;
  fl_err e;
  int in[8], n = 1, y, x;
  op_attrs_init(op, &a);
  x = fg_op_in(g, dt, 2, 4, 33, 0, 0);
  in[0] = x;
  switch (op) {
  case OP_TO: a.dtype = dt == FL_F32 ? FL_F16 : FL_F32; break;
  case OP_CLAMP: a.f[0] = -0.5; a.f[1] = 0.5; break;
  case OP_WHERE:
    in[0] = fg_op_in(g, FL_BOOL, 2, 4, 33, 0, 0);
    in[1] = x; in[2] = fg_op_in(g, dt, 1, 33, 0, 0, 0); n = 3;
    break;
  case OP_SUM: case OP_MEAN: case OP_AMAX: case OP_AMIN: case OP_VAR: case OP_ARGMAX:
    a.ndims = 1; a.dims[0] = 1;
    break;
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: a.i[0] = 1; break;
  case OP_LAYER_NORM: a.i[0] = 1; in[1] = fg_op_par(g, dt, 1, 33, 0, 0, 0); in[2] = fg_op_par(g, dt, 1, 33, 0, 0, 0); n = 3; break;
  case OP_RMS_NORM: a.i[0] = 1; in[1] = fg_op_par(g, dt, 1, 33, 0, 0, 0); n = 2; break;
  case OP_MATMUL: in[1] = fg_op_par(g, dt, 2, 33, 12, 0, 0); n = 2; break;
  case OP_LINEAR: in[1] = fg_op_par(g, dt, 2, 12, 33, 0, 0); in[2] = fg_op_par(g, dt, 1, 12, 0, 0, 0); n = 3; break;
  case OP_CONV2D:
    in[0] = fg_op_in(g, dt, 4, 2, 3, 8, 8);
    in[1] = fg_op_par(g, dt, 4, 4, 3, 3, 3); in[2] = fg_op_par(g, dt, 1, 4, 0, 0, 0); n = 3;
    a.i[0] = a.i[1] = 1; a.i[2] = a.i[3] = a.i[4] = a.i[5] = 1;
    break;
  case OP_MAX_POOL2D: case OP_AVG_POOL2D:
    in[0] = fg_op_in(g, dt, 4, 2, 3, 8, 8);
    a.i[0] = a.i[1] = 2; a.i[2] = a.i[3] = 2;
    break;
  case OP_MAX_POOL2D_BACKWARD:   /* overlapping windows: 3x3, stride 2, pad 1 */
    in[0] = fg_op_in(g, dt, 4, 2, 3, 4, 4);
    in[1] = fg_op_in(g, dt, 4, 2, 3, 8, 8); n = 2;
    a.i[0] = a.i[1] = 3; a.i[2] = a.i[3] = 2; a.i[4] = a.i[5] = a.i[6] = a.i[7] = 1;
    break;
  case OP_BATCH_NORM:
    in[0] = fg_op_in(g, dt, 4, 2, 3, 4, 4);
    in[1] = fg_op_par(g, dt, 1, 3, 0, 0, 0); in[2] = fg_op_par(g, dt, 1, 3, 0, 0, 0);
    in[3] = fg_op_par(g, dt, 1, 3, 0, 0, 0); in[4] = fg_op_par(g, dt, 1, 3, 0, 0, 0); n = 5;
    break;
  case OP_RESHAPE: case OP_VIEW: a.ndims = 2; a.dims[0] = 33; a.dims[1] = 4; break;
  case OP_TRANSPOSE: a.i[0] = 0; a.i[1] = 1; break;
  case OP_PERMUTE: a.ndims = 2; a.dims[0] = 1; a.dims[1] = 0; break;
  case OP_UNSQUEEZE: a.i[0] = 1; break;
  case OP_SQUEEZE:
    in[0] = fg_op_in(g, dt, 3, 4, 1, 33, 0);
    a.i[0] = 1; a.i[1] = 1;
    break;
  case OP_EXPAND:
    in[0] = fg_op_in(g, dt, 2, 1, 33, 0, 0);
    a.ndims = 2; a.dims[0] = 4; a.dims[1] = 33;
    break;
  case OP_NARROW: a.i[0] = 1; a.i[1] = 3; a.i[2] = 20; break;
  case OP_SLICE: a.i[0] = 1; a.i[1] = 3; a.i[2] = 10; a.i[3] = 3; break;
  case OP_PAD: a.ndims = 2; a.dims[0] = 1; a.dims[1] = -2; a.i[0] = 0; a.i[1] = 3; a.i[8] = 1; break;
  case OP_FLIP: a.ndims = 1; a.dims[0] = 1; break;
  case OP_CUMSUM: a.i[0] = 1; a.i[2] = 1; break;
  case OP_GATHER: in[1] = fg_op_in(g, FL_I64, 2, 2, 3, 0, 0); n = 2; a.i[0] = 1; break;
  case OP_INDEX_ADD:   /* src [2, 4, 33] into 5 rows */
    in[0] = fg_op_in(g, dt, 3, 2, 4, 33, 0);
    in[1] = fg_op_in(g, FL_I64, 1, 4, 0, 0, 0); n = 2; a.i[0] = 5;
    break;
  case OP_MATMUL_INT8:   /* uint8 [4, 33] @ int8 [33, 12], zero points of both */
    in[1] = fg_op_par(g, dt, 2, 33, 12, 0, 0);
    in[2] = fg_op_par(g, dt, 1, 4, 0, 0, 0); in[3] = fg_op_par(g, dt, 0, 0, 0, 0, 0); n = 4;
    a.i[0] = 1;
    break;
  case OP_RNN:   /* an LSTM over X [5, 2, 4], H 3 */
    in[0] = fg_op_in(g, dt, 3, 5, 2, 4, 0);
    in[1] = fg_op_par(g, dt, 3, 1, 12, 4, 0); in[2] = fg_op_par(g, dt, 3, 1, 12, 3, 0); n = 3;
    a.i[0] = OP_RNN_CELL_LSTM;
    break;
  case OP_RAND: case OP_RANDN:
    /* no inputs: x stays as an unused graph input */
    n = 0; a.ndims = 2; a.dims[0] = 4; a.dims[1] = 33; a.dtype = dt;
    break;
  case OP_DROPOUT: a.f[0] = 0.25; break;
  case OP_CAT: in[1] = fg_op_in(g, dt, 2, 4, 5, 0, 0); n = 2; a.i[0] = 1; break;
  case OP_EMBEDDING:
    in[0] = fg_op_in(g, FL_I64, 1, 5, 0, 0, 0);
    in[1] = fg_op_par(g, dt, 2, 10, 8, 0, 0); n = 2;
    break;
  default:
    if (op_info_of(op)->kind == OPK_BROADCAST) { in[1] = fg_op_in(g, dt, 1, 33, 0, 0, 0); n = 2; }
    break;
  }
  y = ir_add_op(g, op, in, n, &a, NULL, NULL, &e);
  if (y < 0) { ir_free(g); return NULL; }
  if (epi && dtype_is_float(g->nodes[y].meta.dtype)) {
    op_attrs r;
    op_attrs_init(OP_RELU, &r);
    y = ir_add_op(g, OP_RELU, &y, 1, &r, NULL, NULL, &e);
    if (y < 0) { ir_free(g); return NULL; }
  }
  ir_add_output(g, y, NULL);
  return g;
}

#endif
