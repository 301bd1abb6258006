/*
** mm_post.h -- a product's or convolution's elementwise post-ops over a
** run of its result, shared by the loops of fuselab's own that take them
** (cpu/conv_dw.c, cpu/mm_rows.c).  Inline, so each loop's
** wide clone (EAGER_WIDE_FMA) vectorizes it in place.
*/
#ifndef FUSELAB_CPU_MM_POST_H
#define FUSELAB_CPU_MM_POST_H

#include "mm.h"

#include "eager_impl.h"

/* The elementwise post-op po over y [n]; 0 where po reads a tensor. */
static inline __attribute__((always_inline))
int cpu_mm_post_elem(const cpu_mm_post *po, float *restrict y, int64_t n) {
  float a = po->alpha, b = po->beta;
  int64_t k;
  switch (po->kind) {
  case CPU_MM_RELU: EAGER_SIMD for (k = 0; k < n; k++) y[k] = y[k] < 0.0f ? 0.0f : y[k]; return 1;
  case CPU_MM_TANH: EAGER_SIMD for (k = 0; k < n; k++) y[k] = eager_tanhf(y[k]); return 1;
  case CPU_MM_SIGMOID: EAGER_SIMD for (k = 0; k < n; k++) y[k] = eager_sigmoidf(y[k]); return 1;
  case CPU_MM_SILU: EAGER_SIMD for (k = 0; k < n; k++) y[k] = y[k] * eager_sigmoidf(y[k]); return 1;
  case CPU_MM_EXP: EAGER_SIMD for (k = 0; k < n; k++) y[k] = eager_expf(y[k]); return 1;
  case CPU_MM_GELU_TANH:     /* as eager's gelu_tanh: 1 + tanh(u) = 2 / (1 + e^-2u) */
    EAGER_SIMD
    for (k = 0; k < n; k++) {
      float x = y[k];
      y[k] = x / (1.0f + eager_expf(-1.59576912160573072f * (x + 0.044715f * x * x * x)));
    }
    return 1;
  case CPU_MM_AFFINE: EAGER_SIMD for (k = 0; k < n; k++) y[k] = a * y[k] + b; return 1;
  case CPU_MM_HARDSWISH:     /* as the ONNX loader writes it */
    EAGER_SIMD
    for (k = 0; k < n; k++) {
      float h = y[k] / 6.0f + 0.5f;
      h = h < 1.0f ? h : 1.0f;
      y[k] *= h > 0.0f ? h : 0.0f;
    }
    return 1;
  default: return 0;
  }
}

#endif
