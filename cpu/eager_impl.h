/*
** eager_impl.h -- private to cpu/eager*.c: the kernels each file hands to
** the dispatcher in eager.c, and the helpers they share for reading any
** tensor as float32/double and writing results back in the output dtype.
** Every kernel receives an output already allocated (contiguous, inferred
** metadata) and at least one element; it fills it or returns an error.
*/
#ifndef FL_EAGER_IMPL_H
#define FL_EAGER_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "eager.h"
#include "erff.h"
#include "expf.h"

/* Loops over fewer elements than this stay on one thread: waking the team
** costs more than it saves. */
#define EAGER_PAR_MIN 32768

/* OpenMP pragmas that vanish (without a warning) when OpenMP is off.
** `omp simd` is what makes the plain loops vectorize at -O2, whose cost
** model otherwise refuses loops of unknown trip count. */
#ifdef _OPENMP
#define EAGER_PRAGMA(...) _Pragma(#__VA_ARGS__)
#else
#define EAGER_PRAGMA(...)
#endif
#define EAGER_SIMD EAGER_PRAGMA(omp simd)

/* Compute-bound kernels (exp and its kin) are built three times, for the
** baseline x86-64 (SSE2), AVX2 and AVX-512, and the loader picks one per
** machine (GCC's function multiversioning; glibc ifunc).  Memory-bound
** loops gain nothing from it and stay single. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    defined(__linux__)
#define EAGER_WIDE \
  __attribute__((target_clones("avx512f", "avx2", "default")))
/* The same for loops that are multiply-adds through and through (the
** convolutions of cpu/conv_dw.c and cpu/conv_pw.c): the "avx2" clone has no
** FMA (AVX2 does not imply it) and -std=c11 keeps a * b + c two roundings
** unless told to contract, so these clones are x86-64-v3 / -v4 (AVX2 and
** FMA / AVX-512) and contract.  Eager elementwise ops keep EAGER_WIDE: one
** rounding per op, as their reference counts them. */
#define EAGER_WIDE_FMA                                                               \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"),     \
                 optimize("fp-contract=fast")))
#else
#define EAGER_WIDE
#define EAGER_WIDE_FMA
#endif

/* dst row k = column k of the 8x8 tile of rows r0..r7 (tr8x8: at src,
** rows `ss` floats apart), dst's rows `ds` apart: three rounds of shuffles (GCC's vector
** extension, so each of EAGER_WIDE's builds picks its own instructions).
** Written out, without arrays or loops: GCC kept those in memory, storing
** each vector as two halves that the next load then waited on. */
typedef float v8f __attribute__((vector_size(32)));
typedef float v8f_u __attribute__((vector_size(32), aligned(4)));   /* any float address */
typedef int v8i __attribute__((vector_size(32)));
#define TR8_LO ((v8i){0, 8, 1, 9, 4, 12, 5, 13})
#define TR8_HI ((v8i){2, 10, 3, 11, 6, 14, 7, 15})
#define TR8_LO2 ((v8i){0, 1, 8, 9, 4, 5, 12, 13})
#define TR8_HI2 ((v8i){2, 3, 10, 11, 6, 7, 14, 15})
#define TR8_LO4 ((v8i){0, 1, 2, 3, 8, 9, 10, 11})
#define TR8_HI4 ((v8i){4, 5, 6, 7, 12, 13, 14, 15})
static inline __attribute__((always_inline))
void tr8x8_rows(v8f r0, v8f r1, v8f r2, v8f r3, v8f r4, v8f r5, v8f r6, v8f r7, float *dst, int64_t ds) {
  v8f t0 = __builtin_shuffle(r0, r1, TR8_LO), t1 = __builtin_shuffle(r0, r1, TR8_HI);
  v8f t2 = __builtin_shuffle(r2, r3, TR8_LO), t3 = __builtin_shuffle(r2, r3, TR8_HI);
  v8f t4 = __builtin_shuffle(r4, r5, TR8_LO), t5 = __builtin_shuffle(r4, r5, TR8_HI);
  v8f t6 = __builtin_shuffle(r6, r7, TR8_LO), t7 = __builtin_shuffle(r6, r7, TR8_HI);
  /* u<c>: columns c and c + 4 of rows 0..3 (u) and 4..7 (v) */
  v8f u0 = __builtin_shuffle(t0, t2, TR8_LO2), u1 = __builtin_shuffle(t0, t2, TR8_HI2);
  v8f u2 = __builtin_shuffle(t1, t3, TR8_LO2), u3 = __builtin_shuffle(t1, t3, TR8_HI2);
  v8f v0 = __builtin_shuffle(t4, t6, TR8_LO2), v1 = __builtin_shuffle(t4, t6, TR8_HI2);
  v8f v2 = __builtin_shuffle(t5, t7, TR8_LO2), v3 = __builtin_shuffle(t5, t7, TR8_HI2);
  *(v8f_u *)dst = __builtin_shuffle(u0, v0, TR8_LO4);
  *(v8f_u *)(dst + ds) = __builtin_shuffle(u1, v1, TR8_LO4);
  *(v8f_u *)(dst + 2 * ds) = __builtin_shuffle(u2, v2, TR8_LO4);
  *(v8f_u *)(dst + 3 * ds) = __builtin_shuffle(u3, v3, TR8_LO4);
  *(v8f_u *)(dst + 4 * ds) = __builtin_shuffle(u0, v0, TR8_HI4);
  *(v8f_u *)(dst + 5 * ds) = __builtin_shuffle(u1, v1, TR8_HI4);
  *(v8f_u *)(dst + 6 * ds) = __builtin_shuffle(u2, v2, TR8_HI4);
  *(v8f_u *)(dst + 7 * ds) = __builtin_shuffle(u3, v3, TR8_HI4);
}

static inline __attribute__((always_inline))
void tr8x8(const float *src, int64_t ss, float *dst, int64_t ds) {
  tr8x8_rows(*(const v8f_u *)src, *(const v8f_u *)(src + ss), *(const v8f_u *)(src + 2 * ss),
             *(const v8f_u *)(src + 3 * ss), *(const v8f_u *)(src + 4 * ss), *(const v8f_u *)(src + 5 * ss),
             *(const v8f_u *)(src + 6 * ss), *(const v8f_u *)(src + 7 * ss), dst, ds);
}

/* n pixels of 8 planes (the first nc of them; rows `ss` floats apart)
** into pixel-major d [n][8], lanes past nc zero; and back from u [n][8]
** into the first nc planes (rows `ds` apart).  Whole tiles of 8 through
** tr8x8 where all 8 planes are there. */
static inline __attribute__((always_inline))
void planes_to8(const float *src, int64_t ss, float *d, int64_t n, int nc) {
  int64_t i = 0;
  int j;
  if (nc == 8)
    for (; i + 8 <= n; i += 8) tr8x8(src + i, ss, d + i * 8, 8);
  for (; i < n; i++)
    for (j = 0; j < 8; j++) d[i * 8 + j] = j < nc ? src[j * ss + i] : 0.0f;
}

/* The same from 8 planes anywhere: plane j's pixels from p[j] + at (a
** channel shuffle's planes where they lie, cpu/conv_dw.c). */
static inline __attribute__((always_inline))
void planes_to8_at(const float *const *p, int64_t at, float *d, int64_t n, int nc) {
  int64_t i = 0;
  int j;
  if (nc == 8)
    for (; i + 8 <= n; i += 8)
      tr8x8_rows(*(const v8f_u *)(p[0] + at + i), *(const v8f_u *)(p[1] + at + i),
                 *(const v8f_u *)(p[2] + at + i), *(const v8f_u *)(p[3] + at + i),
                 *(const v8f_u *)(p[4] + at + i), *(const v8f_u *)(p[5] + at + i),
                 *(const v8f_u *)(p[6] + at + i), *(const v8f_u *)(p[7] + at + i), d + i * 8, 8);
  for (; i < n; i++)
    for (j = 0; j < 8; j++) d[i * 8 + j] = j < nc ? p[j][at + i] : 0.0f;
}

static inline __attribute__((always_inline))
void planes_from8(const float *u, float *dst, int64_t ds, int64_t n, int nc) {
  int64_t i = 0;
  int j;
  if (nc == 8)
    for (; i + 8 <= n; i += 8) tr8x8(u + i * 8, 8, dst + i, ds);
  for (; i < n; i++)
    for (j = 0; j < nc; j++) dst[j * ds + i] = u[i * 8 + j];
}

/* Element type a gather writes. */
enum {
  EAGER_F32,   /* float, converted from any dtype */
  EAGER_F64,   /* double, converted from any dtype (exact for int64 < 2^53) */
  EAGER_U8,    /* 0/1 bytes: value != 0 (conditions) */
  EAGER_RAW,   /* the source dtype, bytes copied unchanged */
  EAGER_I64    /* int64, exact from int64 and bool, floats as dtype_f2i */
};

/* The signature every per-op kernel has (the dispatcher's). */
typedef int (*eager_kernel)(fl_op op, const fl_tensor *const *in, int nin,
                            const op_attrs *a, fl_tensor *out, fl_err *e);

/* --- shared helpers (eager.c) ------------------------------------------ */
/* malloc that names the op and the size on failure; caller frees. */
void *eager_alloc(size_t nbytes, const char *opname, fl_err *e);
/* Elements [start, start+n) of t in logical row-major order into dst, as
** type `to` (EAGER_*).  Any strides (0 too), any dtype. */
void eager_gather(const fl_tensor *t, int64_t start, int64_t n, void *dst,
                  int to);
/* All of t into dst (row-major) as `to`, in parallel chunks when large. */
void eager_gather_all(const fl_tensor *t, void *dst, int to);
/* t's values in row-major order as contiguous float32: t's own memory when
** it already is that, else a converted copy left in *owned for the caller
** to free.  NULL (and e set) only when the copy cannot be allocated. */
const float *eager_f32(const fl_tensor *t, float **owned, const char *opname,
                       fl_err *e);
/* Same, as double (the path for integer inputs). */
const double *eager_f64(const fl_tensor *t, double **owned,
                        const char *opname, fl_err *e);
/* Where a kernel writes float32 results for out: out's own memory when out
** is float32, else a scratch buffer (*owned) that eager_out_done converts
** into out and frees. */
float *eager_out_f32(fl_tensor *out, float **owned, const char *opname,
                     fl_err *e);
void eager_out_done(fl_tensor *out, float *owned);
/* Convert n floats (or doubles) into out's memory at element start. */
void eager_store_f32(fl_tensor *out, int64_t start, const float *src,
                     int64_t n);
void eager_store_f64(fl_tensor *out, int64_t start, const double *src,
                     int64_t n);
/* exp(x) within 1 ulp and erf(x) within 1.3: cpu/expf.h and cpu/erff.h,
** the same texts the generated kernels get */
FL_EXPF_DEFINE(eager_expf)
FL_ERFF_DEFINE(eager_erff)

/* --- more vectorizable float32 functions -----------------------------------
** The eager baseline's tanh, log, sin, cos and gelu, written like
** eager_expf: straight-line polynomials and selections by integer masks
** (no branches, no libm calls), so the loops calling them vectorize at
** -O2 in each of EAGER_WIDE's builds.  Where libm calls ran one element at
** a time these run 4-16 at once; the results stay within a few ulps of
** the correctly rounded ones (tests/lua/transcendental.lua measures it
** against the double-precision oracle), NaN and the infinities as libm
** gives them, -0 kept where the function is odd. */

static inline uint32_t eager_bits(float x) {
  union { float f; uint32_t u; } b;
  b.f = x;
  return b.u;
}

static inline float eager_float(uint32_t u) {
  union { float f; uint32_t u; } b;
  b.u = u;
  return b.f;
}

/* All ones when c holds, else zero. */
#define EAGER_MASK(c) (0u - (uint32_t)(c))

/* mask ? a : b, mask being EAGER_MASK(...). */
static inline float eager_pick(uint32_t mask, float a, float b) {
  return eager_float((eager_bits(a) & mask) | (eager_bits(b) & ~mask));
}

/* tanh: Cephes' odd polynomial below |x| = 0.625, 1 - 2/(e^2|x| + 1)
** above (e^2|x| = inf past 44: exactly 1), with the sign of x.  2 ulp. */
static inline float eager_tanhf(float x) {
  float z = fabsf(x), z2 = x * x, p, big;
  p = -5.70498872745E-3f;
  p = p * z2 + 2.06390887954E-2f;
  p = p * z2 - 5.37397155531E-2f;
  p = p * z2 + 1.33314422036E-1f;
  p = p * z2 - 3.33332819422E-1f;
  p = p * z2 * z + z;                       /* tanh |x|: the sign goes on last */
  big = 1.0f - 2.0f / (eager_expf(2.0f * z) + 1.0f);
  p = eager_pick(EAGER_MASK(z > 0.625f), big, p);
  return eager_float(eager_bits(p) | (eager_bits(x) & 0x80000000u));
}

/* 1 / (1 + e^-x) as e^-|x| over 1 + e^-|x| (times e^|x| for x < 0): e^-|x|
** never overflows, so sigmoid reaches its subnormals below x = -88.7,
** where 1 / (1 + inf) gave 0 (cpu/expf.h, the generated kernels' too). */
FL_SIGMOIDF_DEFINE(eager_sigmoidf)

/* log: x = m 2^e with m in [sqrt(1/2), sqrt(2)) read from the bits
** (subnormals scaled by 2^25 first), then Cephes' polynomial in m - 1 and
** e ln 2 in two parts.  1 ulp.  0 -> -inf, < 0 and NaN -> NaN. */
static inline float eager_logf(float x) {
  uint32_t sub = EAGER_MASK(x < 1.17549435e-38f), u, lo;
  int32_t e;
  float m, z, y, r, fe;
  u = eager_bits(eager_pick(sub, x * 33554432.0f, x));
  e = (int32_t)(u >> 23) - 126 - (int32_t)(sub & 25u);
  m = eager_float((u & 0x007fffffu) | 0x3f000000u);      /* [0.5, 1) */
  lo = EAGER_MASK(m < 0.707106781186547524f);
  e -= (int32_t)(lo & 1u);
  m = eager_pick(lo, m + m - 1.0f, m - 1.0f);
  z = m * m;
  y = 7.0376836292E-2f;
  y = y * m - 1.1514610310E-1f;
  y = y * m + 1.1676998740E-1f;
  y = y * m - 1.2420140846E-1f;
  y = y * m + 1.4249322787E-1f;
  y = y * m - 1.6668057665E-1f;
  y = y * m + 2.0000714765E-1f;
  y = y * m - 2.4999993993E-1f;
  y = y * m + 3.3333331174E-1f;
  y = y * m * z;
  fe = (float)e;
  y += -2.12194440e-4f * fe;
  y += -0.5f * z;
  r = m + y + 0.693359375f * fe;
  r = eager_pick(EAGER_MASK(x == 0.0f), -INFINITY, r);
  r = eager_pick(EAGER_MASK(!(x >= 0.0f)), NAN, r);
  return eager_pick(EAGER_MASK(x == INFINITY), INFINITY, r);
}

/* sin and cos for |x| <= EAGER_TRIG_MAX (Cephes: x reduced by multiples of
** pi/4 in three parts, then one of two polynomials); 2 ulp.  Beyond it,
** and for NaN and the infinities, the kernel calls libm afterwards (this
** returns something finite there, never used). */
#define EAGER_TRIG_MAX 8192.0f

static inline float eager_sincosf(float x, int cosine) {
  float ax = fabsf(x), y, z, zz, ps, pc, r;
  uint32_t j, use_other, flip;
  ax = eager_pick(EAGER_MASK(ax <= EAGER_TRIG_MAX), ax, 0.0f);
  j = (uint32_t)(int32_t)(ax * 1.27323954473516f);       /* 4/pi */
  j = (j + 1u) & ~1u;
  y = (float)(int32_t)j;
  z = ((ax - y * 0.78515625f) - y * 2.4187564849853515625e-4f) - y * 3.77489497744594108e-8f;
  zz = z * z;
  ps = ((-1.9515295891E-4f * zz + 8.3321608736E-3f) * zz - 1.6666654611E-1f) * zz * z + z;
  pc = ((2.443315711809948E-5f * zz - 1.388731625493765E-3f) * zz + 4.166664568298827E-2f) *
       zz * zz - 0.5f * zz + 1.0f;
  use_other = EAGER_MASK((j & 2u) != 0);      /* the other function's polynomial */
  if (cosine) {
    r = eager_pick(use_other, ps, pc);
    flip = ((j >> 2) ^ (j >> 1)) & 1u;
  } else {
    r = eager_pick(use_other, pc, ps);
    flip = ((j >> 2) & 1u) ^ (eager_bits(x) >> 31);   /* sin is odd */
  }
  return eager_float(eager_bits(r) ^ (flip << 31));
}

/* erfc(z) for z >= 0: Numerical Recipes' erfcc (fractional error below
** 1.2e-7 everywhere), so 1 + erf(x) for negative x keeps its digits. */
static inline float eager_erfc_pos(float z) {
  float t = 1.0f / (1.0f + 0.5f * z), p;
  p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  /* the rounding of z^2 becomes a relative error of z^2 2^-24 here: as
  ** large as what rounding x itself costs (GELU's condition number is
  ** about x^2 out there), so it is not worth a second exp to avoid */
  return t * eager_expf(p - z * z);
}

/* erf(x) below |x| = 0.75: the Taylor series to x^17 (the next term is
** under 1e-9 there). */
static inline float eager_erf_small(float x) {
  float s = x * x, p;
  p = 1.6462114365889248e-06f;
  p = p * s - 1.4925650358406252e-05f;
  p = p * s + 1.2055332981789665e-04f;
  p = p * s - 8.548327023450853e-04f;
  p = p * s + 5.223977625442188e-03f;
  p = p * s - 2.6866170645131252e-02f;
  p = p * s + 1.1283791670955128e-01f;
  p = p * s - 3.7612638903183754e-01f;
  p = p * s + 1.1283791670955126f;
  return p * x;
}

/* 1 + erf(x), accurate for negative x too (there it is erfc(-x), not a
** difference of two numbers near 1): what exact GELU needs. */
static inline float eager_erf1p(float x) {
  float ax = fabsf(x), ec = eager_erfc_pos(ax);
  float big = eager_pick(EAGER_MASK(x < 0.0f), ec, 2.0f - ec);
  return eager_pick(EAGER_MASK(ax < 0.75f), 1.0f + eager_erf_small(x), big);
}

/* --- kernels ----------------------------------------------------------- */
/* eager_reduce.c: sum mean amax amin var argmax */
int eager_reduce(fl_op, const fl_tensor *const *, int, const op_attrs *,
                 fl_tensor *, fl_err *);
/* eager_reduce.c: softmax log_softmax */
int eager_softmax(fl_op, const fl_tensor *const *, int, const op_attrs *,
                  fl_tensor *, fl_err *);
/* eager_reduce.c: layer_norm rms_norm */
int eager_norm(fl_op, const fl_tensor *const *, int, const op_attrs *,
               fl_tensor *, fl_err *);
/* eager_reduce.c: batch_norm (inference) */
int eager_batch_norm(fl_op, const fl_tensor *const *, int, const op_attrs *,
                     fl_tensor *, fl_err *);
/* eager_linalg.c: matmul linear conv2d max_pool2d avg_pool2d */
int eager_matmul(fl_op, const fl_tensor *const *, int, const op_attrs *,
                 fl_tensor *, fl_err *);
int eager_linear(fl_op, const fl_tensor *const *, int, const op_attrs *,
                 fl_tensor *, fl_err *);
int eager_conv2d(fl_op, const fl_tensor *const *, int, const op_attrs *,
                 fl_tensor *, fl_err *);
int eager_pool2d(fl_op, const fl_tensor *const *, int, const op_attrs *,
                 fl_tensor *, fl_err *);
int eager_max_pool2d_backward(fl_op, const fl_tensor *const *, int, const op_attrs *,
                              fl_tensor *, fl_err *);
/* eager_int8.c: matmul_int8 */
int eager_matmul_int8(fl_op, const fl_tensor *const *, int, const op_attrs *,
                      fl_tensor *, fl_err *);
/* eager_rnn.c: rnn */
int eager_rnn(fl_op, const fl_tensor *const *, int, const op_attrs *,
              fl_tensor *, fl_err *);

#endif
