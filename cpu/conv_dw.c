/*
** conv_dw.c -- depthwise convolutions (one input channel per output
** channel: MobileNet's, EfficientNet's and ShuffleNet's 3x3s) whose input
** or result is plain nchw, with their epilogue.
**
** Why not oneDNN here: 2.6's kernels for plain layouts run such a
** convolution 5-8x slower than its blocked ones (136 channels of 28x28:
** 0.62 ms against 0.09), and the blocked ones cost a reorder in and out on
** every call where the values around are plain (ShuffleNet's, between
** grouped 1x1s that have no blocked kernel) -- on large images as much
** again as the convolution.  Here 8 channels at a time are transposed into
** a zero-bordered pixel-major scratch T[pixel][8] that stays in cache,
** every output pixel is one 8-wide multiply-add per tap with no bounds
** checks (several pixels at a time, so the sums do not wait on each
** other), and the result is transposed back and its epilogue applied
** while it is still in cache: the image is read once and the result
** written once.  A neighbour's blocks of 8 channels (nChw8c,
** cpu/backend.c) on one side are read or written in place: they are this
** loop's pixel-major layout already; blocks of 16 (nChw16c, AVX-512's)
** are two groups of 8 each, copied in or out 8 floats of every 16, where
** oneDNN's kernel writing a plain result took 2-3x as long (EfficientNet's
** 2 x 96 x 56 x 56 stride 2: 0.064 ms against 0.15).  An input left
** channels last (CPU_NHWC: an inverted residual's expansion, written so
** by oneDNN's brgconv, cpu/backend.c conv_reads_alone) is read the same
** way, its pixels all the channels apart, where it cost a reorder into
** blocks first (EfficientNet-B0's 2 x 144 x 28 x 28: 0.028 ms, twice a
** call).  The 8 planes need
** not be evenly spaced: a channel shuffle's are read where they lie
** (cpu_conv.xoff, cpu/backend.c), which no strided view could express.
*/
#include <stdlib.h>
#include <string.h>

#include "mm.h"
#include "mm_post.h"
#include "scratch.h"

#include "eager_impl.h"

/* a padded plane of 8 channels is at most this many floats (16 MB) */
#define DW_MAX_SCRATCH (4 << 20)

/* the channel blocks read or written in place: AVX2's 8 and AVX-512's 16
** (a block of 16 is two groups of 8, its pixels 16 floats apart) */
#define DW_BLOCK(b) ((b) == 8 || (b) == 16)

int cpu_conv_dw_fits(const cpu_conv *c) {
  int64_t hp = c->h + c->pt + c->pb, wp = c->w + c->pl + c->pr;
  int i, sum;
  /* blocks (DW_BLOCK) on one side only: where both are blocked oneDNN's
  ** kernel reads and writes them with nothing to reorder, and with FMA */
  if (c->groups != c->c || c->co != c->c || (c->xblk && c->yblk) || (c->xblk && c->xoff) ||
      (c->xblk && !DW_BLOCK(c->xblk) && c->xblk != CPU_NHWC) || (c->yblk && !DW_BLOCK(c->yblk)) ||
      (c->xblk && c->c % (c->xblk == CPU_NHWC ? 8 : c->xblk)) || (c->yblk && c->c % c->yblk) ||
      c->pt < 0 || c->pl < 0 || c->pb < 0 || c->pr < 0 || c->sh < 1 || c->sw < 1 || c->dh < 1 || c->dw < 1 ||
      (c->oh - 1) * c->sh + (c->kh - 1) * c->dh >= hp || (c->ow - 1) * c->sw + (c->kw - 1) * c->dw >= wp ||
      hp * wp > DW_MAX_SCRATCH / 8 || c->kh * c->kw > 64)
    return 0;
  /* tensors laid out as y; the residual cpu_conv_sum_post names comes in
  ** its own layout (cpu_mm_post.blk), which must be y's here */
  sum = cpu_conv_sum_post(c->post, c->npost);
  if (c->yblk == 8 && cpu_conv_post_in_y(c)) return 0;   /* blocks of 8 are written before the posts read */
  for (i = 0; i < c->npost; i++)
    if ((c->post[i].kind == CPU_MM_ADD || c->post[i].kind == CPU_MM_MUL) &&
        (!c->post[i].like_dst || (i == sum && c->post[i].blk != c->yblk)))
      return 0;
  return 1;
}

/* Post-ops from..npost of c over len values of its plain result's plane
** q (image * co + channel) from element off: those in y, or v's (the
** values of those elements on their way there). */
EAGER_WIDE
void cpu_conv_posts_span(const cpu_conv *c, int from, int64_t q, int64_t off, int64_t len, float *v) {
  float *restrict y = v ? v : c->y + q * c->oh * c->ow + off;
  int i;
  int64_t k;
  for (i = from; i < c->npost; i++) {
    const cpu_mm_post *po = &c->post[i];
    const float *s = po->src.p + q * c->oh * c->ow + off;
    float v;
    if (cpu_mm_post_elem(po, y, len)) continue;
    switch (po->kind) {
    case CPU_MM_ADD: EAGER_SIMD for (k = 0; k < len; k++) y[k] += s[k]; break;
    case CPU_MM_MUL: EAGER_SIMD for (k = 0; k < len; k++) y[k] *= s[k]; break;
    case CPU_MM_ADD_C: v = cpu_mm_chan(po, q % c->co); EAGER_SIMD for (k = 0; k < len; k++) y[k] += v; break;
    case CPU_MM_MUL_C: v = cpu_mm_chan(po, q % c->co); EAGER_SIMD for (k = 0; k < len; k++) y[k] *= v; break;
    default: break;
    }
  }
}

int cpu_conv_post_in_y(const cpu_conv *c) {
  int i;
  for (i = 0; i < c->npost; i++)
    if ((c->post[i].kind == CPU_MM_ADD || c->post[i].kind == CPU_MM_MUL) && c->post[i].src.p == c->y) return 1;
  return 0;
}

/* Post-ops from..npost of c over its plain result, plane by plane. */
void cpu_conv_posts(const cpu_conv *c, int from) {
  int64_t P = c->oh * c->ow, q;
  EAGER_PRAGMA(omp parallel for schedule(static) if (c->n * c->co * P * (c->npost - from) > 8 * EAGER_PAR_MIN))
  for (q = 0; q < c->n * c->co; q++) cpu_conv_posts_span(c, from, q, 0, P, NULL);
}

/* n <= P output pixels of 8 channels from ow into u [ow][8]: P sums in
** flight (P a constant, so unused ones vanish), d floats of 8 between
** windows. */
static inline __attribute__((always_inline))
void dw_pixels(const float *r0, float *u, int64_t ow, int64_t n, int64_t d, int64_t rs, int64_t cs,
               const v8f *wv, v8f bias, const int KH, const int KW, const int P) {
  v8f a0 = bias, a1 = bias, a2 = bias, a3 = bias, a4 = bias, a5 = bias, a6 = bias, a7 = bias;
  int kh, kw;
  for (kh = 0; kh < KH; kh++)
    for (kw = 0; kw < KW; kw++) {
      const v8f *p = (const v8f *)(r0 + kh * rs + ow * d * 8 + kw * cs);   /* T is 32-byte aligned */
      v8f w = wv[kh * KW + kw];
      a0 += p[0] * w;
      if (P > 1 && n > 1) a1 += p[d] * w;
      if (P > 2 && n > 2) a2 += p[2 * d] * w;
      if (P > 3 && n > 3) a3 += p[3 * d] * w;
      if (P > 4 && n > 4) a4 += p[4 * d] * w;
      if (P > 5 && n > 5) a5 += p[5 * d] * w;
      if (P > 6 && n > 6) a6 += p[6 * d] * w;
      if (P > 7 && n > 7) a7 += p[7 * d] * w;
    }
  u += ow * 8;
  *(v8f_u *)u = a0;
  if (P > 1 && n > 1) *(v8f_u *)(u + 8) = a1;
  if (P > 2 && n > 2) *(v8f_u *)(u + 16) = a2;
  if (P > 3 && n > 3) *(v8f_u *)(u + 24) = a3;
  if (P > 4 && n > 4) *(v8f_u *)(u + 32) = a4;
  if (P > 5 && n > 5) *(v8f_u *)(u + 40) = a5;
  if (P > 6 && n > 6) *(v8f_u *)(u + 48) = a6;
  if (P > 7 && n > 7) *(v8f_u *)(u + 56) = a7;
}

/* One output row of 8 channels into u [ow][8]: r0 is its windows' first
** row in T, rs the step between a window's rows, cs between its columns,
** s8 between windows.  Eight pixels at a time (then four, then the last
** one to three together), so that as many sums are in flight as an add's
** latency needs; KH and KW constant where the caller names them (3x3,
** 5x5), so the taps unroll with their weights in registers. */
static inline __attribute__((always_inline))
void dw_row(const float *r0, float *u, int64_t OW, int64_t s8, int64_t rs, int64_t cs, const v8f *wv,
            v8f bias, const int KH, const int KW) {
  int64_t ow, d = s8 / 8;
  for (ow = 0; ow + 8 <= OW; ow += 8) dw_pixels(r0, u, ow, 8, d, rs, cs, wv, bias, KH, KW, 8);
  for (; ow + 4 <= OW; ow += 4) dw_pixels(r0, u, ow, 4, d, rs, cs, wv, bias, KH, KW, 4);
  if (ow < OW) dw_pixels(r0, u, ow, OW - ow, d, rs, cs, wv, bias, KH, KW, 3);
}

/* rows of n pixels in a run of at least 32 (and of an input row of n) */
static int64_t dw_strip(int64_t n) {
  return n >= 32 ? 1 : (32 + n - 1) / n;
}

/* One image's channels c0 .. c0 + nc (nc <= 8) through the scratch:
** T [hp * wp][8] (its border zero), U [oh * ow][8]. */
EAGER_WIDE_FMA
static void dw_group(const cpu_conv *c, int64_t img, int64_t c0, int nc, float *T, float *U,
                     int64_t strip) {
  int64_t H = c->h, W = c->w, OH = c->oh, OW = c->ow, HW = H * W, OHW = OH * OW;
  int64_t wp = W + c->pl + c->pr, KK = c->kh * c->kw, ih, oh, o, R = dw_strip(OW);
  int64_t s8 = c->sw * 8, rs = c->dh * wp * 8, cs = c->dw * 8, xb = c->xblk, yb = c->yblk;
  int64_t at = cpu_layout_at(yb, img, c->c, OHW, c0);
  const float *x = c->x + cpu_layout_at(xb, img, c->c, HW, c0), *pl[8];
  v8f wv[64], bias = {0, 0, 0, 0, 0, 0, 0, 0};
  int j, t;
  for (t = 0; t < KK; t++)
    for (j = 0; j < 8; j++) wv[t][j] = j < nc ? c->wt[(c0 + j) * KK + t] : 0.0f;
  for (j = 0; j < nc && c->bias; j++) bias[j] = c->bias[c0 + j];
  for (j = 0; j < 8; j++)    /* each plane where it lies (a shuffle's: c->xoff) */
    pl[j] = j >= nc ? x : c->xoff ? c->x + c->xoff[img * c->c + c0 + j] : x + j * HW;
  if (xb) {        /* blocks, or channels last: the group's pixels are 8
                     floats each, a block or all channels apart */
    int64_t xcs, ps;
    cpu_layout_steps(xb, c->c, HW, &xcs, &ps);
    for (ih = 0; ih < H; ih++) {
      float *t8 = T + ((ih + c->pt) * wp + c->pl) * 8;
      for (o = 0; o < W; o++) *(v8f_u *)(t8 + o * 8) = *(const v8f_u *)(x + (ih * W + o) * ps);
    }
  } else if (W >= 16) {
    for (ih = 0; ih < H; ih++) planes_to8_at(pl, ih * W, T + ((ih + c->pt) * wp + c->pl) * 8, W, nc);
  } else {        /* short rows: runs of whole rows, through U, then row by row */
    int64_t Ri = dw_strip(W);
    for (ih = 0; ih < H; ih += Ri) {
      int64_t n = (ih + Ri < H ? Ri : H - ih) * W;
      planes_to8_at(pl, ih * W, U, n, nc);
      for (o = 0; o < n / W; o++) memcpy(T + ((ih + o + c->pt) * wp + c->pl) * 8, U + o * W * 8, (size_t)W * 32);
    }
  }
  /* R output rows at a time, so that short rows make one run of at least
  ** 32 pixels for the epilogue and the transposition back */
  for (oh = 0; oh < OH; oh += R) {
    int64_t nr = oh + R < OH ? R : OH - oh;
    /* a result in blocks of 8 is written where it goes: pixel-major
    ** already; one in blocks of 16 through U, then 8 floats of every 16 */
    int64_t off = at + oh * OW * (yb ? yb : 1);
    float *ub = yb == 8 ? c->y + off : U;
    for (o = 0; o < nr; o++) {
      const float *r0 = T + (oh + o) * c->sh * wp * 8;
      float *u = ub + o * OW * 8;
      if (c->kh == 3 && c->kw == 3) dw_row(r0, u, OW, s8, rs, cs, wv, bias, 3, 3);
      else if (c->kh == 5 && c->kw == 5) dw_row(r0, u, OW, s8, rs, cs, wv, bias, 5, 5);
      else dw_row(r0, u, OW, s8, rs, cs, wv, bias, (int)c->kh, (int)c->kw);
    }
    /* operands laid out as y (cpu_conv_dw_fits) */
    if (c->npost) cpu_conv_posts8(c, 0, ub, U + strip * 8, nr * OW, c0, nc, off, off, OHW);
    if (!yb) planes_from8(U, c->y + off, OHW, nr * OW, nc);
    else if (yb != 8)
      for (o = 0; o < nr * OW; o++) *(v8f_u *)(c->y + off + o * yb) = *(const v8f_u *)(U + o * 8);
  }
}

int cpu_conv_dw(const cpu_conv *c) {
  int64_t hp = c->h + c->pt + c->pb, wp = c->w + c->pl + c->pr, ng = (c->c + 7) / 8, q;
  int ok = 1;
  if (!cpu_conv_dw_fits(c)) return FL_EUNSUPPORTED;
  EAGER_PRAGMA(omp parallel if (c->n * c->c * c->oh * c->ow * c->kh * c->kw > EAGER_PAR_MIN))
  {
    /* T: the padded planes; then U, a strip of output rows (or of input
    ** rows, dw_group), and a residual's strip */
    int64_t strip = dw_strip(c->ow) * c->ow > dw_strip(c->w) * c->w ? dw_strip(c->ow) * c->ow
                                                                     : dw_strip(c->w) * c->w;
    float *T = cpu_scratch(0, (size_t)(hp * wp + 2 * strip) * 8 * sizeof(float));
    if (!T) {
      EAGER_PRAGMA(omp atomic write)
      ok = 0;
    } else {      /* the border, zero for good: every group writes the rest */
      int64_t r;
      memset(T, 0, (size_t)(c->pt * wp * 8) * sizeof *T);
      memset(T + (c->pt + c->h) * wp * 8, 0, (size_t)(c->pb * wp * 8) * sizeof *T);
      for (r = c->pt; r < c->pt + c->h; r++) {
        memset(T + r * wp * 8, 0, (size_t)(c->pl * 8) * sizeof *T);
        memset(T + (r * wp + c->pl + c->w) * 8, 0, (size_t)(c->pr * 8) * sizeof *T);
      }
    }
    EAGER_PRAGMA(omp barrier)
    if (ok) {
      EAGER_PRAGMA(omp for schedule(static))
      for (q = 0; q < c->n * ng; q++) {
        int64_t c0 = q % ng * 8;
        dw_group(c, q / ng, c0, c->c - c0 < 8 ? (int)(c->c - c0) : 8, T, T + hp * wp * 8, strip);
      }
    }
    cpu_scratch_done(0, T);
  }
  return ok ? FL_OK : FL_ENOMEM;
}
