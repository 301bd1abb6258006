/*
** eager.c -- eager execution: the dispatcher, the elementwise engine and
** data movement (views, contiguous, cat, embedding).
** Invariant: eager_apply returns what ref_apply returns for the same
** inputs (within rounding).  The result is freshly allocated, except for
** view ops and contiguous of a contiguous tensor, whose result is a counted
** view of in[0] (so, as in PyTorch, an in-place op on one shows in the
** other).  The elementwise engine walks the output in chunks; each chunk
** either reads its inputs in place (contiguous runs or constants) or
** gathers them into float32/double buffers first.
*/
#include <stdlib.h>
#include <string.h>
#include <float.h>
#include <math.h>

#include "eager_impl.h"
#include "../graph/hostpool.h"
#include "../graph/view.h"
#include "../graph/rng.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Elements per chunk: big enough that per-chunk setup is noise, small
** enough that a chunk's buffers stay in L1/L2. */
#define BLK 2048
#define MAX_IN 64          /* cat's max_args in ops.def */

/* --- helpers shared by the eager files ------------------------------- */

/* Scratch gets the huge-page advice every big CPU tensor gets,
** and the cap every tensor gets (a size that wrapped is huge, not 0). */
void *eager_alloc(size_t nbytes, const char *opname, fl_err *e) {
  void *p = nbytes <= (size_t)FL_MAX_ALLOC ? malloc(nbytes ? nbytes : 1) : NULL;
  if (!p)
    err_set(e, FL_ENOMEM, "%s: cannot allocate %zu bytes of scratch memory",
            opname, nbytes);
  hostpool_advise_huge(p, nbytes);
  return p;
}


/* As dtype_store to float32 does: NaN and overflow without undefined
** behaviour, the in-range values inline. */
static float f64_to_f32(double v) {
  float f;
  if (fabs(v) <= FLT_MAX) return (float)v;
  dtype_store(FL_F32, &f, v);
  return f;
}

/* n elements of dtype t from src (stride s elements) into dst as `to`.
** The conversions are those of dtype_load/dtype_store, so eager and the
** oracle read every value the same way. */
static void copy_run(fl_dtype t, const char *src, int64_t s, int64_t n,
                     void *dst, int to) {
  int64_t i;
#define RUN(ST, DT, EXPR)                                                    \
  do {                                                                       \
    const ST *p = (const ST *)(const void *)src;                             \
    DT *q = dst;                                                             \
    for (i = 0; i < n; i++) { ST v = p[i * s]; q[i] = (DT)(EXPR); }          \
  } while (0)
  if (to == EAGER_RAW) {
    size_t es = dtype_size(t);
    if (s == 1) { memcpy(dst, src, (size_t)n * es); return; }
    switch (es) {
    case 1: RUN(uint8_t, uint8_t, v); break;
    case 2: RUN(uint16_t, uint16_t, v); break;
    case 4: RUN(uint32_t, uint32_t, v); break;
    default: RUN(uint64_t, uint64_t, v); break;
    }
    return;
  }
  if (to == EAGER_I64) {
    switch (t) {
    case FL_I64:
      if (s == 1) memcpy(dst, src, (size_t)n * 8);
      else RUN(int64_t, int64_t, v);
      break;
    case FL_F32: RUN(float, int64_t, dtype_f2i(v)); break;
    case FL_F16: RUN(uint16_t, int64_t, dtype_f2i(f16_to_f32(v))); break;
    case FL_BF16: RUN(uint16_t, int64_t, dtype_f2i(bf16_to_f32(v))); break;
    case FL_F64: RUN(double, int64_t, dtype_f2i(v)); break;
    default: RUN(uint8_t, int64_t, v != 0); break;
    }
  } else if (to == EAGER_F32) {
    switch (t) {
    case FL_F32:
      if (s == 1) memcpy(dst, src, (size_t)n * 4);
      else RUN(float, float, v);
      break;
    case FL_F16: RUN(uint16_t, float, f16_to_f32(v)); break;
    case FL_BF16: RUN(uint16_t, float, bf16_to_f32(v)); break;
    case FL_I64: RUN(int64_t, float, v); break;   /* rounded once */
    case FL_F64: RUN(double, float, f64_to_f32(v)); break;
    default: RUN(uint8_t, float, v != 0); break;
    }
  } else if (to == EAGER_F64) {
    switch (t) {
    case FL_F32: RUN(float, double, v); break;
    case FL_F16: RUN(uint16_t, double, f16_to_f32(v)); break;
    case FL_BF16: RUN(uint16_t, double, bf16_to_f32(v)); break;
    case FL_I64: RUN(int64_t, double, v); break;
    case FL_F64:
      if (s == 1) memcpy(dst, src, (size_t)n * 8);
      else RUN(double, double, v);
      break;
    default: RUN(uint8_t, double, v != 0); break;
    }
  } else {
    switch (t) {
    case FL_F32: RUN(float, uint8_t, v != 0.0f); break;
    case FL_F16: case FL_BF16: RUN(uint16_t, uint8_t, (v & 0x7fff) != 0); break;
    case FL_I64: RUN(int64_t, uint8_t, v != 0); break;
    case FL_F64: RUN(double, uint8_t, v != 0.0); break;
    default: RUN(uint8_t, uint8_t, v != 0); break;
    }
  }
#undef RUN
}

void eager_gather(const fl_tensor *t, int64_t start, int64_t n, void *dst,
                  int to) {
  int64_t shape[FL_MAX_DIMS], str[FL_MAX_DIMS], idx[FL_MAX_DIMS];
  int64_t off, rem, done = 0;
  size_t es = dtype_size(t->m.dtype);
  size_t ds = to == EAGER_F32 ? 4 : to == EAGER_F64 || to == EAGER_I64 ? 8 : to == EAGER_U8 ? 1 : es;
  const char *base = (const char *)t->st->data;
  /* the copy converts nothing: raw, or to the dtype the values have (bool
  ** is stored as 0/1 bytes, what EAGER_U8 holds) */
  const int same = to == EAGER_RAW || (to == EAGER_F32 && t->m.dtype == FL_F32) ||
                   (to == EAGER_I64 && t->m.dtype == FL_I64) ||
                   (to == EAGER_F64 && t->m.dtype == FL_F64) ||
                   (to == EAGER_U8 && t->m.dtype == FL_BOOL);
  int nd = 0, d, last;
  if (n <= 0) return;
  /* merge dims that are contiguous with each other and drop size-1 dims:
  ** the logical order is unchanged and the inner runs get longer */
  for (d = 0; d < t->m.ndim; d++) {
    if (t->m.shape[d] == 1) continue;
    if (nd > 0 && str[nd - 1] == t->stride[d] * t->m.shape[d]) {
      shape[nd - 1] *= t->m.shape[d];
      str[nd - 1] = t->stride[d];
      continue;
    }
    shape[nd] = t->m.shape[d];
    str[nd++] = t->stride[d];
  }
  if (nd == 0) { shape[0] = 1; str[0] = 0; nd = 1; }
  last = nd - 1;
  off = t->offset;
  rem = start;
  for (d = last; d >= 0; d--) {
    idx[d] = rem % shape[d];
    rem /= shape[d];
    off += idx[d] * str[d];
  }
  while (done < n) {
    int64_t cnt = shape[last] - idx[last];
    /* short rows (a broadcast's or a window's, 1 to 16 long) copied as
    ** they are: a whole block of the two inner dims per step, not a call
    ** per row */
    if (nd >= 2 && shape[last] <= 16 && idx[last] == 0 && idx[last - 1] == 0 && same &&
        n - done >= shape[last] * shape[last - 1]) {
      int64_t r, j, R = shape[last - 1], W = shape[last], sr = str[last - 1], sw = str[last];
      const char *p = base + off * (int64_t)es;
      char *q = (char *)dst + done * (int64_t)es;
#define BLOCK(T)                                                               \
      for (r = 0; r < R; r++)                                                  \
        for (j = 0; j < W; j++)                                                \
          ((T *)(void *)q)[r * W + j] = ((const T *)(const void *)p)[r * sr + j * sw]
      if (es == 4) BLOCK(uint32_t);
      else if (es == 8) BLOCK(uint64_t);
      else if (es == 2) BLOCK(uint16_t);
      else BLOCK(uint8_t);
#undef BLOCK
      done += R * W;
      off += R * sr;
      idx[last - 1] = R;
      for (d = last - 1; d > 0 && idx[d] == shape[d]; d--) {
        off += str[d - 1] - idx[d] * str[d];
        idx[d] = 0;
        idx[d - 1]++;
      }
      continue;
    }
    if (cnt > n - done) cnt = n - done;
    copy_run(t->m.dtype, base + off * (int64_t)es, str[last], cnt,
             (char *)dst + done * (int64_t)ds, to);
    done += cnt;
    off += cnt * str[last];
    idx[last] += cnt;
    for (d = last; d > 0 && idx[d] == shape[d]; d--) {
      off += str[d - 1] - idx[d] * str[d];
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

void eager_gather_all(const fl_tensor *t, void *dst, int to) {
  int64_t n = meta_numel(&t->m), nch = (n + 65535) / 65536, c;
  size_t ds = to == EAGER_F32 ? 4 : to == EAGER_F64 || to == EAGER_I64 ? 8 : to == EAGER_U8 ? 1
              : dtype_size(t->m.dtype);
  EAGER_PRAGMA(omp parallel for schedule(static) if (n > EAGER_PAR_MIN))
  for (c = 0; c < nch; c++) {
    int64_t s = c * 65536, len = n - s < 65536 ? n - s : 65536;
    eager_gather(t, s, len, (char *)dst + s * (int64_t)ds, to);
  }
}

const float *eager_f32(const fl_tensor *t, float **owned, const char *opname,
                       fl_err *e) {
  int64_t n = meta_numel(&t->m);
  *owned = NULL;
  if (t->m.dtype == FL_F32 && ten_is_contiguous(t) && n > 0)
    return (const float *)ten_data(t);
  *owned = eager_alloc((size_t)n * sizeof(float), opname, e);
  if (*owned && n > 0) eager_gather_all(t, *owned, EAGER_F32);
  return *owned;
}

const double *eager_f64(const fl_tensor *t, double **owned,
                        const char *opname, fl_err *e) {
  int64_t n = meta_numel(&t->m);
  *owned = eager_alloc((size_t)n * sizeof(double), opname, e);
  if (*owned && n > 0) eager_gather_all(t, *owned, EAGER_F64);
  return *owned;
}

float *eager_out_f32(fl_tensor *out, float **owned, const char *opname,
                     fl_err *e) {
  *owned = NULL;
  if (out->m.dtype == FL_F32) return (float *)ten_data(out);
  *owned = eager_alloc((size_t)meta_numel(&out->m) * sizeof(float), opname, e);
  return *owned;
}

void eager_out_done(fl_tensor *out, float *owned) {
  int64_t n = meta_numel(&out->m), c;
  if (!owned) return;
  EAGER_PRAGMA(omp parallel for schedule(static) if (n > EAGER_PAR_MIN))
  for (c = 0; c < n; c += 65536)
    eager_store_f32(out, c, owned + c, n - c < 65536 ? n - c : 65536);
  free(owned);
}

void eager_store_f32(fl_tensor *out, int64_t start, const float *src,
                     int64_t n) {
  char *p = (char *)ten_data(out) + start * (int64_t)dtype_size(out->m.dtype);
  int64_t i;
  switch (out->m.dtype) {
  case FL_F32: memcpy(p, src, (size_t)n * 4); break;
  case FL_F16:
    for (i = 0; i < n; i++) ((uint16_t *)(void *)p)[i] = f32_to_f16(src[i]);
    break;
  case FL_BF16:
    for (i = 0; i < n; i++) ((uint16_t *)(void *)p)[i] = f32_to_bf16(src[i]);
    break;
  case FL_BOOL:
    for (i = 0; i < n; i++) ((uint8_t *)p)[i] = src[i] != 0.0f;
    break;
  default:
    for (i = 0; i < n; i++) dtype_store(out->m.dtype, p + 8 * i, src[i]);
    break;
  }
}

/* dtype_store's conversions; the common in-range cases inline. */
void eager_store_f64(fl_tensor *out, int64_t start, const double *src,
                     int64_t n) {
  size_t es = dtype_size(out->m.dtype);
  char *p = (char *)ten_data(out) + start * (int64_t)es;
  int64_t i;
  if (out->m.dtype == FL_F32) {
    float *q = (float *)(void *)p;
    for (i = 0; i < n; i++) {
      if (fabs(src[i]) <= FLT_MAX) q[i] = (float)src[i];
      else dtype_store(FL_F32, q + i, src[i]);   /* NaN, overflow */
    }
  } else if (out->m.dtype == FL_F64) {
    memcpy(p, src, (size_t)n * 8);
  } else if (out->m.dtype == FL_I64) {
    int64_t *q = (int64_t *)(void *)p;
    for (i = 0; i < n; i++) {
      if (src[i] > -0x1p63 && src[i] < 0x1p63) q[i] = (int64_t)src[i];
      else dtype_store(FL_I64, q + i, src[i]);   /* NaN, saturation */
    }
  } else {
    for (i = 0; i < n; i++) dtype_store(out->m.dtype, p + (size_t)i * es, src[i]);
  }
}

/* --- float32 elementwise kernels ------------------------------------- */
/* One tight loop per op over contiguous operands; the switch runs once per
** chunk.  Loops without library calls carry `omp simd` and vectorize; the
** transcendentals use eager_impl.h's polynomials for that reason (pow is
** the one libm loop left). */

#define L1(EXPR) EAGER_SIMD for (i = 0; i < n; i++) { float x = p[i]; y[i] = (EXPR); } break

EAGER_WIDE
static void unary_f32(fl_op op, const op_attrs *a, float *restrict y,
                      const float *restrict p, int64_t n) {
  float lo = (float)a->f[0], hi = (float)a->f[1];
  int64_t i;
  switch (op) {
  case OP_ABS: L1(fabsf(x));
  case OP_NEG: L1(-x);
  case OP_EXP: L1(eager_expf(x));
  case OP_LOG: L1(eager_logf(x));
  case OP_SQRT: L1(sqrtf(x));          /* one instruction: -fno-math-errno */
  case OP_RSQRT: L1(1.0f / sqrtf(x));
  case OP_SIN:
    EAGER_SIMD for (i = 0; i < n; i++) y[i] = eager_sincosf(p[i], 0);
    for (i = 0; i < n; i++)  /* beyond the reduction's range: libm */
      if (!(fabsf(p[i]) <= EAGER_TRIG_MAX)) y[i] = sinf(p[i]);
    break;
  case OP_COS:
    EAGER_SIMD for (i = 0; i < n; i++) y[i] = eager_sincosf(p[i], 1);
    for (i = 0; i < n; i++)
      if (!(fabsf(p[i]) <= EAGER_TRIG_MAX)) y[i] = cosf(p[i]);
    break;
  /* rare enough that libm's loop is fine */
  case OP_ASIN: for (i = 0; i < n; i++) y[i] = asinf(p[i]); break;
  case OP_ACOS: for (i = 0; i < n; i++) y[i] = acosf(p[i]); break;
  case OP_ATAN: for (i = 0; i < n; i++) y[i] = atanf(p[i]); break;
  case OP_TANH: L1(eager_tanhf(x));
  case OP_SIGMOID: L1(eager_sigmoidf(x));
  case OP_RELU: L1(x < 0.0f ? 0.0f : x);
  case OP_GELU: L1(0.5f * x * eager_erf1p(x * 0.70710678118654752f));
  /* 1 + tanh(u) = 2 / (1 + e^-2u): no cancellation for negative x */
  case OP_GELU_TANH:
    L1(x / (1.0f + eager_expf(-1.59576912160573072f * (x + 0.044715f * x * x * x))));
  case OP_SILU: L1(x * eager_sigmoidf(x));
  case OP_ERF: L1(eager_erff(x));
  /* NaN stays NaN (neither test is true); lo > hi gives hi, as PyTorch */
  case OP_CLAMP: L1(x < lo ? (lo > hi ? hi : lo) : (x > hi ? hi : x));
  case OP_TO: L1(x);
  /* an op without a case: NaN, never its input copied, so a row added
  ** to ops.def without a kernel here fails test_eager's comparison with
  ** the oracle loudly */
  default: L1(x - x + NAN);
  }
}

#define L2(EXPR) EAGER_SIMD for (i = 0; i < n; i++) { float u = p[i], v = q[i]; y[i] = (EXPR); } break

static void binary_f32(fl_op op, float *restrict y, const float *restrict p,
                       const float *restrict q, int64_t n) {
  int64_t i;
  switch (op) {
  case OP_ADD: L2(u + v);
  case OP_SUB: L2(u - v);
  case OP_MUL: L2(u * v);
  case OP_DIV: L2(u / v);
  case OP_POW: for (i = 0; i < n; i++) y[i] = powf(p[i], q[i]); break;
  case OP_MAXIMUM: L2((u != u || u > v) ? u : v);
  case OP_MINIMUM: L2((u != u || u < v) ? u : v);
  case OP_FMOD: for (i = 0; i < n; i++) y[i] = fmodf(p[i], q[i]); break;
  case OP_REMAINDER:
    for (i = 0; i < n; i++) {
      const float r = fmodf(p[i], q[i]);
      y[i] = (r != 0.0f && ((r < 0.0f) != (q[i] < 0.0f))) ? r + q[i] : r;
    }
    break;
  default: L2(u - v + NAN);          /* no case: NaN, as unary_f32 */
  }
}

static void compare_f32(fl_op op, uint8_t *restrict y, const float *restrict p,
                        const float *restrict q, int64_t n) {
  int64_t i;
  switch (op) {
  case OP_EQ: L2(u == v);
  case OP_NE: L2(u != v);
  case OP_LT: L2(u < v);
  case OP_LE: L2(u <= v);
  case OP_GT: L2(u > v);
  case OP_GE: L2(u >= v);
  default: L2(u == v ? 2 : 3);       /* no case: not a bool, as unary_f32 */
  }
}

static void where_f32(float *restrict y, const uint8_t *restrict c,
                      const float *restrict p, const float *restrict q,
                      int64_t n) {
  int64_t i;
  EAGER_SIMD
  for (i = 0; i < n; i++) { float u = p[i], v = q[i]; y[i] = c[i] ? u : v; }
}

static int is_compare(fl_op op) { return op >= OP_EQ && op <= OP_GE; }

/* --- the elementwise engine ------------------------------------------ */

typedef struct ew {
  fl_op op;
  const op_attrs *a;
  int nin;
  int f64;                    /* compute in double through the op table's
                                 scalar function (integer operands) */
  fl_tensor v[3];             /* inputs broadcast to the output shape */
  fl_tensor *out;
  int64_t n;                  /* output elements */
  int split;                  /* dims [split, ndim) form one run ... */
  int64_t run;                /* ... of this many elements, over which */
  int konst[3];               /* each input is constant, or else contiguous */
} ew;

/* A borrowed view of src with out's shape: broadcast dims get stride 0. */
static int bcast_view(const fl_tensor *src, const fl_meta *om, fl_tensor *v) {
  int lead = om->ndim - src->m.ndim, d;
  if (lead < 0) return -1;
  *v = *src;
  v->m.ndim = om->ndim;
  for (d = 0; d < om->ndim; d++) {
    int sd = d - lead;
    int64_t have = sd < 0 ? 1 : src->m.shape[sd];
    if (have != 1 && have != om->shape[d]) return -1;
    v->m.shape[d] = om->shape[d];
    v->stride[d] = have == 1 ? 0 : src->stride[sd];
  }
  return 0;
}

/* The longest run of trailing dims over which every input either walks
** memory in step with the output (contiguous) or stays put (stride 0):
** same-shape contiguous operands give one run of everything, x + b[row]
** gives rows, x * scalar a single run with a constant. */
static void plan_runs(ew *w) {
  const fl_meta *om = &w->out->m;
  int kind[3] = {-1, -1, -1}, want[3], d, k;
  int64_t run = 1;
  w->split = om->ndim;
  for (d = om->ndim - 1; d >= 0; d--) {
    if (om->shape[d] == 1) { w->split = d; continue; }
    for (k = 0; k < w->nin; k++) {
      int64_t s = w->v[k].stride[d];
      want[k] = s == 0 ? 1 : s == run ? 0 : 2;
      if (want[k] == 2 || (kind[k] >= 0 && kind[k] != want[k])) goto done;
    }
    for (k = 0; k < w->nin; k++) kind[k] = want[k];
    run *= om->shape[d];
    w->split = d;
  }
done:
  w->run = run;
  for (k = 0; k < w->nin; k++) w->konst[k] = kind[k] != 0;
}

/* Element offset of input k at the start of run r. */
static int64_t run_offset(const ew *w, int k, int64_t r) {
  const fl_tensor *v = &w->v[k];
  int64_t off = v->offset;
  int d;
  for (d = w->split - 1; d >= 0; d--) {
    off += (r % v->m.shape[d]) * v->stride[d];
    r /= v->m.shape[d];
  }
  return off;
}

/* Run len float32 elements of the op: operands p[], result to y (float or,
** for comparisons, bytes). */
static void ew_kernel(const ew *w, void *y, const void *const *p, int64_t len) {
  if (w->op == OP_WHERE)
    where_f32(y, p[0], p[1], p[2], len);
  else if (is_compare(w->op))
    compare_f32(w->op, y, p[0], p[1], len);
  else if (w->nin == 2)
    binary_f32(w->op, y, p[0], p[1], len);
  else
    unary_f32(w->op, w->a, y, p[0], len);
}

/* Path 1: runs read in place.  Constants are splatted once into a buffer
** (refilled only when the value changes), so every kernel has a single
** vector-vector form. */
static void ew_runs(const ew *w) {
  int64_t cpr = (w->run + BLK - 1) / BLK, nch = (w->n / w->run) * cpr;
  size_t oes = dtype_size(w->out->m.dtype);
  char *obase = (char *)ten_data(w->out);
  EAGER_PRAGMA(omp parallel if (w->n > EAGER_PAR_MIN))
  {
    float splat[3][BLK];
    uint8_t *csplat = (uint8_t *)splat[0];
    double last[3];
    int64_t filled[3] = {0, 0, 0};
    int64_t c;
    EAGER_PRAGMA(omp for schedule(static))
    for (c = 0; c < nch; c++) {
      int64_t r = c / cpr, j0 = (c % cpr) * BLK;
      int64_t len = w->run - j0 < BLK ? w->run - j0 : BLK, i;
      const void *p[3];
      int k;
      for (k = 0; k < w->nin; k++) {
        const fl_tensor *v = &w->v[k];
        int64_t off = run_offset(w, k, r);
        const char *src = (const char *)v->st->data;
        if (!w->konst[k]) {
          p[k] = src + (off + j0) * (int64_t)dtype_size(v->m.dtype);
          continue;
        }
        {
          double x = dtype_load(v->m.dtype,
                                src + off * (int64_t)dtype_size(v->m.dtype));
          /* only the chunk's len: a per-channel constant over 7x7 rows
          ** changes every 49 elements, and a whole BLK refill each
          ** time was most of an eager batch norm */
          if (filled[k] < len || !(x == last[k])) {
            if (w->op == OP_WHERE && k == 0)
              for (i = 0; i < len; i++) csplat[i] = x != 0.0;
            else
              for (i = 0; i < len; i++) splat[k][i] = (float)x;
            filled[k] = len;
            last[k] = x;
          }
          p[k] = splat[k];
        }
      }
      ew_kernel(w, obase + (r * w->run + j0) * (int64_t)oes, p, len);
    }
  }
}

/* Path 2: any strides and dtypes: gather each chunk of every input into a
** buffer (float32, or double when f64), compute, convert into out. */
static int ew_gather(const ew *w, fl_err *e) {
  int64_t nch = (w->n + BLK - 1) / BLK;
  const op_scalar_fn f = op_info_of(w->op)->scalar;
  EAGER_PRAGMA(omp parallel if (w->n > EAGER_PAR_MIN))
  {
    double buf[4][BLK];
    int64_t c;
    EAGER_PRAGMA(omp for schedule(static))
    for (c = 0; c < nch; c++) {
      int64_t start = c * BLK, len = w->n - start < BLK ? w->n - start : BLK, i;
      int k;
      if (!w->f64) {
        const void *p[3];
        float *y = (float *)buf[3];
        for (k = 0; k < w->nin; k++) {
          int to = (w->op == OP_WHERE && k == 0) ? EAGER_U8 : EAGER_F32;
          eager_gather(&w->v[k], start, len, buf[k], to);
          p[k] = buf[k];
        }
        if (is_compare(w->op)) {   /* the output is bool: write in place */
          ew_kernel(w, (uint8_t *)ten_data(w->out) + start, p, len);
          continue;
        }
        if (w->out->m.dtype == FL_F32) y = (float *)ten_data(w->out) + start;
        ew_kernel(w, y, p, len);
        if (w->out->m.dtype != FL_F32) eager_store_f32(w->out, start, y, len);
        continue;
      }
      for (k = 0; k < w->nin; k++) {
        /* an int64 operand of a float32 op is first converted to float32
        ** (PyTorch's promotion), rounding once, as the oracle */
        if (w->v[k].m.dtype == FL_I64 && !(w->op == OP_WHERE && k == 0) &&
            w->out->m.dtype != FL_F64) {
          eager_gather(&w->v[k], start, len, buf[k], EAGER_I64);
          for (i = 0; i < len; i++) {
            int64_t q;
            memcpy(&q, &buf[k][i], 8);
            buf[k][i] = (float)q;
          }
        } else {
          eager_gather(&w->v[k], start, len, buf[k], EAGER_F64);
        }
      }
      for (i = 0; i < len; i++) {
        double x[3];
        x[0] = buf[0][i];
        x[1] = w->nin > 1 ? buf[1][i] : 0.0;
        x[2] = w->nin > 2 ? buf[2][i] : 0.0;
        buf[3][i] = f(x, w->a);
      }
      eager_store_f64(w->out, start, buf[3], len);
    }
  }
  (void)e;
  return FL_OK;
}

/* Path 3: integer operands (op_int_compute): gather each chunk as int64,
** compute with the op table's exact int64 form, convert into out. */
static int ew_int(const ew *w, fl_err *e) {
  int64_t nch = (w->n + BLK - 1) / BLK;
  const op_iscalar_fn f = op_info_of(w->op)->iscalar;
  size_t oes = dtype_size(w->out->m.dtype);
  /* a negative Lua number as the exponent is refused, as PyTorch refuses
  ** a negative scalar exponent; tensor exponents compute (ops.def) */
  if (w->op == OP_POW && w->v[1].m.wrapped && meta_numel(&w->v[1].m) >= 1) {
    int64_t x;
    eager_gather(&w->v[1], 0, 1, &x, EAGER_I64);
    if (x < 0)
      return err_set(e, FL_EINVAL, "pow: integers to negative integer powers "
                     "are not allowed (exponent %lld)", (long long)x);
  }
  /* an integer divisor of 0 is refused, as PyTorch does (a kernel gives 0) */
  if (w->op == OP_FMOD || w->op == OP_REMAINDER) {
    int64_t c, n1 = meta_numel(&w->v[1].m), x[BLK];
    for (c = 0; c < n1; c += BLK) {
      int64_t len = n1 - c < BLK ? n1 - c : BLK, i;
      eager_gather(&w->v[1], c, len, x, EAGER_I64);
      for (i = 0; i < len; i++)
        if (x[i] == 0)
          return err_set(e, FL_EINVAL, "%s: integer division by zero", op_name(w->op));
    }
  }
  EAGER_PRAGMA(omp parallel if (w->n > EAGER_PAR_MIN))
  {
    int64_t buf[3][BLK];
    int64_t c;
    EAGER_PRAGMA(omp for schedule(static))
    for (c = 0; c < nch; c++) {
      int64_t start = c * BLK, len = w->n - start < BLK ? w->n - start : BLK, i;
      char *o = (char *)ten_data(w->out) + start * (int64_t)oes;
      int k;
      for (k = 0; k < w->nin; k++)
        eager_gather(&w->v[k], start, len, buf[k], EAGER_I64);
      for (i = 0; i < len; i++) {
        int64_t x[3];
        for (k = 0; k < w->nin; k++) x[k] = buf[k][i];
        dtype_store_i64(w->out->m.dtype, o + (size_t)i * oes, f(x, w->a));
      }
    }
  }
  return FL_OK;
}

static int elementwise(fl_op op, const fl_tensor *const *in, int nin,
                       const op_attrs *a, fl_tensor *out, fl_err *e) {
  fl_dtype od = out->m.dtype;
  char sa[160], sb[160];
  int k, allf = 1, inplace = 1;
  fl_dtype dt[3];
  ew w;
  memset(&w, 0, sizeof w);
  w.op = op;
  w.a = a;
  w.nin = nin;
  w.out = out;
  w.n = meta_numel(&out->m);
  if (nin > 3 || !op_info_of(op)->scalar)
    return err_set(e, FL_EINVAL, "%s: not an elementwise op", op_name(op));
  for (k = 0; k < nin; k++) {
    if (!in[k] || bcast_view(in[k], &out->m, &w.v[k]) != 0)
      return err_set(e, FL_EINVAL, "%s: input %d %s does not broadcast to %s",
                     op_name(op), k + 1,
                     in[k] ? meta_shape_str(&in[k]->m, sa, sizeof sa) : "(none)",
                     meta_shape_str(&out->m, sb, sizeof sb));
    if (op == OP_WHERE && k == 0) continue;
    /* a Lua number converts to the op's float type, as in PyTorch, so it
    ** does not force the double path onto a float tensor */
    if (!dtype_is_float(in[k]->m.dtype) &&
        !(in[k]->m.wrapped && (dtype_is_float(od) || is_compare(op))))
      allf = 0;
  }
  for (k = 0; k < nin; k++) dt[k] = in[k]->m.dtype;
  if (op_int_compute(op, dt, nin)) return ew_int(&w, e);
  if (is_compare(op))
    w.f64 = !(allf && od == FL_BOOL);
  else if (op == OP_TO)
    w.f64 = in[0]->m.dtype == FL_I64 || od == FL_I64;
  else
    w.f64 = !(allf && dtype_is_float(od));
  /* float64 anywhere: every value in double */
  for (k = 0; k < nin; k++)
    if (dt[k] == FL_F64 && !(op == OP_WHERE && k == 0)) w.f64 = 1;
  if (od == FL_F64) w.f64 = 1;
  if (w.f64) return ew_gather(&w, e);
  plan_runs(&w);
  /* in place needs float32 operands (bool for where's condition) wherever
  ** they are read as arrays, and a float32 (or comparison) result */
  if (od != (is_compare(op) ? FL_BOOL : FL_F32) || w.run < 16) inplace = 0;
  for (k = 0; k < nin && inplace; k++)
    if (!w.konst[k] &&
        w.v[k].m.dtype != ((op == OP_WHERE && k == 0) ? FL_BOOL : FL_F32))
      inplace = 0;
  if (inplace) {
    ew_runs(&w);
    return FL_OK;
  }
  return ew_gather(&w, e);
}

/* --- data movement --------------------------------------------------- */

/* out (allocated, contiguous, src's dtype) gets src's values in row-major
** order: reshape's fallback, contiguous. */
static void copy_rowmajor(const fl_tensor *src, fl_tensor *out) {
  if (meta_numel(&out->m) > 0) eager_gather_all(src, ten_data(out), EAGER_RAW);
}

/* Each input lands as one block per outer index: a memcpy per block when
** its dtype matches and it is contiguous, else ten_copy into the matching
** strided window of out (which converts). */
static int cat(fl_op op, const fl_tensor *const *in, int nin,
               const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_meta *om = &out->m;
  int64_t dim = a->i[0], outer = 1, inner = 1, at = 0, o;
  size_t es = dtype_size(om->dtype);
  int k, d, rc;
  char sa[160], sb[160];
  (void)op;
  if (dim < 0 || dim >= om->ndim)
    return err_set(e, FL_EINVAL, "cat: dim %lld out of range for a %d-d "
                   "result", (long long)dim, om->ndim);
  for (d = 0; d < dim; d++) outer *= om->shape[d];
  for (d = (int)dim + 1; d < om->ndim; d++) inner *= om->shape[d];
  for (k = 0; k < nin; k++) {
    const fl_tensor *t = in[k];
    const fl_meta *m;
    int64_t sk, chunk;
    if (!t) continue;
    m = &t->m;
    for (d = 0; d < om->ndim; d++)
      if (m->ndim != om->ndim || (d != dim && m->shape[d] != om->shape[d]) ||
          (d == dim && at + m->shape[d] > om->shape[d]))
        return err_set(e, FL_EINVAL, "cat: input %d %s does not fit result %s "
                       "along dim %lld", k + 1, meta_shape_str(m, sa, sizeof sa),
                       meta_shape_str(om, sb, sizeof sb), (long long)dim);
    sk = m->shape[dim];
    chunk = sk * inner;
    if (meta_numel(m) == 0) { at += sk; continue; }
    if (m->dtype == om->dtype && ten_is_contiguous(t)) {
      const char *src = (const char *)ten_data(t);
      char *dst = (char *)ten_data(out);
      EAGER_PRAGMA(omp parallel for schedule(static) if (outer * chunk > EAGER_PAR_MIN && outer > 1))
      for (o = 0; o < outer; o++)
        memcpy(dst + ((o * om->shape[dim] + at) * inner) * (int64_t)es,
               src + o * chunk * (int64_t)es, (size_t)chunk * es);
    } else {
      fl_tensor win = *out;          /* borrowed: no reference taken */
      win.m = *m;
      win.m.dtype = om->dtype;
      win.offset = out->offset + at * out->stride[dim];
      if ((rc = ten_copy(&win, t, e)) != FL_OK) return err_prefix(e, "cat");
    }
    at += sk;
  }
  return FL_OK;
}

/* out[..., :] = weight[idx[...], :], one row memcpy per index after every
** index has been checked (an error leaves nothing half-done to explain). */
static int embedding(fl_op op, const fl_tensor *const *in, int nin,
                     const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_tensor *idx = in[0], *w = in[1];
  int64_t rows = meta_numel(&idx->m), V, D, r;
  size_t rowb;
  double *ix;
  fl_tensor wc;
  const char *src;
  char *dst = (char *)ten_data(out);
  int rc;
  (void)nin; (void)a;
  if (w->m.ndim != 2)
    return err_set(e, FL_EINVAL, "embedding: weight must be 2-d, got %d-d",
                   w->m.ndim);
  V = w->m.shape[0];
  D = w->m.shape[1];
  if (!eager_f64(idx, &ix, op_name(op), e)) return e ? e->code : FL_ENOMEM;
  for (r = 0; r < rows; r++)
    if (!(ix[r] >= 0 && ix[r] < (double)V) || ix[r] != floor(ix[r])) {
      rc = err_set(e, FL_EINVAL, "embedding: index %.17g out of range for a "
                   "table of %lld rows (valid 0..%lld)", ix[r], (long long)V,
                   (long long)V - 1);
      free(ix);
      return rc;
    }
  if ((rc = ten_contiguous(&wc, w, e)) != FL_OK) {
    free(ix);
    return err_prefix(e, "embedding");
  }
  src = (const char *)ten_data(&wc);
  rowb = (size_t)D * dtype_size(w->m.dtype);
  /* the result has the weight's dtype (shape rule), so rows copy as bytes */
  EAGER_PRAGMA(omp parallel for schedule(static) if (rows * D > EAGER_PAR_MIN))
  for (r = 0; r < rows; r++)
    memcpy(dst + (size_t)r * rowb, src + (size_t)ix[r] * rowb, rowb);
  ten_release(&wc);
  free(ix);
  return rc;
}

/* rand, randn: a block-at-a-time fill from the draw reserved now.
** dropout: the oracle's rule (graph/rng.c) over a contiguous copy of x,
** four elements per Philox block (U keeps 24 bits, as the oracle's
** rng_uniform_at); the same float32 arithmetic, so the same bits. */
static int eager_random(fl_op op, const fl_tensor *const *in, int nin,
                        const op_attrs *a, fl_tensor *out, fl_err *e) {
  int64_t n = meta_numel(&out->m), i;
  uint64_t key = rng_key(), start = rng_reserve(n);
  float p, scale;
  fl_tensor xc;
  size_t es;
  const char *src;
  char *dst;
  int rc;
  (void)nin;
  if (op != OP_DROPOUT) {
    rng_fill(out, op == OP_RANDN, key, start);
    return FL_OK;
  }
  if ((rc = ten_contiguous(&xc, in[0], e)) != FL_OK) return err_prefix(e, "dropout");
  p = (float)a->f[0];
  scale = rng_dropout_scale(a->f[0]);
  es = dtype_size(out->m.dtype);
  src = (const char *)ten_data(&xc);
  dst = (char *)ten_data(out);
  EAGER_PRAGMA(omp parallel for schedule(static) if (n > EAGER_PAR_MIN))
  for (i = 0; i < (n + 3) / 4; i++) {
    uint32_t w[4];
    int64_t j;
    rng_block(key, start + (uint64_t)i, w);
    for (j = 0; j < 4 && 4 * i + j < n; j++) {
      int64_t k = 4 * i + j;
      float u = (float)(w[j] >> 8) * 0x1p-24f;
      if (out->m.dtype == FL_F32) {
        float x = ((const float *)src)[k];
        ((float *)dst)[k] = u < p ? 0.0f : x * scale;
      } else {
        float x = (float)dtype_load(xc.m.dtype, src + (size_t)k * es);
        dtype_store(out->m.dtype, dst + (size_t)k * es, u < p ? 0.0f : x * scale);
      }
    }
  }
  ten_release(&xc);
  return FL_OK;
}

/* --- pad, flip, gather: element copies by bytes ---------------------------- */

/* Row-major strides of m in elements. */
static void rowmajor_strides(const fl_meta *m, int64_t *st) {
  int64_t s = 1;
  int d;
  for (d = m->ndim - 1; d >= 0; d--) { st[d] = s; s *= m->shape[d]; }
}

/* pad (the oracle's rule, ref_pad): each output element from its source in
** a contiguous copy of x, or the constant (one element of x's dtype made
** once, then copied as bytes). */
static int pad(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
               fl_tensor *out, fl_err *e) {
  const fl_meta *im = &in[0]->m, *om = &out->m;
  int64_t n = meta_numel(om), i, ist[FL_MAX_DIMS];
  int64_t crop[FL_MAX_DIMS], before[FL_MAX_DIMS], m[FL_MAX_DIMS];
  size_t es = dtype_size(im->dtype);
  unsigned char cval[16];
  fl_tensor xc, one;
  fl_meta cm;
  const char *src;
  char *dst = (char *)ten_data(out);
  int d, nd = im->ndim, rc, mode = (int)a->i[8];
  (void)nin;
  for (d = 0; d < nd; d++) {
    crop[d] = a->dims[d] < 0 ? -a->dims[d] : 0;
    before[d] = a->dims[d] > 0 ? a->dims[d] : 0;
    m[d] = im->shape[d] - crop[d] - (a->i[d] < 0 ? -a->i[d] : 0);
  }
  memset(&cm, 0, sizeof cm);
  cm.ndim = 1; cm.shape[0] = 1; cm.dtype = im->dtype;
  if ((rc = ten_empty(&one, &cm, e)) != FL_OK) return err_prefix(e, op_name(op));
  if (im->dtype == FL_I64) ten_set_i64(&one, 0, a->i[9]);
  else ten_set(&one, 0, a->f[0]);
  memcpy(cval, ten_data(&one), es);
  ten_release(&one);
  if (n == 0) return FL_OK;
  if ((rc = ten_contiguous(&xc, in[0], e)) != FL_OK) return err_prefix(e, op_name(op));
  src = (const char *)ten_data(&xc);
  rowmajor_strides(im, ist);
  if (nd == 0) {
    memcpy(dst, src, es);
    ten_release(&xc);
    return FL_OK;
  }
  /* a row (the last dim) at a time: its source row found once, its middle
  ** copied as one run when the mode is constant */
  {
    const int64_t W = om->shape[nd - 1], rows = n / W;
    const int last = nd - 1;
    EAGER_PRAGMA(omp parallel for schedule(static) if (n > EAGER_PAR_MIN))
    for (i = 0; i < rows; i++) {
      int64_t r = i, at = 0, c, j;
      int k, inside = 1;
      char *drow = dst + (size_t)(i * W) * es;
      for (k = last - 1; k >= 0; k--) {
        c = r % om->shape[k] - before[k];
        r /= om->shape[k];
        if (c < 0 || c >= m[k]) {
          if (mode == 0) { inside = 0; break; }
          if (mode == 2) c = c < 0 ? 0 : m[k] - 1;
          else c = c < 0 ? -c : 2 * (m[k] - 1) - c;
        }
        at += (crop[k] + c) * ist[k];
      }
      if (!inside) {
        for (j = 0; j < W; j++) memcpy(drow + (size_t)j * es, cval, es);
        continue;
      }
      at += crop[last] * ist[last];
      if (mode == 0) {
        int64_t lo = before[last], hi = before[last] + m[last];
        for (j = 0; j < lo && j < W; j++) memcpy(drow + (size_t)j * es, cval, es);
        if (hi > lo) memcpy(drow + (size_t)lo * es, src + (size_t)at * es, (size_t)(hi - lo) * es);
        for (j = hi; j < W; j++) memcpy(drow + (size_t)j * es, cval, es);
        continue;
      }
      for (j = 0; j < W; j++) {
        c = j - before[last];
        if (c < 0 || c >= m[last]) {
          if (mode == 2) c = c < 0 ? 0 : m[last] - 1;
          else c = c < 0 ? -c : 2 * (m[last] - 1) - c;
        }
        memcpy(drow + (size_t)j * es, src + (size_t)(at + c) * es, es);
      }
    }
  }
  ten_release(&xc);
  return FL_OK;
}

/* flip: coordinate c of a flipped dim of size n reads n - 1 - c. */
static int flip(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                fl_tensor *out, fl_err *e) {
  const fl_meta *im = &in[0]->m;
  int64_t n = meta_numel(im), i, ist[FL_MAX_DIMS];
  size_t es = dtype_size(im->dtype);
  int flipped[FL_MAX_DIMS] = {0}, d, nd = im->ndim, rc;
  fl_tensor xc;
  const char *src;
  char *dst = (char *)ten_data(out);
  (void)nin;
  if (n == 0) return FL_OK;
  for (d = 0; d < a->ndims; d++) flipped[a->dims[d]] = 1;
  if ((rc = ten_contiguous(&xc, in[0], e)) != FL_OK) return err_prefix(e, op_name(op));
  src = (const char *)ten_data(&xc);
  rowmajor_strides(im, ist);
  EAGER_PRAGMA(omp parallel for schedule(static) if (n > EAGER_PAR_MIN))
  for (i = 0; i < n; i++) {
    int64_t r = i, at = 0, c;
    int k;
    for (k = nd - 1; k >= 0; k--) {
      c = r % im->shape[k];
      r /= im->shape[k];
      at += (flipped[k] ? im->shape[k] - 1 - c : c) * ist[k];
    }
    memcpy(dst + (size_t)i * es, src + (size_t)at * es, es);
  }
  ten_release(&xc);
  return FL_OK;
}

/* gather (ONNX Gather): every index checked first (an error leaves nothing
** half-done), then one run of `inner` elements per (outer, index) pair. */
static int gather(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                  fl_tensor *out, fl_err *e) {
  const fl_tensor *x = in[0], *idx = in[1];
  int64_t dim = a->i[0], size = x->m.shape[dim], ni = meta_numel(&idx->m), i;
  int64_t outer = 1, inner = 1, *ix, o;
  size_t es = dtype_size(x->m.dtype), run;
  fl_tensor xc, ic;
  const char *src;
  char *dst = (char *)ten_data(out);
  int d, rc;
  (void)nin;
  for (d = 0; d < dim; d++) outer *= x->m.shape[d];
  for (d = (int)dim + 1; d < x->m.ndim; d++) inner *= x->m.shape[d];
  if ((rc = ten_contiguous(&ic, idx, e)) != FL_OK) return err_prefix(e, op_name(op));
  ix = (int64_t *)ten_data(&ic);
  for (i = 0; i < ni; i++)
    if (ix[i] < -size || ix[i] >= size) {
      rc = err_set(e, FL_EINVAL, "gather: index %lld out of range for dim %lld of size "
                   "%lld (valid %lld..%lld)", (long long)ix[i], (long long)dim + 1,
                   (long long)size, (long long)-size, (long long)size - 1);
      ten_release(&ic);
      return rc;
    }
  if (meta_numel(&out->m) == 0) { ten_release(&ic); return FL_OK; }
  if ((rc = ten_contiguous(&xc, x, e)) != FL_OK) {
    ten_release(&ic);
    return err_prefix(e, op_name(op));
  }
  src = (const char *)ten_data(&xc);
  run = (size_t)inner * es;
  EAGER_PRAGMA(omp parallel for schedule(static) if (outer * ni * inner > EAGER_PAR_MIN))
  for (o = 0; o < outer; o++) {
    int64_t j;
    for (j = 0; j < ni; j++) {
      int64_t v = ix[j] < 0 ? ix[j] + size : ix[j];
      memcpy(dst + (size_t)(o * ni + j) * run, src + (size_t)(o * size + v) * run, run);
    }
  }
  ten_release(&xc);
  ten_release(&ic);
  return FL_OK;
}

/* index_add (the oracle's rule, ref_index_add): threads split the
** output's outer rows and its columns, so no two share an element, and
** each sums its indices in order (the same result on any thread count). */
static int index_add(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                     fl_tensor *out, fl_err *e) {
  int64_t A = in[0]->m.shape[0], I = in[0]->m.shape[1], R = in[0]->m.shape[2], n = a->i[0];
  int64_t i, t, ncol = (R + 63) / 64, tasks;
  const int64_t *ix;
  const float *sf;
  float *so = NULL, *yo = NULL, *y;
  fl_tensor ic;
  int rc;
  (void)nin;
  if ((rc = ten_contiguous(&ic, in[1], e)) != FL_OK) return err_prefix(e, op_name(op));
  ix = (const int64_t *)ten_data(&ic);
  for (i = 0; i < I; i++)
    if (ix[i] < -n || ix[i] >= n) {
      rc = err_set(e, FL_EINVAL, "%s: index %lld out of range for %lld rows (valid %lld..%lld)",
                   op_name(op), (long long)ix[i], (long long)n, (long long)-n, (long long)n - 1);
      ten_release(&ic);
      return rc;
    }
  if (!(sf = eager_f32(in[0], &so, op_name(op), e))) { ten_release(&ic); return FL_ENOMEM; }
  if (!(y = eager_out_f32(out, &yo, op_name(op), e))) { free(so); ten_release(&ic); return FL_ENOMEM; }
  memset(y, 0, (size_t)meta_numel(&out->m) * sizeof *y);
  tasks = A * ncol;
  EAGER_PRAGMA(omp parallel for schedule(static) if (A * I * R > EAGER_PAR_MIN))
  for (t = 0; t < tasks; t++) {
    int64_t x = t / ncol, r0 = t % ncol * 64, r1 = r0 + 64 < R ? r0 + 64 : R, k, r;
    for (k = 0; k < I; k++) {
      int64_t v = ix[k] < 0 ? ix[k] + n : ix[k];
      const float *s = sf + (x * I + k) * R;
      float *d = y + (x * n + v) * R;
      for (r = r0; r < r1; r++) d[r] += s[r];
    }
  }
  eager_out_done(out, yo);
  free(so);
  ten_release(&ic);
  return FL_OK;
}

/* cumsum: one running sum per line (double, or wrapping int64), lines
** in parallel. */
static int cumsum(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                  fl_tensor *out, fl_err *e) {
  const fl_meta *im = &in[0]->m;
  int64_t n = meta_numel(im), dim = a->i[0], len, inner = 1, lines, l;
  int d, ints = out->m.dtype == FL_I64, excl = a->i[1] != 0, rev = a->i[2] != 0;
  int f32 = out->m.dtype == FL_F32;
  void *o = ten_data(out);
  const double *xd = NULL;
  double *xo = NULL;
  int64_t *xi = NULL;
  (void)nin;
  if (n == 0) return FL_OK;
  len = im->ndim ? im->shape[dim] : 1;
  for (d = (int)dim + 1; d < im->ndim; d++) inner *= im->shape[d];
  lines = n / len;
  if (ints) {
    if (!(xi = eager_alloc((size_t)n * sizeof *xi, op_name(op), e))) return FL_ENOMEM;
    eager_gather_all(in[0], xi, EAGER_I64);
  } else if (!(xd = eager_f64(in[0], &xo, op_name(op), e))) {
    return e ? e->code : FL_ENOMEM;
  }
  /* out is contiguous: float32 and int64 results are stored directly
  ** (ten_set per element cost 9 ms for 0.5 M elements) */
  EAGER_PRAGMA(omp parallel for schedule(static) if (n > EAGER_PAR_MIN))
  for (l = 0; l < lines; l++) {
    int64_t base = (l / inner) * len * inner + l % inner, k;
    double s = 0;
    uint64_t is = 0;
    for (k = 0; k < len; k++) {
      int64_t at = base + (rev ? len - 1 - k : k) * inner;
      if (!excl) { if (ints) is += (uint64_t)xi[at]; else s += xd[at]; }
      if (ints) ((int64_t *)o)[at] = (int64_t)is;
      else if (f32) ((float *)o)[at] = (float)s;
      else ten_set(out, at, s);
      if (excl) { if (ints) is += (uint64_t)xi[at]; else s += xd[at]; }
    }
  }
  free(xo);
  free(xi);
  return FL_OK;
}

/* --- the dispatcher -------------------------------------------------- */

static eager_kernel kernel_of(fl_op op) {
  if (op_is_reduce(op)) return eager_reduce;
  switch (op) {
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: return eager_softmax;
  case OP_LAYER_NORM: case OP_RMS_NORM: return eager_norm;
  case OP_BATCH_NORM: return eager_batch_norm;
  case OP_MATMUL: return eager_matmul;
  case OP_LINEAR: return eager_linear;
  case OP_CONV2D: return eager_conv2d;
  case OP_MAX_POOL2D: case OP_AVG_POOL2D: return eager_pool2d;
  case OP_MAX_POOL2D_BACKWARD: return eager_max_pool2d_backward;
  case OP_CAT: return cat;
  case OP_EMBEDDING: return embedding;
  case OP_PAD: return pad;
  case OP_FLIP: return flip;
  case OP_GATHER: return gather;
  case OP_INDEX_ADD: return index_add;
  case OP_CUMSUM: return cumsum;
  case OP_RNN: return eager_rnn;
  case OP_MATMUL_INT8: return eager_matmul_int8;
  case OP_RAND: case OP_RANDN: case OP_DROPOUT: return eager_random;
  default:
    if (op_info_of(op)->scalar) return elementwise;
    return NULL;
  }
}

static int touches_f64(const fl_tensor *const *in, int nin, const fl_meta *om) {
  int k;
  if (om->dtype == FL_F64) return 1;
  for (k = 0; k < nin; k++)
    if (in[k] && in[k]->m.dtype == FL_F64) return 1;
  return 0;
}

int eager_apply(fl_op op, const fl_tensor *const *in, int nin,
                const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_meta *metas[MAX_IN];
  op_attrs defaults;
  fl_meta om;
  eager_kernel kern;
  int k, rc;
  memset(out, 0, sizeof *out);
  if (op < 0 || op >= OP_COUNT)
    return err_set(e, FL_EINVAL, "unknown op %d", (int)op);
  /* rand and randn take no inputs */
  if ((!in && nin > 0) || nin < op_table[op].min_args || nin > MAX_IN)
    return err_set(e, FL_EINVAL, "%s: expected %d to %d inputs, got %d",
                   op_name(op), op_table[op].min_args, op_table[op].max_args,
                   nin);
  if (!a) { op_attrs_init(op, &defaults); a = &defaults; }
  for (k = 0; k < nin; k++) {
    metas[k] = in[k] ? &in[k]->m : NULL;
    if (!in[k]) continue;
    if (in[k]->m.device != FL_DEV_CPU)
      return err_set(e, FL_EUNSUPPORTED, "%s: eager CPU kernels need CPU "
                     "tensors (input %d is on cuda)", op_name(op), k + 1);
    if (!in[k]->st && meta_numel(&in[k]->m) > 0)
      return err_set(e, FL_EINVAL, "%s: input %d has no storage", op_name(op),
                     k + 1);
  }
  if ((rc = op_infer(op, metas, nin, a, &om, e)) != FL_OK) return rc;
  om.device = FL_DEV_CPU;
  om.wrapped = 0;

  if (op_table[op].flags & OPF_VIEW) {
    rc = view_apply(op, in[0], a, &om, out, e);
    if (rc != FL_EUNSUPPORTED || op != OP_RESHAPE) return rc;
    /* reshape of strides no view can express: a copy, as PyTorch does */
    err_clear(e);
    if ((rc = ten_uninit(out, &om, e)) != FL_OK) return err_prefix(e, "reshape");
    copy_rowmajor(in[0], out);
    return FL_OK;
  }
  if (op == OP_CONTIGUOUS && ten_is_contiguous(in[0]))
  {
    /* shares, as PyTorch returns self */
    if ((rc = ten_contiguous(out, in[0], e)) == FL_OK) out->m.wrapped = 0;
    return rc;
  }

  kern = kernel_of(op);
  if (!kern && op != OP_CONTIGUOUS)
    return err_set(e, FL_EUNSUPPORTED, "%s: no eager kernel", op_name(op));
  if ((rc = ten_uninit(out, &om, e)) != FL_OK)
    return err_prefix(e, "%s", op_name(op));
  if (meta_numel(&om) == 0) return FL_OK;
  if (op == OP_CONTIGUOUS) {
    copy_rowmajor(in[0], out);
    return FL_OK;
  }
  if (kern != elementwise && touches_f64(in, nin, &om)) {
    /* float64 beyond elementwise arithmetic: the reference kernel, which
    ** computes every value in double (and may accumulate into out) */
    memset(ten_data(out), 0, (size_t)meta_numel(&om) * dtype_size(om.dtype));
    rc = op_table[op].ref(op, in, nin, a, out, e);
  } else {
    rc = kern(op, in, nin, a, out, e);
  }
  if (rc != FL_OK) ten_release(out);
  return rc;
}

int eager_apply_into(fl_op op, const fl_tensor *const *in, int nin,
                     const op_attrs *a, fl_tensor *out, fl_err *e) {
  const fl_meta *metas[MAX_IN];
  op_attrs defaults;
  fl_meta om;
  int k, rc;
  /* a matmul also writes a strided out (FL_EUNSUPPORTED where it cannot);
  ** a convolution or a pool a contiguous one that no input shares (a
  ** program's planned buffer, the same memory every call, where fresh
  ** memory had its pages faulted in again on every call) */
  int grid = op == OP_CONV2D || op == OP_MAX_POOL2D || op == OP_AVG_POOL2D;
  if ((op != OP_MATMUL && op != OP_LINEAR && !grid) || !out->st ||
      ((op == OP_LINEAR || grid) && !ten_is_contiguous(out)) || !in || nin < 1 || nin > MAX_IN) {
    ten_release(out);
    return eager_apply(op, in, nin, a, out, e);
  }
  if (!a) { op_attrs_init(op, &defaults); a = &defaults; }
  for (k = 0; k < nin; k++) {
    metas[k] = in[k] ? &in[k]->m : NULL;
    if (in[k] && (in[k]->m.device != FL_DEV_CPU || !in[k]->st || (grid && in[k]->st == out->st))) {
      ten_release(out);
      return eager_apply(op, in, nin, a, out, e);   /* it names the problem */
    }
  }
  if ((rc = op_infer(op, metas, nin, a, &om, e)) != FL_OK) { ten_release(out); return rc; }
  if (om.dtype != out->m.dtype || !meta_same_shape(&om, &out->m) || meta_numel(&om) == 0 ||
      touches_f64(in, nin, &om)) {
    ten_release(out);
    return eager_apply(op, in, nin, a, out, e);
  }
  if ((rc = kernel_of(op)(op, in, nin, a, out, e)) != FL_OK) ten_release(out);
  return rc;
}
