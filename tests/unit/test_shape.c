/*
** test_shape.c -- the shape and dtype rule of every op in ops.def against
** hand-worked results, NumPy broadcasting, and the text of the errors a
** user sees for wrong shapes, dtypes and dims.  The last test fails when
** an op row is added to ops.def without a test here.
*/
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "graph/op.h"
#include "tap.h"

static int tested[OP_COUNT];

static fl_meta meta(fl_dtype dt, int nd, ...) {
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
#define NARGS(...) NARGS_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define NARGS_(a, b, c, d, e, f, g, h, n, ...) n
#define T(dt, ...) meta(dt, NARGS(__VA_ARGS__), __VA_ARGS__)
#define F32(...) T(FL_F32, __VA_ARGS__)
#define I64(...) T(FL_I64, __VA_ARGS__)
#define SCALAR(dt) meta(dt, 0)
#define I(x) ((int64_t)(x))

/* a Lua number as the bindings pass it: a wrapped 0-dim tensor */
static fl_meta number(fl_dtype dt) {
  fl_meta m = meta(dt, 0);
  m.wrapped = 1;
  return m;
}

static int run(fl_op op, const fl_meta *const *in, int nin, const op_attrs *a,
               fl_meta *out, fl_err *e) {
  op_attrs def;
  tested[op] = 1;
  if (!a) { op_attrs_init(op, &def); a = &def; }
  err_clear(e);
  return op_infer(op, in, nin, a, out, e);
}

/* op over inputs must give shape and dtype */
static void expect(fl_op op, const fl_meta *const *in, int nin,
                   const op_attrs *a, const char *shape, fl_dtype dt,
                   const char *what) {
  fl_meta out;
  fl_err e;
  char buf[128];
  int rc = run(op, in, nin, a, &out, &e);
  if (!ok(rc == FL_OK, "%s %s: inferred", op_name(op), what)) {
    printf("#   %s\n", e.msg);
    return;
  }
  is_str(meta_shape_str(&out, buf, sizeof buf), shape, "%s %s: shape",
         op_name(op), what);
  is_str(dtype_name(out.dtype), dtype_name(dt), "%s %s: dtype", op_name(op), what);
  ok(!out.wrapped, "%s %s: not wrapped", op_name(op), what);
}

/* op over inputs must fail with exactly msg */
static void expect_err(fl_op op, const fl_meta *const *in, int nin,
                       const op_attrs *a, const char *msg) {
  fl_meta out;
  fl_err e;
  int rc = run(op, in, nin, a, &out, &e);
  ok(rc == FL_EINVAL, "%s: refused (%s)", op_name(op), msg);
  is_str(e.msg, msg, "%s: error text", op_name(op));
}

#define IN(...) ((const fl_meta *const[]){__VA_ARGS__})
#define NIN(...) (int)(sizeof((const fl_meta *[]){__VA_ARGS__}) / sizeof(fl_meta *))
#define EXPECT(op, a, shape, dt, what, ...) \
  expect(op, IN(__VA_ARGS__), NIN(__VA_ARGS__), a, shape, dt, what)
#define EXPECT_ERR(op, a, msg, ...) \
  expect_err(op, IN(__VA_ARGS__), NIN(__VA_ARGS__), a, msg)

static void test_broadcast(void) {
  fl_meta a = F32(I(2), I(1), I(3)), b = F32(I(4), I(1)), c = F32(I(0)),
          d = F32(I(5), I(1)), s = SCALAR(FL_F32), out;
  fl_err e;
  char buf[64];
  ok(op_broadcast_shapes("add", &a, &b, &out, &e) == FL_OK &&
     strcmp(meta_shape_str(&out, buf, sizeof buf), "[2,4,3]") == 0,
     "[2,1,3] with [4,1] is [2,4,3]");
  ok(op_broadcast_shapes("add", &d, &c, &out, &e) == FL_OK &&
     strcmp(meta_shape_str(&out, buf, sizeof buf), "[5,0]") == 0,
     "[5,1] with [0] is [5,0]: size 1 stretches to 0");
  ok(op_broadcast_shapes("add", &s, &a, &out, &e) == FL_OK &&
     strcmp(meta_shape_str(&out, buf, sizeof buf), "[2,1,3]") == 0,
     "a scalar broadcasts to anything");
  ok(op_broadcast_shapes("add", &s, &s, &out, &e) == FL_OK && out.ndim == 0,
     "two scalars give a scalar");
  b = F32(I(4), I(2));
  is_int(op_broadcast_shapes("mul", &a, &b, &out, &e), FL_EINVAL, "[2,1,3] vs [4,2]");
  is_str(e.msg, "mul: shapes [2,1,3] and [4,2] cannot be broadcast (size 3 vs "
         "2 at dim -1)", "broadcast error names op, shapes and sizes");
  b = F32(I(3), I(3));
  ok(op_broadcast_shapes("add", &a, &b, &out, &e) == FL_OK &&
     strcmp(meta_shape_str(&out, buf, sizeof buf), "[2,3,3]") == 0,
     "[2,1,3] with [3,3] is [2,3,3]");
  b = F32(I(3), I(2));
  is_int(op_broadcast_shapes("add", &a, &b, &out, &e), FL_EINVAL, "[2,1,3] vs [3,2]");
  b = F32(I(2), I(0));
  a = F32(I(3), I(1));
  is_int(op_broadcast_shapes("add", &a, &b, &out, &e), FL_EINVAL, "[3,1] vs [2,0]");
  is_str(e.msg, "add: shapes [3,1] and [2,0] cannot be broadcast (size 3 vs 2 "
         "at dim -2)", "0-size dims only pair with 1 or 0");
}

static void test_elementwise(void) {
  static const fl_op unary_float[] = {OP_EXP, OP_LOG, OP_SQRT, OP_RSQRT,
    OP_SIN, OP_COS, OP_ASIN, OP_ACOS, OP_ATAN, OP_TANH, OP_SIGMOID, OP_GELU, OP_GELU_TANH,
    OP_SILU, OP_ERF};
  static const fl_op keep[] = {OP_ABS, OP_NEG, OP_RELU, OP_CLAMP};
  static const fl_op cmp[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
  fl_meta x = F32(I(2), I(3)), xi = I64(I(2), I(3)), xb = T(FL_BOOL, I(4)),
          xh = T(FL_F16, I(2), I(3)), row = F32(I(3)), fnum = number(FL_F32),
          inum = number(FL_I64), f16s = SCALAR(FL_F16), col = I64(I(2), I(1));
  op_attrs a;
  size_t k;

  op_attrs_init(OP_TO, &a);
  a.dtype = FL_BF16;
  EXPECT(OP_TO, &a, "[2,3]", FL_BF16, "to bfloat16", &x);
  a.dtype = FL_I64;
  EXPECT(OP_TO, &a, "[2,3]", FL_I64, "float16 to int64", &xh);
  for (k = 0; k < sizeof unary_float / sizeof *unary_float; k++) {
    EXPECT(unary_float[k], NULL, "[2,3]", FL_F32, "of int64 is float32", &xi);
    EXPECT(unary_float[k], NULL, "[2,3]", FL_F16, "keeps float16", &xh);
    EXPECT(unary_float[k], NULL, "[4]", FL_F32, "of bool is float32", &xb);
  }
  for (k = 0; k < sizeof keep / sizeof *keep; k++) {
    EXPECT(keep[k], NULL, "[2,3]", FL_I64, "keeps int64", &xi);
    EXPECT(keep[k], NULL, "[]", FL_F16, "of a scalar", &f16s);
  }
  EXPECT_ERR(OP_NEG, NULL, "neg: negation of a bool tensor [4] is not supported", &xb);

  EXPECT(OP_ADD, NULL, "[2,3]", FL_F32, "[2,3] + [3]", &x, &row);
  EXPECT(OP_ADD, NULL, "[2,3]", FL_F32, "int tensor + float number", &xi, &fnum);
  EXPECT(OP_ADD, NULL, "[2,3]", FL_I64, "int tensor + int number", &xi, &inum);
  EXPECT(OP_SUB, NULL, "[2,3]", FL_F16, "float16 - float number", &xh, &fnum);
  EXPECT(OP_MUL, NULL, "[2,3]", FL_F32, "float16 * float32", &xh, &x);
  EXPECT(OP_MUL, NULL, "[4]", FL_BOOL, "bool * bool", &xb, &xb);
  EXPECT(OP_ADD, NULL, "[2,3]", FL_F16, "int64 + 0-dim float16", &xi, &f16s);
  EXPECT(OP_POW, NULL, "[2,3]", FL_I64, "int ** int", &xi, &col);
  EXPECT(OP_POW, NULL, "[2,3]", FL_F32, "int ** float number", &xi, &fnum);
  EXPECT(OP_MAXIMUM, NULL, "[2,3]", FL_F32, "broadcast", &col, &x);
  EXPECT(OP_MINIMUM, NULL, "[2,3]", FL_F16, "0-dim float16 with float16", &f16s, &xh);
  EXPECT(OP_FMOD, NULL, "[2,3]", FL_I64, "int fmod int stays int", &xi, &col);
  EXPECT(OP_REMAINDER, NULL, "[2,3]", FL_F32, "remainder broadcasts, float with int", &x, &col);
  EXPECT(OP_DIV, NULL, "[2,3]", FL_F32, "int / int is float32", &xi, &col);
  EXPECT(OP_DIV, NULL, "[4]", FL_F32, "bool / bool is float32", &xb, &xb);
  EXPECT(OP_DIV, NULL, "[2,3]", FL_F16, "float16 / int number", &xh, &inum);
  EXPECT_ERR(OP_SUB, NULL, "sub: subtraction of two bool tensors is not supported", &xb, &xb);
  EXPECT_ERR(OP_ADD, NULL, "add: shapes [2,3] and [4] cannot be broadcast (size 3 vs "
             "4 at dim -1)", &x, &xb);
  for (k = 0; k < sizeof cmp / sizeof *cmp; k++)
    EXPECT(cmp[k], NULL, "[2,3]", FL_BOOL, "is bool", &x, &col);
  EXPECT_ERR(OP_LT, NULL, "lt: shapes [4] and [2,3] cannot be broadcast (size 4 vs "
             "3 at dim -1)", &xb, &x);
  {
    fl_meta c = T(FL_BOOL, I(2), I(1)), onecol = F32(I(3));
    EXPECT(OP_WHERE, NULL, "[2,3]", FL_F32, "broadcasts all three", &c, &onecol, &inum);
    EXPECT(OP_WHERE, NULL, "[2,3]", FL_F16, "promotes the values", &c, &xi, &xh);
    EXPECT(OP_WHERE, NULL, "[2,3]", FL_F32, "float16 with float32 values", &c, &x, &xh);
    EXPECT(OP_WHERE, NULL, "[2,1]", FL_I64, "int value + int number", &c, &inum, &col);
    EXPECT_ERR(OP_WHERE, NULL, "where: expected a bool condition, got float32 [2,3]",
               &x, &x, &x);
    c = T(FL_BOOL, I(4));
    EXPECT_ERR(OP_WHERE, NULL, "where: condition [4] does not broadcast with values "
               "[2,3] and [3]", &c, &x, &onecol);
  }
  {
    fl_meta g = x;
    g.device = FL_DEV_CUDA;
    EXPECT_ERR(OP_ADD, NULL, "add: expected all tensors on the same device, got cpu "
               "and cuda", &x, &g);
    EXPECT(OP_ADD, NULL, "[2,3]", FL_F32, "cpu number + cuda tensor", &fnum, &g);
  }
}

static void test_reduce(void) {
  fl_meta x = F32(I(2), I(3), I(4)), xi = I64(I(2), I(3)), xb = T(FL_BOOL, I(5)),
          s = SCALAR(FL_F32), empty = F32(I(2), I(0));
  op_attrs a;

  op_attrs_init(OP_SUM, &a);
  EXPECT(OP_SUM, &a, "[]", FL_F32, "all dims", &x);
  a.keepdim = 1;
  EXPECT(OP_SUM, &a, "[1,1,1]", FL_F32, "all dims, keepdim", &x);
  a.keepdim = 0; a.ndims = 2; a.dims[0] = 2; a.dims[1] = 0;
  EXPECT(OP_SUM, &a, "[3]", FL_F32, "dims {2,0}", &x);
  a.keepdim = 1;
  EXPECT(OP_SUM, &a, "[1,3,1]", FL_F32, "dims {2,0} keepdim", &x);
  a.ndims = 1; a.dims[0] = 1; a.keepdim = 0;
  EXPECT(OP_SUM, &a, "[2]", FL_I64, "int64 sums to int64", &xi);
  a.dims[0] = 0;
  EXPECT(OP_SUM, &a, "[]", FL_I64, "bool sums to int64", &xb);
  EXPECT(OP_SUM, &a, "[]", FL_F32, "a scalar over dim 0", &s);
  a.dims[0] = 1;
  EXPECT(OP_SUM, &a, "[2]", FL_F32, "over a 0-size dim", &empty);
  a.dims[0] = 3;
  EXPECT_ERR(OP_SUM, &a, "sum: dim 3 out of range for 3-D input [2,3,4]", &x);
  a.ndims = 2; a.dims[0] = 1; a.dims[1] = 1;
  EXPECT_ERR(OP_SUM, &a, "sum: dim 1 appears more than once in the reduction dims "
             "of [2,3,4]", &x);

  op_attrs_init(OP_MEAN, &a);
  a.ndims = 1; a.dims[0] = 2;
  EXPECT(OP_MEAN, &a, "[2,3]", FL_F32, "last dim", &x);
  EXPECT_ERR(OP_MEAN, &a, "mean: dim 2 out of range for 2-D input [2,3]", &xi);
  a.dims[0] = 1;
  EXPECT_ERR(OP_MEAN, &a, "mean: expected a floating-point input, got int64 [2,3]", &xi);
  op_attrs_init(OP_VAR, &a);
  a.ndims = 1; a.dims[0] = 1; a.keepdim = 1;
  EXPECT(OP_VAR, &a, "[2,1,4]", FL_F32, "keepdim", &x);
  EXPECT_ERR(OP_VAR, &a, "var: expected a floating-point input, got int64 [2,3]", &xi);
  op_attrs_init(OP_AMAX, &a);
  a.ndims = 1; a.dims[0] = 0;
  EXPECT(OP_AMAX, &a, "[3]", FL_I64, "keeps int64", &xi);
  a.dims[0] = 1;
  EXPECT_ERR(OP_AMAX, &a, "amax: cannot reduce over dim 1 of size 0 in [2,0] (no "
             "identity)", &empty);
  a.dims[0] = 0;
  EXPECT(OP_AMAX, &a, "[0]", FL_F32, "over a nonempty dim of an empty tensor", &empty);
  op_attrs_init(OP_AMIN, &a);
  EXPECT(OP_AMIN, &a, "[]", FL_BOOL, "keeps bool", &xb);
  EXPECT_ERR(OP_AMIN, &a, "amin: cannot reduce the empty input [2,0] (no identity); "
             "give a dim", &empty);
  op_attrs_init(OP_ARGMAX, &a);
  EXPECT(OP_ARGMAX, &a, "[]", FL_I64, "over everything", &x);
  a.ndims = 1; a.dims[0] = 1; a.keepdim = 1;
  EXPECT(OP_ARGMAX, &a, "[2,1,4]", FL_I64, "one dim keepdim", &x);
  a.ndims = 2; a.dims[1] = 2;
  EXPECT_ERR(OP_ARGMAX, &a, "argmax: expected at most one dim, got 2", &x);
  a.ndims = 0;
  EXPECT_ERR(OP_ARGMAX, &a, "argmax: bool input [5] is not supported", &xb);
}

static void test_norms(void) {
  fl_meta x = F32(I(2), I(5), I(8)), w = F32(I(8)), w2 = F32(I(5), I(8)),
          bad = F32(I(5)), xi = I64(I(2), I(8)), xh = T(FL_F16, I(3), I(8));
  op_attrs a;
  op_attrs_init(OP_SOFTMAX, &a);
  a.i[0] = 1;
  EXPECT(OP_SOFTMAX, &a, "[2,5,8]", FL_F32, "dim 1", &x);
  EXPECT(OP_LOG_SOFTMAX, &a, "[3,8]", FL_F16, "float16", &xh);
  EXPECT_ERR(OP_SOFTMAX, &a, "softmax: expected a floating-point input, got int64 "
             "[2,8]", &xi);
  a.i[0] = 3;
  EXPECT_ERR(OP_LOG_SOFTMAX, &a, "log_softmax: dim 3 out of range for 3-D input "
             "[2,5,8]", &x);

  op_attrs_init(OP_LAYER_NORM, &a);
  a.i[0] = 1;
  EXPECT(OP_LAYER_NORM, &a, "[2,5,8]", FL_F32, "weight and bias", &x, &w, &w);
  EXPECT(OP_LAYER_NORM, &a, "[2,5,8]", FL_F32, "no parameters", &x);
  EXPECT(OP_LAYER_NORM, &a, "[2,5,8]", FL_F32, "bias only", &x, NULL, &w);
  a.i[0] = 2;
  EXPECT(OP_LAYER_NORM, &a, "[2,5,8]", FL_F32, "two trailing dims", &x, &w2, &w2);
  EXPECT_ERR(OP_LAYER_NORM, &a, "layer_norm: weight has shape [8], expected [5,8] "
             "(the normalized shape of input [2,5,8])", &x, &w);
  a.i[0] = 1;
  EXPECT_ERR(OP_LAYER_NORM, &a, "layer_norm: bias has shape [5], expected [8] (the "
             "normalized shape of input [2,5,8])", &x, &w, &bad);
  a.i[0] = 4;
  EXPECT_ERR(OP_LAYER_NORM, &a, "layer_norm: cannot normalize the last 4 dims of "
             "input [2,5,8] (expected 1 to 3)", &x);
  op_attrs_init(OP_RMS_NORM, &a);
  a.i[0] = 1;
  EXPECT(OP_RMS_NORM, &a, "[3,8]", FL_F16, "float16 with weight", &xh, &w);
  EXPECT_ERR(OP_RMS_NORM, &a, "rms_norm: expected a floating-point input, got int64 "
             "[2,8]", &xi, &w);
}

static void test_matmul(void) {
  fl_meta a = F32(I(64), I(128)), b = F32(I(64), I(10)), c = F32(I(128), I(10)),
          v = F32(I(128)), v64 = F32(I(64)), ba = F32(I(5), I(1), I(3), I(4)),
          bb = F32(I(7), I(4), I(2)), s = SCALAR(FL_F32), h = T(FL_F16, I(128), I(10)),
          bx = F32(I(2), I(3), I(4)), by = F32(I(3), I(4), I(5));
  EXPECT(OP_MATMUL, NULL, "[64,10]", FL_F32, "2-D @ 2-D", &a, &c);
  EXPECT(OP_MATMUL, NULL, "[64]", FL_F32, "2-D @ 1-D", &a, &v);
  EXPECT(OP_MATMUL, NULL, "[10]", FL_F32, "1-D @ 2-D", &v, &c);
  EXPECT(OP_MATMUL, NULL, "[]", FL_F32, "1-D @ 1-D is a dot", &v, &v);
  EXPECT(OP_MATMUL, NULL, "[5,7,3,2]", FL_F32, "batched broadcast", &ba, &bb);
  EXPECT(OP_MATMUL, NULL, "[128]", FL_F32, "1-D @ 2-D, 64 inner", &v64, &a);
  {
    fl_meta v4 = F32(I(4));
    EXPECT(OP_MATMUL, NULL, "[7,2]", FL_F32, "1-D @ 3-D", &v4, &bb);
    EXPECT(OP_MATMUL, NULL, "[5,1,3]", FL_F32, "4-D @ 1-D", &ba, &v4);
  }
  EXPECT_ERR(OP_MATMUL, NULL, "matmul: [64,128] @ [64,10]: inner dimensions differ "
             "(128 vs 64)", &a, &b);
  EXPECT_ERR(OP_MATMUL, NULL, "matmul: [128] @ [64]: inner dimensions differ (128 vs "
             "64)", &v, &v64);
  EXPECT_ERR(OP_MATMUL, NULL, "matmul: [] @ [64,128]: both arguments need at least 1 "
             "dimension", &s, &a);
  EXPECT_ERR(OP_MATMUL, NULL, "matmul: [64,128] @ [128,10]: expected the same dtype, "
             "got float32 and float16", &a, &h);
  EXPECT_ERR(OP_MATMUL, NULL, "matmul: [2,3,4] @ [3,4,5]: batch dimensions [2] and [3] "
             "cannot be broadcast", &bx, &by);

  {
    fl_meta x = F32(I(8), I(3), I(20)), w = F32(I(10), I(20)), bias = F32(I(10)),
            bad = F32(I(20)), x1 = F32(I(20)), wi = I64(I(10), I(20));
    EXPECT(OP_LINEAR, NULL, "[8,3,10]", FL_F32, "with bias", &x, &w, &bias);
    EXPECT(OP_LINEAR, NULL, "[10]", FL_F32, "1-D input, no bias", &x1, &w);
    EXPECT(OP_LINEAR, NULL, "[8,3,10]", FL_F32, "absent bias", &x, &w, NULL);
    EXPECT_ERR(OP_LINEAR, NULL, "linear: weight [20] must be 2-D [out,in]", &x, &bad);
    EXPECT_ERR(OP_LINEAR, NULL, "linear: input [10] and weight [10,20]: in_features "
               "differ (input has 10, weight expects 20)", &bias, &w);
    EXPECT_ERR(OP_LINEAR, NULL, "linear: bias has shape [20], expected [10] (the "
               "out_features of weight [10,20])", &x, &w, &bad);
    EXPECT_ERR(OP_LINEAR, NULL, "linear: expected input and weight of the same dtype, "
               "got float32 and int64", &x, &wi);
  }
}

static void test_conv_pool(void) {
  fl_meta x = F32(I(2), I(3), I(32), I(32)), w = F32(I(8), I(3), I(3), I(3)),
          b = F32(I(8)), w4 = F32(I(8), I(4), I(3), I(3)), small = F32(I(1), I(3), I(2), I(2)),
          x3 = F32(I(3), I(8), I(8)), xi = I64(I(1), I(1), I(4), I(4));
  op_attrs a;
  op_attrs_init(OP_CONV2D, &a);
  a.i[0] = a.i[1] = 1;
  EXPECT(OP_CONV2D, &a, "[2,8,30,30]", FL_F32, "3x3 valid", &x, &w, &b);
  a.i[2] = a.i[3] = a.i[4] = a.i[5] = 1;
  EXPECT(OP_CONV2D, &a, "[2,8,32,32]", FL_F32, "3x3 same padding", &x, &w);
  a.i[0] = 2; a.i[1] = 3; a.i[2] = a.i[4] = 1; a.i[3] = a.i[5] = 0;
  /* H: (32 + 2 - 3) / 2 + 1 = 16;  W: (32 - 3) / 3 + 1 = 10 */
  EXPECT(OP_CONV2D, &a, "[2,8,16,10]", FL_F32, "strides 2,3 padding 1,0", &x, &w, &b);
  a.i[0] = a.i[1] = 1; a.i[2] = a.i[3] = a.i[4] = a.i[5] = 0;
  EXPECT_ERR(OP_CONV2D, &a, "conv2d: weight [8,4,3,3] expects 4 input channels, but "
             "input [2,3,32,32] has 3", &x, &w4);
  EXPECT_ERR(OP_CONV2D, &a, "conv2d: padded input size 2x2 is smaller than the kernel "
             "3x3 (input [1,3,2,2], weight [8,3,3,3], padding [0,0,0,0], dilation [1,1])", &small, &w);
  EXPECT_ERR(OP_CONV2D, &a, "conv2d: expected a 4-D input [N,C,H,W], got [3,8,8]", &x3, &w);
  EXPECT_ERR(OP_CONV2D, &a, "conv2d: bias has shape [3,8,8], expected [8] (the out "
             "channels of weight [8,3,3,3])", &x, &w, &x3);
  a.i[0] = 0;
  EXPECT_ERR(OP_CONV2D, &a, "conv2d: stride must be positive, got [0,1]", &x, &w);

  op_attrs_init(OP_MAX_POOL2D, &a);
  a.i[0] = a.i[1] = 2;
  EXPECT(OP_MAX_POOL2D, &a, "[2,3,16,16]", FL_F32, "2x2, stride = kernel", &x);
  a.i[0] = a.i[1] = 3; a.i[2] = a.i[3] = 2; a.i[4] = a.i[5] = a.i[6] = a.i[7] = 1;
  /* (32 + 2 - 3) / 2 + 1 = 16 */
  EXPECT(OP_MAX_POOL2D, &a, "[2,3,16,16]", FL_F32, "3x3 stride 2 pad 1", &x);
  EXPECT(OP_MAX_POOL2D, &a, "[1,1,2,2]", FL_I64, "int64 max pool", &xi);
  a.i[0] = 3; a.i[1] = 2; a.i[2] = 1; a.i[3] = 0; a.i[4] = a.i[5] = a.i[6] = a.i[7] = 0;
  /* H: (32 - 3) / 1 + 1 = 30;  W: stride 0 means 2: (32 - 2) / 2 + 1 = 16 */
  EXPECT(OP_AVG_POOL2D, &a, "[2,3,30,16]", FL_F32, "3x2 stride 1,kernel", &x);
  EXPECT_ERR(OP_AVG_POOL2D, &a, "avg_pool2d: int64 input [1,1,4,4] is not supported", &xi);
  a.i[0] = a.i[1] = 3; a.i[2] = a.i[3] = 0; a.i[4] = 3; a.i[5] = 1;
  EXPECT_ERR(OP_MAX_POOL2D, &a, "max_pool2d: padding [3,1,0,0] (top, left, bottom, right) "
             "must be smaller than the kernel [3,3]", &x);
  a.i[4] = a.i[5] = 0;
  EXPECT_ERR(OP_MAX_POOL2D, &a, "max_pool2d: input [1,3,2,2] is too small for kernel "
             "[3,3] with padding [0,0,0,0]", &small);
  {   /* the pool's gradient: x's shape, the gradient of the pool's output's */
    fl_meta g16 = F32(I(2), I(3), I(16), I(16)), g15 = F32(I(2), I(3), I(15), I(16));
    op_attrs_init(OP_MAX_POOL2D_BACKWARD, &a);
    a.i[0] = a.i[1] = 2;
    EXPECT(OP_MAX_POOL2D_BACKWARD, &a, "[2,3,32,32]", FL_F32, "max_pool2d_backward: x's shape",
           &g16, &x);
    EXPECT_ERR(OP_MAX_POOL2D_BACKWARD, &a, "max_pool2d_backward: gradient [2,3,15,16] "
               "differs from the pool's output [2,3,16,16]", &g15, &x);
  }
  EXPECT_ERR(OP_AVG_POOL2D, &a, "avg_pool2d: expected a 4-D input [N,C,H,W], got "
             "[3,8,8]", &x3);

  {
    fl_meta c = F32(I(3)), c4 = F32(I(4)), x2 = F32(I(5), I(3)), one = F32(I(7));
    op_attrs_init(OP_BATCH_NORM, &a);
    EXPECT(OP_BATCH_NORM, &a, "[2,3,32,32]", FL_F32, "all parameters", &x, &c, &c, &c, &c);
    EXPECT(OP_BATCH_NORM, &a, "[5,3]", FL_F32, "2-D input, no affine", &x2, &c, &c);
    EXPECT(OP_BATCH_NORM, &a, "[2,3,32,32]", FL_F32, "bias only", &x, &c, &c, NULL, &c);
    EXPECT_ERR(OP_BATCH_NORM, &a, "batch_norm: running_mean has shape [4], expected [3] "
               "(the channels of input [2,3,32,32])", &x, &c4, &c);
    EXPECT_ERR(OP_BATCH_NORM, &a, "batch_norm: weight has shape [4], expected [3] (the "
               "channels of input [2,3,32,32])", &x, &c, &c, &c4);
    EXPECT_ERR(OP_BATCH_NORM, &a, "batch_norm: expected input [N,C,...] with at least 2 "
               "dims, got [7]", &one, &c, &c);
  }
}

static void test_views(void) {
  fl_meta x = F32(I(2), I(3), I(4)), e0 = F32(I(0), I(4)), s = SCALAR(FL_I64),
          y = T(FL_BF16, I(3), I(1), I(5), I(1));
  op_attrs a;

  op_attrs_init(OP_RESHAPE, &a);
  a.ndims = 2; a.dims[0] = 4; a.dims[1] = -1;
  EXPECT(OP_RESHAPE, &a, "[4,6]", FL_F32, "-1 inferred", &x);
  a.ndims = 0;
  EXPECT(OP_VIEW, &a, "[]", FL_I64, "scalar to scalar", &s);
  a.ndims = 3; a.dims[0] = 1; a.dims[1] = -1; a.dims[2] = 1;
  EXPECT(OP_VIEW, &a, "[1,1,1]", FL_I64, "scalar to [1,-1,1]", &s);
  a.ndims = 2; a.dims[0] = 0; a.dims[1] = 7;
  EXPECT(OP_RESHAPE, &a, "[0,7]", FL_F32, "empty to empty", &e0);
  a.dims[0] = 3; a.dims[1] = 5;
  EXPECT_ERR(OP_RESHAPE, &a, "reshape: shape [3,5] is invalid for input of size 24", &x);
  a.dims[0] = 5; a.dims[1] = -1;
  EXPECT_ERR(OP_VIEW, &a, "view: shape [5,-1] is invalid for input of size 24", &x);
  a.dims[0] = -1; a.dims[1] = -1;
  EXPECT_ERR(OP_RESHAPE, &a, "reshape: only one dimension can be inferred, got shape "
             "[-1,-1]", &x);
  a.dims[0] = 0; a.dims[1] = -1;
  EXPECT_ERR(OP_RESHAPE, &a, "reshape: cannot reshape a tensor of 0 elements into "
             "shape [0,-1]: the -1 could be any size", &e0);
  a.dims[0] = -3; a.dims[1] = 8;
  EXPECT_ERR(OP_RESHAPE, &a, "reshape: invalid size -3 in shape [-3,8]", &x);
  a.ndims = 3; a.dims[0] = INT64_MAX / 2; a.dims[1] = 4; a.dims[2] = -1;
  EXPECT_ERR(OP_RESHAPE, &a, "reshape: shape [4611686018427387903,4,-1] is invalid for "
             "input of size 24", &x);

  op_attrs_init(OP_TRANSPOSE, &a);
  a.i[0] = 0; a.i[1] = 2;
  EXPECT(OP_TRANSPOSE, &a, "[4,3,2]", FL_F32, "0 <-> 2", &x);
  a.i[0] = a.i[1] = 0;
  EXPECT(OP_TRANSPOSE, &a, "[]", FL_I64, "of a scalar", &s);
  a.i[1] = 3;
  EXPECT_ERR(OP_TRANSPOSE, &a, "transpose: dim 3 out of range for 3-D input [2,3,4]", &x);

  op_attrs_init(OP_PERMUTE, &a);
  a.ndims = 3; a.dims[0] = 1; a.dims[1] = 2; a.dims[2] = 0;
  EXPECT(OP_PERMUTE, &a, "[3,4,2]", FL_F32, "rotate", &x);
  a.dims[2] = 1;
  EXPECT_ERR(OP_PERMUTE, &a, "permute: [1,2,1] is not a permutation of the dims of "
             "[2,3,4]", &x);
  a.ndims = 2;
  EXPECT_ERR(OP_PERMUTE, &a, "permute: input [2,3,4] has 3 dims but the permutation "
             "[1,2] has 2", &x);

  op_attrs_init(OP_UNSQUEEZE, &a);
  a.i[0] = 3;
  EXPECT(OP_UNSQUEEZE, &a, "[2,3,4,1]", FL_F32, "at the end", &x);
  a.i[0] = 0;
  EXPECT(OP_UNSQUEEZE, &a, "[1]", FL_I64, "of a scalar", &s);
  a.i[0] = 4;
  EXPECT_ERR(OP_UNSQUEEZE, &a, "unsqueeze: dim 4 out of range for input [2,3,4] "
             "(expected 0 to 3)", &x);

  op_attrs_init(OP_SQUEEZE, &a);
  EXPECT(OP_SQUEEZE, &a, "[3,5]", FL_BF16, "all size-1 dims", &y);
  a.i[0] = 1; a.i[1] = 1;
  EXPECT(OP_SQUEEZE, &a, "[3,5,1]", FL_BF16, "dim 1", &y);
  a.i[0] = 0;
  EXPECT(OP_SQUEEZE, &a, "[3,1,5,1]", FL_BF16, "dim 0 is not 1: unchanged", &y);
  a.i[0] = 4;
  EXPECT_ERR(OP_SQUEEZE, &a, "squeeze: dim 4 out of range for 4-D input [3,1,5,1]", &y);

  op_attrs_init(OP_EXPAND, &a);
  a.ndims = 5; a.dims[0] = 2; a.dims[1] = 3; a.dims[2] = 4; a.dims[3] = -1; a.dims[4] = 6;
  EXPECT(OP_EXPAND, &a, "[2,3,4,5,6]", FL_BF16, "grow size-1 dims, add a leading one", &y);
  a.dims[1] = 0;
  EXPECT_ERR(OP_EXPAND, &a, "expand: cannot expand [3,1,5,1] to [2,0,4,-1,6]: size 0 "
             "must match the existing size 3 (only size-1 dims can grow)", &y);
  a.dims[0] = -1; a.dims[1] = 3;
  EXPECT_ERR(OP_EXPAND, &a, "expand: cannot expand [3,1,5,1] to [-1,3,4,-1,6]: -1 is "
             "not allowed in a new leading dim", &y);
  a.ndims = 2;
  EXPECT_ERR(OP_EXPAND, &a, "expand: cannot expand [3,1,5,1] to [-1,3]: the target "
             "needs at least 4 dims", &y);

  op_attrs_init(OP_NARROW, &a);
  a.i[0] = 2; a.i[1] = 1; a.i[2] = 2;
  EXPECT(OP_NARROW, &a, "[2,3,2]", FL_F32, "dim 2 from 1", &x);
  a.i[1] = 4; a.i[2] = 0;
  EXPECT(OP_NARROW, &a, "[2,3,0]", FL_F32, "empty at the end", &x);
  a.i[1] = 2; a.i[2] = 3;
  EXPECT_ERR(OP_NARROW, &a, "narrow: start (2) + length (3) exceeds dimension size (4) "
             "of [2,3,4]", &x);
  EXPECT_ERR(OP_NARROW, &a, "narrow: cannot narrow a 0-dim tensor", &s);

  EXPECT(OP_CONTIGUOUS, NULL, "[3,1,5,1]", FL_BF16, "same shape", &y);
}

static void test_cat_embedding(void) {
  fl_meta a = F32(I(2), I(3)), b = F32(I(2), I(5)), c = T(FL_F16, I(2), I(1)),
          d = F32(I(4), I(3)), s = SCALAR(FL_F32), idx = I64(I(4), I(7)),
          fidx = F32(I(4)), w = F32(I(100), I(16)), w3 = F32(I(2), I(3), I(4)),
          ib = I64(I(1), I(3)), e = F32(I(0), I(3));
  op_attrs at;
  op_attrs_init(OP_CAT, &at);
  at.i[0] = 1;
  EXPECT(OP_CAT, &at, "[2,9]", FL_F32, "three along dim 1", &a, &b, &c);
  EXPECT(OP_CAT, &at, "[2,1]", FL_F16, "one tensor", &c);
  at.i[0] = 0;
  EXPECT(OP_CAT, &at, "[7,3]", FL_F32, "int64 and float32 along dim 0", &ib, &d, &a);
  EXPECT(OP_CAT, &at, "[2,3]", FL_F32, "with an empty tensor", &e, &a);
  EXPECT(OP_CAT, &at, "[2,3]", FL_I64, "int64 with bool", &ib, &(fl_meta){.dtype = FL_BOOL,
         .ndim = 2, .shape = {1, 3}});
  EXPECT_ERR(OP_CAT, &at, "cat: sizes must match except in dim 0: tensor 1 is [2,3], "
             "tensor 2 is [2,5]", &a, &b);
  EXPECT_ERR(OP_CAT, &at, "cat: tensors must have the same number of dims: tensor 1 "
             "is [2,3], tensor 2 is [4]", &a, &fidx);
  EXPECT_ERR(OP_CAT, &at, "cat: tensor 2 is 0-dim and cannot be concatenated", &a, &s);
  at.i[0] = 2;
  EXPECT_ERR(OP_CAT, &at, "cat: dim 2 out of range for 2-D input [2,3]", &a, &a);

  EXPECT(OP_EMBEDDING, NULL, "[4,7,16]", FL_F32, "2-D indices", &idx, &w);
  EXPECT(OP_EMBEDDING, NULL, "[16]", FL_F32, "a scalar index", &(fl_meta){.dtype = FL_I64}, &w);
  EXPECT_ERR(OP_EMBEDDING, NULL, "embedding: indices must be int64, got float32 [4]",
             &fidx, &w);
  EXPECT_ERR(OP_EMBEDDING, NULL, "embedding: weight must be 2-D [num,dim], got [2,3,4]",
             &idx, &w3);
}

static void test_movement(void) {
  fl_meta x = F32(I(2), I(3), I(4)), s = SCALAR(FL_F32), idx = I64(I(5), I(6)),
          fidx = F32(I(5));
  op_attrs a;
  op_attrs_init(OP_SLICE, &a);
  a.i[0] = 2; a.i[1] = 1; a.i[2] = 2; a.i[3] = 2;
  EXPECT(OP_SLICE, &a, "[2,3,2]", FL_F32, "slice 1, 3 of 4", &x);
  a.i[2] = 3;
  EXPECT_ERR(OP_SLICE, &a, "slice: 3 elements from 1 by step 2 run past dimension 2 of "
             "[2,3,4]", &x);
  a.i[2] = 1; a.i[3] = 0;
  EXPECT_ERR(OP_SLICE, &a, "slice: step must be >= 1 here, got 0", &x);
  EXPECT_ERR(OP_SLICE, &a, "slice: cannot slice a 0-dim tensor", &s);

  op_attrs_init(OP_PAD, &a);
  a.ndims = 3; a.dims[0] = 1; a.dims[1] = -1; a.dims[2] = 0; a.i[0] = 0; a.i[1] = -1; a.i[2] = 5;
  EXPECT(OP_PAD, &a, "[3,1,9]", FL_F32, "pad and crop", &x);
  a.i[1] = -3;
  EXPECT_ERR(OP_PAD, &a, "pad: pads -1, -3 crop 4 elements from dim 2 of [2,3,4], which has 3", &x);
  a.i[1] = 0; a.i[8] = 1;
  EXPECT_ERR(OP_PAD, &a, "pad: reflect pads 0, 5 of dim 3 must be smaller than its size 4 "
             "(after cropping) in [2,3,4]", &x);
  a.ndims = 2;
  EXPECT_ERR(OP_PAD, &a, "pad: 2 pads per side for a 3-d tensor [2,3,4] (expected one per dim)", &x);

  op_attrs_init(OP_FLIP, &a);
  a.ndims = 2; a.dims[0] = 2; a.dims[1] = 0;
  EXPECT(OP_FLIP, &a, "[2,3,4]", FL_F32, "flip two dims", &x);
  a.dims[1] = 2;
  EXPECT_ERR(OP_FLIP, &a, "flip: dim 3 appears twice", &x);

  op_attrs_init(OP_CUMSUM, &a);
  a.i[0] = 2;
  EXPECT(OP_CUMSUM, &a, "[2,3,4]", FL_F32, "cumsum keeps the shape", &x);
  a.i[0] = 1;
  EXPECT(OP_CUMSUM, &a, "[5,6]", FL_I64, "cumsum of int64", &idx);
  a.i[0] = 3;
  EXPECT_ERR(OP_CUMSUM, &a, "cumsum: dim 3 out of range for 3-D input [2,3,4]", &x);

  op_attrs_init(OP_GATHER, &a);
  a.i[0] = 1;
  EXPECT(OP_GATHER, &a, "[2,5,6,4]", FL_F32, "gather 2-d indices along dim 1", &x, &idx);
  a.i[0] = 2;
  EXPECT(OP_GATHER, &a, "[2,3]", FL_F32, "gather a scalar index", &x, &(fl_meta){.dtype = FL_I64});
  EXPECT_ERR(OP_GATHER, &a, "gather: indices must be int64, got float32 [5]", &x, &fidx);
  a.i[0] = 3;
  EXPECT_ERR(OP_GATHER, &a, "gather: dim 3 out of range for 3-D input [2,3,4]", &x, &idx);
  {
    fl_meta i3 = I64(I(3)), i4 = I64(I(4));
    op_attrs_init(OP_INDEX_ADD, &a);
    a.i[0] = 7;
    EXPECT(OP_INDEX_ADD, &a, "[2,7,4]", FL_F32, "index_add: [A, I, R] into n rows", &x, &i3);
    EXPECT_ERR(OP_INDEX_ADD, &a, "index_add: idx must be int64 [3] (src [2,3,4]), got int64 [4]",
               &x, &i4);
  }
}

/* matmul_int8: int64 [..., M, N]; B 2-d or with A's batch dims; zero
** points one value or one per row / column */
static void test_matmul_int8(void) {
  fl_meta a3 = I64(I(2), I(3), I(4)), b2 = I64(I(4), I(5)), b3 = I64(I(2), I(4), I(5));
  fl_meta bb = I64(I(3), I(4), I(5)), za = I64(I(3)), zb = I64(I(5)), zs = SCALAR(FL_I64), bad = I64(I(4));
  fl_meta f = F32(I(4), I(5));
  op_attrs a;
  op_attrs_init(OP_MATMUL_INT8, &a);
  EXPECT(OP_MATMUL_INT8, &a, "[2,3,5]", FL_I64, "a shared 2-d B", &a3, &b2);
  EXPECT(OP_MATMUL_INT8, &a, "[2,3,5]", FL_I64, "a batched B, zero points", &a3, &b3, &za, &zb);
  EXPECT(OP_MATMUL_INT8, &a, "[2,3,5]", FL_I64, "one-value zero points", &a3, &b2, &zs, &zs);
  EXPECT_ERR(OP_MATMUL_INT8, &a, "matmul_int8: B must be int64 (8-bit values held wide), got float32", &a3, &f);
  EXPECT_ERR(OP_MATMUL_INT8, &a, "matmul_int8: [2,3,4] @ [3,4,5]: batch dimensions differ (expand them first)", &a3, &bb);
  EXPECT_ERR(OP_MATMUL_INT8, &a, "matmul_int8: zero point za must be one value or [3], got [4]", &a3, &b2, &bad);
  EXPECT_ERR(OP_MATMUL_INT8, &a, "matmul_int8: [4,5] @ [2,3,4]: A needs at least 2 dims and B 2 or A's number", &b2, &a3);
}

/* rnn: [S + T, D, B, H] (S = 2 state rows for an LSTM, 1 else) */
static void test_rnn(void) {
  fl_meta x = F32(I(5), I(2), I(3)), w = F32(I(2), I(16), I(3)), r = F32(I(2), I(16), I(4));
  fl_meta b = F32(I(2), I(32)), lens = I64(I(2)), h0 = F32(I(2), I(2), I(4)), p = F32(I(2), I(12));
  fl_meta wg = F32(I(1), I(12), I(3)), rg = F32(I(1), I(12), I(4)), bad = F32(I(2), I(2), I(5));
  fl_meta flens = F32(I(2));
  op_attrs a;
  op_attrs_init(OP_RNN, &a);
  a.i[0] = OP_RNN_CELL_LSTM; a.i[1] = 2;
  EXPECT(OP_RNN, &a, "[7,2,2,4]", FL_F32, "LSTM bidirectional: Y_h, Y_c, then Y", &x, &w, &r);
  expect(OP_RNN, IN(&x, &w, &r, &b, &lens, &h0, &h0, &p), 8, &a, "[7,2,2,4]", FL_F32,
         "LSTM with every optional input");
  expect_err(OP_RNN, IN(&x, &w, &r, NULL, NULL, &bad), 6, &a,
             "rnn: initial_h has shape [2,2,5], expected [2,2,4]");
  expect_err(OP_RNN, IN(&x, &w, &r, NULL, &flens), 5, &a,
             "rnn: sequence_lens must be int64 [2] (X [5,2,3]), got float32 [2]");
  a.i[0] = OP_RNN_CELL_GRU; a.i[1] = 1;
  EXPECT(OP_RNN, &a, "[6,1,2,4]", FL_F32, "GRU reverse: Y_h, then Y", &x, &wg, &rg);
  EXPECT_ERR(OP_RNN, &a, "rnn: R must be [1, 3*H, H] (1 direction(s), 3 gate(s)), got [2,16,4]",
             &x, &w, &r);
  expect_err(OP_RNN, IN(&x, &wg, &rg, NULL, NULL, NULL, &h0), 7, &a,
             "rnn: initial_c is for LSTM cells only");
}

static void test_arity(void) {
  fl_meta x = F32(I(2));
  fl_meta out;
  fl_err e;
  op_attrs a;
  op_attrs_init(OP_ADD, &a);
  is_int(op_infer(OP_ADD, IN(&x), 1, &a, &out, &e), FL_EINVAL, "add with one input");
  is_str(e.msg, "add: expected 2 input(s), got 1", "arity message");
  op_attrs_init(OP_LINEAR, &a);
  is_int(op_infer(OP_LINEAR, IN(&x, &x, &x, &x), 4, &a, &out, &e), FL_EINVAL,
         "linear with four inputs");
  is_str(e.msg, "linear: expected 2 to 3 inputs, got 4", "range arity message");
}

/* Views may name up to 2^62 elements; nothing else may read more than
** 2^40 of them, and no shape may multiply past 2^62. */
static void test_size_limits(void) {
  fl_meta huge = F32(I(1) << 62), big = F32(I(1) << 40), over = F32((I(1) << 40) + 1);
  fl_meta one = F32(I(1)), empty = F32(I(0), I(1) << 62);
  op_attrs a;
  op_attrs_init(OP_EXPAND, &a);
  a.ndims = 3;
  a.dims[0] = I(1) << 42; a.dims[1] = 3; a.dims[2] = 1000000;
  EXPECT_ERR(OP_EXPAND, &a, "expand: shape [4398046511104,3,1000000] is too "
             "large: its sizes multiply to 1.319e+19, at most 2^62 = "
             "4611686018427387904 is supported", &one);
  a.ndims = 1;
  a.dims[0] = I(1) << 62;
  EXPECT(OP_EXPAND, &a, "[4611686018427387904]", FL_F32, "to 2^62", &one);
  EXPECT_ERR(OP_SUM, NULL, "sum: input 1 [4611686018427387904] is too large to "
             "compute on: 4611686018427387904 elements, at most 2^40 = "
             "1099511627776", &huge);
  EXPECT_ERR(OP_ADD, NULL, "add: input 2 [1099511627777] is too large to "
             "compute on: 1099511627777 elements, at most 2^40 = 1099511627776",
             &big, &over);
  EXPECT(OP_SUM, NULL, "[]", FL_F32, "of 2^40 elements", &big);
  op_attrs_init(OP_TRANSPOSE, &a);
  a.i[1] = 1;
  EXPECT(OP_TRANSPOSE, &a, "[4611686018427387904,0]", FL_F32, "of a huge empty", &empty);
  EXPECT(OP_SUM, NULL, "[]", FL_F32, "of a huge empty", &empty);
  op_attrs_init(OP_CAT, &a);
  a.i[0] = 1;
  EXPECT_ERR(OP_CAT, &a, "cat: the result is too large along the joined dim "
             "(tensor 2 [0,4611686018427387904] takes its size past 2^63)",
             &empty, &empty, &empty);
}

/* rand/randn: no inputs, shape and dtype from the attributes; dropout keeps
** x's shape and dtype and wants p in [0, 1] and a float x */
static void test_random(void) {
  fl_meta x = F32(I(3), I(5)), h = T(FL_F16, I(7)), n = I64(I(4));
  op_attrs a;
  op_attrs_init(OP_RAND, &a);
  a.ndims = 2; a.dims[0] = 3; a.dims[1] = 5;
  expect(OP_RAND, NULL, 0, &a, "[3,5]", FL_F32, "of sizes 3, 5");
  a.dtype = FL_BF16;
  expect(OP_RANDN, NULL, 0, &a, "[3,5]", FL_BF16, "bfloat16");
  a.ndims = 0;
  expect(OP_RAND, NULL, 0, &a, "[]", FL_BF16, "0-dim");
  a.ndims = 1; a.dims[0] = 4; a.dtype = FL_I64;
  expect_err(OP_RANDN, NULL, 0, &a, "randn: dtype int64 is not a floating dtype "
             "(expected float32, float16 or bfloat16)");
  a.dtype = FL_F32; a.dims[0] = -2;
  expect_err(OP_RAND, NULL, 0, &a, "rand: size -2 of dim 1 is negative");
  a.dims[0] = 4;
  expect_err(OP_RAND, IN(&x), 1, &a, "rand: expected 0 input(s), got 1");
  op_attrs_init(OP_DROPOUT, &a);
  EXPECT(OP_DROPOUT, &a, "[3,5]", FL_F32, "keeps x's shape", &x);
  EXPECT(OP_DROPOUT, &a, "[7]", FL_F16, "keeps float16", &h);
  EXPECT_ERR(OP_DROPOUT, &a, "dropout: dtype int64 is not a floating dtype "
             "(expected float32, float16 or bfloat16)", &n);
  a.f[0] = 1.5;
  EXPECT_ERR(OP_DROPOUT, &a, "dropout: p must be a probability in [0, 1], got 1.5", &x);
}

int main(void) {
  int k, missing = 0;
  test_broadcast();
  test_elementwise();
  test_reduce();
  test_norms();
  test_matmul();
  test_conv_pool();
  test_views();
  test_cat_embedding();
  test_movement();
  test_arity();
  test_size_limits();
  test_random();
  test_rnn();
  test_matmul_int8();
  for (k = 0; k < OP_COUNT; k++)
    if (!tested[k]) {
      printf("# no shape test for %s\n", op_name((fl_op)k));
      missing++;
    }
  is_int(missing, 0, "every op in ops.def has shape tests");
  return tap_done();
}
