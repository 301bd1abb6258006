/*
** mm_post.h -- a product's or convolution's elementwise post-ops over a
** run of its result, shared by the loops of fuselab's own that take them
** (cpu/conv_dw.c, cpu/conv_pw.c, cpu/mm_rows.c).  Inline, so each loop's
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

/* Post-ops from .. npost of convolution c over u [n][8] (pixel-major:
** nc <= 8 channels from c0), as cpu_conv_posts computes them.  A tensor
** operand in blocks (laid out as y is, or the residual in its own layout:
** cpu_mm_post.blk) has the group's first pixel at element at: blocks of 8
** are pixel-major already and read in place, of 16 gathered into r [n][8]
** (8 floats of every 16); a plain one is brought into r from element pl
** of channel c0's plane, planes ps apart.  Shared by cpu/conv_dw.c and
** cpu/conv_pw.c's loop on blocks. */
EAGER_WIDE
static inline void cpu_conv_posts8(const cpu_conv *c, int from, float *restrict u, float *restrict r, int64_t n,
                            int64_t c0, int nc, int64_t at, int64_t pl, int64_t ps) {
  int i, j, sum = cpu_conv_sum_post(c->post, c->npost);
  int64_t k, m = n * 8;
  for (i = from; i < c->npost; i++) {
    const cpu_mm_post *po = &c->post[i];
    v8f cv = {0, 0, 0, 0, 0, 0, 0, 0};
    if (cpu_mm_post_elem(po, u, m)) continue;
    switch (po->kind) {
    case CPU_MM_ADD: case CPU_MM_MUL: {
      const float *rr = po->src.p + at;
      int b = i == sum ? po->blk : c->yblk;
      if (b != 8) {
        if (b) for (k = 0; k < n; k++) *(v8f_u *)(r + k * 8) = *(const v8f_u *)(rr + k * b);
        else planes_to8(po->src.p + pl, ps, r, n, nc);
        rr = r;
      }
      if (po->kind == CPU_MM_ADD) { EAGER_SIMD for (k = 0; k < m; k++) u[k] += rr[k]; }
      else { EAGER_SIMD for (k = 0; k < m; k++) u[k] *= rr[k]; }
      break;
    }
    case CPU_MM_ADD_C: case CPU_MM_MUL_C:
      for (j = 0; j < nc; j++) cv[j] = cpu_mm_chan(po, c0 + j);
      if (po->kind == CPU_MM_ADD_C) for (k = 0; k < n; k++) *(v8f_u *)(u + k * 8) += cv;
      else for (k = 0; k < n; k++) *(v8f_u *)(u + k * 8) *= cv;
      break;
    default: break;
    }
  }
}

#endif
