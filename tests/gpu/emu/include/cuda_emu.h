/*
** cuda_emu.h -- CUDA C as host C++17, for the emulator: the NVRTC shim
** compiles every program with `-include cuda_emu.h`.  Device qualifiers
** vanish, the builtin variables read the running fiber's coordinates, the
** 16-bit float types round exactly as the GPU does, and every collective
** (barriers, shuffles, WMMA) goes through the scheduler, which checks
** that all the threads it names take part.
** Invariant: every `__shared__` variable lands in the section emu_shared,
** which the runtime fills with 0xFF bytes (NaN) before each block.
*/
#ifndef FL_CUDA_EMU_H
#define FL_CUDA_EMU_H

/* No <cmath>: parsing it is most of a kernel's compile time.  The C
** math functions device code calls are declared here (GCC knows them as
** builtins); the few standard headers kept are small. */
#include <cstdint>
#include <cstring>

extern "C" {
#define EMU_MATH1(n) float n##f(float) noexcept; double n(double) noexcept;
#define EMU_MATH2(n) float n##f(float, float) noexcept; double n(double, double) noexcept;
EMU_MATH1(exp) EMU_MATH1(exp2) EMU_MATH1(expm1) EMU_MATH1(log) EMU_MATH1(log2) EMU_MATH1(log10)
EMU_MATH1(log1p) EMU_MATH1(sqrt) EMU_MATH1(cbrt) EMU_MATH1(sin) EMU_MATH1(cos) EMU_MATH1(tan)
EMU_MATH1(asin) EMU_MATH1(acos) EMU_MATH1(atan) EMU_MATH1(sinh) EMU_MATH1(cosh) EMU_MATH1(tanh)
EMU_MATH1(asinh) EMU_MATH1(acosh) EMU_MATH1(atanh) EMU_MATH1(erf) EMU_MATH1(erfc)
EMU_MATH1(lgamma) EMU_MATH1(tgamma) EMU_MATH1(fabs) EMU_MATH1(floor) EMU_MATH1(ceil)
EMU_MATH1(trunc) EMU_MATH1(round) EMU_MATH1(rint) EMU_MATH1(nearbyint)
EMU_MATH2(pow) EMU_MATH2(atan2) EMU_MATH2(fmod) EMU_MATH2(fmax) EMU_MATH2(fmin)
EMU_MATH2(hypot) EMU_MATH2(copysign) EMU_MATH2(remainder) EMU_MATH2(fdim)
float fmaf(float, float, float) noexcept;
double fma(double, double, double) noexcept;
#undef EMU_MATH1
#undef EMU_MATH2
}
/* CUDA overloads the double names for float, as <cmath> does */
inline float sqrt(float x) { return sqrtf(x); }
inline float exp(float x) { return expf(x); }
inline float log(float x) { return logf(x); }
inline float fabs(float x) { return fabsf(x); }
inline float floor(float x) { return floorf(x); }
inline float ceil(float x) { return ceilf(x); }
inline float tanh(float x) { return tanhf(x); }
inline float pow(float a, float b) { return powf(a, b); }
inline float fmax(float a, float b) { return fmaxf(a, b); }
inline float fmin(float a, float b) { return fminf(a, b); }
inline bool isnan(float x) { return __builtin_isnan(x); }
inline bool isnan(double x) { return __builtin_isnan(x); }
inline bool isinf(float x) { return __builtin_isinf(x); }
inline bool isinf(double x) { return __builtin_isinf(x); }
inline bool isfinite(float x) { return __builtin_isfinite(x); }
inline bool isfinite(double x) { return __builtin_isfinite(x); }
inline bool signbit(float x) { return __builtin_signbit(x); }
inline bool signbit(double x) { return __builtin_signbit(x); }
#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define HUGE_VALF (__builtin_huge_valf())
#define HUGE_VAL (__builtin_huge_val())

#include "emu_abi.h"

#define __CUDA_ARCH__ 900
#define __CUDACC__ 1
#define __CUDACC_RTC__ 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static __attribute__((section("emu_shared")))
#define __constant__ static

/* --- builtin variables ------------------------------------------------------ */
struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };
#define threadIdx (emu_self->tid)
#define blockIdx (emu_dims.block)
#define blockDim (emu_dims.bdim)
#define gridDim (emu_dims.gdim)
#define warpSize 32

/* --- vector types: CUDA's alignment, so -fsanitize=alignment checks the
** vector loads and stores the generator writes ------------------------------- */
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(4))) uchar4 { unsigned char x, y, z, w; };
struct __attribute__((aligned(8))) int2 { int x, y; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline uchar4 make_uchar4(unsigned char x, unsigned char y, unsigned char z, unsigned char w)
{
  return uchar4{x, y, z, w};
}

/* --- bit casts ------------------------------------------------------------------ */
template <typename D, typename S> inline D emu_bits(S s)
{
  static_assert(sizeof(D) == sizeof(S), "bit cast of different sizes");
  D d;
  memcpy(&d, &s, sizeof d);
  return d;
}
inline float __int_as_float(int i) { return emu_bits<float>(i); }
inline int __float_as_int(float f) { return emu_bits<int>(f); }
inline float __uint_as_float(unsigned i) { return emu_bits<float>(i); }
inline unsigned __float_as_uint(float f) { return emu_bits<unsigned>(f); }
inline double __longlong_as_double(long long i) { return emu_bits<double>(i); }
inline long long __double_as_longlong(double d) { return emu_bits<long long>(d); }

/* --- float16 and bfloat16: storage types, round to nearest even -------------------- */
inline unsigned short emu_f2h(float f)
{
  const uint32_t x = emu_bits<uint32_t>(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fffu;                 /* NaN: the GPU's canonical one */
  if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);   /* >= 65520: inf */
  if (ax < 0x38800000u) {                               /* below 2^-14: subnormal */
    const int e = (int)(ax >> 23);
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const int shift = 126 - e;
    if (shift > 24) return (unsigned short)sign;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return (unsigned short)(sign | q);
  }
  const uint32_t r = ax - 0x38000000u;                 /* rebias 127 -> 15 */
  uint32_t q = r >> 13;
  const uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1))) q++;   /* a carry may make inf */
  return (unsigned short)(sign | q);
}
inline float emu_h2f(unsigned short h)
{
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return emu_bits<float>(sign | 0x7f800000u | (m << 13));
  if (e) return emu_bits<float>(sign | ((e + 112) << 23) | (m << 13));
  const float v = (float)m * 0x1p-24f;                  /* subnormal or zero: exact */
  return sign ? -v : v;
}
inline unsigned short emu_f2bf(float f)
{
  const uint32_t u = emu_bits<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
inline float emu_bf2f(unsigned short b) { return emu_bits<float>((uint32_t)b << 16); }

/* trivially default-constructible: shared arrays of them need no guard */
struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(emu_f2h(f)) {}
  __half(double f) : __x(emu_f2h((float)f)) {}
  operator float() const { return emu_h2f(__x); }
};
struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(emu_f2bf(f)) {}
  __nv_bfloat16(double f) : __x(emu_f2bf((float)f)) {}
  operator float() const { return emu_bf2f(__x); }
};
struct __attribute__((aligned(4))) __half2 { __half x, y; };
struct __attribute__((aligned(4))) __nv_bfloat162 { __nv_bfloat16 x, y; };
typedef __half half;
typedef __half2 half2;

inline float __half2float(__half h) { return emu_h2f(h.__x); }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return __half2{__half(a), __half(a)}; }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }
inline float __bfloat162float(__nv_bfloat16 b) { return emu_bf2f(b.__x); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
  return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(b)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h)
{
  return float2{__bfloat162float(h.x), __bfloat162float(h.y)};
}

/* --- math as CUDA names it (the fast intrinsics are the accurate functions:
** the emulator does not model GPU rounding) ---------------------------------------- */
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float a, float b) { return powf(a, b); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b)
{
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

/* --- collectives ------------------------------------------------------------------- */
#define __syncthreads() emu_syncthreads(__LINE__)
#define __syncwarp(...) emu_warp_sync(__LINE__, "__syncwarp")
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)

template <typename T> inline T emu_shfl_t(int line, unsigned mask, T v, int mode, int arg, int width)
{
  static_assert(sizeof(T) <= 8, "shuffle of more than 64 bits");
  unsigned long long u = 0;
  memcpy(&u, &v, sizeof v);
  u = emu_shfl(line, mask, u, mode, arg, width);
  memcpy(&v, &u, sizeof v);
  return v;
}
template <typename T> inline T emu_shfl_idx(int line, unsigned m, T v, int l, int w = 32)
{
  return emu_shfl_t(line, m, v, 0, l, w);
}
template <typename T> inline T emu_shfl_up(int line, unsigned m, T v, unsigned d, int w = 32)
{
  return emu_shfl_t(line, m, v, 1, (int)d, w);
}
template <typename T> inline T emu_shfl_down(int line, unsigned m, T v, unsigned d, int w = 32)
{
  return emu_shfl_t(line, m, v, 2, (int)d, w);
}
template <typename T> inline T emu_shfl_xor(int line, unsigned m, T v, int d, int w = 32)
{
  return emu_shfl_t(line, m, v, 3, d, w);
}
#define __shfl_sync(...) emu_shfl_idx(__LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) emu_shfl_up(__LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) emu_shfl_down(__LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) emu_shfl_xor(__LINE__, __VA_ARGS__)

/* --- WMMA 16x16x16: each lane holds the whole tile (the GPU spreads it over
** the warp); every operation is warp-collective and checked as such --------------- */
template <typename A, typename B> struct emu_same { enum { value = 0 }; };
template <typename A> struct emu_same<A, A> { enum { value = 1 }; };

namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
  enum { num_elements = 256 };
  T x[256];
};

template <typename P> inline void emu_wmma_check(const P *p, unsigned ldm, const char *what)
{
  if ((uintptr_t)p % 32 != 0)
    emu_fault("wmma::%s: address %p is not 32-byte aligned", what, (const void *)p);
  if ((ldm * sizeof(P)) % 16 != 0)
    emu_fault("wmma::%s: leading dimension %u is not a multiple of 16 bytes", what, ldm);
}

template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, T v)
{
  emu_warp_sync(__LINE__, "wmma::fill_fragment");
  for (int i = 0; i < 256; i++) f.x[i] = v;
}
template <typename Use, int M, int N, int K, typename T, typename L, typename P>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const P *p, unsigned ldm)
{
  static_assert(M == 16 && N == 16 && K == 16, "the emulator has 16x16x16 fragments only");
  emu_warp_sync(__LINE__, "wmma::load_matrix_sync");
  emu_wmma_check(p, ldm, "load_matrix_sync");
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      f.x[r * 16 + c] = emu_same<L, col_major>::value ? p[c * ldm + r] : p[r * ldm + c];
}
template <typename A, typename B, typename C, typename D, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, D> &d,
                     const fragment<matrix_a, 16, 16, 16, A, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, B, LB> &b,
                     const fragment<accumulator, 16, 16, 16, C> &c)
{
  float r[256];
  emu_warp_sync(__LINE__, "wmma::mma_sync");
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float s = (float)c.x[i * 16 + j];
      for (int k = 0; k < 16; k++) s += (float)a.x[i * 16 + k] * (float)b.x[k * 16 + j];
      r[i * 16 + j] = s;
    }
  for (int i = 0; i < 256; i++) d.x[i] = r[i];
}
template <int M, int N, int K, typename T, typename P>
inline void store_matrix_sync(P *p, const fragment<accumulator, M, N, K, T> &f, unsigned ldm,
                              layout_t layout)
{
  emu_warp_sync(__LINE__, "wmma::store_matrix_sync");
  emu_wmma_check(p, ldm, "store_matrix_sync");
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) {
      P &at = layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
      at = f.x[r * 16 + c];
    }
}
}  /* namespace wmma */
}  /* namespace nvcuda */

#endif
