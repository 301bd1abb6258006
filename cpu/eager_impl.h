/*
** eager_impl.h -- private to cpu/eager*.c: the kernels each file hands to
** the dispatcher in eager.c, and the helpers they share for reading any
** tensor as float32/double and writing results back in the output dtype.
** Every kernel receives an output already allocated (contiguous, inferred
** metadata) and at least one element; it fills it or returns an error.
*/
#ifndef FL_EAGER_IMPL_H
#define FL_EAGER_IMPL_H

#include <stdint.h>

#include "eager.h"

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
#else
#define EAGER_WIDE
#endif

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
/* exp(x) within 1 ulp (Cephes' polynomial after n = round(x / ln 2)),
** NaN and the infinities as expf.  Written branch-free, with integer masks
** for the range ends: a plain `?:` there makes GCC sink the polynomial
** into a branch that -ftrapping-math then refuses to vectorize. */
static inline float eager_expf(float x) {
  union { float f; uint32_t u; } t, s1, s2;
  uint32_t big, keep;
  float n, r, p;
  int32_t ni, n1;
  t.f = x * 1.44269504088896341f + 12582912.0f;  /* 1.5 * 2^23: rounds */
  n = t.f - 12582912.0f;
  ni = (int32_t)(t.u - 0x4B400000u);             /* n, read from the bits */
  r = x - n * 0.693359375f;                       /* ln 2, split */
  r = r + n * 2.12194440e-4f;
  p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  /* 2^n as two factors, so n in [-151, 128] reaches subnormals and
  ** overflow with one final rounding */
  n1 = ni / 2;
  s1.u = (uint32_t)(n1 + 127) << 23;
  s2.u = (uint32_t)(ni - n1 + 127) << 23;
  t.f = p * s1.f * s2.f;
  big = 0u - (uint32_t)(x > 88.8f);               /* ones: +inf */
  keep = (uint32_t)(x < -104.0f) - 1u;            /* zeros: 0 */
  t.u = ((t.u & ~big) | (0x7f800000u & big)) & keep;
  return t.f;
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

#endif
