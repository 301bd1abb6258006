/*
** expf.h -- the float exp of the eager kernels and of the generated C
** kernels, one text for both: FL_EXPF_DEFINE(name) defines it as a static
** inline function, and FL_EXPF_SOURCE(name) is the same definition as a
** string for the generated file's preamble.
**
** exp(x) within 1 ulp (Cephes' polynomial after n = round(x / ln 2)), NaN
** and the infinities as expf.  Written branch-free, with integer masks for
** the range ends: a plain `?:` there makes GCC sink the polynomial into a
** branch that -ftrapping-math then refuses to vectorize.  Inlined, it
** replaces libmvec's vector expf in generated loops, whose special-input
** path runs lane by lane: a causal attention softmax, half of whose
** scores are -inf, took 4.5x as long with it.  Adding 1.5 * 2^23 rounds
** x / ln 2 to n, read back from the bits; ln 2 is split in two for the
** reduction; 2^n is built as two factors, so n in [-151, 128] reaches
** subnormals and overflow with one final rounding.  The sigmoid
** (FL_SIGMOIDF_DEFINE, FL_SIGMOIDF_SOURCE) is built on the same
** polynomial.
*/
#ifndef FL_EXPF_H
#define FL_EXPF_H

/* n = round(x / ln 2) read back from the bits of t, and p = e^r for the
** rest r, in [-ln 2 / 2, ln 2 / 2]: e^x = p 2^n */
#define FL_EXPF_POLY(x)                                                         \
    t.f = x * 1.44269504088896341f + 12582912.0f;                               \
    n = t.f - 12582912.0f;                                                      \
    r = x - n * 0.693359375f;                                                   \
    r = r + n * 2.12194440e-4f;                                                 \
    p = 1.9875691500E-4f;                                                       \
    p = p * r + 1.3981999507E-3f;                                               \
    p = p * r + 8.3334519073E-3f;                                               \
    p = p * r + 4.1665795894E-2f;                                               \
    p = p * r + 1.6666665459E-1f;                                               \
    p = p * r + 5.0000001201E-1f;                                               \
    p = p * r * r + r + 1.0f;

#define FL_EXPF_DEFINE(name)                                                    \
  static inline float name(float x) {                                           \
    union { float f; uint32_t u; } t, s1, s2;                                   \
    uint32_t big, keep;                                                         \
    float n, r, p;                                                              \
    int32_t ni, n1;                                                             \
    FL_EXPF_POLY(x)                                                             \
    ni = (int32_t)(t.u - 0x4B400000u);                                          \
    n1 = ni / 2;                                                                \
    s1.u = (uint32_t)(n1 + 127) << 23;                                          \
    s2.u = (uint32_t)(ni - n1 + 127) << 23;                                     \
    t.f = p * s1.f * s2.f;                                                      \
    big = 0u - (uint32_t)(x > 88.8f);                                           \
    keep = (uint32_t)(x < -104.0f) - 1u;                                        \
    t.u = ((t.u & ~big) | (0x7f800000u & big)) & keep;                          \
    return t.f;                                                                 \
  }

/* exp(x) for x = a - max(a), a softmax's argument: x <= 0 (a rounding
** above at most) or NaN.  The same polynomial, with 2^n as one factor and
** neither overflow nor subnormal results to build: within 1 ulp where
** exp(x) is normal; below 2^-126 (x < -87.34) a subnormal, then 0 (a
** softmax's terms there are under 2^-126 of the sum, which is at least
** 1); valid up to x = 88.  2^n is 0 at n = -127, so the range test, false
** for NaN, only has to fall between n = -126 and n = -128 (x = -87.68,
** -88.38).  Eight fewer operations a lane: the generated [4096, 1024]
** softmax 2.72-2.83 -> 2.33-2.46 ms on an AVX2 EPYC (bench/RESULTS.md,
** "On an AMD EPYC"). */
#define FL_EXPF_SHIFTED_DEFINE(name)                                            \
  static inline float name(float x) {                                           \
    union { float f; uint32_t u; } t, s;                                        \
    float n, r, p;                                                              \
    FL_EXPF_POLY(x)                                                             \
    s.u = (t.u - 0x4B400000u + 127u) << 23;                                     \
    t.f = p * s.f;                                                              \
    t.u &= (uint32_t)(x < -88.0f) - 1u;                                         \
    return t.f;                                                                 \
  }

/* sigmoid(x) as e / (1 + e) (x < 0) or 1 / (1 + e), e = exp(-|x|): e never
** overflows.  e comes from the same polynomial as exp, times 2^24 with
** 2^n as one factor (n in [-150, 0] for -|x| >= -104, where exp goes to
** 0): e 2^24 is normal wherever e is above 2^-150, and the quotient,
** numerator and denominator both times 2^24, is the same, rounded once
** into the subnormals below x = -87.3, where a subnormal e rounded first.
** The same bits as exp's quotient for every float32 x (all 2^32 checked),
** with six fewer operations a lane: x * sigmoid(x) over 75264 floats on
** one Zen 4 core 1.38x as fast in 256-bit vectors, 1.40x in 512-bit ones
** (bench/sigmoid, bench/RESULTS.md).  NaN gives NaN (the range test is
** false for it), -inf 0, +inf 1. */
#define FL_SIGMOIDF_DEFINE(name)                                                \
  static inline float name(float x) {                                           \
    union { float f; uint32_t u; } t, s, num;                                   \
    float n, r, p, a = -fabsf(x);                                               \
    FL_EXPF_POLY(a)                                                             \
    s.u = (t.u - 0x4B400000u + 151u) << 23;                                     \
    t.f = p * s.f;                                                              \
    t.u &= (uint32_t)(a < -104.0f) - 1u;                                        \
    num.f = 16777216.0f;                                                        \
    num.u = (num.u & ((uint32_t)(x < 0.0f) - 1u)) | (t.u & (0u - (uint32_t)(x < 0.0f))); \
    return num.f / (16777216.0f + t.f);                                         \
  }

#define FL_EXPF_STR_(...) #__VA_ARGS__
#define FL_EXPF_STR(...) FL_EXPF_STR_(__VA_ARGS__)
#define FL_EXPF_SOURCE(name) FL_EXPF_STR(FL_EXPF_DEFINE(name))
#define FL_EXPF_SHIFTED_SOURCE(name) FL_EXPF_STR(FL_EXPF_SHIFTED_DEFINE(name))
#define FL_SIGMOIDF_SOURCE(name) FL_EXPF_STR(FL_SIGMOIDF_DEFINE(name))

#endif
