/*
** test_eager.c -- every op of ops.def through eager_apply against the
** oracle (ref_apply) on random inputs: several shapes each, size-1 and odd
** sizes (7, 1023), broadcasting, transposed (non-contiguous) inputs, empty
** tensors, NaN/inf/-0 where they matter, every dtype the shape rules take.
** Big enough cases to reach the parallel and in-place fast paths.  View ops
** must share storage; reshape of a transposed tensor must copy and view of
** it must refuse; errors must name the op.
**
** Tolerances (|eager - ref| <= atol + rtol * |ref|), by result:
**   float32 elementwise         atol 1e-5  rtol 1e-5
**   float32 reductions, pools   atol 1e-6  rtol 1e-6  (rows up to 200000 of
**                               values near 1000: float accumulation fails)
**   softmax, norms, batch_norm  atol 1e-5  rtol 1e-5
**   matmul, linear, conv2d      atol 1e-4  rtol 1e-4  (float32 sgemm)
**   float16 results             at least 1e-3 / 2e-3  (one half ulp step)
**   bfloat16 results            at least 1e-2 / 1e-2
**   int64 and bool results      exact
** NaN must match NaN, infinities must match exactly.
*/
#ifdef _OPENMP
#include <math.h>
#include <omp.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/eager.h"
#include "cpu/mm.h"
#include "graph/ref.h"
#include "graph/rng.h"
#include "tap.h"

/* T() flags: non-contiguous, NaN/inf/-0 sprinkled in, positive values,
** a wrapped Lua number, values near 1000 (float sums drift), small
** integers only (ties for argmax) */
enum { NC = 1, SPECIAL = 2, POS = 4, WRAP = 8, OFFSET = 16, INTS = 32, NONZERO = 64 };

#define F32 FL_F32
#define F16 FL_F16
#define BF16 FL_BF16
#define I64 FL_I64
#define BOOL FL_BOOL

static const double EW = 1e-5, RED = 1e-6, NORM = 1e-5, MM = 1e-4;

/* --- inputs ------------------------------------------------------------ */

static uint64_t seed = 0x9E3779B97F4A7C15ull;

static double uniform(void) {   /* [0, 1), xorshift64* */
  seed ^= seed >> 12; seed ^= seed << 25; seed ^= seed >> 27;
  return (double)((seed * 2685821657736338717ull) >> 11) * 0x1p-53;
}

#define MAXP 64
static fl_tensor pool[MAXP];
static int tested[OP_COUNT];   /* ops compared against the oracle */
static int npool;

/* The tensors of one case are released together. */
static void gc(void) {
  while (npool > 0) ten_release(&pool[--npool]);
}

/* A random tensor of shape spec ("3,1,5"; "" is 0-dim).  NC makes it
** non-contiguous (a transposed view, or every other element in 1-d). */
static fl_tensor *T(fl_dtype dt, const char *spec, int flags) {
  fl_meta m = {0};
  fl_err e = {0};
  fl_tensor base, *t = &pool[npool++];
  const char *p = spec;
  int64_t n, i, tmp;
  m.dtype = dt;
  while (*p) {
    m.shape[m.ndim++] = strtoll(p, (char **)&p, 10);
    if (*p == ',') p++;
  }
  if ((flags & NC) && m.ndim >= 2) {
    fl_meta b = m;
    b.shape[m.ndim - 2] = m.shape[m.ndim - 1];
    b.shape[m.ndim - 1] = m.shape[m.ndim - 2];
    ten_empty(&base, &b, &e);
  } else if ((flags & NC) && m.ndim == 1) {
    fl_meta b = m;
    b.ndim = 2;
    b.shape[1] = 2;
    ten_empty(&base, &b, &e);
  } else {
    ten_empty(&base, &m, &e);
  }
  n = meta_numel(&base.m);
  for (i = 0; i < n; i++) {
    double v;
    if (dt == I64) v = (double)(int)(uniform() * 11) - ((flags & POS) ? 0 : 5);
    else if (dt == BOOL) v = uniform() < 0.5;
    else v = (flags & POS) ? 0.1 + 2 * uniform() : 4 * uniform() - 2;
    if (flags & OFFSET) v += 1000;
    if (flags & INTS) v = floor(v * 2);
    if ((flags & NONZERO) && v == 0) v = 3;
    if ((flags & SPECIAL) && dtype_is_float(dt)) {
      if (i % 17 == 3) v = NAN;
      else if (i % 17 == 5) v = INFINITY;
      else if (i % 17 == 7) v = -INFINITY;
      else if (i % 17 == 11) v = -0.0;
    }
    ten_set(&base, i, v);
  }
  *t = base;
  if ((flags & NC) && m.ndim >= 2) {
    int d = m.ndim - 2;
    t->m.shape[d] = m.shape[d];
    t->m.shape[d + 1] = m.shape[d + 1];
    tmp = t->stride[d]; t->stride[d] = t->stride[d + 1]; t->stride[d + 1] = tmp;
  } else if ((flags & NC) && m.ndim == 1) {
    t->m.ndim = 1;
    t->m.shape[0] = m.shape[0];
    t->stride[0] = 2;
  }
  t->m.wrapped = (flags & WRAP) != 0;
  return t;
}

/* --- comparing ---------------------------------------------------------- */

static void describe(char *buf, size_t n, fl_op op, fl_tensor **in, int nin,
                     const char *extra) {
  size_t used = (size_t)snprintf(buf, n, "%s", op_name(op));
  int k;
  for (k = 0; k < nin && used < n; k++) {
    char sh[96];
    if (!in[k]) { used += (size_t)snprintf(buf + used, n - used, " -"); continue; }
    used += (size_t)snprintf(buf + used, n - used, " %s%s%s%s",
                             dtype_name(in[k]->m.dtype),
                             meta_shape_str(&in[k]->m, sh, sizeof sh),
                             ten_is_contiguous(in[k]) ? "" : "(nc)",
                             in[k]->m.wrapped ? "(w)" : "");
  }
  if (extra && *extra && used < n) snprintf(buf + used, n - used, " %s", extra);
}

/* ref_apply and eager_apply on the same inputs: both refuse, or the same
** shape and dtype and values within tolerance. */
static void check_ex(fl_op op, fl_tensor **in, int nin, const op_attrs *a,
                     double atol, double rtol, const char *extra) {
  const fl_tensor *const *cin = (const fl_tensor *const *)in;
  fl_err e1 = {0}, e2 = {0};
  fl_tensor r, g;
  char desc[400], s1[96], s2[96];
  int rc1 = ref_apply(op, cin, nin, a, &r, &e1);
  int rc2 = eager_apply(op, cin, nin, a, &g, &e2);
  int64_t n, i, bad = -1;
  double gv = 0, rv = 0;
  tested[op] = 1;
  describe(desc, sizeof desc, op, in, nin, extra);
  if (rc1 != FL_OK) {
    if (!ok(rc2 != FL_OK, "%s: both refuse (%s)", desc, e1.msg))
      ten_release(&g);
    return;
  }
  if (rc2 != FL_OK) {
    ok(0, "%s: eager failed: %s", desc, e2.msg);
    ten_release(&r);
    return;
  }
  if (r.m.dtype == F16) { atol = fmax(atol, 1e-3); rtol = fmax(rtol, 2e-3); }
  if (r.m.dtype == BF16) { atol = fmax(atol, 1e-2); rtol = fmax(rtol, 1e-2); }
  if (!dtype_is_float(r.m.dtype)) atol = rtol = 0;
  if (!meta_same_shape(&r.m, &g.m) || r.m.dtype != g.m.dtype) {
    ok(0, "%s: eager gives %s %s, ref %s %s", desc, dtype_name(g.m.dtype),
       meta_shape_str(&g.m, s1, sizeof s1), dtype_name(r.m.dtype),
       meta_shape_str(&r.m, s2, sizeof s2));
  } else {
    n = meta_numel(&r.m);
    for (i = 0; i < n && bad < 0; i++) {
      gv = ten_get(&g, i);
      rv = ten_get(&r, i);
      if (isnan(rv) || isnan(gv)) { if (!(isnan(rv) && isnan(gv))) bad = i; }
      else if (isinf(rv) || isinf(gv)) { if (gv != rv) bad = i; }
      else if (fabs(gv - rv) > atol + rtol * fabs(rv)) bad = i;
    }
    if (!ok(bad < 0, "%s", desc))
      printf("#   element %lld: eager %.9g, ref %.9g (atol %g rtol %g)\n",
             (long long)bad, gv, rv, atol, rtol);
  }
  ten_release(&r);
  ten_release(&g);
}

static void check(fl_op op, fl_tensor **in, int nin, const op_attrs *a,
                  double tol, const char *extra) {
  check_ex(op, in, nin, a, tol, tol, extra);
}

static op_attrs attrs(fl_op op) {
  op_attrs a;
  op_attrs_init(op, &a);
  return a;
}

/* --- elementwise ---------------------------------------------------------- */

static void test_unary(void) {
  static const char *const shapes[] = {"", "1", "7", "3,1,5", "1023", "0,3",
                                       "40000"};
  static const struct { fl_dtype dt; int flags; } kinds[] = {
    {F32, 0}, {F32, SPECIAL}, {F16, 0}, {BF16, 0}, {I64, 0}};
  fl_op op;
  size_t s, k;
  for (op = OP_ABS; op <= OP_CLAMP; op++) {
    op_attrs a = attrs(op);
    if (op == OP_CLAMP) { a.f[0] = -0.5; a.f[1] = 0.7; }
    for (s = 0; s < sizeof shapes / sizeof *shapes; s++) {
      fl_tensor *x = T(F32, shapes[s], s == 3 ? SPECIAL : 0);
      check(op, &x, 1, &a, EW, NULL);
      gc();
    }
    for (k = 0; k < sizeof kinds / sizeof *kinds; k++) {
      fl_tensor *x = T(kinds[k].dt, "5,7", kinds[k].flags);
      check(op, &x, 1, &a, EW, kinds[k].flags ? "special" : NULL);
      x = T(kinds[k].dt, "5,7", kinds[k].flags | NC);
      check(op, &x, 1, &a, EW, kinds[k].flags ? "special" : NULL);
      gc();
    }
    {
      fl_tensor *x = T(F32, "4,300", NC);     /* large, strided: gathers */
      check(op, &x, 1, &a, EW, NULL);
      x = T(F32, "2,3,4", NC);
      check(op, &x, 1, &a, EW, NULL);
      gc();
    }
  }
  {   /* clamp: one-sided, and lo > hi (everything becomes hi) */
    op_attrs a = attrs(OP_CLAMP);
    fl_tensor *x = T(F32, "9,9", SPECIAL);
    a.f[1] = 0.3;
    check(OP_CLAMP, &x, 1, &a, EW, "hi only");
    a.f[0] = 1.0; a.f[1] = -1.0;
    check(OP_CLAMP, &x, 1, &a, EW, "lo > hi");
    gc();
  }
}

static void test_cast(void) {
  static const fl_dtype dts[] = {F32, F16, BF16, I64, BOOL};
  size_t i, j;
  for (i = 0; i < 5; i++)
    for (j = 0; j < 5; j++) {
      op_attrs a = attrs(OP_TO);
      fl_tensor *x = T(dts[i], "3,7", dtype_is_float(dts[i]) ? SPECIAL : 0);
      char buf[32];
      a.dtype = dts[j];
      snprintf(buf, sizeof buf, "-> %s", dtype_name(dts[j]));
      check(OP_TO, &x, 1, &a, EW, buf);
      x = T(dts[i], "40,1000", NC);
      check(OP_TO, &x, 1, &a, EW, buf);
      gc();
    }
}

static void test_binary(void) {
  static const struct { const char *a, *b; int fa, fb; } shp[] = {
    {"7", "7", 0, 0}, {"4,7", "7", 0, 0}, {"4,7", "4,1", 0, 0},
    {"3,1,5", "4,1", 0, 0}, {"", "5,3", WRAP, 0}, {"5,3", "", 0, WRAP},
    {"1023", "1", 0, 0}, {"0,3", "3", 0, 0}, {"2,3", "2,3", NC, 0},
    {"6,5", "5", NC, 0}, {"300,200", "200", 0, 0}, {"300,200", "300,1", 0, 0},
    {"50000", "", 0, WRAP}, {"", "50000", WRAP, 0}, {"7,9", "7,9", SPECIAL, 0},
    {"7,9", "9", 0, SPECIAL}, {"", "", 0, 0}, {"2,1,3", "1,4,1", 0, 0},
    /* per-row constants that repeat (INTS: 8 values) over rows shorter
    ** and longer than a chunk, one and two threads: a splat filled for a
    ** short chunk must be refilled for a longer one of the same value */
    {"40,49", "40,1", 0, INTS}, {"9,3000", "9,1", 0, INTS},
    {"64,3000", "64,1", 0, INTS}, {"33,2049", "33,1", 0, INTS}};
  static const struct { fl_dtype a, b; int fa, fb; } dts[] = {
    {F16, F16, 0, 0}, {BF16, F32, 0, 0}, {I64, I64, 0, 0}, {I64, F32, 0, 0},
    {F32, I64, 0, WRAP}, {I64, F32, 0, WRAP}, {BOOL, BOOL, 0, 0},
    {F16, F32, 0, WRAP}, {I64, I64, POS, POS}};
  fl_op op;
  size_t s, k;
  for (op = OP_ADD; op <= OP_GE; op++) {
    op_attrs a = attrs(op);
    for (s = 0; s < sizeof shp / sizeof *shp; s++) {
      fl_tensor *in[2];
      in[0] = T(F32, shp[s].a, shp[s].fa);
      in[1] = T(F32, shp[s].b, shp[s].fb);
      check(op, in, 2, &a, EW, NULL);
      gc();
    }
    for (k = 0; k < sizeof dts / sizeof *dts; k++) {
      fl_tensor *in[2];
      /* an integer divisor of 0 is refused eagerly (test_ref checks the
      ** kernels' 0); here every divisor is one */
      int nz = (op == OP_FMOD || op == OP_REMAINDER) ? NONZERO : 0;
      in[0] = T(dts[k].a, "4,6", dts[k].fa & ~WRAP);
      in[1] = T(dts[k].b, (dts[k].fb & WRAP) ? "" : "6", dts[k].fb | nz);
      check(op, in, 2, &a, EW, NULL);
      in[0] = T(dts[k].a, "6,4", (dts[k].fa & ~WRAP) | NC);
      check(op, in, 2, &a, EW, NULL);
      gc();
    }
  }
}

static void test_where(void) {
  static const char *const shp[][3] = {
    {"4,7", "4,7", "4,7"}, {"4,1", "7", ""}, {"1023", "1023", "1"},
    {"300,200", "300,200", ""}, {"", "3,4", "3,4"}, {"0,2", "2", "2"},
    {"2,3,1", "3,5", "1,5"}, {"300,1", "300,200", "200"}, {"", "40,50", ""},
    {"64,1", "64,3000", "64,3000"}};
  static const fl_dtype vt[] = {F16, I64, BOOL};
  op_attrs a = attrs(OP_WHERE);
  size_t s, k;
  for (s = 0; s < sizeof shp / sizeof *shp; s++) {
    fl_tensor *in[3];
    in[0] = T(BOOL, shp[s][0], 0);
    in[1] = T(F32, shp[s][1], SPECIAL);
    in[2] = T(F32, shp[s][2], *shp[s][2] ? 0 : WRAP);
    check(OP_WHERE, in, 3, &a, EW, NULL);
    in[0] = T(BOOL, shp[s][0], NC);
    check(OP_WHERE, in, 3, &a, EW, NULL);
    gc();
  }
  for (k = 0; k < 3; k++) {
    fl_tensor *in[3];
    in[0] = T(BOOL, "5,6", 0);
    in[1] = T(vt[k], "5,6", NC);
    in[2] = T(vt[k], "6", 0);
    check(OP_WHERE, in, 3, &a, EW, NULL);
    gc();
  }
}

/* --- reductions, softmax, norms ------------------------------------------- */

static void test_reduce(void) {
  static const struct { const char *shape; int flags, nd, d0, d1, keep; } cs[] = {
    {"7", 0, 0, 0, 0, 0}, {"4,7", 0, 1, 1, 0, 0}, {"4,7", 0, 1, 0, 0, 1},
    {"4,7", 0, 0, 0, 0, 1}, {"3,5,7", 0, 1, 1, 0, 0}, {"3,5,7", 0, 2, 0, 2, 0},
    {"3,5,7", 0, 1, 2, 0, 1}, {"3,5,7", 0, 2, 0, 1, 0}, {"1023", 0, 1, 0, 0, 0},
    {"2,1,3", 0, 1, 1, 0, 0}, {"2,1,3", 0, 2, 0, 2, 0}, {"", 0, 0, 0, 0, 0},
    {"", 0, 1, 0, 0, 1}, {"64,1000", 0, 1, 1, 0, 0}, {"200000", 0, 0, 0, 0, 0},
    {"1000,300", 0, 1, 0, 0, 0}, {"5,0", 0, 1, 1, 0, 0}, {"0,4", 0, 1, 1, 0, 0},
    {"6,5", NC, 1, 0, 0, 0}, {"6,5", NC, 1, 1, 0, 1}, {"6,5", NC, 0, 0, 0, 0},
    {"9,33", SPECIAL, 1, 1, 0, 0}, {"9,33", SPECIAL, 1, 0, 0, 0},
    {"200000", SPECIAL, 0, 0, 0, 0}, {"200000", OFFSET, 0, 0, 0, 0},
    {"200000", INTS, 0, 0, 0, 0}, {"9,33", INTS, 1, 0, 0, 0},
    {"100,1000", OFFSET, 1, 1, 0, 0}};
  static const struct { fl_dtype dt; int flags; } kinds[] = {
    {F16, 0}, {BF16, 0}, {I64, 0}, {BOOL, 0}, {I64, NC}};
  fl_op op;
  size_t c, k;
  for (op = OP_SUM; op <= OP_ARGMAX; op++) {
    for (c = 0; c < sizeof cs / sizeof *cs; c++) {
      op_attrs a = attrs(op);
      fl_tensor *x = T(F32, cs[c].shape, cs[c].flags);
      char buf[64];
      if (op == OP_ARGMAX && cs[c].nd > 1) continue;
      a.ndims = cs[c].nd;
      a.dims[0] = cs[c].d0;
      a.dims[1] = cs[c].d1;
      a.keepdim = cs[c].keep;
      snprintf(buf, sizeof buf, "dims %d:{%d,%d}%s", cs[c].nd, cs[c].d0,
               cs[c].d1, cs[c].keep ? " keepdim" : "");
      check(op, &x, 1, &a, RED, buf);
      if (op == OP_VAR) {
        a.f[0] = 0.0;
        check(op, &x, 1, &a, RED, "correction 0");
      }
      gc();
    }
    for (k = 0; k < sizeof kinds / sizeof *kinds; k++) {
      op_attrs a = attrs(op);
      fl_tensor *x = T(kinds[k].dt, "5,6,4", kinds[k].flags);
      a.ndims = 1;
      a.dims[0] = 1;
      check(op, &x, 1, &a, RED, "dim 1");
      a.ndims = 0;
      check(op, &x, 1, &a, RED, "all");
      gc();
    }
  }
}

static void test_softmax(void) {
  static const struct { const char *shape; int flags, dim; } cs[] = {
    {"4,7", 0, 1}, {"4,7", 0, 0}, {"3,5,7", 0, 1}, {"1023", 0, 0},
    {"64,1000", 0, 1}, {"", 0, 0}, {"5,6", NC, 1}, {"5,6", NC, 0},
    {"6,17", SPECIAL, 1}, {"6,17", SPECIAL, 0}, {"0,5", 0, 1},
    {"40,30,50", 0, 1}, {"2,1,9", 0, 1}};
  fl_op op;
  size_t c;
  for (op = OP_SOFTMAX; op <= OP_LOG_SOFTMAX; op++) {
    for (c = 0; c < sizeof cs / sizeof *cs; c++) {
      op_attrs a = attrs(op);
      fl_tensor *x = T(F32, cs[c].shape, cs[c].flags);
      char buf[32];
      a.i[0] = cs[c].dim;
      snprintf(buf, sizeof buf, "dim %d", cs[c].dim);
      check(op, &x, 1, &a, EW, buf);
      gc();
    }
    {
      op_attrs a = attrs(op);
      fl_tensor *x = T(F16, "7,9", 0);
      a.i[0] = 1;
      check(op, &x, 1, &a, EW, "dim 1");
      x = T(BF16, "7,9", NC);
      a.i[0] = 0;
      check(op, &x, 1, &a, EW, "dim 0");
      x = T(I64, "7,9", 0);   /* refused by both */
      check(op, &x, 1, &a, EW, "dim 0");
      gc();
    }
  }
}

static void test_norms(void) {
  static const struct { const char *x, *w; int k, wflags, bias; fl_dtype dt; } cs[] = {
    {"4,7", "7", 1, 0, 1, F32}, {"3,5,7", "5,7", 2, 0, 0, F32},
    {"3,5,7", NULL, 1, 0, 0, F32}, {"64,1000", "1000", 1, 0, 1, F32},
    {"6,5", "5", 1, NC, 1, F32}, {"7", "7", 1, 0, 1, F32},
    {"4,9", "9", 1, 0, 1, F16}, {"2,3,4", "3,4", 2, NC, 1, BF16},
    {"1,1", "1", 1, 0, 1, F32}, {"0,4", "4", 1, 0, 1, F32}};
  size_t c;
  for (c = 0; c < sizeof cs / sizeof *cs; c++) {
    op_attrs a = attrs(OP_LAYER_NORM);
    fl_tensor *in[3] = {NULL, NULL, NULL};
    in[0] = T(cs[c].dt, cs[c].x, 0);
    if (cs[c].w) in[1] = T(F32, cs[c].w, cs[c].wflags);
    if (cs[c].w && cs[c].bias) in[2] = T(F32, cs[c].w, 0);
    a.i[0] = cs[c].k;
    check(OP_LAYER_NORM, in, 3, &a, NORM, NULL);
    check(OP_LAYER_NORM, in, 1, &a, NORM, NULL);
    a = attrs(OP_RMS_NORM);
    a.i[0] = cs[c].k;
    check(OP_RMS_NORM, in, 2, &a, NORM, NULL);
    check(OP_RMS_NORM, in, 1, &a, NORM, NULL);
    in[0] = T(cs[c].dt, cs[c].x, NC);
    check(OP_RMS_NORM, in, 2, &a, NORM, NULL);
    a = attrs(OP_LAYER_NORM);
    a.i[0] = cs[c].k;
    a.f[0] = 0.1;
    check(OP_LAYER_NORM, in, 3, &a, NORM, "eps 0.1");
    gc();
  }
}

static void test_batch_norm(void) {
  static const char *const shapes[] = {"4,3,5,5", "4,3", "2,3,7", "1,3,1,1",
                                       "8,16,20,20"};
  size_t s;
  for (s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    op_attrs a = attrs(OP_BATCH_NORM);
    fl_tensor *in[5];
    const char *c = shapes[s][0] == '8' ? "16" : "3";
    in[0] = T(F32, shapes[s], 0);
    in[1] = T(F32, c, 0);
    in[2] = T(F32, c, POS);
    in[3] = T(F32, c, 0);
    in[4] = T(F32, c, NC);
    check(OP_BATCH_NORM, in, 5, &a, NORM, NULL);
    check(OP_BATCH_NORM, in, 3, &a, NORM, NULL);
    in[0] = T(F16, shapes[s], 0);
    in[3] = T(F16, c, 0);
    check(OP_BATCH_NORM, in, 4, &a, NORM, NULL);
    gc();
  }
}

/* --- products ---------------------------------------------------------------- */

static void test_matmul(void) {
  static const struct { const char *a, *b; int fa, fb; } cs[] = {
    {"7", "7", 0, 0}, {"3,7", "7", 0, 0}, {"7", "7,4", 0, 0},
    {"3,7", "7,4", 0, 0}, {"2,3,7", "7,4", 0, 0}, {"2,3,7", "2,7,4", 0, 0},
    {"2,1,3,7", "5,7,4", 0, 0}, {"7", "2,7,4", 0, 0}, {"2,3,7", "7", 0, 0},
    {"3,7", "7,4", NC, 0}, {"3,7", "7,4", 0, NC}, {"3,7", "7,4", NC, NC},
    {"2,3,7", "7,4", NC, 0}, {"64,300", "300,50", 0, 0}, {"3,0", "0,4", 0, 0},
    {"0,3", "3,4", 0, 0}, {"7", "7", NC, NC}, {"1,7", "7,1", 0, 0},
    {"3,7", "4,7", 0, 0}, {"2,3,7", "3,7,4", 0, 0}};
  static const fl_dtype dts[] = {F16, BF16, I64};
  op_attrs a = attrs(OP_MATMUL);
  size_t c, k;
  for (c = 0; c < sizeof cs / sizeof *cs; c++) {
    fl_tensor *in[2];
    in[0] = T(F32, cs[c].a, cs[c].fa);
    in[1] = T(F32, cs[c].b, cs[c].fb);
    check(OP_MATMUL, in, 2, &a, MM, NULL);
    gc();
  }
  for (k = 0; k < 3; k++) {
    fl_tensor *in[2];
    in[0] = T(dts[k], "2,3,5", 0);
    in[1] = T(dts[k], "5,4", NC);
    check(OP_MATMUL, in, 2, &a, MM, NULL);
    in[1] = T(dts[k], "2,5,4", 0);
    check(OP_MATMUL, in, 2, &a, MM, NULL);
    gc();
  }
  {   /* batch strides that do not fold into rows: [3,2,7] permuted */
    op_attrs pa = attrs(OP_PERMUTE);
    fl_tensor *in[2], pv;
    fl_err e = {0};
    in[0] = T(F32, "3,2,7", 0);
    pa.ndims = 3; pa.dims[0] = 1; pa.dims[1] = 0; pa.dims[2] = 2;
    if (eager_apply(OP_PERMUTE, (const fl_tensor *const *)in, 1, &pa, &pv, &e) == FL_OK) {
      in[0] = &pool[npool++];
      *in[0] = pv;
      in[1] = T(F32, "7,4", 0);
      check(OP_MATMUL, in, 2, &a, MM, "permuted batch");
    } else {
      ok(0, "permute for matmul: %s", e.msg);
    }
    gc();
  }
  {   /* an expanded (stride 0) operand is copied before BLAS */
    op_attrs ea = attrs(OP_EXPAND);
    fl_tensor *in[2], ex;
    fl_err e = {0};
    in[0] = T(F32, "1,7", 0);
    ea.ndims = 2; ea.dims[0] = 3; ea.dims[1] = 7;
    if (eager_apply(OP_EXPAND, (const fl_tensor *const *)in, 1, &ea, &ex, &e) == FL_OK) {
      in[0] = &pool[npool++];
      *in[0] = ex;
      in[1] = T(F32, "7,2", 0);
      check(OP_MATMUL, in, 2, &a, MM, "expanded");
    } else {
      ok(0, "expand for matmul: %s", e.msg);
    }
    gc();
  }
}

/* cpu_mm_run with one weight for every batch and a's rows strided: a's
** rows [D0, D1, D2] lie as [D1, D2, D0] (permuted), dst is contiguous, and
** two residuals added inside the call are broadcast over some row dims,
** [1, D1, 1] and [D0, 1, D2]; another case writes dst as a's rows lie
** (all three dims merge into one).  Against a loop in double; the count
** of products that took their rows in another order. */
static void test_mm_rows_order(void) {
  enum { D0 = 5, D1 = 3, D2 = 4, K = 19, N = 11 };
  static float a[D0 * D1 * D2 * K], b[K * N], y[D0 * D1 * D2 * N], r1[D1 * N], r2[D0 * D2 * N];
  int lay, i;
  for (i = 0; i < D0 * D1 * D2 * K; i++) a[i] = (float)rng_normal_at(17, 0, i);
  for (i = 0; i < K * N; i++) b[i] = (float)rng_normal_at(18, 0, i);
  for (i = 0; i < D1 * N; i++) r1[i] = (float)rng_normal_at(19, 0, i);
  for (i = 0; i < D0 * D2 * N; i++) r2[i] = (float)rng_normal_at(20, 0, i);
  for (lay = 0; lay < 2; lay++) {
    cpu_mm m;
    fl_err e = {0};
    int64_t c0, p0, o0, c1, p1, o1, d0, d1, d2, n, k, bad = 0;
    memset(&m, 0, sizeof m);
    m.nd = 4;
    m.a.p = a; m.b.p = b; m.dst.p = y;
    m.a.shape[0] = m.dst.shape[0] = D0; m.a.shape[1] = m.dst.shape[1] = D1;
    m.a.shape[2] = m.dst.shape[2] = D2; m.a.shape[3] = K; m.dst.shape[3] = N;
    m.a.stride[3] = 1; m.a.stride[0] = K; m.a.stride[2] = D0 * K; m.a.stride[1] = D2 * D0 * K;
    m.b.shape[0] = m.b.shape[1] = 1; m.b.shape[2] = K; m.b.shape[3] = N;
    m.b.stride[2] = N; m.b.stride[3] = 1;
    m.dst.stride[3] = 1;
    if (lay == 0) { m.dst.stride[2] = N; m.dst.stride[1] = D2 * N; m.dst.stride[0] = D1 * D2 * N; }
    else { m.dst.stride[0] = N; m.dst.stride[2] = D0 * N; m.dst.stride[1] = D2 * D0 * N; }
    m.npost = 2;
    m.post[0].kind = m.post[1].kind = CPU_MM_ADD;
    m.post[0].src.p = r1;
    m.post[0].src.shape[0] = 1; m.post[0].src.shape[1] = D1; m.post[0].src.shape[2] = 1;
    m.post[0].src.shape[3] = N; m.post[0].src.stride[1] = N; m.post[0].src.stride[3] = 1;
    m.post[1].src.p = r2;
    m.post[1].src.shape[0] = D0; m.post[1].src.shape[1] = 1; m.post[1].src.shape[2] = D2;
    m.post[1].src.shape[3] = N; m.post[1].src.stride[0] = D2 * N; m.post[1].src.stride[2] = N;
    m.post[1].src.stride[3] = 1;
    cpu_mm_counts(&c0, &p0, &o0);
    if (cpu_mm_run(&m, &e) != FL_OK) {
      ok(!cpu_mm_enabled(), "rows in another order: %s", e.msg);
      continue;
    }
    cpu_mm_counts(&c1, &p1, &o1);
    for (d0 = 0; d0 < D0; d0++)
      for (d1 = 0; d1 < D1; d1++)
        for (d2 = 0; d2 < D2; d2++)
          for (n = 0; n < N; n++) {
            double s = r1[d1 * N + n] + r2[(d0 * D2 + d2) * N + n], got;
            for (k = 0; k < K; k++)
              s += (double)a[d0 * K + d2 * D0 * K + d1 * D2 * D0 * K + k] * b[k * N + n];
            got = y[d0 * m.dst.stride[0] + d1 * m.dst.stride[1] + d2 * m.dst.stride[2] + n];
            bad += fabs(got - s) > 1e-5 + 1e-5 * fabs(s);
          }
    ok(bad == 0 && o1 - o0 == 1, "rows [%d, %d, %d] lying as [%d, %d, %d], dst %s, residuals broadcast "
       "over rows: %lld wrong, %lld reordered", D0, D1, D2, D1, D2, D0, lay ? "as a's rows lie" : "contiguous",
       (long long)bad, (long long)(o1 - o0));
  }
}

/* cpu_mm_warm runs a product of its own: nothing counted, kept or named,
** and a second call does nothing */
static void test_mm_warm(void) {
  int64_t calls0, posts0, ro0, calls1, posts1, ro1, pc0, pw0, pb0, pm0, pc1, pw1, pb1, pm1;
  char desc[256];
  cpu_mm_counts(&calls0, &posts0, &ro0);
  cpu_mm_pack_info(&pc0, &pw0, &pb0, &pm0);
  snprintf(desc, sizeof desc, "%s", cpu_mm_describe());
  cpu_mm_warm();
  cpu_mm_warm();
  cpu_mm_counts(&calls1, &posts1, &ro1);
  cpu_mm_pack_info(&pc1, &pw1, &pb1, &pm1);
  ok(calls1 == calls0 && posts1 == posts0 && ro1 == ro0, "mm_warm: no product counted (%lld -> %lld)",
     (long long)calls0, (long long)calls1);
  ok(pc1 == pc0 && pw1 == pw0 && pb1 == pb0 && pm1 == pm0, "mm_warm: no weight kept");
  is_str(cpu_mm_describe(), desc, "mm_warm: blas_info's sentence unchanged");
}

static void test_linear(void) {
  static const struct { const char *x, *w; int fx, fw, bias; fl_dtype dt; } cs[] = {
    {"5,7", "4,7", 0, 0, 1, F32}, {"7", "4,7", 0, 0, 1, F32},
    {"2,3,7", "4,7", 0, 0, 0, F32}, {"5,7", "4,7", 0, NC, 1, F32},
    {"5,7", "4,7", NC, 0, 0, F32}, {"64,300", "100,300", 0, 0, 1, F32},
    {"5,0", "4,0", 0, 0, 1, F32}, {"5,7", "4,7", 0, 0, 1, F16},
    {"5,7", "4,7", 0, NC, 1, I64}, {"3,7", "1,7", 0, 0, 1, F32}};
  op_attrs a = attrs(OP_LINEAR);
  size_t c;
#ifdef _OPENMP
  int threads = omp_get_max_threads();
#endif
  for (c = 0; c < sizeof cs / sizeof *cs; c++) {
    fl_tensor *in[3];
    char bs[16];
    in[0] = T(cs[c].dt, cs[c].x, cs[c].fx);
    in[1] = T(cs[c].dt, cs[c].w, cs[c].fw);
    snprintf(bs, sizeof bs, "%lld", (long long)in[1]->m.shape[0]);
    in[2] = cs[c].bias ? T(cs[c].dt, bs, 0) : NULL;
    check(OP_LINEAR, in, 3, &a, MM, cs[c].bias ? "bias" : NULL);
    check(OP_LINEAR, in, 2, &a, MM, NULL);
    gc();
  }
#ifdef _OPENMP
  /* small products run on one thread (cpu/mm.c); the team size after them
  ** is the caller's again */
  ok(omp_get_max_threads() == threads, "linear: OpenMP's thread count is %d after the products, as before (%d)",
     omp_get_max_threads(), threads);
#endif
}

static void test_conv(void) {
  static const struct { const char *x, *w; int sh, sw, ph, pw, bias, fx; fl_dtype dt; } cs[] = {
    {"2,3,8,8", "4,3,3,3", 1, 1, 0, 0, 1, 0, F32},
    {"2,3,8,8", "4,3,3,3", 2, 2, 1, 1, 1, 0, F32},
    {"2,3,8,8", "5,3,1,1", 1, 1, 0, 0, 1, 0, F32},
    {"1,2,5,7", "3,2,2,3", 2, 1, 0, 1, 0, 0, F32},
    {"2,3,6,6", "4,3,3,3", 1, 1, 2, 2, 1, NC, F32},
    {"2,3,6,6", "4,3,3,3", 1, 1, 1, 1, 1, 0, F16},
    {"1,1,3,3", "1,1,3,3", 1, 1, 0, 0, 0, 0, F32},
    {"4,16,20,20", "8,16,3,3", 1, 1, 1, 1, 1, 0, F32}};
  size_t c;
  for (c = 0; c < sizeof cs / sizeof *cs; c++) {
    op_attrs a = attrs(OP_CONV2D);
    fl_tensor *in[3];
    char bs[16];
    a.i[0] = cs[c].sh; a.i[1] = cs[c].sw; a.i[2] = a.i[4] = cs[c].ph; a.i[3] = a.i[5] = cs[c].pw;
    in[0] = T(cs[c].dt, cs[c].x, cs[c].fx);
    in[1] = T(cs[c].dt, cs[c].w, 0);
    snprintf(bs, sizeof bs, "%lld", (long long)in[1]->m.shape[0]);
    in[2] = cs[c].bias ? T(cs[c].dt, bs, 0) : NULL;
    check(OP_CONV2D, in, cs[c].bias ? 3 : 2, &a, MM, NULL);
    gc();
  }
}

static void test_pool(void) {
  static const struct { const char *x; int k0, k1, s0, s1, p0, p1, flags; fl_dtype dt; } cs[] = {
    {"2,3,8,8", 2, 2, 2, 2, 0, 0, 0, F32}, {"2,3,8,8", 3, 3, 1, 1, 1, 1, 0, F32},
    {"2,3,8,8", 3, 3, 2, 2, 1, 1, SPECIAL, F32}, {"1,1,7,5", 3, 2, 2, 1, 1, 0, 0, F32},
    {"1,2,5,5", 2, 2, 0, 0, 0, 0, NC, F32}, {"2,2,6,6", 2, 2, 2, 2, 1, 1, 0, F16},
    {"2,2,6,6", 3, 3, 1, 1, 1, 1, 0, I64}, {"1,1,1,1", 1, 1, 1, 1, 0, 0, 0, F32},
    /* 2x2, stride 2 (the gradient's vectorized path): NaN, ties, a view */
    {"2,3,8,10", 2, 2, 2, 2, 0, 0, SPECIAL, F32}, {"3,2,6,34", 2, 2, 2, 2, 0, 0, INTS, F32},
    {"2,3,8,8", 2, 2, 2, 2, 0, 0, NC, F32}};
  fl_op op;
  size_t c;
  for (op = OP_MAX_POOL2D; op <= OP_AVG_POOL2D; op++)
    for (c = 0; c < sizeof cs / sizeof *cs; c++) {
      op_attrs a = attrs(op);
      fl_tensor *x = T(cs[c].dt, cs[c].x, cs[c].flags);
      char buf[64];
      a.i[0] = cs[c].k0; a.i[1] = cs[c].k1; a.i[2] = cs[c].s0;
      a.i[3] = cs[c].s1; a.i[4] = a.i[6] = cs[c].p0; a.i[5] = a.i[7] = cs[c].p1;
      snprintf(buf, sizeof buf, "k%dx%d s%d,%d p%d,%d", cs[c].k0, cs[c].k1,
               cs[c].s0, cs[c].s1, cs[c].p0, cs[c].p1);
      check(op, &x, 1, &a, RED, buf);
      gc();
    }
  /* 8 planes and more with short rows go through transposed groups of 8
  ** (pool_by8): a last group of fewer planes, pixel counts that are not
  ** whole tiles of 8, global windows, dilation, ceil mode and both
  ** divisors */
  {
    static const struct { const char *x; int k, s, p, d, ceil, incl, flags; } bs[] = {
      {"3,5,7,9", 3, 2, 1, 1, 0, 1, SPECIAL}, {"2,8,14,14", 7, 7, 0, 1, 0, 1, 0},
      {"1,9,6,6", 6, 1, 0, 1, 0, 1, NC}, {"2,4,11,13", 3, 2, 1, 1, 1, 0, 0},
      {"1,16,9,9", 3, 2, 0, 2, 1, 1, 0}, {"2,12,10,10", 3, 1, 1, 1, 0, 0, SPECIAL},
      {"1,40,5,5", 5, 1, 2, 1, 0, 0, 0}};
    for (op = OP_MAX_POOL2D; op <= OP_AVG_POOL2D; op++)
      for (c = 0; c < sizeof bs / sizeof *bs; c++) {
        op_attrs a = attrs(op);
        fl_tensor *x;
        char buf[64];
        if (op == OP_AVG_POOL2D && bs[c].d > 1) continue;     /* dilation: the max only */
        x = T(F32, bs[c].x, bs[c].flags);
        a.i[0] = a.i[1] = bs[c].k; a.i[2] = a.i[3] = bs[c].s;
        a.i[4] = a.i[5] = a.i[6] = a.i[7] = bs[c].p; a.i[8] = a.i[9] = bs[c].d;
        a.i[10] = bs[c].ceil; a.i[11] = bs[c].incl;
        snprintf(buf, sizeof buf, "by8 k%d s%d p%d d%d%s%s", bs[c].k, bs[c].s, bs[c].p,
                 bs[c].d, bs[c].ceil ? " ceil" : "", bs[c].incl ? "" : " exclude-pad");
        check(op, &x, 1, &a, RED, buf);
        gc();
      }
  }
  /* the same pools over oneDNN's nChw8c and nChw16c blocks (a blocked
  ** chain's, eager_pool2d_blocked) against the plain layout's; blocks of
  ** 16 are the AVX-512 layout, checked here on any CPU */
  {
    static const struct { int k, s, p, d, ceil, incl, global; } ps[] = {
      {3, 2, 1, 1, 0, 1, 0}, {3, 1, 0, 2, 1, 1, 0}, {3, 2, 1, 1, 1, 0, 0}, {2, 2, 0, 1, 0, 1, 0},
      {0, 1, 0, 1, 0, 1, 1}};
    int b;
    for (b = 8; b <= 16; b += 8)
      for (op = OP_MAX_POOL2D; op <= OP_AVG_POOL2D; op++)
        for (c = 0; c < sizeof ps / sizeof *ps; c++) {
          const int64_t N = 2, C = 32, H = 9, W = 11;
          op_attrs a = attrs(op);
          fl_tensor *x = T(F32, "2,32,9,11", SPECIAL), y = {0};
          const fl_tensor *cx = x;
          fl_err e = {0};
          float *xb, *yb;
          const float *xf = ten_data(x), *yf;
          int64_t OH, OW, i, n, ch, px, bad = -1;
          if (op == OP_AVG_POOL2D && ps[c].d > 1) continue;
          a.i[0] = ps[c].global ? H : ps[c].k; a.i[1] = ps[c].global ? W : ps[c].k;
          a.i[2] = a.i[3] = ps[c].s; a.i[4] = a.i[5] = a.i[6] = a.i[7] = ps[c].p;
          a.i[8] = a.i[9] = ps[c].d; a.i[10] = ps[c].ceil; a.i[11] = ps[c].incl;
          if (eager_apply(op, &cx, 1, &a, &y, &e) != FL_OK) { ok(0, "blocked pool: plain: %s", e.msg); continue; }
          OH = y.m.shape[2]; OW = y.m.shape[3]; yf = ten_data(&y);
          xb = malloc((size_t)(N * C * H * W) * sizeof *xb);
          yb = malloc((size_t)(N * C * OH * OW) * sizeof *yb);
          for (n = 0; n < N; n++)
            for (ch = 0; ch < C; ch++)
              for (px = 0; px < H * W; px++)
                xb[((n * C / b + ch / b) * H * W + px) * b + ch % b] = xf[(n * C + ch) * H * W + px];
          if (eager_pool2d_blocked(op, &a, xb, yb, N, C, H, W, OH, OW, b) != FL_OK) bad = 0;
          for (i = 0; i < N * C * OH * OW && bad < 0; i++) {
            int64_t pn = i / (C * OH * OW), pc = i / (OH * OW) % C, pp = i % (OH * OW);
            float got = yb[((pn * C / b + pc / b) * OH * OW + pp) * b + pc % b], want = yf[i];
            if (!(got == want || (got != got && want != want) ||
                  (op == OP_AVG_POOL2D && fabsf(got - want) <= 1e-6f + 1e-6f * fabsf(want))))
              bad = i;
          }
          ok(bad < 0, "%s in blocks of %d (k%d s%d p%d d%d%s%s%s) as in the plain layout%s", op_name(op), b,
             ps[c].k, ps[c].s, ps[c].p, ps[c].d, ps[c].ceil ? " ceil" : "", ps[c].incl ? "" : " exclude-pad",
             ps[c].global ? " global" : "", bad >= 0 ? ": differs" : "");
          free(xb);
          free(yb);
          ten_release(&y);
          gc();
        }
  }
  /* the pool's gradient, over the same windows: g of the pool's shape */
  for (c = 0; c < sizeof cs / sizeof *cs; c++) {
    op_attrs a = attrs(OP_MAX_POOL2D_BACKWARD);
    fl_tensor *in[2];
    fl_meta pm;
    const fl_meta *xm[1];
    char buf[64], gs[64];
    if (cs[c].dt == I64) continue;
    a.i[0] = cs[c].k0; a.i[1] = cs[c].k1; a.i[2] = cs[c].s0;
    a.i[3] = cs[c].s1; a.i[4] = a.i[6] = cs[c].p0; a.i[5] = a.i[7] = cs[c].p1;
    in[1] = T(cs[c].dt, cs[c].x, cs[c].flags);
    xm[0] = &in[1]->m;
    if (infer_pool2d(OP_MAX_POOL2D, xm, 1, &a, &pm, NULL) != FL_OK) continue;
    snprintf(gs, sizeof gs, "%lld,%lld,%lld,%lld", (long long)pm.shape[0], (long long)pm.shape[1],
             (long long)pm.shape[2], (long long)pm.shape[3]);
    in[0] = T(cs[c].dt, gs, 0);
    snprintf(buf, sizeof buf, "backward k%dx%d s%d,%d p%d,%d", cs[c].k0, cs[c].k1,
             cs[c].s0, cs[c].s1, cs[c].p0, cs[c].p1);
    check(OP_MAX_POOL2D_BACKWARD, in, 2, &a, RED, buf);
    gc();
  }
}

/* --- data movement ------------------------------------------------------------ */

static void test_cat_embedding(void) {
  static const struct { const char *a, *b, *c; int dim, fb; fl_dtype db; } cs[] = {
    {"2,3", "4,3", NULL, 0, 0, F32}, {"2,3", "2,5", NULL, 1, 0, F32},
    {"2,3", "2,5", "2,1", 1, NC, F32}, {"2,3", "2,5", NULL, 1, 0, F16},
    {"2,0,3", "2,4,3", "2,1,3", 1, 0, F32}, {"3", "4", NULL, 0, 0, I64},
    {"500,100", "500,300", NULL, 1, 0, F32}, {"2,3,4", "2,3,4", NULL, 2, NC, F32},
    {"2,3", "4,3", "1,3", 0, NC, F32}, {"2,3", "4,3", NULL, 0, 0, BF16},
    {"2,3,4", "2,5,4", NULL, 1, NC, F32}};
  op_attrs a = attrs(OP_CAT);
  size_t c;
  for (c = 0; c < sizeof cs / sizeof *cs; c++) {
    fl_tensor *in[3];
    in[0] = T(F32, cs[c].a, 0);
    in[1] = T(cs[c].db, cs[c].b, cs[c].fb);
    in[2] = cs[c].c ? T(F32, cs[c].c, 0) : NULL;
    a.i[0] = cs[c].dim;
    check(OP_CAT, in, cs[c].c ? 3 : 2, &a, EW, NULL);
    gc();
  }
  {
    op_attrs ea = attrs(OP_EMBEDDING);
    fl_tensor *in[2];
    in[0] = T(I64, "5", POS);
    in[1] = T(F32, "10,4", 0);
    check(OP_EMBEDDING, in, 2, &ea, EW, NULL);
    in[0] = T(I64, "2,3", POS);
    in[1] = T(F32, "11,6", NC);
    check(OP_EMBEDDING, in, 2, &ea, EW, NULL);
    in[1] = T(F16, "11,6", 0);
    check(OP_EMBEDDING, in, 2, &ea, EW, NULL);
    in[0] = T(I64, "4", NC | POS);
    check(OP_EMBEDDING, in, 2, &ea, EW, NULL);
    in[0] = T(I64, "0", 0);
    check(OP_EMBEDDING, in, 2, &ea, EW, "empty");
    in[0] = T(I64, "6", 0);      /* negative indices: both refuse */
    check(OP_EMBEDDING, in, 2, &ea, EW, "negative");
    gc();
  }
}

/* pad, flip, gather: copies, exact against the oracle in every dtype */
static void test_movement(void) {
  static const fl_dtype dts[] = {F32, F16, I64, BOOL};
  static const struct { const char *x; int64_t pads[6]; int mode; double v; } ps[] = {
    {"3,4", {1, 2, 0, 1}, 0, 0}, {"3,4", {-1, 2, 1, -2}, 0, -1.5}, {"3,4", {2, 1, 1, 3}, 1, 0},
    {"2,3,4", {1, 0, 2, 1, 1, 3}, 2, 0}, {"2,3,4", {0, -1, 1, 1, 0, -2}, 1, 0},
    {"5", {4, 3}, 2, 0}, {"0,3", {1, 0, 1, 2}, 0, 7}, {"3,4", {-3, 0, 0, 0}, 0, 0}};
  size_t c, d;
  for (d = 0; d < sizeof dts / sizeof *dts; d++)
    for (c = 0; c < sizeof ps / sizeof *ps; c++) {
      op_attrs a = attrs(OP_PAD);
      fl_tensor *x = T(dts[d], ps[c].x, c % 2 ? NC : 0);
      int k;
      a.ndims = x->m.ndim;
      for (k = 0; k < a.ndims; k++) { a.dims[k] = ps[c].pads[k]; a.i[k] = ps[c].pads[a.ndims + k]; }
      a.i[8] = ps[c].mode;
      a.f[0] = ps[c].v;
      a.i[9] = (int64_t)ps[c].v;
      if (dts[d] == I64 && ps[c].v != floor(ps[c].v)) continue;
      check(OP_PAD, &x, 1, &a, 0, ps[c].x);
      gc();
    }
  for (d = 0; d < sizeof dts / sizeof *dts; d++) {
    static const char *const sh[] = {"2,3,5", "7", "", "4,0,3"};
    size_t k;
    for (k = 0; k < sizeof sh / sizeof *sh; k++) {
      op_attrs a = attrs(OP_CUMSUM);
      fl_tensor *x = T(dts[d], sh[k], k == 0 ? NC : 0);
      int dim, nd = x->m.ndim ? x->m.ndim : 1;
      for (dim = 0; dim < nd; dim++) {
        a.i[0] = dim; a.i[1] = dim % 2; a.i[2] = (dim + (int)k) % 2;
        check(OP_CUMSUM, &x, 1, &a, dts[d] == F16 ? 1e-3 : 1e-6, sh[k]);
      }
      gc();
    }
  }
  for (d = 0; d < sizeof dts / sizeof *dts; d++) {
    op_attrs a = attrs(OP_FLIP);
    fl_tensor *x = T(dts[d], "2,3,5", NC);
    a.ndims = 2; a.dims[0] = 2; a.dims[1] = 0;
    check(OP_FLIP, &x, 1, &a, 0, "dims 2, 0");
    a.ndims = 0;
    check(OP_FLIP, &x, 1, &a, 0, "no dims");
    gc();
  }
  for (d = 0; d < sizeof dts / sizeof *dts; d++) {
    static const char *const ix[] = {"4", "2,3", "", "0"};
    size_t k;
    int dim;
    for (dim = 0; dim < 3; dim++)
      for (k = 0; k < sizeof ix / sizeof *ix; k++) {
        op_attrs a = attrs(OP_GATHER);
        fl_tensor *in[2];
        int64_t i, n;
        in[0] = T(dts[d], "3,4,2", k % 2 ? NC : 0);
        in[1] = T(I64, ix[k], 0);
        n = meta_numel(&in[1]->m);
        for (i = 0; i < n; i++)       /* every index in range, negative ones too */
          ten_set_i64(in[1], i, (int64_t)(uniform() * 2 * (double)in[0]->m.shape[dim]) -
                                in[0]->m.shape[dim]);
        a.i[0] = dim;
        check(OP_GATHER, in, 2, &a, 0, ix[k]);
        gc();
      }
  }
  /* index_add (gather's gradient): repeated and negative indices, a strided
  ** src, an empty one */
  {
    static const struct { const char *src; int64_t n; int flags; fl_dtype dt; } ia[] = {
      {"2,7,5", 4, 0, F32}, {"1,300,70", 9, 0, F32}, {"3,6,4", 2, NC, F32},
      {"2,5,3", 3, 0, F16}, {"2,0,3", 5, 0, F32}};
    size_t k;
    for (k = 0; k < sizeof ia / sizeof *ia; k++) {
      op_attrs a = attrs(OP_INDEX_ADD);
      fl_tensor *in[2];
      char spec[16];
      int64_t i, I;
      in[0] = T(ia[k].dt, ia[k].src, ia[k].flags);
      I = in[0]->m.shape[1];
      snprintf(spec, sizeof spec, "%lld", (long long)I);
      in[1] = T(I64, spec, 0);
      for (i = 0; i < I; i++)
        ten_set_i64(in[1], i, (int64_t)(uniform() * 2 * (double)ia[k].n) - ia[k].n);
      a.i[0] = ia[k].n;
      /* eager adds in float, in index order (as PyTorch); the oracle in
      ** double: the 1,300,70 case sums ~33 N(0,1) terms per element, each
      ** rounding at most half an ulp of a partial sum below ~16 (1e-6), so
      ** the absolute bound is 33 x 1e-6 */
      check_ex(OP_INDEX_ADD, in, 2, &a, (double)I / (double)ia[k].n * 1e-6 + RED, RED, ia[k].src);
      gc();
    }
  }
}

/* A view op: eager shares x's storage; values as the oracle's copy. */
static void view_case(fl_op op, fl_tensor *x, const op_attrs *a, int share,
                      const char *what) {
  fl_tensor g;
  fl_err e = {0};
  int rc = eager_apply(op, (const fl_tensor *const *)&x, 1, a, &g, &e);
  if (!ok(rc == FL_OK, "%s %s runs", op_name(op), what)) {
    printf("#   %s\n", e.msg);
    return;
  }
  if (share) ok(g.st == x->st, "%s %s shares storage", op_name(op), what);
  else ok(g.st != x->st, "%s %s copies", op_name(op), what);
  ten_release(&g);
  check(op, &x, 1, a, EW, what);
}

static void test_views(void) {
  op_attrs a;
  fl_tensor *x = T(F32, "2,3,4", 0), *xt = T(F32, "3,4", NC), g;
  fl_err e = {0};
  int rc;
  a = attrs(OP_RESHAPE);
  a.ndims = 2; a.dims[0] = 4; a.dims[1] = -1;
  view_case(OP_RESHAPE, x, &a, 1, "contiguous");
  a.ndims = 1; a.dims[0] = 12;
  view_case(OP_RESHAPE, xt, &a, 0, "transposed");
  a.ndims = 3; a.dims[0] = 1; a.dims[1] = 3; a.dims[2] = 4;
  view_case(OP_RESHAPE, xt, &a, 1, "transposed, splitting no dim");
  a = attrs(OP_VIEW);
  a.ndims = 1; a.dims[0] = 24;
  view_case(OP_VIEW, x, &a, 1, "contiguous");
  a.ndims = 1; a.dims[0] = 12;
  rc = eager_apply(OP_VIEW, (const fl_tensor *const *)&xt, 1, &a, &g, &e);
  ok(rc != FL_OK && g.st == NULL, "view of a transposed tensor refuses");
  ok(strstr(e.msg, "view") == e.msg && strstr(e.msg, "reshape") != NULL,
     "... with PyTorch's advice: %s", e.msg);
  a = attrs(OP_TRANSPOSE);
  a.i[0] = 0; a.i[1] = 2;
  view_case(OP_TRANSPOSE, x, &a, 1, "0,2");
  a = attrs(OP_PERMUTE);
  a.ndims = 3; a.dims[0] = 2; a.dims[1] = 0; a.dims[2] = 1;
  view_case(OP_PERMUTE, x, &a, 1, "2,0,1");
  a = attrs(OP_UNSQUEEZE);
  a.i[0] = 1;
  view_case(OP_UNSQUEEZE, xt, &a, 1, "1");
  a = attrs(OP_SQUEEZE);
  {
    fl_tensor *y = T(F32, "2,1,3,1", 0);
    view_case(OP_SQUEEZE, y, &a, 1, "all");
    a.i[0] = 1; a.i[1] = 1;
    view_case(OP_SQUEEZE, y, &a, 1, "dim 1");
  }
  a = attrs(OP_EXPAND);
  {
    fl_tensor *y = T(F32, "3,1", 0);
    a.ndims = 3; a.dims[0] = 2; a.dims[1] = -1; a.dims[2] = 5;
    view_case(OP_EXPAND, y, &a, 1, "2,-1,5");
  }
  a = attrs(OP_NARROW);
  a.i[0] = 2; a.i[1] = 1; a.i[2] = 2;
  view_case(OP_NARROW, x, &a, 1, "dim 2 1:3");
  a = attrs(OP_SLICE);
  a.i[0] = 2; a.i[1] = 1; a.i[2] = 2; a.i[3] = 2;
  view_case(OP_SLICE, x, &a, 1, "dim 2 from 1 by 2");
  a.i[0] = 0; a.i[1] = 1; a.i[2] = 2; a.i[3] = 1;
  view_case(OP_SLICE, xt, &a, 1, "of a transposed tensor");
  a.i[2] = 0;
  view_case(OP_SLICE, x, &a, 1, "empty");
  a = attrs(OP_CONTIGUOUS);
  view_case(OP_CONTIGUOUS, x, &a, 1, "of a contiguous tensor");
  view_case(OP_CONTIGUOUS, xt, &a, 0, "of a transposed tensor");
  {
    fl_tensor *y = T(F16, "5,7", NC);
    view_case(OP_CONTIGUOUS, y, &a, 0, "float16");
  }
  a = attrs(OP_TRANSPOSE);
  a.i[0] = 0; a.i[1] = 1;
  view_case(OP_TRANSPOSE, xt, &a, 1, "of a transposed tensor");
  a = attrs(OP_NARROW);
  a.i[0] = 0; a.i[1] = 1; a.i[2] = 0;
  view_case(OP_NARROW, xt, &a, 1, "to nothing");
  {
    fl_tensor *y = T(I64, "0,3", 0);
    a = attrs(OP_RESHAPE);
    a.ndims = 2; a.dims[0] = 3; a.dims[1] = 0;
    view_case(OP_RESHAPE, y, &a, 1, "empty");
  }
  gc();
}

/* Random ops: the oracle and eager, each from the same seed, give the same
** bits (both draw from the stream where it stands, so each is reseeded);
** odd sizes end inside a Philox block; dropout of a strided view. */
static void check_random(fl_op op, fl_tensor *x, const op_attrs *a, uint64_t seed,
                         const char *what) {
  const fl_tensor *in[1] = {x};
  fl_tensor r, g;
  fl_err e = {0};
  int64_t n, i, same = 0;
  int rc1, rc2;
  tested[op] = 1;
  rng_seed(seed);
  rc1 = ref_apply(op, in, x ? 1 : 0, a, &r, &e);
  rng_seed(seed);
  rc2 = eager_apply(op, in, x ? 1 : 0, a, &g, &e);
  if (!ok(rc1 == FL_OK && rc2 == FL_OK, "%s %s: both run", op_name(op), what)) {
    printf("#   %s\n", e.msg);
    if (rc1 == FL_OK) ten_release(&r);
    if (rc2 == FL_OK) ten_release(&g);
    return;
  }
  n = meta_numel(&r.m);
  for (i = 0; i < n; i++) {
    double u = ten_get(&r, i), v = ten_get(&g, i);
    same += memcmp(&u, &v, sizeof u) == 0;
  }
  ok(same == n && r.m.dtype == g.m.dtype, "%s %s: eager equals the oracle bit for bit "
     "(%lld of %lld)", op_name(op), what, (long long)same, (long long)n);
  ten_release(&r);
  ten_release(&g);
}

static void test_random(void) {
  static const fl_dtype dts[] = {F32, F16, BF16};
  static const int64_t sizes[] = {1, 7, 4099};
  op_attrs a;
  int d, s;
  for (d = 0; d < 3; d++)
    for (s = 0; s < 3; s++) {
      char what[64];
      snprintf(what, sizeof what, "%s[%lld]", dtype_name(dts[d]), (long long)sizes[s]);
      op_attrs_init(OP_RAND, &a);
      a.ndims = 1; a.dims[0] = sizes[s]; a.dtype = dts[d];
      check_random(OP_RAND, NULL, &a, 11 + (uint64_t)s, what);
      check_random(OP_RANDN, NULL, &a, 21 + (uint64_t)s, what);
    }
  op_attrs_init(OP_DROPOUT, &a);
  a.f[0] = 0.3;
  check_random(OP_DROPOUT, T(F32, "5,7", 0), &a, 5, "float32[5,7] p=0.3");
  check_random(OP_DROPOUT, T(F32, "5,7", NC), &a, 5, "float32[5,7] transposed");
  check_random(OP_DROPOUT, T(F16, "33", 0), &a, 6, "float16[33]");
  check_random(OP_DROPOUT, T(BF16, "3,3", 0), &a, 6, "bfloat16[3,3]");
  a.f[0] = 1.0;
  check_random(OP_DROPOUT, T(F32, "9", 0), &a, 7, "p=1");
  gc();
}

/* --- rnn ---------------------------------------------------------------------------- */

/* Every cell and direction, with and without the optional inputs; a
** strided X; float16; lengths from 0 (the state stays initial_h) to T. */
static void test_rnn(void) {
  static const struct { int cell, dir, opt, lbr, clip; fl_dtype dt; int flags; } cs[] = {
    {OP_RNN_CELL_RNN, 0, 0, 0, 0, F32, 0}, {OP_RNN_CELL_RNN, 2, 1, 0, 1, F32, NC},
    {OP_RNN_CELL_GRU, 1, 1, 0, 0, F32, 0}, {OP_RNN_CELL_GRU, 2, 1, 1, 0, F32, 0},
    {OP_RNN_CELL_GRU, 0, 0, 1, 1, F16, 0}, {OP_RNN_CELL_LSTM, 0, 1, 0, 0, F32, NC},
    {OP_RNN_CELL_LSTM, 2, 1, 0, 1, F32, 0}, {OP_RNN_CELL_LSTM, 1, 0, 0, 0, F32, 0}};
  size_t k;
  for (k = 0; k < sizeof cs / sizeof *cs; k++) {
    static const int G[] = {1, 3, 4};
    int64_t D = cs[k].dir == 2 ? 2 : 1, H = 3, GH = G[cs[k].cell] * H, i;
    op_attrs a = attrs(OP_RNN);
    fl_tensor *in[8];
    char sw[32], sr[32], sb[32], sh[32], sp[32];
    snprintf(sw, sizeof sw, "%lld,%lld,4", (long long)D, (long long)GH);
    snprintf(sr, sizeof sr, "%lld,%lld,3", (long long)D, (long long)GH);
    snprintf(sb, sizeof sb, "%lld,%lld", (long long)D, (long long)(2 * GH));
    snprintf(sh, sizeof sh, "%lld,2,3", (long long)D);
    snprintf(sp, sizeof sp, "%lld,9", (long long)D);
    a.i[0] = cs[k].cell; a.i[1] = cs[k].dir; a.i[2] = cs[k].lbr;
    a.i[3] = cs[k].clip; a.f[0] = 1.25;
    in[0] = T(cs[k].dt, "5,2,4", cs[k].flags);
    in[1] = T(cs[k].dt, sw, 0);
    in[2] = T(cs[k].dt, sr, 0);
    if (!cs[k].opt) {
      check(OP_RNN, in, 3, &a, cs[k].dt == F16 ? 5e-3 : 1e-5, "X, W, R");
    } else {
      in[3] = T(cs[k].dt, sb, 0);
      in[4] = T(I64, "2", 0);
      for (i = 0; i < 2; i++) ten_set_i64(in[4], i, i ? 0 : 3);
      in[5] = T(cs[k].dt, sh, 0);
      in[6] = cs[k].cell == OP_RNN_CELL_LSTM ? T(cs[k].dt, sh, 0) : NULL;
      in[7] = cs[k].cell == OP_RNN_CELL_LSTM ? T(cs[k].dt, sp, 0) : NULL;
      check(OP_RNN, in, cs[k].cell == OP_RNN_CELL_LSTM ? 8 : 6, &a, 1e-5, "every input");
    }
    gc();
  }
}

/* --- matmul_int8 ----------------------------------------------------------------------- */

static void refuses(fl_op op, fl_tensor **in, int nin, const op_attrs *a, const char *want);

/* Fill t (int64) with values of an 8-bit type: random over the whole range
** (mode 0), or its extremes alternating (1), the sums that overflow 16-bit
** pair additions. */
static void int8_fill(fl_tensor *t, int is_unsigned, int mode) {
  int64_t i, n = meta_numel(&t->m), lo = is_unsigned ? 0 : -128, hi = is_unsigned ? 255 : 127;
  for (i = 0; i < n; i++)
    ten_set_i64(t, i, mode ? (i % 3 ? hi : lo) : lo + (int64_t)(uniform() * (double)(hi - lo + 1)));
}

/* Every type pair, with and without zero points (one value, per row / per
** column), a batched and a shared B, a transposed A, K past a pair sum's
** 16 bits and K = 0, exactly equal to the oracle; out-of-range values
** refused. */
static void test_matmul_int8(void) {
  static const struct { const char *a, *b, *za, *zb; int flags; } cs[] = {
    {"7,33", "33,5", NULL, NULL, 0}, {"2,7,300", "2,300,9", "7", "9", 0},
    {"3,4,64", "64,17", "", "", 0}, {"6,40", "40,3", "1", NULL, NC},
    {"1,1", "1,1", NULL, "1", 0}, {"5,0", "0,4", "5", "4", 0}, {"2,3,130", "2,130,70", NULL, "70", NC}};
  size_t k;
  int types, mode;
  char what[64];
  for (k = 0; k < sizeof cs / sizeof *cs; k++)
    for (types = 0; types < 4; types++)
      for (mode = 0; mode < 2; mode++) {
        op_attrs a = attrs(OP_MATMUL_INT8);
        fl_tensor *in[4];
        int n = 2;
        a.i[0] = types & 1; a.i[1] = types >> 1;
        in[0] = T(I64, cs[k].a, cs[k].flags);
        in[1] = T(I64, cs[k].b, 0);
        in[2] = cs[k].za ? T(I64, cs[k].za, 0) : NULL;
        in[3] = cs[k].zb ? T(I64, cs[k].zb, 0) : NULL;
        for (n = 0; n < 4; n++)
          if (in[n]) int8_fill(in[n], (int)a.i[n & 1], n < 2 ? mode : 0);
        n = in[3] ? 4 : in[2] ? 3 : 2;
        snprintf(what, sizeof what, "%s%s x %s%s", a.i[0] ? "u" : "s", cs[k].a, a.i[1] ? "u" : "s", cs[k].b);
        check(OP_MATMUL_INT8, in, n, &a, 0, what);
        gc();
      }
  {
    op_attrs a = attrs(OP_MATMUL_INT8);
    fl_tensor *in[2];
    in[0] = T(I64, "2,3", 0);
    in[1] = T(I64, "3,2", 0);
    int8_fill(in[0], 0, 0);
    int8_fill(in[1], 0, 0);
    ten_set_i64(in[1], 4, 128);
    refuses(OP_MATMUL_INT8, in, 2, &a, "matmul_int8: B holds 128, outside int8's range -128..127");
    gc();
  }
}

/* A row added to ops.def without a case here fails this. */
static void test_coverage(void) {
  int op, missing = 0;
  for (op = 0; op < OP_COUNT; op++)
    if (!tested[op]) {
      printf("# no eager test compares %s\n", op_name((fl_op)op));
      missing++;
    }
  ok(missing == 0, "every op of ops.def is compared with the oracle");
}

/* --- errors ----------------------------------------------------------------------- */

static void refuses(fl_op op, fl_tensor **in, int nin, const op_attrs *a,
                    const char *want) {
  fl_tensor g;
  fl_err e = {0};
  int rc = eager_apply(op, (const fl_tensor *const *)in, nin, a, &g, &e);
  ok(rc != FL_OK && g.st == NULL && strstr(e.msg, want) == e.msg,
     "refuses: %s", e.msg);
  if (rc == FL_OK) ten_release(&g);
}

static void test_errors(void) {
  op_attrs a = attrs(OP_ADD);
  fl_tensor *in[3], cuda;
  in[0] = T(F32, "3", 0);
  in[1] = T(F32, "4", 0);
  refuses(OP_ADD, in, 2, &a, "add: ");
  a = attrs(OP_MATMUL);
  in[0] = T(F32, "2,3", 0);
  in[1] = T(F32, "4,5", 0);
  refuses(OP_MATMUL, in, 2, &a, "matmul: [2,3] @ [4,5]: inner dimensions");
  a = attrs(OP_EMBEDDING);
  in[0] = T(I64, "2", 0);
  ten_set(in[0], 0, 10);
  in[1] = T(F32, "10,4", 0);
  refuses(OP_EMBEDDING, in, 2, &a, "embedding: index 10 out of range");
  a = attrs(OP_GATHER);
  in[1] = T(I64, "3", 0);
  ten_set_i64(in[1], 0, 0); ten_set_i64(in[1], 1, -11); ten_set_i64(in[1], 2, 1);
  in[0] = T(F32, "10,4", 0);
  refuses(OP_GATHER, in, 2, &a, "gather: index -11 out of range for dim 1 of size 10");
  a = attrs(OP_INDEX_ADD);
  a.i[0] = 4;
  in[0] = T(F32, "1,3,2", 0);
  refuses(OP_INDEX_ADD, in, 2, &a, "index_add: index -11 out of range for 4 rows");
  a = attrs(OP_POW);
  in[0] = T(I64, "3", 0);
  in[1] = T(I64, "", 0);          /* a Lua number; tensor exponents compute */
  ten_set(in[1], 0, -1);
  in[1]->m.wrapped = 1;
  refuses(OP_POW, in, 2, &a, "pow: integers to negative integer powers");
  a = attrs(OP_SUM);
  a.ndims = 1; a.dims[0] = 5;
  refuses(OP_SUM, in, 1, &a, "sum: dim 5 out of range");
  refuses(OP_SUM, in, 0, &a, "sum: expected");
  a = attrs(OP_WHERE);
  refuses(OP_WHERE, in, 2, &a, "where");
  memset(&cuda, 0, sizeof cuda);
  cuda.m.ndim = 1; cuda.m.shape[0] = 3; cuda.m.device = FL_DEV_CUDA;
  in[0] = &cuda;
  a = attrs(OP_EXP);
  refuses(OP_EXP, in, 1, &a, "exp: ");
  a = attrs(OP_SOFTMAX);
  a.i[0] = 3;
  in[0] = T(F32, "3,3", 0);
  refuses(OP_SOFTMAX, in, 1, &a, "softmax: dim 3 out of range");
  ok(eager_apply(OP_COUNT, (const fl_tensor *const *)in, 1, &a, &cuda, NULL) != FL_OK,
     "an unknown op is refused even without an error record");
  gc();
}

/* --- int64 beyond 2^53 ----------------------------------------------------------- */

/* [rows, cols] int64 near a nanosecond timestamp, with INT64_MIN / MAX and
** small values mixed in; transposed (a strided view) when nc. */
static fl_tensor *big_i64(int64_t rows, int64_t cols, int nc, uint64_t seed) {
  fl_tensor *t = T(I64, nc ? "9,5" : "5,9", 0);
  int64_t i, n = rows * cols, *p = (int64_t *)t->st->data;
  for (i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    switch ((seed >> 33) % 6) {
    case 0: p[i] = INT64_MAX - (int64_t)((seed >> 40) % 3); break;
    case 1: p[i] = INT64_MIN + (int64_t)((seed >> 40) % 3); break;
    case 2: p[i] = (int64_t)((seed >> 40) % 9) - 4; break;
    default: p[i] = 1733000000123456789LL + (int64_t)((seed >> 40) % 1000) - 500; break;
    }
  }
  if (nc) {
    t->m.shape[0] = 5; t->m.shape[1] = 9;
    t->stride[0] = 1; t->stride[1] = 5;
  }
  return t;
}

/* eager and the oracle agree on every bit of an int64 result */
static void same_bits(const char *what, fl_op op, fl_tensor **in, int nin,
                      const op_attrs *a) {
  fl_tensor g, r;
  fl_err e = {0};
  int64_t i, n;
  int good = eager_apply(op, (const fl_tensor *const *)in, nin, a, &g, &e) == FL_OK;
  if (!good) printf("# eager: %s\n", e.msg);
  if (ref_apply(op, (const fl_tensor *const *)in, nin, a, &r, &e) != FL_OK) {
    printf("# ref: %s\n", e.msg);
    if (good) ten_release(&g);
    ok(0, "int64 %s %s", op_name(op), what);
    return;
  }
  n = meta_numel(&r.m);
  if (good) {
    good = g.m.dtype == r.m.dtype && meta_numel(&g.m) == n;
    for (i = 0; good && i < n; i++)
      good = memcmp(ten_elem_ptr(&g, i), ten_elem_ptr(&r, i), dtype_size(r.m.dtype)) == 0;
    if (!good) printf("# first difference at %lld\n", (long long)i - 1);
    ten_release(&g);
  }
  ten_release(&r);
  ok(good, "int64 %s %s: eager gives the oracle's exact result", op_name(op), what);
}

static void test_int64_exact(void) {
  static const fl_op bin[] = {OP_ADD, OP_SUB, OP_MUL, OP_POW, OP_MAXIMUM,
                              OP_MINIMUM, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
  static const fl_op un[] = {OP_ABS, OP_NEG, OP_RELU, OP_CLAMP, OP_SUM,
                             OP_AMAX, OP_AMIN, OP_ARGMAX};
  fl_tensor *in[3], g;
  fl_err e = {0};
  op_attrs a;
  size_t k;
  int nc;
  for (nc = 0; nc < 2; nc++) {
    const char *what = nc ? "[5,9](nc) near 2^60" : "[5,9] near 2^60";
    for (k = 0; k < sizeof bin / sizeof bin[0]; k++) {
      a = attrs(bin[k]);
      in[0] = big_i64(5, 9, nc, 1 + k);
      in[1] = big_i64(5, 9, 0, 100 + k);
      if (bin[k] == OP_POW) in[1] = T(I64, "5,9", 0);   /* -5..5 */
      same_bits(what, bin[k], in, 2, &a);
      gc();
    }
    for (k = 0; k < sizeof un / sizeof un[0]; k++) {
      a = attrs(un[k]);
      if (un[k] == OP_CLAMP) { a.f[0] = -1e18; a.f[1] = 1.7330000001234567e18; }
      if (un[k] != OP_CLAMP && un[k] != OP_ABS && un[k] != OP_NEG && un[k] != OP_RELU) {
        a.ndims = 1; a.dims[0] = 1;
      }
      in[0] = big_i64(5, 9, nc, 200 + k);
      same_bits(what, un[k], in, 1, &a);
      gc();
    }
    a = attrs(OP_WHERE);
    in[0] = T(BOOL, "5,9", 0);
    in[1] = big_i64(5, 9, nc, 300);
    in[2] = big_i64(5, 9, 0, 301);
    same_bits(what, OP_WHERE, in, 3, &a);
    gc();
  }
  /* (t + 1) - t == 1 for a nanosecond timestamp */
  in[0] = T(I64, "", 0);
  in[1] = T(I64, "", 0);
  *(int64_t *)in[0]->st->data = 1733000000123456789LL;
  *(int64_t *)in[1]->st->data = 1;
  a = attrs(OP_ADD);
  if (eager_apply(OP_ADD, (const fl_tensor *const *)in, 2, &a, &g, &e) == FL_OK) {
    fl_tensor d;
    const fl_tensor *sub[2] = {&g, in[0]};
    a = attrs(OP_SUB);
    ok(eager_apply(OP_SUB, sub, 2, &a, &d, &e) == FL_OK &&
       *(const int64_t *)ten_data(&d) == 1, "int64 (t + 1) - t is 1 eagerly");
    if (d.st) ten_release(&d);
    ten_release(&g);
  } else {
    ok(0, "int64 (t + 1) - t is 1 eagerly");
  }
  gc();
}

/* Element (ch, p) of image i in layout l (0 plain, CPU_NHWC, blocks of
** 8 or 16), written out here apart from cpu/layout.c's. */
static int64_t at_layout(int l, int64_t c, int64_t hw, int64_t i, int64_t ch, int64_t p) {
  if (l == 0) return (i * c + ch) * hw + p;
  if (l == CPU_NHWC) return (i * hw + p) * c + ch;
  return i * c * hw + ((ch / l) * hw + p) * l + ch % l;
}

/* cpu_relayout between every two of plain, channels last and blocks of 8
** and 16 (and cpu_unblock_nchw, the way back to plain), over planes
** shorter and longer than a tile of 8 pixels and channel counts off the
** group of 8 (plain and channels last only), each value checked in its
** place. */
static void test_relayout(void) {
  static const int64_t shapes[][3] = {{1, 16, 1}, {2, 32, 7}, {1, 48, 49}, {3, 16, 300}, {2, 64, 700},
                                      {2, 3, 50}, {1, 12, 9}, {2, 20, 64}};
  static const int ls[4] = {0, CPU_NHWC, 8, 16};
  static const char *const names[4] = {"nchw", "channels last", "nChw8c", "nChw16c"};
  size_t s;
  int f, t;
  for (s = 0; s < sizeof shapes / sizeof *shapes; s++)
    for (f = 0; f < 4; f++)
      for (t = 0; t < 4; t++) {
        int64_t n = shapes[s][0], c = shapes[s][1], hw = shapes[s][2], i, ch, p, bad = 0;
        float *x, *y;
        if ((f >= 2 && c % ls[f]) || (t >= 2 && c % ls[t])) continue;
        x = malloc((size_t)(n * c * hw) * sizeof *x);
        y = malloc((size_t)(n * c * hw) * sizeof *y);
        for (i = 0; i < n; i++)
          for (ch = 0; ch < c; ch++)
            for (p = 0; p < hw; p++) x[at_layout(ls[f], c, hw, i, ch, p)] = (float)((i * c + ch) * hw + p);
        for (i = 0; i < n * c * hw; i++) y[i] = -1.0f;
        if (t == 0 && f > 0) cpu_unblock_nchw(x, y, n, c, hw, ls[f]);
        else cpu_relayout(x, ls[f], y, ls[t], n, c, hw);
        for (i = 0; i < n; i++)
          for (ch = 0; ch < c; ch++)
            for (p = 0; p < hw; p++) bad += y[at_layout(ls[t], c, hw, i, ch, p)] != (float)((i * c + ch) * hw + p);
        ok(bad == 0, "%lldx%lldx%lld from %s to %s: %lld misplaced", (long long)n, (long long)c, (long long)hw,
           names[f], names[t], (long long)bad);
        free(x);
        free(y);
      }
}

/* cpu/conv_dw.c reads its input channels last (CPU_NHWC: an expansion's
** result left so by oneDNN's brgconv) as it reads plain planes: the same
** values into its scratch, so the same result to the bit, over channel
** counts of one and several groups of 8, 3x3 and 5x5, strides 1 and 2; a
** channel count off the group of 8 is refused (its last load would run
** past the pixel). */
static void test_dw_nhwc(void) {
  static const int64_t cs[][6] = {   /* n, c, h, w, k, stride */
    {1, 8, 5, 7, 3, 1}, {2, 24, 11, 9, 3, 2}, {2, 96, 14, 14, 5, 1}, {1, 16, 3, 20, 5, 2}, {3, 40, 8, 8, 3, 1}};
  size_t t;
  for (t = 0; t < sizeof cs / sizeof *cs; t++) {
    int64_t n = cs[t][0], c = cs[t][1], h = cs[t][2], w = cs[t][3], k = cs[t][4], st = cs[t][5];
    int64_t pad = k / 2, oh = (h + 2 * pad - k) / st + 1, ow = (w + 2 * pad - k) / st + 1, i, ch, p, bad = 0;
    int64_t nx = n * c * h * w, ny = n * c * oh * ow;
    float *x = malloc((size_t)nx * sizeof *x), *xl = malloc((size_t)nx * sizeof *xl),
          *wt = malloc((size_t)(c * k * k) * sizeof *wt), *b = malloc((size_t)c * sizeof *b),
          *y0 = malloc((size_t)ny * sizeof *y0), *y1 = malloc((size_t)ny * sizeof *y1);
    cpu_conv cv;
    int r0, r1;
    for (i = 0; i < nx; i++) x[i] = (float)((i * 7919) % 201) / 100.0f - 1.0f;
    for (i = 0; i < c * k * k; i++) wt[i] = (float)((i * 104729) % 97) / 97.0f - 0.5f;
    for (i = 0; i < c; i++) b[i] = (float)i / (float)c;
    for (i = 0; i < n; i++)
      for (ch = 0; ch < c; ch++)
        for (p = 0; p < h * w; p++) xl[(i * h * w + p) * c + ch] = x[(i * c + ch) * h * w + p];
    memset(&cv, 0, sizeof cv);
    cv.n = n; cv.c = cv.co = cv.groups = c; cv.h = h; cv.w = w; cv.kh = cv.kw = k; cv.oh = oh; cv.ow = ow;
    cv.sh = cv.sw = st; cv.dh = cv.dw = 1; cv.pt = cv.pl = cv.pb = cv.pr = pad;
    cv.x = x; cv.wt = wt; cv.bias = b; cv.y = y0;
    r0 = cpu_conv_dw(&cv);
    cv.x = xl; cv.xblk = CPU_NHWC; cv.y = y1;
    r1 = cpu_conv_dw(&cv);
    for (i = 0; i < ny; i++) bad += memcmp(&y0[i], &y1[i], sizeof *y0) != 0;
    ok(r0 == FL_OK && r1 == FL_OK && bad == 0, "depthwise %lldx%lldx%lldx%lld k%lld stride %lld: channels last "
       "in as plain (%lld of %lld differ)", (long long)n, (long long)c, (long long)h, (long long)w, (long long)k,
       (long long)st, (long long)bad, (long long)ny);
    free(x); free(xl); free(wt); free(b); free(y0); free(y1);
  }
  {
    cpu_conv cv;
    memset(&cv, 0, sizeof cv);
    cv.n = 1; cv.c = cv.co = cv.groups = 12; cv.h = cv.w = cv.oh = cv.ow = 4; cv.kh = cv.kw = 3;
    cv.sh = cv.sw = cv.dh = cv.dw = 1; cv.pt = cv.pl = cv.pb = cv.pr = 1; cv.xblk = CPU_NHWC;
    ok(!cpu_conv_dw_fits(&cv), "depthwise over 12 channels last: refused (off the group of 8)");
  }
}

int main(void) {
  test_relayout();
  test_unary();
  test_cast();
  test_binary();
  test_where();
  test_reduce();
  test_softmax();
  test_norms();
  test_batch_norm();
  test_matmul();
  test_mm_warm();
  test_mm_rows_order();
  test_linear();
  test_conv();
  test_dw_nhwc();
  test_pool();
  test_cat_embedding();
  test_movement();
  test_views();
  test_errors();
  test_int64_exact();
  test_random();
  test_rnn();
  test_matmul_int8();
  test_coverage();
  return tap_done();
}
