/*
** test_ref.c -- the reference interpreter against values worked by hand
** (or from exact formulas), one block per op family, then the errors it
** must report and the random stream.  Every op of ops.def must be run at
** least once: the last test fails when a new row has no test here.
**
** Tolerances: float32 outputs are the double result rounded once to
** float32, a relative error of at most 2^-24 (6e-8); REL = 1e-6 relative
** (absolute below 1) leaves room for the 16-17 digit constants written
** below.  int64 and bool outputs must match exactly.
*/
#include <stdint.h>
#include <stdlib.h>

#include "graph/ref.h"
#include "graph/rng.h"
#include "tap.h"

#define REL 1e-6

/* shapes and values as compound literals: SH(2,3) expands to ptr, count */
#define SH(...) (const int64_t[]){__VA_ARGS__}, \
  (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define V(...) (const double[]){__VA_ARGS__}
#define S0 NULL, 0   /* the shape of a 0-d tensor */
#define NV(...) (int)(sizeof((double[]){__VA_ARGS__}) / sizeof(double))

static int ran[OP_COUNT];   /* ops exercised, for the coverage test */

/* A fresh contiguous tensor of the given shape holding vals (row-major),
** or 0, 1, 2, ... when vals is NULL. */
static fl_tensor mk(fl_dtype dt, const int64_t *shape, int ndim,
                    const double *vals) {
  fl_tensor t;
  fl_meta m;
  fl_err e;
  int64_t i, n;
  int d;
  memset(&m, 0, sizeof m);
  m.dtype = dt;
  m.ndim = ndim;
  for (d = 0; d < ndim; d++) m.shape[d] = shape[d];
  if (ten_empty(&t, &m, &e) != FL_OK) {
    printf("Bail out! ten_empty: %s\n", e.msg);
    exit(1);
  }
  n = meta_numel(&m);
  for (i = 0; i < n; i++) ten_set(&t, i, vals ? vals[i] : (double)i);
  return t;
}

/* A 0-d tensor. */
static fl_tensor mk0(fl_dtype dt, double v) { return mk(dt, NULL, 0, &v); }

/* 0, 1, ..., n-1 in the given shape. */
#define iota(dt, shape) mk(dt, shape, NULL)

static fl_err err;

/* ref_apply, counted for coverage; a failure prints its message. */
static int run(fl_op op, const fl_tensor *const *in, int nin,
               const op_attrs *a, fl_tensor *out) {
  int rc;
  err_clear(&err);
  rc = ref_apply(op, in, nin, a, out, &err);
  if (rc == FL_OK) ran[op] = 1;
  else printf("# %s: %s\n", op_name(op), err.msg);
  return rc;
}

/* One test: out has dtype dt, the given shape, and values within REL
** (relative, absolute below 1); NaN matches NaN.  Releases out. */
static void check(const char *name, fl_tensor *out, fl_dtype dt,
                  const int64_t *shape, int ndim, const double *want, int nw) {
  fl_meta m;
  char got_s[96], want_s[96];
  int64_t i, n;
  int d, good = 1;
  memset(&m, 0, sizeof m);
  m.ndim = ndim;
  for (d = 0; d < ndim; d++) m.shape[d] = shape[d];
  if (!out->st && meta_numel(&m) > 0) {
    ok(0, "%s (no result)", name);
    return;
  }
  if (out->m.dtype != dt || !meta_same_shape(&out->m, &m) ||
      meta_numel(&m) != nw) {
    ok(0, "%s", name);
    printf("#   got %s %s, want %s %s\n", dtype_name(out->m.dtype),
           meta_shape_str(&out->m, got_s, sizeof got_s), dtype_name(dt),
           meta_shape_str(&m, want_s, sizeof want_s));
    ten_release(out);
    return;
  }
  n = meta_numel(&m);
  for (i = 0; i < n && good; i++) {
    double g = ten_get(out, i), w = want[i];
    double tol = dtype_is_float(dt) ? REL * (fabs(w) > 1 ? fabs(w) : 1) : 0;
    if (!(g == w || fabs(g - w) <= tol || (isnan(g) && isnan(w)))) {
      good = 0;
      ok(0, "%s", name);
      printf("#   element %lld: got %.17g, want %.17g\n", (long long)i, g, w);
    }
  }
  if (good) ok(1, "%s", name);
  ten_release(out);
}

/* Run op on all of the local array ins[] and check the result in one
** line. */
#define CHECK(name, op, a, dt, shape, ...) do { \
    const fl_tensor *p_[8]; \
    fl_tensor o_; \
    int n_ = (int)(sizeof ins / sizeof ins[0]), k_; \
    for (k_ = 0; k_ < n_; k_++) p_[k_] = &ins[k_]; \
    run(op, p_, n_, a, &o_); \
    check(name, &o_, dt, shape, V(__VA_ARGS__), NV(__VA_ARGS__)); \
  } while (0)

static void release_all(fl_tensor *t, int n) {
  int k;
  for (k = 0; k < n; k++) ten_release(&t[k]);
}

static op_attrs attrs(fl_op op) {
  op_attrs a;
  op_attrs_init(op, &a);
  return a;
}

/* --- elementwise ------------------------------------------------------ */

static void test_unary(void) {
  struct { fl_op op; double x[3], want[3]; } rows[] = {
    {OP_ABS,       {-1.5, 2, 0},      {1.5, 2, 0}},
    {OP_NEG,       {1, -2, 0.5},      {-1, 2, -0.5}},
    {OP_EXP,       {0, 1, -1},        {1, 2.718281828459045, 0.36787944117144233}},
    {OP_LOG,       {1, 4, 0.5},       {0, 1.3862943611198906, -0.6931471805599453}},
    {OP_SQRT,      {4, 2, 0},         {2, 1.4142135623730951, 0}},
    {OP_RSQRT,     {4, 0.25, 1},      {0.5, 2, 1}},
    {OP_SIN,       {0, 0.5, -0.5},    {0, 0.479425538604203, -0.479425538604203}},
    {OP_COS,       {0, 0.5, -0.5},    {1, 0.8775825618903728, 0.8775825618903728}},
    {OP_ASIN,      {0, 0.5, -1},      {0, 0.5235987755982989, -1.5707963267948966}},
    {OP_ACOS,      {1, 0.5, -1},      {0, 1.0471975511965979, 3.141592653589793}},
    {OP_ATAN,      {0, 1, -2},        {0, 0.7853981633974483, -1.1071487177940904}},
    {OP_TANH,      {0, 1, -1},        {0, 0.7615941559557649, -0.7615941559557649}},
    {OP_SIGMOID,   {0, 2, -2},        {0.5, 0.8807970779778823, 0.11920292202211755}},
    {OP_RELU,      {-1, 0, NAN},      {0, 0, NAN}},
    {OP_GELU,      {1, -1, 0},        {0.8413447460685429, -0.15865525393145707, 0}},
    {OP_GELU_TANH, {1, 0, -1},        {0.8411919906082768, 0, -0.15880800939172324}},
    {OP_SILU,      {1, 0, -1},        {0.7310585786300049, 0, -0.2689414213699951}},
    {OP_ERF,       {0, 1, -1},        {0, 0.8427007929497149, -0.8427007929497149}},
  };
  size_t r;
  op_attrs a;
  char name[64];
  for (r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    fl_tensor ins[] = {mk(FL_F32, SH(3), rows[r].x)}, o;
    a = attrs(rows[r].op);
    snprintf(name, sizeof name, "%s at known points", op_name(rows[r].op));
    run(rows[r].op, (const fl_tensor *const[]){&ins[0]}, 1, &a, &o);
    check(name, &o, FL_F32, SH(3), rows[r].want, 3);
    release_all(ins, 1);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(4), V(-2, 0.5, 3, NAN))};
    a = attrs(OP_CLAMP);
    a.f[0] = -1; a.f[1] = 1;
    CHECK("clamp(-1, 1) keeps NaN", OP_CLAMP, &a, FL_F32, SH(4), -1, 0.5, 1,
          NAN);
    a = attrs(OP_CLAMP);
    a.f[0] = 0;   /* only a lower bound: hi stays +inf */
    CHECK("clamp(0, nil)", OP_CLAMP, &a, FL_F32, SH(4), 0, 0.5, 3, NAN);
    release_all(ins, 1);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(3), V(1.7, -1.7, 1.0 / 3))};
    a = attrs(OP_TO);
    a.dtype = FL_I64;
    CHECK("to int64 truncates toward zero", OP_TO, &a, FL_I64, SH(3), 1, -1, 0);
    a.dtype = FL_F16;
    /* 1.7 and 1/3 rounded to 11 significant bits */
    CHECK("to float16 rounds", OP_TO, &a, FL_F16, SH(3),
          1.7001953125, -1.7001953125, 0.333251953125);
    release_all(ins, 1);
  }
}

static void test_binary(void) {
  op_attrs a;
  {
    /* [3,1] + [1,4] broadcasts to [3,4] */
    fl_tensor ins[] = {mk(FL_F32, SH(3, 1), V(0, 10, 20)),
                       mk(FL_F32, SH(1, 4), V(1, 2, 3, 4))};
    a = attrs(OP_ADD);
    CHECK("add [3,1] + [1,4]", OP_ADD, &a, FL_F32, SH(3, 4),
          1, 2, 3, 4, 11, 12, 13, 14, 21, 22, 23, 24);
    a = attrs(OP_MUL);
    CHECK("mul [3,1] * [1,4]", OP_MUL, &a, FL_F32, SH(3, 4),
          0, 0, 0, 0, 10, 20, 30, 40, 20, 40, 60, 80);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2, 3), V(1, 2, 3, 4, 5, 6)),
                       mk(FL_F32, SH(3), V(1, 10, 100))};
    a = attrs(OP_SUB);
    CHECK("sub [2,3] - [3]", OP_SUB, &a, FL_F32, SH(2, 3),
          0, -8, -97, 3, -5, -94);
    a = attrs(OP_DIV);
    CHECK("div [2,3] / [3]", OP_DIV, &a, FL_F32, SH(2, 3),
          1, 0.2, 0.03, 4, 0.5, 0.06);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(3), V(2, 3, 4)), mk0(FL_F32, 0.5)};
    a = attrs(OP_POW);
    CHECK("pow [3] ^ 0-d 0.5", OP_POW, &a, FL_F32, SH(3),
          1.4142135623730951, 1.7320508075688772, 2);
    release_all(ins, 2);
  }
  {
    /* NaN from either side wins */
    fl_tensor ins[] = {mk(FL_F32, SH(4), V(1, NAN, 3, -1)),
                       mk(FL_F32, SH(4), V(2, 0, NAN, -2))};
    a = attrs(OP_MAXIMUM);
    CHECK("maximum propagates NaN", OP_MAXIMUM, &a, FL_F32, SH(4),
          2, NAN, NAN, -1);
    a = attrs(OP_MINIMUM);
    CHECK("minimum propagates NaN", OP_MINIMUM, &a, FL_F32, SH(4),
          1, NAN, NAN, -2);
    release_all(ins, 2);
  }
  {
    /* fmod: the dividend's sign; remainder: the divisor's (Python's %) */
    fl_tensor ins[] = {mk(FL_F32, SH(4), V(-7.5, 7.5, -7.5, 7.5)),
                       mk(FL_F32, SH(4), V(2, 2, -2, -2))};
    a = attrs(OP_FMOD);
    CHECK("fmod truncates", OP_FMOD, &a, FL_F32, SH(4), -1.5, 1.5, -1.5, 1.5);
    a = attrs(OP_REMAINDER);
    CHECK("remainder floors", OP_REMAINDER, &a, FL_F32, SH(4), 0.5, 1.5, -1.5, -0.5);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(4), V(1, 2, 3, NAN)),
                       mk(FL_F32, SH(4), V(2, 2, 2, NAN))};
    a = attrs(OP_EQ);
    CHECK("eq", OP_EQ, &a, FL_BOOL, SH(4), 0, 1, 0, 0);
    CHECK("ne (NaN != NaN)", OP_NE, &a, FL_BOOL, SH(4), 1, 0, 1, 1);
    CHECK("lt", OP_LT, &a, FL_BOOL, SH(4), 1, 0, 0, 0);
    CHECK("le", OP_LE, &a, FL_BOOL, SH(4), 1, 1, 0, 0);
    CHECK("gt", OP_GT, &a, FL_BOOL, SH(4), 0, 0, 1, 0);
    CHECK("ge", OP_GE, &a, FL_BOOL, SH(4), 0, 1, 1, 0);
    release_all(ins, 2);
  }
  {
    /* condition [3,1], a [1,2], b 0-d: all three broadcast to [3,2] */
    fl_tensor ins[] = {mk(FL_BOOL, SH(3, 1), V(1, 0, 1)),
                       mk(FL_F32, SH(1, 2), V(1, 2)), mk0(FL_F32, -5)};
    a = attrs(OP_WHERE);
    CHECK("where [3,1] ? [1,2] : 0-d", OP_WHERE, &a, FL_F32, SH(3, 2),
          1, 2, -5, -5, 1, 2);
    release_all(ins, 3);
  }
}

/* int64 stays exact (below 2^53), and int64 / int64 is true division. */
static void test_int64(void) {
  op_attrs a;
  double big = 1099511627776.0;   /* 2^40 */
  {
    fl_tensor ins[] = {mk(FL_I64, SH(3), V(big + 1, -5, 67108864)),
                       mk(FL_I64, SH(3), V(3, 7, 67108864))};
    a = attrs(OP_ADD);
    CHECK("int64 add exact at 2^40 + 4", OP_ADD, &a, FL_I64, SH(3),
          big + 4, 2, 134217728);
    a = attrs(OP_SUB);
    CHECK("int64 sub", OP_SUB, &a, FL_I64, SH(3), big - 2, -12, 0);
    a = attrs(OP_MAXIMUM);
    CHECK("int64 maximum", OP_MAXIMUM, &a, FL_I64, SH(3), big + 1, 7, 67108864);
    a = attrs(OP_MUL);
    CHECK("int64 mul exact at 2^26 * 2^26", OP_MUL, &a, FL_I64, SH(3),
          3 * big + 3, -35, 4503599627370496.0);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_I64, SH(3), V(7, -7, 3)),
                       mk(FL_I64, SH(3), V(2, 2, 20))};
    a = attrs(OP_DIV);
    CHECK("int64 div is true division", OP_DIV, &a, FL_F32, SH(3),
          3.5, -3.5, 0.15);
    a = attrs(OP_POW);
    CHECK("int64 pow 3^20 exact", OP_POW, &a, FL_I64, SH(3),
          49, 49, 3486784401.0);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_I64, SH(2), V(-3, 4))};
    a = attrs(OP_ABS);
    CHECK("int64 abs", OP_ABS, &a, FL_I64, SH(2), 3, 4);
    a = attrs(OP_NEG);
    CHECK("int64 neg", OP_NEG, &a, FL_I64, SH(2), 3, -4);
    a = attrs(OP_SUM);
    CHECK("int64 sum", OP_SUM, &a, FL_I64, S0, 1);
    release_all(ins, 1);
  }
}

/* Beyond 2^53 (nanosecond timestamps): int64 computes in int64, exactly,
** and wraps around on overflow as PyTorch does. */
#define IV(...) (const int64_t[]){__VA_ARGS__}

static fl_tensor mki(const int64_t *shape, int ndim, const int64_t *vals) {
  fl_tensor t = mk(FL_I64, shape, ndim, NULL);
  int64_t i, n = meta_numel(&t.m);
  for (i = 0; i < n; i++) ((int64_t *)ten_data(&t))[i] = vals[i];
  return t;
}

/* op over the inputs gives exactly want (n int64 values). */
static void check_i64(const char *name, fl_op op, const fl_tensor *x,
                      const fl_tensor *y, const op_attrs *a,
                      const int64_t *want, int n) {
  const fl_tensor *in[2] = {x, y};
  fl_tensor out;
  int i, good;
  good = run(op, in, y ? 2 : 1, a, &out) == FL_OK &&
         meta_numel(&out.m) == n && out.m.dtype == FL_I64;
  for (i = 0; good && i < n; i++)
    if (((const int64_t *)ten_data(&out))[i] != want[i]) {
      printf("# %s: element %d is %lld, expected %lld\n", name, i,
             (long long)((const int64_t *)ten_data(&out))[i],
             (long long)want[i]);
      good = 0;
    }
  ok(good, "%s", name);
  if (out.st) ten_release(&out);
}

static void test_int64_exact(void) {
  const int64_t ts = 1733000000123456789LL;
  fl_tensor t = mki(SH(3), IV(ts, INT64_MAX, INT64_MIN));
  fl_tensor one = mki(S0, IV(1));
  fl_tensor two = mki(SH(3), IV(2, 2, 2));
  fl_tensor e = mki(SH(4), IV(-1, -3, -2, 63));
  fl_tensor b = mki(SH(4), IV(1, -1, -1, 2));
  fl_tensor f = mk(FL_F32, SH(5), V(NAN, INFINITY, -INFINITY, 1e30, -7.9));
  fl_tensor c = mk(FL_BOOL, SH(3), V(1, 0, 1));
  const fl_tensor *in[3];
  fl_tensor out, sum1;
  op_attrs a = attrs(OP_ADD);
  check_i64("int64 add: timestamp + 1 exact, INT64_MAX + 1 wraps", OP_ADD,
            &t, &one, &a, IV(ts + 1, INT64_MIN, INT64_MIN + 1), 3);
  in[0] = &t; in[1] = &one;
  if (run(OP_ADD, in, 2, &a, &sum1) == FL_OK) {
    a = attrs(OP_SUB);
    check_i64("int64 (t + 1) - t is 1 for a nanosecond timestamp", OP_SUB,
              &sum1, &t, &a, IV(1, 1, 1), 3);
    ten_release(&sum1);
  }
  a = attrs(OP_MUL);
  check_i64("int64 mul wraps", OP_MUL, &t, &two, &a,
            IV((int64_t)((uint64_t)ts * 2), -2, 0), 3);
  a = attrs(OP_NEG);
  check_i64("int64 neg: -INT64_MIN wraps to itself", OP_NEG, &t, NULL, &a,
            IV(-ts, -INT64_MAX, INT64_MIN), 3);
  a = attrs(OP_ABS);
  check_i64("int64 abs exact", OP_ABS, &t, NULL, &a,
            IV(ts, INT64_MAX, INT64_MIN), 3);
  a = attrs(OP_MAXIMUM);
  check_i64("int64 maximum exact", OP_MAXIMUM, &t, &one, &a,
            IV(ts, INT64_MAX, 1), 3);
  a = attrs(OP_CLAMP);
  a.f[0] = 0; a.f[1] = 1e300;
  check_i64("int64 clamp: bounds saturate to int64", OP_CLAMP, &t, NULL, &a,
            IV(ts, INT64_MAX, 0), 3);
  a = attrs(OP_POW);
  check_i64("int64 pow: negative tensor exponents as PyTorch, 2^63 wraps",
            OP_POW, &b, &e, &a, IV(1, -1, 1, INT64_MIN), 4);
  a = attrs(OP_SUM);
  check_i64("int64 sum exact and wrapping", OP_SUM, &t, NULL, &a,
            IV(ts - 1), 1);
  a = attrs(OP_AMIN);
  check_i64("int64 amin exact", OP_AMIN, &t, NULL, &a, IV(INT64_MIN), 1);
  a = attrs(OP_ARGMAX);
  check_i64("int64 argmax exact", OP_ARGMAX, &t, NULL, &a, IV(1), 1);
  a = attrs(OP_TO);
  a.dtype = FL_I64;
  check_i64("float -> int64: NaN, inf, out of range give INT64_MIN", OP_TO,
            &f, NULL, &a, IV(INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN, -7), 5);
  /* comparisons and where see the last bit */
  in[0] = &t; in[1] = &t;
  a = attrs(OP_LT);
  {
    fl_tensor t1 = mki(SH(3), IV(ts + 1, INT64_MAX - 1, INT64_MIN + 1));
    in[1] = &t1;
    ok(run(OP_LT, in, 2, &a, &out) == FL_OK &&
       ((const uint8_t *)ten_data(&out))[0] == 1 &&
       ((const uint8_t *)ten_data(&out))[1] == 0 &&
       ((const uint8_t *)ten_data(&out))[2] == 1,
       "int64 lt sees a difference of 1 beyond 2^53");
    if (out.st) ten_release(&out);
    in[0] = &c; in[1] = &t; in[2] = &t1;
    a = attrs(OP_WHERE);
    ok(run(OP_WHERE, in, 3, &a, &out) == FL_OK &&
       ((const int64_t *)ten_data(&out))[0] == ts &&
       ((const int64_t *)ten_data(&out))[1] == INT64_MAX - 1,
       "int64 where keeps every bit");
    if (out.st) ten_release(&out);
    ten_release(&t1);
  }
  /* a negative Lua number as the exponent is refused, as in PyTorch */
  one.m.wrapped = 1;
  ((int64_t *)ten_data(&one))[0] = -1;
  in[0] = &t; in[1] = &one;
  a = attrs(OP_POW);
  err_clear(&err);
  ok(ref_apply(OP_POW, in, 2, &a, &out, &err) == FL_EINVAL && !out.st &&
     strstr(err.msg, "negative integer powers"),
     "int64 pow refuses a negative scalar exponent");
  ten_release(&t); ten_release(&one); ten_release(&two); ten_release(&e);
  ten_release(&b); ten_release(&f); ten_release(&c);
}

/* --- reductions ----------------------------------------------------------- */

static void test_reduce(void) {
  op_attrs a;
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2, 3), V(1, 2, 3, 4, 5, 6))};
    a = attrs(OP_SUM);
    CHECK("sum over all dims", OP_SUM, &a, FL_F32, S0, 21);
    a.ndims = 1; a.dims[0] = 0;
    CHECK("sum dim 0", OP_SUM, &a, FL_F32, SH(3), 5, 7, 9);
    a.dims[0] = 1; a.keepdim = 1;
    CHECK("sum dim 1 keepdim", OP_SUM, &a, FL_F32, SH(2, 1), 6, 15);
    a = attrs(OP_MEAN);
    a.ndims = 1; a.dims[0] = 1;
    CHECK("mean dim 1", OP_MEAN, &a, FL_F32, SH(2), 2, 5);
    a = attrs(OP_AMAX);
    a.ndims = 1; a.dims[0] = 0;
    CHECK("amax dim 0", OP_AMAX, &a, FL_F32, SH(3), 4, 5, 6);
    a = attrs(OP_AMIN);
    CHECK("amin over all dims", OP_AMIN, &a, FL_F32, S0, 1);
    /* 1..6: mean 3.5, squared deviations sum to 17.5 */
    a = attrs(OP_VAR);
    CHECK("var correction 1 (unbiased) = 17.5/5", OP_VAR, &a, FL_F32, S0,
          3.5);
    a.f[0] = 0;
    CHECK("var correction 0 (population) = 17.5/6", OP_VAR, &a, FL_F32, S0,
          2.9166666666666665);
    a = attrs(OP_VAR);
    a.ndims = 1; a.dims[0] = 1;
    CHECK("var dim 1", OP_VAR, &a, FL_F32, SH(2), 1, 1);
    release_all(ins, 1);
  }
  {
    /* both dims of a [2,2,2], keeping the middle one */
    fl_tensor ins[] = {iota(FL_F32, SH(2, 2, 2))};
    a = attrs(OP_SUM);
    a.ndims = 2; a.dims[0] = 0; a.dims[1] = 2;
    CHECK("sum dims {0,2} of iota [2,2,2]", OP_SUM, &a, FL_F32, SH(2),
          0 + 1 + 4 + 5, 2 + 3 + 6 + 7);
    release_all(ins, 1);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2, 3), V(3, 1, 3, 0, 5, 5))};
    a = attrs(OP_ARGMAX);
    a.ndims = 1; a.dims[0] = 1;
    CHECK("argmax ties take the first", OP_ARGMAX, &a, FL_I64, SH(2), 0, 1);
    a.ndims = 0;
    CHECK("argmax flattened", OP_ARGMAX, &a, FL_I64, S0, 4);
    release_all(ins, 1);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(5), V(1, NAN, 5, NAN, 7))};
    a = attrs(OP_ARGMAX);
    CHECK("argmax: NaN is the max", OP_ARGMAX, &a, FL_I64, S0, 1);
    a = attrs(OP_AMAX);
    CHECK("amax propagates NaN", OP_AMAX, &a, FL_F32, S0, NAN);
    a = attrs(OP_AMIN);
    CHECK("amin propagates NaN", OP_AMIN, &a, FL_F32, S0, NAN);
    release_all(ins, 1);
  }
  {
    fl_tensor ins[] = {mk(FL_I64, SH(2), V(4503599627370495.0, 1))};
    a = attrs(OP_SUM);
    CHECK("int64 sum exact at 2^52", OP_SUM, &a, FL_I64, S0,
          4503599627370496.0);
    release_all(ins, 1);
  }
}

/* --- softmax and norms -------------------------------------------------- */

static void test_softmax_norms(void) {
  op_attrs a;
  {
    fl_tensor ins[] = {mk(FL_F32, SH(3), V(1, 2, 3))};
    a = attrs(OP_SOFTMAX);
    CHECK("softmax [1,2,3]", OP_SOFTMAX, &a, FL_F32, SH(3),
          0.09003057317038046, 0.24472847105479764, 0.6652409557748218);
    CHECK("log_softmax [1,2,3]", OP_LOG_SOFTMAX, &a, FL_F32, SH(3),
          -2.4076059644443806, -1.4076059644443804, -0.4076059644443804);
    release_all(ins, 1);
  }
  {
    /* along dim 0 of [2,2]; 1000 would overflow exp without the max */
    fl_tensor ins[] = {mk(FL_F32, SH(2, 2), V(1000, 0, 1000, -INFINITY))};
    a = attrs(OP_SOFTMAX);
    CHECK("softmax dim 0, large and -inf", OP_SOFTMAX, &a, FL_F32, SH(2, 2),
          0.5, 1, 0.5, 0);
    a.i[0] = 1;
    CHECK("softmax dim 1", OP_SOFTMAX, &a, FL_F32, SH(2, 2), 1, 0, 1, 0);
    CHECK("log_softmax dim 1", OP_LOG_SOFTMAX, &a, FL_F32, SH(2, 2),
          0, -1000, 0, -INFINITY);
    release_all(ins, 1);
  }
  {
    /* mean 2.5, population var 1.25 */
    fl_tensor ins[] = {mk(FL_F32, SH(4), V(1, 2, 3, 4))};
    a = attrs(OP_LAYER_NORM);
    a.i[0] = 1;
    CHECK("layer_norm [1,2,3,4], eps 1e-5", OP_LAYER_NORM, &a, FL_F32, SH(4),
          -1.3416354199689269, -0.447211806656309, 0.447211806656309,
          1.3416354199689269);
    a = attrs(OP_RMS_NORM);
    a.i[0] = 1;
    /* mean of squares 7.5, eps FLT_EPSILON */
    CHECK("rms_norm [1,2,3,4], no weight", OP_RMS_NORM, &a, FL_F32, SH(4),
          0.3651483687681722, 0.7302967375363444, 1.0954451063045165,
          1.4605934750726888);
    release_all(ins, 1);
  }
  {
    /* two rows of [2,2] normalized over both trailing dims, eps 0 */
    fl_tensor ins[] = {mk(FL_F32, SH(2, 2, 2), V(1, 3, 1, 3, 0, 0, 0, 4)),
                       mk(FL_F32, SH(2, 2), V(1, 2, 1, 2)),
                       mk(FL_F32, SH(2, 2), V(0, 0, 10, 10))};
    a = attrs(OP_LAYER_NORM);
    a.i[0] = 2;
    a.f[0] = 0;
    /* row 0: mean 2, var 1 -> [-1,1,-1,1]; row 1: mean 1, var 3 */
    CHECK("layer_norm over 2 dims with weight and bias", OP_LAYER_NORM, &a,
          FL_F32, SH(2, 2, 2), -1, 2, 9, 12,
          -1 / 1.7320508075688772, -2 / 1.7320508075688772,
          10 - 1 / 1.7320508075688772, 10 + 2 * 3 / 1.7320508075688772);
    release_all(ins, 3);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2, 2), V(3, 4, 0, 2)),
                       mk(FL_F32, SH(2), V(1, 10))};
    a = attrs(OP_RMS_NORM);
    a.i[0] = 1;
    a.f[0] = 0;
    /* rows: rms sqrt(12.5), sqrt(2) */
    CHECK("rms_norm with weight, eps 0", OP_RMS_NORM, &a, FL_F32, SH(2, 2),
          3 / 3.5355339059327378, 40 / 3.5355339059327378, 0,
          20 / 1.4142135623730951);
    release_all(ins, 2);
  }
}

/* --- products ------------------------------------------------------------- */

static void test_products(void) {
  op_attrs a = attrs(OP_MATMUL);
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2, 3), V(1, 2, 3, 4, 5, 6)),
                       mk(FL_F32, SH(3, 2), V(7, 8, 9, 10, 11, 12))};
    CHECK("matmul [2,3] @ [3,2]", OP_MATMUL, &a, FL_F32, SH(2, 2),
          58, 64, 139, 154);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(3), V(1, 2, 3)),
                       mk(FL_F32, SH(3), V(4, 5, 6))};
    CHECK("matmul 1-d @ 1-d is a dot", OP_MATMUL, &a, FL_F32, S0, 32);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2), V(1, 2)),
                       mk(FL_F32, SH(2, 2), V(1, 2, 3, 4))};
    CHECK("matmul 1-d @ 2-d", OP_MATMUL, &a, FL_F32, SH(2), 7, 10);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2, 2), V(1, 2, 3, 4)),
                       mk(FL_F32, SH(2), V(1, 1))};
    CHECK("matmul 2-d @ 1-d", OP_MATMUL, &a, FL_F32, SH(2), 3, 7);
    release_all(ins, 2);
  }
  {
    /* batch [2,1] against [3]: b_k = [[k],[1]], out[i][k] = a_i0*k + a_i1 */
    fl_tensor ins[] = {mk(FL_F32, SH(2, 1, 1, 2), V(1, 2, 3, 4)),
                       mk(FL_F32, SH(3, 2, 1), V(1, 1, 2, 1, 3, 1))};
    CHECK("matmul broadcasts batch [2,1] with [3]", OP_MATMUL, &a, FL_F32,
          SH(2, 3, 1, 1), 3, 4, 5, 7, 10, 13);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2, 1, 2), V(1, 2, 3, 4)),
                       mk(FL_F32, SH(2, 1), V(1, 1))};
    CHECK("matmul batched @ 2-d", OP_MATMUL, &a, FL_F32, SH(2, 1, 1), 3, 7);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2, 3), V(1, 2, 3, 4, 5, 6)),
                       mk(FL_F32, SH(2, 3), V(1, 0, 1, 0, 1, 0)),
                       mk(FL_F32, SH(2), V(10, 20))};
    a = attrs(OP_LINEAR);
    CHECK("linear x @ w^T + b", OP_LINEAR, &a, FL_F32, SH(2, 2),
          14, 22, 20, 25);
    {
      fl_tensor o;
      run(OP_LINEAR, (const fl_tensor *const[]){&ins[0], &ins[1]}, 2, &a, &o);
      check("linear without bias", &o, FL_F32, SH(2, 2), V(4, 2, 10, 5), 4);
    }
    release_all(ins, 3);
  }
}

/* --- vision --------------------------------------------------------------- */

static void test_vision(void) {
  op_attrs a;
  {
    /* x = 1..9 as 3x3; w = [[1,2],[3,4]]: out[i][j] =
    ** x[i][j] + 2 x[i][j+1] + 3 x[i+1][j] + 4 x[i+1][j+1] */
    fl_tensor ins[] = {mk(FL_F32, SH(1, 1, 3, 3), V(1, 2, 3, 4, 5, 6, 7, 8, 9)),
                       mk(FL_F32, SH(1, 1, 2, 2), V(1, 2, 3, 4)),
                       mk(FL_F32, SH(1), V(1))};
    a = attrs(OP_CONV2D);
    a.i[0] = a.i[1] = 1;
    CHECK("conv2d 1x1x3x3 * 2x2 + bias", OP_CONV2D, &a, FL_F32,
          SH(1, 1, 2, 2), 38, 48, 68, 78);
    /* stride 2, padding 1: each window sees 1, 2 or 4 real pixels */
    a.i[0] = a.i[1] = 2;
    a.i[2] = a.i[3] = a.i[4] = a.i[5] = 1;
    CHECK("conv2d stride 2 padding 1", OP_CONV2D, &a, FL_F32, SH(1, 1, 2, 2),
          1 + 4 * 1, 1 + 3 * 2 + 4 * 3, 1 + 2 * 4 + 4 * 7,
          1 + 1 * 5 + 2 * 6 + 3 * 8 + 4 * 9);
    release_all(ins, 3);
  }
  {
    /* two channels in and out: channel 1 of x is all ones */
    fl_tensor ins[] = {mk(FL_F32, SH(1, 2, 3, 3),
                          V(1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1)),
                       mk(FL_F32, SH(2, 2, 2, 2),
                          V(1, 2, 3, 4, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1))};
    a = attrs(OP_CONV2D);
    a.i[0] = a.i[1] = 1;
    CHECK("conv2d 2 -> 2 channels, no bias", OP_CONV2D, &a, FL_F32,
          SH(1, 2, 2, 2), 41, 51, 71, 81, 1, 1, 1, 1);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {iota(FL_F32, SH(1, 1, 4, 4))};
    a = attrs(OP_MAX_POOL2D);
    a.i[0] = a.i[1] = 2;   /* stride 0: the kernel size */
    CHECK("max_pool2d 2x2 on 4x4", OP_MAX_POOL2D, &a, FL_F32, SH(1, 1, 2, 2),
          5, 7, 13, 15);
    a = attrs(OP_AVG_POOL2D);
    a.i[0] = a.i[1] = 2;
    CHECK("avg_pool2d 2x2 on 4x4", OP_AVG_POOL2D, &a, FL_F32, SH(1, 1, 2, 2),
          2.5, 4.5, 10.5, 12.5);
    release_all(ins, 1);
  }
  {
    /* each window's gradient onto its first largest element (ties: the
    ** first), overlapping windows summed; a NaN window: its last NaN */
    fl_tensor ins[] = {mk(FL_F32, SH(1, 1, 2, 2), V(10, 20, 30, 40)),
                       mk(FL_F32, SH(1, 1, 3, 3), V(1, 5, 5, 0, 2, 0, 7, 0, 1))};
    a = attrs(OP_MAX_POOL2D_BACKWARD);
    a.i[0] = a.i[1] = 2;
    a.i[2] = a.i[3] = 1;
    CHECK("max_pool2d_backward: first max, overlaps summed", OP_MAX_POOL2D_BACKWARD, &a,
          FL_F32, SH(1, 1, 3, 3), 0, 30, 0, 0, 40, 0, 30, 0, 0);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(1, 1, 1, 1), V(5)),
                       mk(FL_F32, SH(1, 1, 2, 2), V(1, NAN, NAN, 2))};
    a = attrs(OP_MAX_POOL2D_BACKWARD);
    a.i[0] = a.i[1] = 2;
    CHECK("max_pool2d_backward: a NaN window's last NaN", OP_MAX_POOL2D_BACKWARD, &a,
          FL_F32, SH(1, 1, 2, 2), 0, 0, 5, 0);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(1, 1, 2, 2), V(1, NAN, 3, 2))};
    a = attrs(OP_MAX_POOL2D);
    a.i[0] = a.i[1] = 2;
    CHECK("max_pool2d propagates NaN", OP_MAX_POOL2D, &a, FL_F32,
          SH(1, 1, 1, 1), NAN);
    release_all(ins, 1);
  }
  {
    /* negative values: padding must act as -inf for max, 0 for avg */
    fl_tensor ins[] = {mk(FL_F32, SH(1, 1, 3, 3),
                          V(-1, -2, -3, -4, -5, -6, -7, -8, -9))};
    a = attrs(OP_MAX_POOL2D);
    a.i[0] = a.i[1] = 2;
    a.i[2] = a.i[3] = 2;
    a.i[4] = a.i[5] = a.i[6] = a.i[7] = 1;
    CHECK("max_pool2d padding is -inf", OP_MAX_POOL2D, &a, FL_F32,
          SH(1, 1, 2, 2), -1, -2, -4, -5);
    a = attrs(OP_AVG_POOL2D);
    a.i[0] = a.i[1] = 2;
    a.i[2] = a.i[3] = 2;
    a.i[4] = a.i[5] = a.i[6] = a.i[7] = 1;
    /* count_include_pad: every window divides by 4 */
    CHECK("avg_pool2d counts the padding", OP_AVG_POOL2D, &a, FL_F32,
          SH(1, 1, 2, 2), -0.25, -1.25, -2.75, -7);
    a.i[2] = a.i[3] = 1;
    a.i[4] = a.i[5] = a.i[6] = a.i[7] = 0;
    CHECK("avg_pool2d stride 1", OP_AVG_POOL2D, &a, FL_F32, SH(1, 1, 2, 2),
          -3, -4, -6, -7);
    release_all(ins, 1);
  }
  {
    /* channel 0 holds 1,3; channel 1 holds 2,4 */
    fl_tensor ins[] = {mk(FL_F32, SH(1, 2, 1, 2), V(1, 3, 2, 4)),
                       mk(FL_F32, SH(2), V(2, 3)), mk(FL_F32, SH(2), V(1, 4)),
                       mk(FL_F32, SH(2), V(1, 2)), mk(FL_F32, SH(2), V(0, 1))};
    a = attrs(OP_BATCH_NORM);
    a.f[0] = 0;
    CHECK("batch_norm per channel, eps 0", OP_BATCH_NORM, &a, FL_F32,
          SH(1, 2, 1, 2), -1, 1, 0, 2);
    {
      fl_tensor o;
      a = attrs(OP_BATCH_NORM);   /* eps 1e-5, no weight or bias */
      run(OP_BATCH_NORM, (const fl_tensor *const[]){&ins[0], &ins[1], &ins[2]},
          3, &a, &o);
      check("batch_norm without affine, eps 1e-5", &o, FL_F32, SH(1, 2, 1, 2),
            V(-0.9999950000374997, 0.9999950000374997,
              -0.5 / sqrt(1 + 0.25e-5), 0.5 / sqrt(1 + 0.25e-5)), 4);
    }
    release_all(ins, 5);
  }
}

/* --- views and data movement ---------------------------------------------- */

static void test_views(void) {
  op_attrs a;
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2, 3), V(1, 2, 3, 4, 5, 6))};
    a = attrs(OP_TRANSPOSE);
    a.i[0] = 0; a.i[1] = 1;
    CHECK("transpose [2,3]", OP_TRANSPOSE, &a, FL_F32, SH(3, 2),
          1, 4, 2, 5, 3, 6);
    a = attrs(OP_RESHAPE);
    a.ndims = 2; a.dims[0] = 3; a.dims[1] = 2;
    CHECK("reshape [2,3] -> [3,2]", OP_RESHAPE, &a, FL_F32, SH(3, 2),
          1, 2, 3, 4, 5, 6);
    a = attrs(OP_VIEW);
    a.ndims = 1; a.dims[0] = -1;
    CHECK("view -1", OP_VIEW, &a, FL_F32, SH(6), 1, 2, 3, 4, 5, 6);
    a = attrs(OP_UNSQUEEZE);
    a.i[0] = 1;
    CHECK("unsqueeze 1", OP_UNSQUEEZE, &a, FL_F32, SH(2, 1, 3),
          1, 2, 3, 4, 5, 6);
    a = attrs(OP_NARROW);
    a.i[0] = 1; a.i[1] = 1; a.i[2] = 2;
    CHECK("narrow dim 1 start 1 length 2", OP_NARROW, &a, FL_F32, SH(2, 2),
          2, 3, 5, 6);
    a = attrs(OP_CONTIGUOUS);
    CHECK("contiguous", OP_CONTIGUOUS, &a, FL_F32, SH(2, 3), 1, 2, 3, 4, 5, 6);
    release_all(ins, 1);
  }
  {
    fl_tensor ins[] = {iota(FL_F32, SH(2, 1, 3))};
    a = attrs(OP_PERMUTE);
    /* out[k][i][0] = x[i][0][k] */
    a.ndims = 3; a.dims[0] = 2; a.dims[1] = 0; a.dims[2] = 1;
    CHECK("permute (2,0,1)", OP_PERMUTE, &a, FL_F32, SH(3, 2, 1),
          0, 3, 1, 4, 2, 5);
    a = attrs(OP_SQUEEZE);
    a.i[0] = 1; a.i[1] = 1;
    CHECK("squeeze dim 1", OP_SQUEEZE, &a, FL_F32, SH(2, 3), 0, 1, 2, 3, 4, 5);
    release_all(ins, 1);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(3, 1), V(1, 2, 3))};
    a = attrs(OP_EXPAND);
    a.ndims = 3; a.dims[0] = 2; a.dims[1] = 3; a.dims[2] = 2;
    CHECK("expand [3,1] -> [2,3,2]", OP_EXPAND, &a, FL_F32, SH(2, 3, 2),
          1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3);
    release_all(ins, 1);
  }
  {
    /* a transposed view (strides swapped by hand): the oracle must follow
    ** logical order, not memory order */
    fl_tensor base = mk(FL_F32, SH(2, 3), V(1, 2, 3, 4, 5, 6)), t, o;
    const fl_tensor *in[] = {&t};
    ten_share(&t, &base);
    t.m.shape[0] = 3; t.m.shape[1] = 2;
    t.stride[0] = 1; t.stride[1] = 3;
    a = attrs(OP_RESHAPE);
    a.ndims = 1; a.dims[0] = 6;
    run(OP_RESHAPE, in, 1, &a, &o);
    check("reshape of a strided view follows logical order", &o, FL_F32,
          SH(6), V(1, 4, 2, 5, 3, 6), 6);
    a = attrs(OP_EXP);
    run(OP_EXP, in, 1, &a, &o);
    check("exp of a strided view", &o, FL_F32, SH(3, 2),
          V(exp(1.0), exp(4.0), exp(2.0), exp(5.0), exp(3.0), exp(6.0)), 6);
    ten_release(&t);
    ten_release(&base);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2, 1), V(1, 2)),
                       mk(FL_F32, SH(2, 2), V(3, 4, 5, 6)),
                       mk(FL_F32, SH(2, 1), V(7, 8))};
    a = attrs(OP_CAT);
    a.i[0] = 1;
    CHECK("cat three along dim 1", OP_CAT, &a, FL_F32, SH(2, 4),
          1, 3, 4, 7, 2, 5, 6, 8);
    release_all(ins, 3);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(1, 2), V(1, 2)),
                       mk(FL_F32, SH(2, 2), V(3, 4, 5, 6))};
    a = attrs(OP_CAT);
    CHECK("cat along dim 0", OP_CAT, &a, FL_F32, SH(3, 2), 1, 2, 3, 4, 5, 6);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_I64, SH(2, 2), V(2, 0, 1, 2)),
                       mk(FL_F32, SH(3, 2), V(0, 1, 10, 11, 20, 21))};
    a = attrs(OP_EMBEDDING);
    CHECK("embedding gathers rows", OP_EMBEDDING, &a, FL_F32, SH(2, 2, 2),
          20, 21, 0, 1, 10, 11, 20, 21);
    release_all(ins, 2);
  }
  {
    /* x = 0..11 as 3x4 */
    fl_tensor ins[] = {iota(FL_F32, SH(3, 4))};
    a = attrs(OP_SLICE);
    a.i[0] = 1; a.i[1] = 1; a.i[2] = 2; a.i[3] = 2;
    CHECK("slice dim 1 from 1 by 2", OP_SLICE, &a, FL_F32, SH(3, 2), 1, 3, 5, 7, 9, 11);
    a = attrs(OP_FLIP);
    a.ndims = 2; a.dims[0] = 0; a.dims[1] = 1;
    CHECK("flip both dims", OP_FLIP, &a, FL_F32, SH(3, 4), 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    a = attrs(OP_CUMSUM);
    a.i[0] = 1;
    CHECK("cumsum along dim 1", OP_CUMSUM, &a, FL_F32, SH(3, 4), 0, 1, 3, 6, 4, 9, 15, 22, 8, 17, 27, 38);
    a.i[0] = 0; a.i[1] = 1; a.i[2] = 1;
    CHECK("cumsum exclusive, reversed, along dim 0", OP_CUMSUM, &a, FL_F32, SH(3, 4),
          12, 14, 16, 18, 8, 9, 10, 11, 0, 0, 0, 0);
    a = attrs(OP_PAD);
    /* dim 0: crop one before, one pad after; dim 1: two before, crop one after */
    a.ndims = 2; a.dims[0] = -1; a.dims[1] = 2; a.i[0] = 1; a.i[1] = -1; a.f[0] = -1;
    CHECK("pad constant, negative pads crop", OP_PAD, &a, FL_F32, SH(3, 5),
          -1, -1, 4, 5, 6, -1, -1, 8, 9, 10, -1, -1, -1, -1, -1);
    a.i[8] = 1;                          /* reflect: [2, 1, 0, 1, 2] of the cropped row */
    CHECK("pad reflect", OP_PAD, &a, FL_F32, SH(3, 5), 6, 5, 4, 5, 6, 10, 9, 8, 9, 10, 6, 5, 4, 5, 6);
    a.i[8] = 2;
    CHECK("pad edge", OP_PAD, &a, FL_F32, SH(3, 5), 4, 4, 4, 5, 6, 8, 8, 8, 9, 10, 8, 8, 8, 9, 10);
    release_all(ins, 1);
  }
  {
    fl_tensor ins[] = {iota(FL_F32, SH(3, 2)), mk(FL_I64, SH(2, 2), V(2, -3, 1, -1))};
    a = attrs(OP_GATHER);
    CHECK("gather dim 0, negative indices wrap", OP_GATHER, &a, FL_F32, SH(2, 2, 2),
          4, 5, 0, 1, 2, 3, 4, 5);
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {iota(FL_F32, SH(3, 2)), mk(FL_I64, SH(2, 2), V(1, -2, 0, -1))};
    a = attrs(OP_GATHER);
    a.i[0] = 1;
    CHECK("gather dim 1", OP_GATHER, &a, FL_F32, SH(3, 2, 2), 1, 0, 0, 1, 3, 2, 2, 3, 5, 4, 4, 5);
    release_all(ins, 2);
  }
  {
    /* rows 0..3 of src into 3 rows: indices 2, 0, -1 (= 2), 2 */
    fl_tensor ins[] = {iota(FL_F32, SH(1, 4, 2)), mk(FL_I64, SH(4), V(2, 0, -1, 2))};
    a = attrs(OP_INDEX_ADD);
    a.i[0] = 3;
    CHECK("index_add: repeated and negative indices accumulate", OP_INDEX_ADD, &a, FL_F32,
          SH(1, 3, 2), 2, 3, 0, 0, 0 + 4 + 6, 1 + 5 + 7);
    release_all(ins, 2);
  }
  {
    /* matmul_int8, by hand: uint8 [[200, 3], [255, 0]] less a_zero [128, 0]
    ** (per row) times int8 [[-128, 127], [5, -7]] less b_zero 1:
    ** (72 * -129 + -125 * 4, 72 * 126 + -125 * -8), (255 * -129, 255 * 126) */
    fl_tensor ins[] = {mk(FL_I64, SH(2, 2), V(200, 3, 255, 0)), mk(FL_I64, SH(2, 2), V(-128, 127, 5, -7)),
                       mk(FL_I64, SH(2), V(128, 0)), mk0(FL_I64, 1)};
    a = attrs(OP_MATMUL_INT8);
    a.i[0] = 1;
    CHECK("matmul_int8: zero points per row and per tensor", OP_MATMUL_INT8, &a, FL_I64, SH(2, 2),
          -9788, 10072, -32895, 32130);
    release_all(ins, 4);
  }
  {
    /* RNN, one unit: h1 = tanh(1), h2 = tanh(2 + h1 / 2); rows Y_h, then Y */
    fl_tensor ins[] = {mk(FL_F32, SH(2, 1, 1), V(1, 2)), mk(FL_F32, SH(1, 1, 1), V(1)),
                       mk(FL_F32, SH(1, 1, 1), V(0.5))};
    a = attrs(OP_RNN);
    CHECK("rnn: two tanh steps", OP_RNN, &a, FL_F32, SH(3, 1, 1, 1), 0.9830411011980433,
          0.7615941559557649, 0.9830411011980433);
    release_all(ins, 3);
  }
  {
    /* GRU, one unit, one step from h0 = 1: z = r = sigmoid(1.5), the
    ** candidate tanh(1 + (r h0) / 2), h = (1 - z) cand + z h0 */
    fl_tensor ins[] = {mk(FL_F32, SH(1, 1, 1), V(1)), mk(FL_F32, SH(1, 3, 1), V(1, 1, 1)),
                       mk(FL_F32, SH(1, 3, 1), V(0.5, 0.5, 0.5)), mk(FL_F32, SH(1, 6), V(0, 0, 0, 0, 0, 0)),
                       mk(FL_I64, SH(1), V(1)), mk(FL_F32, SH(1, 1, 1), V(1))};
    a = attrs(OP_RNN);
    a.i[0] = OP_RNN_CELL_GRU;
    CHECK("rnn: a GRU step", OP_RNN, &a, FL_F32, SH(2, 1, 1, 1), 0.9794290266920131,
          0.9794290266920131);
    release_all(ins, 6);
  }
}

/* --- errors ------------------------------------------------------------- */

/* Run op on all of ins[]: it must fail with code, leave no result, and
** say both words in its message. */
#define FAILS(name, op, a, code, word1, word2) do { \
    const fl_tensor *p_[8]; \
    fl_tensor o_; \
    int n_ = (int)(sizeof ins / sizeof ins[0]), k_, rc_; \
    for (k_ = 0; k_ < n_; k_++) p_[k_] = &ins[k_]; \
    err_clear(&err); \
    rc_ = ref_apply(op, p_, n_, a, &o_, &err); \
    ok(rc_ == (code) && !o_.st && strstr(err.msg, word1) && \
       strstr(err.msg, word2), "%s", name); \
    printf("#   %s\n", err.msg); \
    if (rc_ == FL_OK) ten_release(&o_); \
  } while (0)

static void test_errors(void) {
  op_attrs a;
  {
    fl_tensor ins[] = {iota(FL_F32, SH(3, 2)), mk(FL_I64, SH(2), V(1, 2))};
    a = attrs(OP_GATHER);
    a.i[0] = 1;
    FAILS("gather: an index past the end is an error, no read", OP_GATHER, &a, FL_EINVAL,
          "index 2 out of range", "valid -2..1");
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_I64, SH(3), V(0, 3, 1)),
                       mk(FL_F32, SH(3, 2), V(0, 1, 2, 3, 4, 5))};
    a = attrs(OP_EMBEDDING);
    FAILS("embedding: index 3 of 3 rows is out of range", OP_EMBEDDING, &a,
          FL_EINVAL, "index 3", "3 rows");
    ten_set(&ins[0], 1, -1);
    FAILS("embedding: index -1 is out of range", OP_EMBEDDING, &a, FL_EINVAL,
          "embedding", "index -1");
    release_all(ins, 2);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2), V(1, 2))};
    a = attrs(OP_ADD);
    FAILS("add with one input: wrong arity", OP_ADD, &a, FL_EINVAL, "add",
          "2");
    release_all(ins, 1);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2), V(1, 2)), mk(FL_F32, SH(2), V(1, 2)),
                       mk(FL_F32, SH(2), V(1, 2)), mk(FL_F32, SH(2), V(1, 2))};
    a = attrs(OP_WHERE);
    FAILS("where with four inputs: wrong arity", OP_WHERE, &a, FL_EINVAL,
          "where", "4");
    release_all(ins, 4);
  }
  {
    fl_tensor ins[] = {mk(FL_F32, SH(2, 3), V(1, 2, 3, 4, 5, 6)),
                       mk(FL_F32, SH(2, 3), V(1, 2, 3, 4, 5, 6))};
    a = attrs(OP_MATMUL);
    FAILS("matmul [2,3] @ [2,3]: inner dims differ", OP_MATMUL, &a,
          FL_EINVAL, "matmul", "[2,3]");
    release_all(ins, 2);
  }
  {
    /* a wrapped (Lua number) exponent; a tensor exponent computes */
    fl_tensor ins[] = {mk(FL_I64, SH(2), V(2, 2)), mk0(FL_I64, -1)};
    ins[1].m.wrapped = 1;
    a = attrs(OP_POW);
    FAILS("int64 pow with a negative scalar exponent", OP_POW, &a, FL_EINVAL,
          "pow", "negative");
    release_all(ins, 2);
  }
}

/* --- the random stream ---------------------------------------------------- */

static void test_rng(void) {
  fl_tensor a = iota(FL_F32, SH(100000)), b = iota(FL_F32, SH(100000));
  fl_tensor h = iota(FL_F16, SH(1000));
  int64_t i, n = 100000, same = 0;
  double s = 0, s2 = 0, lo = 1, hi = 0;
  /* Philox4x32-10 of counter 0, key 0 (Random123's known answer
  ** 6627e8d5 e169c58d bc57ac4c 9b00dbd8), top 24 bits of each word */
  rng_seed(0);
  rng_uniform(&a);
  ok(ten_get(&a, 0) == 0x6627e8 * 0x1p-24 &&
     ten_get(&a, 1) == 0xe169c5 * 0x1p-24 &&
     ten_get(&a, 2) == 0xbc57ac * 0x1p-24 &&
     ten_get(&a, 3) == 0x9b00db * 0x1p-24,
     "rng: seed 0 gives Philox4x32-10's known answer");
  rng_seed(42);
  rng_uniform(&a);
  rng_seed(42);
  rng_uniform(&b);
  for (i = 0; i < n; i++) same += ten_get(&a, i) == ten_get(&b, i);
  ok(same == n, "rng: the same seed gives the same values");
  rng_uniform(&b);
  for (same = 0, i = 0; i < n; i++) same += ten_get(&a, i) == ten_get(&b, i);
  ok(same < n / 100, "rng: the next fill continues the stream (%lld equal)",
     (long long)same);
  rng_seed(43);
  rng_uniform(&b);
  for (same = 0, i = 0; i < n; i++) same += ten_get(&a, i) == ten_get(&b, i);
  ok(same < n / 100, "rng: another seed gives other values (%lld equal)",
     (long long)same);
  for (i = 0; i < n; i++) {
    double v = ten_get(&a, i);
    s += v;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  is_near(s / (double)n, 0.5, 0.01, "rng: uniform mean 0.5 +- 0.01");
  ok(lo >= 0 && hi < 1, "rng: uniform values in [0,1) (min %g max %g)", lo, hi);
  rng_uniform(&h);
  for (hi = 0, i = 0; i < 1000; i++)
    if (ten_get(&h, i) > hi) hi = ten_get(&h, i);
  ok(hi < 1, "rng: float16 uniform never rounds up to 1 (max %g)", hi);
  rng_normal(&a);
  for (s = 0, i = 0; i < n; i++) {
    double v = ten_get(&a, i);
    s += v;
    s2 += v * v;
  }
  s /= (double)n;
  is_near(s, 0.0, 0.02, "rng: normal mean 0 +- 0.02");
  is_near(sqrt(s2 / (double)n - s * s), 1.0, 0.02,
          "rng: normal std 1 +- 0.02");
  ten_release(&a);
  ten_release(&b);
  ten_release(&h);
}

/* The random ops through the oracle: rand is the stream's fill, so the
** known answer again; randn's pairs; dropout zeroes where U < p and scales
** the rest by 1/(1-p), p=0 keeps everything, p=1 nothing. */
static void test_random_ops(void) {
  op_attrs a;
  fl_tensor u, v, x = iota(FL_F32, SH(4000)), d;
  const fl_tensor *in[1] = {&x};
  int64_t i, n = 4000, kept = 0, bad = 0;
  op_attrs_init(OP_RAND, &a);
  a.ndims = 1; a.dims[0] = 5;
  rng_seed(0);
  if (run(OP_RAND, NULL, 0, &a, &u) == FL_OK) {
    ok(ten_get(&u, 0) == 0x6627e8 * 0x1p-24 && ten_get(&u, 3) == 0x9b00db * 0x1p-24,
       "rand: seed 0 gives Philox4x32-10's known answer");
    ten_release(&u);
  }
  a.dims[0] = 6;
  rng_seed(3);
  if (run(OP_RANDN, NULL, 0, &a, &u) == FL_OK) {
    rng_seed(3);
    v = iota(FL_F32, SH(6));
    rng_normal(&v);
    for (i = 0; i < 6; i++) bad += ten_get(&u, i) != ten_get(&v, i);
    ok(bad == 0, "randn: the oracle draws what fl.randn's fill draws");
    ten_release(&u);
    ten_release(&v);
  }
  op_attrs_init(OP_DROPOUT, &a);
  a.f[0] = 0.25;
  rng_seed(9);
  if (run(OP_DROPOUT, in, 1, &a, &d) == FL_OK) {
    for (bad = 0, i = 0; i < n; i++) {
      double y = ten_get(&d, i), u9 = rng_uniform_at(9, 0, i, 24);
      if (y != 0) kept++;
      bad += (u9 < 0.25 && y != 0) || (u9 >= 0.25 && y != (float)((float)i * (float)(1 / 0.75)));
    }
    ok(bad == 0, "dropout: zero where U < p, else x / (1 - p) (%lld wrong)", (long long)bad);
    is_near((double)kept / (double)n, 0.75, 0.03, "dropout: keeps about 1 - p");
    ten_release(&d);
  }
  a.f[0] = 0.0;
  if (run(OP_DROPOUT, in, 1, &a, &d) == FL_OK) {
    for (bad = 0, i = 0; i < n; i++) bad += ten_get(&d, i) != (double)i;
    ok(bad == 0, "dropout: p = 0 keeps every value");
    ten_release(&d);
  }
  a.f[0] = 1.0;
  if (run(OP_DROPOUT, in, 1, &a, &d) == FL_OK) {
    for (bad = 0, i = 0; i < n; i++) bad += ten_get(&d, i) != 0.0;
    ok(bad == 0, "dropout: p = 1 zeroes every value");
    ten_release(&d);
  }
  ten_release(&x);
}

int main(void) {
  int k, missing = 0;
  test_unary();
  test_binary();
  test_int64();
  test_int64_exact();
  test_reduce();
  test_softmax_norms();
  test_products();
  test_vision();
  test_views();
  test_errors();
  test_rng();
  test_random_ops();
  for (k = 0; k < OP_COUNT; k++)
    if (!ran[k]) {
      printf("# no passing reference test runs op %s\n", op_name((fl_op)k));
      missing++;
    }
  ok(missing == 0, "every op in ops.def has a reference test (%d missing)",
     missing);
  return tap_done();
}
