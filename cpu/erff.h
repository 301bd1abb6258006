/*
** erff.h -- the float erf of the eager kernels and of the generated C
** kernels, one text for both, as cpu/expf.h is for exp:
** FL_ERFF_DEFINE(name) defines it as a static inline function and
** FL_ERFF_SOURCE(name) is the same definition as a string.
**
** Two polynomials and no exp or division: below |x| = 1.1, x + x P(x^2)
** (erf(x) / x - 1 fitted in x^2, so the leading term x is added exactly);
** up to 3.9375, where erf rounds to 1, Q((|x| - 2.51875) / 1.41875) fitted
** to erf itself.  Both are Chebyshev fits (bench/erff_fit.py, against
** mpmath) evaluated by Horner, every lane computing both and picking by
** integer masks, so loops calling it vectorize.  Over every float: at
** most 1.26 ulp from erf with the multiply-adds contracted to FMA (1561
** of 2^31 inputs above 1 ulp), 1.497 without (the SSE2 build;
** tests/unit/test_erff.c samples it).  NaN
** stays NaN through the second polynomial, +-inf gives +-1, the sign is
** copied from x (odd, -0 kept).  In a GELU over 1M floats (2 threads) it
** took 0.41-0.43 ms where glibc's vector erff took 0.60-0.63.
*/
#ifndef FL_ERFF_H
#define FL_ERFF_H

#include "expf.h"              /* FL_EXPF_STR: the stringizing */

#define FL_ERFF_DEFINE(name)                                                    \
  static inline float name(float x) {                                           \
    union { float f; uint32_t u; } a, s, b;                                     \
    uint32_t small, one;                                                        \
    float z, x2, p, q, t;                                                       \
    a.f = x;                                                                    \
    a.u &= 0x7fffffffu;                                                         \
    z = a.f;                                                                    \
    x2 = x * x;                                                                 \
    p = -8.848233866e-06f;                                                      \
    p = p * x2 + 1.097230048e-04f;                                              \
    p = p * x2 - 8.442827443e-04f;                                              \
    p = p * x2 + 5.218169669e-03f;                                              \
    p = p * x2 - 2.686441685e-02f;                                              \
    p = p * x2 + 1.128376552e-01f;                                              \
    p = p * x2 - 3.761263741e-01f;                                              \
    p = p * x2 + 1.283791670e-01f;                                              \
    p = p * z + z;                                                              \
    t = (z - 2.51875f) * 0.704845815f;                                          \
    q = -7.190977224e-05f;                                                      \
    q = q * t + 1.041335314e-04f;                                               \
    q = q * t + 3.667336448e-04f;                                               \
    q = q * t - 9.814732896e-04f;                                               \
    q = q * t + 1.740959495e-04f;                                               \
    q = q * t + 2.712857698e-03f;                                               \
    q = q * t - 5.523813391e-03f;                                               \
    q = q * t + 3.571326436e-03f;                                               \
    q = q * t + 6.704650111e-03f;                                               \
    q = q * t - 2.221379540e-02f;                                               \
    q = q * t + 3.337541041e-02f;                                               \
    q = q * t - 3.267080602e-02f;                                               \
    q = q * t + 2.205939896e-02f;                                               \
    q = q * t - 1.005175122e-02f;                                               \
    q = q * t + 2.812886277e-03f;                                               \
    q = q * t + 9.996320300e-01f;                                               \
    small = 0u - (uint32_t)(z < 1.1f);                                          \
    one = 0u - (uint32_t)(z >= 3.9375f);                                        \
    s.f = p;                                                                    \
    b.f = q;                                                                    \
    s.u = (s.u & small) | (b.u & ~small);                                       \
    s.u = (s.u & ~one) | (0x3f800000u & one);                                   \
    b.f = x;                                                                    \
    s.u |= b.u & 0x80000000u;                                                   \
    return s.f;                                                                 \
  }

#define FL_ERFF_SOURCE(name) FL_EXPF_STR(FL_ERFF_DEFINE(name))

#endif
