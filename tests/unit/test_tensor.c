/*
** test_tensor.c -- dtypes (16-bit float rounding, stores through double,
** promotion), size checks, storage reference counts, the strides of every
** view op, and copies across strides, broadcasts and dtypes.
*/
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "graph/tensor.h"
#include "graph/view.h"
#include "tap.h"

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
#define META(dt, ...) meta(dt, NARGS(__VA_ARGS__), __VA_ARGS__)
#define NARGS(...) NARGS_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define NARGS_(a, b, c, d, e, f, g, h, n, ...) n
#define I(x) ((int64_t)(x))

/* a float32 tensor holding 0, 1, 2, ... in row-major order */
static fl_tensor iota(fl_meta m) {
  fl_tensor t;
  fl_err e;
  int64_t i, n;
  if (ten_empty(&t, &m, &e) != FL_OK) return t;
  n = meta_numel(&m);
  for (i = 0; i < n; i++) ten_set(&t, i, (double)i);
  return t;
}

static const char *strides_str(const fl_tensor *t, char *buf, size_t n) {
  fl_meta m = t->m;
  memcpy(m.shape, t->stride, sizeof m.shape);
  return meta_shape_str(&m, buf, n);
}

static const char *shape_of(const fl_tensor *t, char *buf, size_t n) {
  return meta_shape_str(&t->m, buf, n);
}

/* infer op's output for one input with attributes a, then view it */
static int apply_view(fl_op op, const fl_tensor *x, const op_attrs *a,
                      fl_tensor *out, fl_err *e) {
  const fl_meta *in[1] = {&x->m};
  fl_meta om;
  int rc = op_infer(op, in, 1, a, &om, e);
  if (rc != FL_OK) return rc;
  return view_apply(op, x, a, &om, out, e);
}

static int values_are(const fl_tensor *t, const double *want, int64_t n) {
  int64_t i;
  if (meta_numel(&t->m) != n) return 0;
  for (i = 0; i < n; i++)
    if (ten_get(t, i) != want[i]) return 0;
  return 1;
}

static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void test_dtype_basics(void) {
  fl_dtype t;
  is_int(dtype_size(FL_F32), 4, "float32 is 4 bytes");
  is_int(dtype_size(FL_F16), 2, "float16 is 2 bytes");
  is_int(dtype_size(FL_BF16), 2, "bfloat16 is 2 bytes");
  is_int(dtype_size(FL_I64), 8, "int64 is 8 bytes");
  is_int(dtype_size(FL_BOOL), 1, "bool is 1 byte");
  is_str(dtype_name(FL_BF16), "bfloat16", "bfloat16 name");
  is_str(dtype_name(FL_BOOL), "bool", "bool name");
  ok(dtype_from_name("int64", &t) == 0 && t == FL_I64, "int64 by name");
  ok(dtype_from_name("float64", &t) == 0 && t == FL_F64 && dtype_size(FL_F64) == 8 &&
     dtype_is_float(FL_F64), "float64 by name, 8 bytes, a float");
  ok(dtype_from_name("float128", &t) == -1, "float128 is unknown");
  {
    /* double round-trips exactly, and rounds once to float32 */
    double d = 0.1, v[] = {1e300, -1e300, 0x1.fffffe8p127, 1e-320}, back;
    float f;
    int good = 1, i;
    unsigned char b[8];
    dtype_store(FL_F64, b, d);
    ok(dtype_load(FL_F64, b) == 0.1, "float64 stores and loads 0.1 exactly");
    dtype_store_i64(FL_F64, b, (INT64_C(1) << 53) + 1);
    ok(dtype_load_i64(FL_F64, b) == INT64_C(1) << 53, "int64 2^53 + 1 into float64 rounds to 2^53");
    for (i = 0; i < 4; i++) {
      dtype_store(FL_F64, b, v[i]);
      back = dtype_load(FL_F64, b);
      dtype_store(FL_F32, &f, back);
      good = good && back == v[i] && (i < 2 ? isinf(f) : i == 2 ? f == FLT_MAX : f == 0.0f);
    }
    ok(good, "float64 extremes round-trip, then round to float32 as a cast does");
  }
  ok(dtype_is_float(FL_BF16) && !dtype_is_float(FL_I64) &&
     !dtype_is_float(FL_BOOL), "float classification");
}

static void test_f16(void) {
  uint32_t h;
  int bad = 0, nan_ok = 1;
  is_int(f32_to_f16(1.0f), 0x3c00, "f16(1)");
  is_int(f32_to_f16(-2.0f), 0xc000, "f16(-2)");
  is_int(f32_to_f16(-0.0f), 0x8000, "f16(-0) keeps the sign");
  is_int(f32_to_f16(65504.0f), 0x7bff, "f16 max");
  is_int(f32_to_f16(65519.0f), 0x7bff, "just below the halfway to 2^16 rounds down");
  is_int(f32_to_f16(65520.0f), 0x7c00, "halfway to 2^16 rounds (to even) to inf");
  is_int(f32_to_f16(1e10f), 0x7c00, "overflow is inf");
  is_int(f32_to_f16(-INFINITY), 0xfc00, "-inf");
  h = f32_to_f16(NAN);
  ok((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0, "NaN stays NaN (0x%04x)", h);
  ok(isnan(f16_to_f32(0x7e00)) && isnan(f16_to_f32(0xfc01)), "f16 NaN loads as NaN");
  /* ties to even */
  is_int(f32_to_f16(1.0f + 0x1p-11f), 0x3c00, "1 + half ulp ties down to even");
  is_int(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02, "1 + 3 half ulps ties up to even");
  is_int(f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01, "just above a tie rounds up");
  /* subnormals */
  is_int(f32_to_f16(0x1p-24f), 0x0001, "smallest subnormal");
  is_int(f32_to_f16(0x1p-25f), 0x0000, "half the smallest subnormal ties to 0");
  is_int(f32_to_f16(0x1.8p-25f), 0x0001, "0.75 of the smallest rounds up");
  is_int(f32_to_f16(3 * 0x1p-25f), 0x0002, "1.5 subnormal units tie to 2");
  is_int(f32_to_f16(1023 * 0x1p-24f), 0x03ff, "largest subnormal");
  is_int(f32_to_f16(0x1p-14f), 0x0400, "smallest normal");
  is_int(f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400, "rounding up into the normals");
  is_int(f32_to_f16(1e-10f), 0x0000, "underflow is 0");
  is_near(f16_to_f32(0x0001), 0x1p-24, 0, "load smallest subnormal");
  is_near(f16_to_f32(0x7bff), 65504, 0, "load max");
  ok(isinf(f16_to_f32(0xfc00)) && f16_to_f32(0xfc00) < 0, "load -inf");
  for (h = 0; h < 0x10000; h++) {
    float f = f16_to_f32((uint16_t)h);
    if (isnan(f)) { if (!isnan(f16_to_f32(f32_to_f16(f)))) nan_ok = 0; continue; }
    if (f32_to_f16(f) != h) bad++;
  }
  is_int(bad, 0, "every non-NaN float16 round-trips through float32");
  ok(nan_ok, "every float16 NaN round-trips as a NaN");
}

static void test_bf16(void) {
  uint32_t h;
  int bad = 0;
  is_int(f32_to_bf16(1.0f), 0x3f80, "bf16(1)");
  is_int(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80, "bf16 tie rounds to even (down)");
  is_int(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82, "bf16 tie rounds to even (up)");
  is_int(f32_to_bf16(INFINITY), 0x7f80, "bf16 inf");
  is_int(f32_to_bf16(FLT_MAX), 0x7f80, "FLT_MAX rounds to bf16 inf");
  is_int(f32_to_bf16(bits_f(0x00010000u)), 0x0001, "bf16 keeps subnormals");
  h = f32_to_bf16(bits_f(0x7f800001u));   /* a NaN whose top bits are zero */
  ok((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0, "signalling NaN stays NaN");
  for (h = 0; h < 0x10000; h++) {
    float f = bf16_to_f32((uint16_t)h);
    if (isnan(f) ? !isnan(bf16_to_f32(f32_to_bf16(f))) : f32_to_bf16(f) != h)
      bad++;
  }
  is_int(bad, 0, "every bfloat16 round-trips through float32");
}

static void test_load_store(void) {
  unsigned char buf[8];
  int64_t i;
  dtype_store(FL_I64, buf, 2.7);  memcpy(&i, buf, 8); is_int(i, 2, "2.7 -> 2");
  dtype_store(FL_I64, buf, -2.7); memcpy(&i, buf, 8); is_int(i, -2, "-2.7 -> -2 (toward zero)");
  /* what does not fit gives INT64_MIN, as x86 and PyTorch there do */
  dtype_store(FL_I64, buf, NAN);  memcpy(&i, buf, 8); ok(i == INT64_MIN, "NaN -> INT64_MIN");
  dtype_store(FL_I64, buf, 1e30); memcpy(&i, buf, 8); ok(i == INT64_MIN, "1e30 -> INT64_MIN");
  dtype_store(FL_I64, buf, INFINITY); memcpy(&i, buf, 8); ok(i == INT64_MIN, "inf -> INT64_MIN");
  dtype_store(FL_I64, buf, -1e30); memcpy(&i, buf, 8); ok(i == INT64_MIN, "-1e30 -> INT64_MIN");
  dtype_store(FL_I64, buf, -INFINITY); memcpy(&i, buf, 8); ok(i == INT64_MIN, "-inf -> INT64_MIN");
  dtype_store(FL_I64, buf, -0x1p63); memcpy(&i, buf, 8); ok(i == INT64_MIN, "-2^63 fits");
  dtype_store(FL_I64, buf, 0x1.fffffffffffffp62); memcpy(&i, buf, 8);
  ok(i == (int64_t)0x1.fffffffffffffp62, "the largest double below 2^63 fits");
  ok(dtype_load_i64(FL_F32, &(float){-7.9f}) == -7, "load_i64 of a float truncates");
  i = INT64_MAX;
  dtype_store_i64(FL_I64, buf, i); memcpy(&i, buf, 8); ok(i == INT64_MAX, "store_i64 keeps every bit");
  dtype_store(FL_BOOL, buf, 0.5); is_int(buf[0], 1, "bool(0.5) is true");
  dtype_store(FL_BOOL, buf, -0.0); is_int(buf[0], 0, "bool(-0) is false");
  dtype_store(FL_BOOL, buf, NAN); is_int(buf[0], 1, "bool(NaN) is true");
  buf[0] = 7; is_near(dtype_load(FL_BOOL, buf), 1, 0, "any nonzero byte loads as 1");
  dtype_store(FL_F32, buf, 1e300);
  ok(isinf(dtype_load(FL_F32, buf)), "1e300 stores as float inf");
  dtype_store(FL_F16, buf, 0.1);
  is_near(dtype_load(FL_F16, buf), 0.0999755859375, 0, "0.1 in float16");
  dtype_store(FL_BF16, buf, -3.0);
  is_near(dtype_load(FL_BF16, buf), -3.0, 0, "-3 in bfloat16");
  dtype_store(FL_I64, buf, 9007199254740992.0);
  is_near(dtype_load(FL_I64, buf), 9007199254740992.0, 0, "2^53 in int64");
}

static void test_promote(void) {
#define P(a, ad, aw, b, bd, bw) dtype_name(dtype_promote(a, ad, aw, b, bd, bw))
  is_str(P(FL_F32, 0, 0, FL_F16, 0, 0), "float32", "f32 + f16 tensors");
  is_str(P(FL_F16, 0, 0, FL_BF16, 0, 0), "float32", "f16 + bf16 meet at f32");
  is_str(P(FL_I64, 0, 0, FL_F16, 0, 0), "float16", "int64 + f16");
  is_str(P(FL_BOOL, 0, 0, FL_BOOL, 0, 0), "bool", "bool + bool");
  is_str(P(FL_BOOL, 0, 0, FL_I64, 0, 0), "int64", "bool + int64");
  is_str(P(FL_I64, 0, 0, FL_F32, 1, 1), "float32", "int tensor + float number");
  is_str(P(FL_F16, 0, 0, FL_F32, 1, 1), "float16", "f16 tensor + float number stays f16");
  is_str(P(FL_BF16, 0, 0, FL_I64, 1, 1), "bfloat16", "bf16 tensor + int number");
  is_str(P(FL_I64, 0, 0, FL_I64, 1, 1), "int64", "int tensor + int number");
  is_str(P(FL_BOOL, 0, 0, FL_I64, 1, 1), "int64", "bool tensor + int number");
  is_str(P(FL_BOOL, 0, 0, FL_F32, 1, 1), "float32", "bool tensor + float number");
  is_str(P(FL_F32, 1, 1, FL_BOOL, 0, 0), "float32", "number first, same result");
  is_str(P(FL_F16, 0, 0, FL_F32, 1, 0), "float16", "dimensioned f16 beats 0-dim f32");
  is_str(P(FL_F32, 1, 0, FL_F16, 0, 0), "float16", "order does not matter");
  is_str(P(FL_I64, 0, 0, FL_F16, 1, 0), "float16", "0-dim float lifts an int tensor");
  is_str(P(FL_BOOL, 0, 0, FL_I64, 1, 0), "int64", "0-dim int lifts a bool tensor");
  is_str(P(FL_I64, 0, 0, FL_BOOL, 1, 0), "int64", "0-dim bool does not lower int");
  is_str(P(FL_F16, 1, 0, FL_F32, 1, 1), "float16", "0-dim f16 beats a float number");
  is_str(P(FL_BF16, 1, 0, FL_F16, 1, 0), "float32", "two 0-dim halves meet at f32");
  is_str(P(FL_I64, 1, 0, FL_F32, 1, 1), "float32", "0-dim int + float number");
  is_str(P(FL_F32, 0, 0, FL_F32, 0, 0), "float32", "f32 + f32");
  is_str(P(FL_F32, 0, 0, FL_F64, 0, 0), "float64", "f32 + f64 tensors");
  is_str(P(FL_F64, 0, 0, FL_BF16, 0, 0), "float64", "f64 + bf16 tensors");
  is_str(P(FL_I64, 0, 0, FL_F64, 0, 0), "float64", "int64 + f64");
  is_str(P(FL_F64, 0, 0, FL_F32, 1, 1), "float64", "f64 tensor + float number stays f64");
  is_str(P(FL_F32, 0, 0, FL_F64, 1, 0), "float32", "dimensioned f32 beats 0-dim f64");
  is_str(P(FL_I64, 0, 0, FL_F64, 1, 0), "float64", "0-dim f64 lifts an int tensor");
  is_str(P(FL_F64, 1, 0, FL_F16, 1, 0), "float64", "two 0-dim floats: f64 wins");
#undef P
}

static void test_sizes(void) {
  fl_meta m = META(FL_F32, I(100000), I(100000), I(100000));
  fl_tensor t;
  fl_err e;
  char buf[64];
  is_int(meta_numel(&m), 1000000000000000LL, "numel of 1e15");
  is_int(meta_check_size(&m, "zeros", &e), FL_ENOMEM, "1e15 floats refused");
  is_str(e.msg, "zeros: cannot allocate 4000000000000000 bytes (1e+15 "
         "elements of float32)", "the message names the size");
  t.st = (fl_storage *)&t;  /* garbage that ten_empty must clear */
  is_int(ten_empty(&t, &m, &e), FL_ENOMEM, "ten_empty refuses it too");
  ok(t.st == NULL, "a failed ten_empty leaves the tensor empty");
  ok(strstr(e.msg, "4000000000000000 bytes") != NULL, "ten_empty names the bytes");
  m = META(FL_F32, I(2), I(-3));
  is_int(meta_check_size(&m, "zeros", &e), FL_EINVAL, "negative dim refused");
  is_str(e.msg, "zeros: negative dimension -3 in shape [2,-3]", "negative dim message");
  m = META(FL_I64, INT64_MAX / 2, I(4), I(3));
  is_int(meta_check_size(&m, "ones", &e), FL_ENOMEM, "element count overflow refused");
  ok(strstr(e.msg, "ones: cannot allocate") == e.msg, "overflow message: %s", e.msg);
  m = META(FL_F32, I(1) << 40, I(0));
  is_int(meta_check_size(&m, "zeros", &e), FL_OK, "a zero dim makes anything fit");
  m = META(FL_BOOL, (I(1) << 40) + 1);
  is_int(meta_check_size(&m, "zeros", &e), FL_ENOMEM, "one byte past the limit");
  m = META(FL_F32, I(0), I(1) << 62, I(1) << 62);
  is_int(meta_check_size(&m, "zeros", &e), FL_EINVAL, "empty, but past 2^62");
  is_str(e.msg, "zeros: shape [0,4611686018427387904,4611686018427387904] is too "
         "large: its sizes multiply to 2.127e+37, at most 2^62 = "
         "4611686018427387904 is supported", "its strides would overflow");
  m = META(FL_F32, I(0), I(1) << 61, I(2));
  is_int(meta_check_extent(&m, "expand", &e), FL_OK, "2^62 is the limit");
  m = META(FL_F32, I(3), I(1) << 61);
  is_int(meta_check_extent(&m, "expand", &e), FL_EINVAL, "3 * 2^61 is past it");
  m = META(FL_F32, I(2), I(3));
  is_str(meta_shape_str(&m, buf, sizeof buf), "[2,3]", "shape string");
  m.ndim = 0;
  is_str(meta_shape_str(&m, buf, sizeof buf), "[]", "scalar shape string");
  is_int(meta_numel(&m), 1, "a scalar has one element");
  m = META(FL_F32, I(4), I(0), I(2));
  is_int(meta_numel(&m), 0, "a zero dim empties it");
  is_int(ten_empty(&t, &m, &e), FL_OK, "an empty tensor allocates");
  ok(ten_is_contiguous(&t), "empty tensors are contiguous");
  ten_release(&t);
}

static void test_lifetime(void) {
  fl_meta m = META(FL_F32, I(3), I(4));
  fl_tensor t, u, v;
  fl_err e;
  op_attrs a;
  int64_t i;
  int zero = 1;
  ten_release(NULL);
  memset(&t, 0, sizeof t);
  ten_release(&t);
  ok(1, "releasing NULL and an empty tensor is harmless");
  is_int(ten_empty(&t, &m, &e), FL_OK, "allocate [3,4]");
  for (i = 0; i < 12; i++) if (ten_get(&t, i) != 0) zero = 0;
  ok(zero, "fresh storage is zero-filled");
  is_int(t.st->refs, 1, "one reference");
  is_int(t.st->nbytes, 48, "48 bytes");
  ten_share(&u, &t);
  is_int(t.st->refs, 2, "a share adds one");
  op_attrs_init(OP_TRANSPOSE, &a);
  a.i[0] = 0; a.i[1] = 1;
  is_int(apply_view(OP_TRANSPOSE, &t, &a, &v, &e), FL_OK, "transpose view");
  ok(v.st == t.st, "the view shares storage");
  is_int(t.st->refs, 3, "a view adds one");
  ten_set(&v, 1, 42);   /* v[0][1] is t[1][0] */
  is_near(ten_get(&t, 4), 42, 0, "writes through a view are seen");
  ten_release(&t);
  ok(t.st == NULL, "release clears the tensor");
  is_int(u.st->refs, 2, "the others keep the storage alive");
  ten_release(&u);
  is_int(v.st->refs, 1, "the view holds the last reference");
  is_near(ten_get(&v, 1), 42, 0, "and the data is still there");
  ten_release(&v);
  /* compiled buffers skip the zero-fill; the suite poisons them, so a
  ** kernel that leaves an element unwritten is a wrong (NaN) answer */
  is_int(ten_uninit(&t, &m, &e), FL_OK, "allocate [3,4] without the zero-fill");
  if (getenv("FUSELAB_POISON_UNINIT") && strcmp(getenv("FUSELAB_POISON_UNINIT"), "1") == 0) {
    int nan = 1;
    for (i = 0; i < 12; i++) if (!isnan(ten_get(&t, i))) nan = 0;
    ok(nan, "FUSELAB_POISON_UNINIT=1: every element starts as NaN");
  } else {
    ok(1, "# SKIP FUSELAB_POISON_UNINIT is not 1 (make check sets it)");
  }
  ten_release(&t);
  /* storage from 64 bytes up starts on a cache line, below the pool's
  ** size as above it: a kernel's vector loads never straddle two lines */
  {
    static const int64_t n[] = {16, 100, 1000, 65536, 262144, 300000};
    int aligned = 1, k, z;
    for (k = 0; k < 6; k++)
      for (z = 0; z < 2; z++) {
        fl_meta mk = META(FL_F32, n[k]);
        fl_tensor a2;
        if ((z ? ten_empty(&a2, &mk, &e) : ten_uninit(&a2, &mk, &e)) != FL_OK) { aligned = 0; continue; }
        if ((uintptr_t)ten_data(&a2) % 64 != 0) {
          aligned = 0;
          printf("#   %lld floats (%s): at %p\n", (long long)n[k], z ? "zeroed" : "uninit", ten_data(&a2));
        }
        if (z) for (i = 0; i < n[k]; i++) if (ten_get(&a2, i) != 0) { aligned = 0; break; }
        ten_release(&a2);
      }
    ok(aligned, "storage of 64 bytes up is 64-byte aligned (and zeroed where asked)");
  }
}

static void check_view(fl_op op, fl_meta im, const op_attrs *a,
                       const char *shape, const char *strides, int64_t off,
                       const double *vals) {
  fl_tensor x = iota(im), v;
  fl_err e;
  char b1[64], b2[64];
  int rc = apply_view(op, &x, a, &v, &e);
  if (!ok(rc == FL_OK, "%s: view made", op_name(op))) {
    printf("#   %s\n", e.msg);
    ten_release(&x);
    return;
  }
  is_str(shape_of(&v, b1, sizeof b1), shape, "%s: shape", op_name(op));
  is_str(strides_str(&v, b2, sizeof b2), strides, "%s: strides", op_name(op));
  is_int(v.offset, off, "%s: offset", op_name(op));
  ok(v.st == x.st && x.st->refs == 2, "%s: shares storage", op_name(op));
  if (vals) ok(values_are(&v, vals, meta_numel(&v.m)), "%s: values", op_name(op));
  ten_release(&v);
  ten_release(&x);
}

static void test_views(void) {
  op_attrs a;
  fl_tensor x, t, v;
  fl_err e;
  char b1[64];
  static const double tr[] = {0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21,
                              2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23};
  static const double nar[] = {1, 2, 3, 6, 7, 8, 11, 12, 13, 16, 17, 18};
  static const double exp_[] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2,
                                0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2};

  op_attrs_init(OP_TRANSPOSE, &a); a.i[0] = 0; a.i[1] = 2;
  check_view(OP_TRANSPOSE, META(FL_F32, I(2), I(3), I(4)), &a, "[4,3,2]", "[1,4,12]", 0, tr);
  op_attrs_init(OP_PERMUTE, &a); a.ndims = 3; a.dims[0] = 2; a.dims[1] = 0; a.dims[2] = 1;
  check_view(OP_PERMUTE, META(FL_F32, I(2), I(3), I(4)), &a, "[4,2,3]", "[1,12,4]", 0, NULL);
  op_attrs_init(OP_UNSQUEEZE, &a); a.i[0] = 1;
  check_view(OP_UNSQUEEZE, META(FL_F32, I(2), I(3)), &a, "[2,1,3]", "[3,3,1]", 0, NULL);
  a.i[0] = 2;
  check_view(OP_UNSQUEEZE, META(FL_F32, I(2), I(3)), &a, "[2,3,1]", "[3,1,1]", 0, NULL);
  op_attrs_init(OP_SQUEEZE, &a);
  check_view(OP_SQUEEZE, META(FL_F32, I(1), I(3), I(1)), &a, "[3]", "[1]", 0, NULL);
  a.i[0] = 0; a.i[1] = 1;
  check_view(OP_SQUEEZE, META(FL_F32, I(1), I(3), I(1)), &a, "[3,1]", "[1,1]", 0, NULL);
  op_attrs_init(OP_EXPAND, &a); a.ndims = 3; a.dims[0] = 2; a.dims[1] = -1; a.dims[2] = 4;
  check_view(OP_EXPAND, META(FL_F32, I(3), I(1)), &a, "[2,3,4]", "[0,1,0]", 0, exp_);
  op_attrs_init(OP_NARROW, &a); a.i[0] = 1; a.i[1] = 1; a.i[2] = 3;
  check_view(OP_NARROW, META(FL_F32, I(4), I(5)), &a, "[4,3]", "[5,1]", 1, nar);
  op_attrs_init(OP_RESHAPE, &a); a.ndims = 2; a.dims[0] = 3; a.dims[1] = -1;
  check_view(OP_RESHAPE, META(FL_F32, I(2), I(6)), &a, "[3,4]", "[4,1]", 0, NULL);
  op_attrs_init(OP_VIEW, &a); a.ndims = 2; a.dims[0] = 1; a.dims[1] = 1;
  check_view(OP_VIEW, meta(FL_F32, 0), &a, "[1,1]", "[1,1]", 0, NULL);

  /* reshape of a transpose: [4,6]^T is [6,4] with strides [1,6] */
  x = iota(META(FL_F32, I(4), I(6)));
  op_attrs_init(OP_TRANSPOSE, &a); a.i[0] = 0; a.i[1] = 1;
  apply_view(OP_TRANSPOSE, &x, &a, &t, &e);
  ok(!ten_is_contiguous(&t), "a transpose is not contiguous");
  op_attrs_init(OP_VIEW, &a); a.ndims = 3; a.dims[0] = 2; a.dims[1] = 3; a.dims[2] = 4;
  is_int(apply_view(OP_VIEW, &t, &a, &v, &e), FL_OK, "[6,4]^T viewed as [2,3,4]");
  is_str(strides_str(&v, b1, sizeof b1), "[3,1,6]", "split of the strided dim");
  is_near(ten_get(&v, 6), 13, 0, "v[0][1][2] is t[1][2] = x[2][1]");
  ten_release(&v);
  a.ndims = 1; a.dims[0] = 24;
  is_int(apply_view(OP_VIEW, &t, &a, &v, &e), FL_EUNSUPPORTED, "flattening a transpose needs a copy");
  ok(strstr(e.msg, "view: size is not compatible with input tensor's size and stride") == e.msg,
     "view error says so: %s", e.msg);
  ok(strstr(e.msg, "reshape") != NULL, "and suggests reshape");
  ok(v.st == NULL, "failed view is empty");
  is_int(apply_view(OP_RESHAPE, &t, &a, &v, &e), FL_EUNSUPPORTED, "reshape asks its caller to copy");
  ten_release(&t);

  /* narrowed rows stay contiguous; narrowed columns split */
  op_attrs_init(OP_NARROW, &a); a.i[0] = 0; a.i[1] = 1; a.i[2] = 2;
  apply_view(OP_NARROW, &x, &a, &t, &e);
  is_int(t.offset, 6, "row narrow offset");
  ok(ten_is_contiguous(&t), "row narrow is contiguous");
  ten_release(&t);
  op_attrs_init(OP_NARROW, &a); a.i[0] = 1; a.i[1] = 3; a.i[2] = 3;
  apply_view(OP_NARROW, &x, &a, &t, &e);
  op_attrs_init(OP_VIEW, &a); a.ndims = 3; a.dims[0] = 2; a.dims[1] = 2; a.dims[2] = 3;
  is_int(apply_view(OP_VIEW, &t, &a, &v, &e), FL_OK, "column narrow [4,3] as [2,2,3]");
  is_str(strides_str(&v, b1, sizeof b1), "[12,6,1]", "its strides");
  is_int(v.offset, 3, "its offset");
  is_near(ten_get(&v, 4), 10, 0, "v[0][1][1] = x[1][4]");
  ten_release(&v);
  a.ndims = 1; a.dims[0] = 12;
  is_int(apply_view(OP_VIEW, &t, &a, &v, &e), FL_EUNSUPPORTED, "column narrow cannot flatten");
  ten_release(&t);
  is_int(x.st->refs, 1, "every view released");
  ten_release(&x);
}

static void test_copy(void) {
  fl_tensor x, t, c, d, b;
  fl_err e;
  op_attrs a;
  fl_meta m;
  char b1[64];
  static const double tvals[] = {0, 3, 1, 4, 2, 5};
  static const double bvals[] = {0, 1, 2, 0, 1, 2};
  static const double shifted[] = {0, 0, 1, 2, 3};
  static const double filled[] = {0, 1, 2, 3, 7, 5, 6, 7, 7, 9, 10, 11};
  int64_t i;

  x = iota(META(FL_F32, I(2), I(3)));
  op_attrs_init(OP_TRANSPOSE, &a); a.i[0] = 0; a.i[1] = 1;
  apply_view(OP_TRANSPOSE, &x, &a, &t, &e);
  is_int(ten_contiguous(&c, &t, &e), FL_OK, "contiguous of a transpose");
  ok(c.st != x.st && ten_is_contiguous(&c), "is a fresh contiguous copy");
  ok(values_are(&c, tvals, 6), "with the transposed values");
  ten_release(&c);
  is_int(ten_contiguous(&c, &x, &e), FL_OK, "contiguous of a contiguous tensor");
  ok(c.st == x.st && x.st->refs == 3, "shares instead of copying");
  ten_release(&c);

  /* broadcast src [3] into [2,3] */
  m = META(FL_F32, I(3));
  b = iota(m);
  m = META(FL_F32, I(2), I(3));
  ten_empty(&d, &m, &e);
  is_int(ten_copy(&d, &b, &e), FL_OK, "copy broadcasts [3] to [2,3]");
  ok(values_are(&d, bvals, 6), "row repeated");
  ten_release(&d);
  m = META(FL_F32, I(3), I(2));
  ten_empty(&d, &m, &e);
  is_int(ten_copy(&d, &b, &e), FL_EINVAL, "[3] does not broadcast to [3,2]");
  is_str(e.msg, "copy_: broadcast_to: cannot broadcast [3] to [3,2] (size 3 vs 2)",
         "broadcast error message");
  ten_release(&d);
  ten_release(&b);

  /* dtype conversions, strided source */
  m = META(FL_F16, I(3), I(2));
  ten_empty(&d, &m, &e);
  ten_fill(&t, 1.0 / 3.0);  /* writes x through the transposed view */
  ten_set(&t, 5, -2.5);
  is_int(ten_copy(&d, &t, &e), FL_OK, "float32 transpose -> float16");
  is_near(ten_get(&d, 0), 0.333251953125, 0, "1/3 rounded to float16");
  is_near(ten_get(&d, 5), -2.5, 0, "exact value kept");
  m = META(FL_I64, I(3), I(2));
  ten_empty(&c, &m, &e);
  ten_set(&t, 1, 2.9); ten_set(&t, 2, -2.9);
  ten_copy(&c, &t, &e);
  ok(ten_get(&c, 1) == 2 && ten_get(&c, 2) == -2 && ten_get(&c, 0) == 0,
     "float -> int64 truncates toward zero");
  m = META(FL_BOOL, I(3), I(2));
  ten_empty(&b, &m, &e);
  ten_copy(&b, &c, &e);
  ok(ten_get(&b, 0) == 0 && ten_get(&b, 1) == 1 && ten_get(&b, 2) == 1,
     "int64 -> bool tests != 0");
  ten_release(&b);
  m = META(FL_BF16, I(3), I(2));
  ten_empty(&b, &m, &e);
  ten_copy(&b, &d, &e);
  is_near(ten_get(&b, 0), 0.333984375, 0, "float16 -> bfloat16 rounds again");
  ten_release(&b); ten_release(&c); ten_release(&d); ten_release(&t);
  ten_release(&x);

  /* strided destination: d = x[1:3, 0] reached as narrow(narrow(x^T)) */
  x = iota(META(FL_F32, I(3), I(4)));
  op_attrs_init(OP_TRANSPOSE, &a); a.i[0] = 0; a.i[1] = 1;
  apply_view(OP_TRANSPOSE, &x, &a, &t, &e);              /* [4,3] */
  op_attrs_init(OP_NARROW, &a); a.i[0] = 1; a.i[1] = 1; a.i[2] = 2;
  apply_view(OP_NARROW, &t, &a, &c, &e);                 /* [4,2] */
  op_attrs_init(OP_NARROW, &a); a.i[0] = 0; a.i[1] = 0; a.i[2] = 1;
  apply_view(OP_NARROW, &c, &a, &d, &e);                 /* [1,2] */
  is_str(strides_str(&d, b1, sizeof b1), "[1,4]", "nested view strides");
  is_int(d.offset, 4, "nested view offset");
  ten_fill(&d, 7);
  ok(values_are(&x, filled, 12), "fill through nested views touches only them");
  for (i = 0; i < 12; i++) ten_set(&x, i, (double)i);
  b = iota(META(FL_F32, I(3)));
  is_int(ten_copy(&d, &b, &e), FL_EINVAL, "[3] cannot go into [1,2]");
  ten_release(&b);
  m = meta(FL_I64, 0);
  ten_empty(&b, &m, &e);
  ten_set(&b, 0, 7);
  is_int(ten_copy(&d, &b, &e), FL_OK, "a 0-dim int64 broadcasts into a strided float view");
  ok(values_are(&x, filled, 12), "only the viewed elements changed");
  ten_release(&b); ten_release(&c); ten_release(&d); ten_release(&t);
  ten_release(&x);

  /* overlapping copy inside one storage reads the old values */
  x = iota(META(FL_F32, I(5)));
  op_attrs_init(OP_NARROW, &a); a.i[0] = 0; a.i[1] = 1; a.i[2] = 4;
  apply_view(OP_NARROW, &x, &a, &d, &e);
  a.i[1] = 0;
  apply_view(OP_NARROW, &x, &a, &c, &e);
  is_int(ten_copy(&d, &c, &e), FL_OK, "overlapping copy");
  ok(values_are(&x, shifted, 5), "x[1:5] = old x[0:4]");
  ten_release(&c); ten_release(&d); ten_release(&x);

  /* ten_broadcast_to */
  x = iota(META(FL_F32, I(3), I(1)));
  {
    int64_t sh[3] = {2, 3, 4};
    is_int(ten_broadcast_to(&t, &x, 3, sh, &e), FL_OK, "broadcast [3,1] to [2,3,4]");
    is_str(strides_str(&t, b1, sizeof b1), "[0,1,0]", "broadcast strides");
    is_near(ten_get(&t, 23), 2, 0, "last element");
    ten_release(&t);
    sh[2] = 4; sh[1] = 2;
    is_int(ten_broadcast_to(&t, &x, 3, sh, &e), FL_EINVAL, "[3,1] to [2,2,4] fails");
    is_int(ten_broadcast_to(&t, &x, 1, sh, &e), FL_EINVAL, "fewer dims fails");
    sh[1] = 3;
    ten_broadcast_to(&t, &x, 3, sh, &e);
    is_int(ten_copy(&t, &x, &e), FL_EINVAL, "copying into an expanded view is refused");
    ok(strstr(e.msg, "copy_: the destination is an expanded view") == e.msg,
       "and says why: %s", e.msg);
    ten_release(&t);
  }
  ten_release(&x);

  /* same-dtype strided float32 copy over many rows, both sides strided */
  x = iota(META(FL_F32, I(64), I(33)));
  op_attrs_init(OP_TRANSPOSE, &a); a.i[0] = 0; a.i[1] = 1;
  apply_view(OP_TRANSPOSE, &x, &a, &t, &e);
  m = META(FL_F32, I(64), I(33));
  ten_empty(&d, &m, &e);
  apply_view(OP_TRANSPOSE, &d, &a, &c, &e);
  ten_copy(&c, &t, &e);
  {
    int same = 1;
    for (i = 0; i < 64 * 33; i++) if (ten_get(&d, i) != (double)i) same = 0;
    ok(same, "strided-to-strided float32 copy puts every element back");
  }
  ten_release(&c); ten_release(&d); ten_release(&t); ten_release(&x);
}

int main(void) {
  test_dtype_basics();
  test_f16();
  test_bf16();
  test_load_store();
  test_promote();
  test_sizes();
  test_lifetime();
  test_views();
  test_copy();
  return tap_done();
}
