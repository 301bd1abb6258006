/*
** layout.c -- a 4-d float32 value from one channel layout into another:
** plain (nchw), channels last (CPU_NHWC), blocks of 8 or 16 channels
** (nChw8c, nChw16c).
**
** Why not oneDNN's reorders: between these layouts they run a generic
** loop of their own ("jit:uni"), where transposing 8 x 8 tiles in
** registers (tr8x8) is a copy at the caches' speed: EfficientNet-B0's
** first projection, reading 2 x 32 x 56 x 56 plain into channels last,
** 0.086 -> 0.073 ms on a Zen 4 (bench/RESULTS.md).  And the values put
** back plain for a reader of plain ones (cpu_unblock_nchw) went through
** a scalar gather before.  Every layout here keeps a group of
** 8 channels (from a multiple of 8) at 8 pixels as an 8 x 8 tile: rows of
** pixels in plain planes (channel-major, rows a plane apart), rows of
** channels otherwise (pixel-major, rows a pixel apart: all the channels
** channels last, a block in blocks).  So a tile goes across by one
** transposition, or along by eight vector moves.
*/
#include "mm.h"

#include "eager_impl.h"

/* Channels c0 .. c0 + nc (nc <= 8) of image img, every pixel: whole tiles
** across (tr8x8, a tile's rows pixels on one side and channels on the
** other) or along, then the last pixels, or a group short of 8, one by
** one. */
EAGER_WIDE
static void relayout_group(const float *x, int from, float *y, int to, int64_t img, int64_t C, int64_t P,
                           int64_t c0, int nc) {
  const float *xg = x + cpu_layout_at(from, img, C, P, c0);
  float *yg = y + cpu_layout_at(to, img, C, P, c0);
  int64_t xcs, xps, ycs, yps, p = 0;
  int i;
  cpu_layout_steps(from, C, P, &xcs, &xps);
  cpu_layout_steps(to, C, P, &ycs, &yps);
  if (nc == 8)
    for (; p + 8 <= P; p += 8) {
      const float *s = xg + p * xps;
      float *d = yg + p * yps;
      if (from == 0 && to != 0) tr8x8(s, xcs, d, yps);
      else if (from != 0 && to == 0) tr8x8(s, xps, d, ycs);
      else if (from == 0)       /* plain both: rows of pixels, a plane apart */
        for (i = 0; i < 8; i++) *(v8f_u *)(d + i * ycs) = *(const v8f_u *)(s + i * xcs);
      else
        for (i = 0; i < 8; i++) *(v8f_u *)(d + i * yps) = *(const v8f_u *)(s + i * xps);
    }
  for (; p < P; p++)
    for (i = 0; i < nc; i++) yg[i * ycs + p * yps] = xg[i * xcs + p * xps];
}

void cpu_relayout(const float *x, int from, float *y, int to, int64_t n, int64_t c, int64_t hw) {
  int64_t ng = (c + 7) / 8, q;
  EAGER_PRAGMA(omp parallel for schedule(static) if (n * c * hw >= (1 << 12)))
  for (q = 0; q < n * ng; q++) {
    int64_t c0 = q % ng * 8;
    relayout_group(x, from, y, to, q / ng, c, hw, c0, c - c0 < 8 ? (int)(c - c0) : 8);
  }
}
