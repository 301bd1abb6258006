/*
** conv_pw.c -- 1x1 convolutions, grouped (ShuffleNet's pointwise layers)
** or not, on plain nchw, with their epilogue.
**
** Why not oneDNN here: 2.6 has no blocked kernel for groups whose width is
** not a multiple of its block (ShuffleNet's 4 groups of 34, 68 and 136
** channels), its convolution on plain layouts runs them at 11-14 GFLOP/s,
** and its batched matmul (cpu/mm.c, centry_make_mm) needs the bias and a
** residual written into the result first and a batch norm's per-channel
** scale and shift in a pass of its own after: three passes over the
** result where one would do.  The same holds for a 1x1 of one group
** whose width is off the block (MobileNetV3's 72 and 88 channels: 2x16x28x28
** to 72 with a relu, oneDNN 0.072 ms in its layouts, 0.29 on plain ones,
** 0.060 as a matmul, this loop 0.033).  Here each group's product y_g = w_g x_g is
** computed a strip of pixels at a time (its input small enough to stay
** in L1 while every output channel of the group passes over it): each
** output tile of up to 6 channels x 16 pixels is 12 sums in registers
** (per input channel two loads of pixels read where they lie, and one
** broadcast weight and two FMAs per channel), then s * sum + t per row
** (the bias and any leading per-channel scale and shift folded into one
** multiply-add) and the rest of the epilogue -- a residual, relu,
** hardswish -- before the tile is stored.  The input is read in place
** and the result written once; only a last column of fewer than 16
** pixels goes through a zero-padded copy.
**
** On blocks of 8 channels (nChw8c in and out, each group whole blocks:
** ShuffleNet's last stage, 4 groups of 136) oneDNN 2.6's grouped kernel
** runs at a third of the speed of onnxruntime's over a 7x7 map, and where
** a residual follows the batch norm's scale and shift it needs a pass of
** its own.  There the weights come packed (gOIhw8i8o: each input
** channel's 8 weights of a block of output channels in a row; cpu/mm.c
** packs them once and keeps them), and each output tile of up to 4 blocks
** x 3 pixels is 12 sums in registers: per input channel, 3 broadcasts of
** a pixel's value, 4 loads of 8 weights and 12 FMAs.  The epilogue runs
** over the tile's results while they are in L1.
*/
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "mm.h"
#include "mm_post.h"
#include "scratch.h"

#include "eager_impl.h"

/* a strip of the input: at most this many floats (16 KB, half of L1) */
#define PW_STRIP_FLOATS 4096

static int pw_posts_in_registers(const cpu_conv *c);

int cpu_conv_pw_fits(const cpu_conv *c) {
  int i, sum;
  if (c->kh != 1 || c->kw != 1 || c->sh != 1 || c->sw != 1 ||
      c->pt || c->pl || c->pb || c->pr || c->oh != c->h || c->ow != c->w || c->c % c->groups ||
      c->co % c->groups || c->c / c->groups > (1 << 16))
    return 0;
  /* blocks of 8 on either side, whole in each group */
  if ((c->xblk || c->yblk) && ((c->xblk && c->xblk != 8) || (c->yblk && c->yblk != 8) ||
                               (c->c / c->groups) % 8 || (c->co / c->groups) % 8))
    return 0;
  /* tensors laid out as y; the residual cpu_conv_sum_post names comes in
  ** its own layout (cpu_mm_post.blk): y's, or plain where y is in blocks;
  ** one in y itself (stored over, fuse/plan.c residual_over) only where
  ** each tile reads it before its store: plain, the epilogue in registers
  ** (the posts on stored rows and the blocked loop's read it after) */
  if (cpu_conv_post_in_y(c) && (c->xblk || c->yblk || !pw_posts_in_registers(c))) return 0;
  sum = cpu_conv_sum_post(c->post, c->npost);
  for (i = 0; i < c->npost; i++) {
    const cpu_mm_post *po = &c->post[i];
    if ((po->kind == CPU_MM_ADD || po->kind == CPU_MM_MUL) &&
        (!po->like_dst || (c->yblk ? i == sum && po->blk && po->blk != c->yblk : po->blk != 0)))
      return 0;
  }
  return 1;
}

/* 1 when every post-op of c is one pw_rest runs on registers. */
static int pw_posts_in_registers(const cpu_conv *c) {
  int i;
  for (i = 0; i < c->npost; i++)
    switch (c->post[i].kind) {
    case CPU_MM_RELU: case CPU_MM_AFFINE: case CPU_MM_HARDSWISH: case CPU_MM_ADD: case CPU_MM_MUL:
    case CPU_MM_ADD_C: case CPU_MM_MUL_C: break;
    default: return 0;
    }
  return 1;
}

/* How many post-ops of c lead that are affine per channel (a batch norm's
** scale and shift, constants): they and the bias become one multiply-add
** per row, s * sum + t (pw_scale). */
static int pw_lead(const cpu_conv *c) {
  int i;
  for (i = 0; i < c->npost; i++)
    if (c->post[i].kind != CPU_MM_MUL_C && c->post[i].kind != CPU_MM_ADD_C && c->post[i].kind != CPU_MM_AFFINE)
      break;
  return i;
}

/* s, t of channel ch: bias then the first lead post-ops, as one affine. */
static void pw_scale(const cpu_conv *c, int lead, int64_t ch, float *s, float *t) {
  int i;
  *s = 1.0f;
  *t = c->bias ? c->bias[ch] : 0.0f;
  for (i = 0; i < lead; i++) {
    const cpu_mm_post *po = &c->post[i];
    float v = po->kind == CPU_MM_AFFINE ? po->alpha : cpu_mm_chan(po, ch);
    if (po->kind == CPU_MM_ADD_C) *t += v;
    else {
      *s *= v;
      *t = *t * v + (po->kind == CPU_MM_AFFINE ? po->beta : 0.0f);
    }
  }
}

/* m ? a : b, lane by lane (m from a comparison: all bits or none) */
#define PW_SEL(m, a, b) ((v8f)(((v8i)(a) & (m)) | ((v8i)(b) & ~(m))))

/* Post-ops from .. npost over one row's 16 values (v0, v1) in registers:
** channel ch, its plane's element at (a tensor operand's, laid out as y).
** What cpu_conv_posts_span computes, NaN too. */
static inline __attribute__((always_inline))
void pw_rest(const cpu_conv *c, int from, v8f *v0, v8f *v1, int64_t ch, int64_t at) {
  const v8f zero = {0, 0, 0, 0, 0, 0, 0, 0}, one = zero + 1.0f;
  v8f a = *v0, b = *v1, h;
  int i;
  for (i = from; i < c->npost; i++) {
    const cpu_mm_post *po = &c->post[i];
    const float *src = po->src.p + at;
    float v;
    switch (po->kind) {
    case CPU_MM_RELU: a = PW_SEL(a < zero, zero, a); b = PW_SEL(b < zero, zero, b); break;
    case CPU_MM_AFFINE: a = a * po->alpha + po->beta; b = b * po->alpha + po->beta; break;
    case CPU_MM_HARDSWISH:
      h = a / 6.0f + 0.5f;
      h = PW_SEL(h < one, h, one);
      a *= PW_SEL(h > zero, h, zero);
      h = b / 6.0f + 0.5f;
      h = PW_SEL(h < one, h, one);
      b *= PW_SEL(h > zero, h, zero);
      break;
    case CPU_MM_ADD: a += *(const v8f_u *)src; b += *(const v8f_u *)(src + 8); break;
    case CPU_MM_MUL: a *= *(const v8f_u *)src; b *= *(const v8f_u *)(src + 8); break;
    case CPU_MM_ADD_C: v = cpu_mm_chan(po, ch); a += v; b += v; break;
    case CPU_MM_MUL_C: v = cpu_mm_chan(po, ch); a *= v; b *= v; break;
    default: break;
    }
  }
  *v0 = a;
  *v1 = b;
}

/* MR output channels (rows of w from w, CG apart) x 8 NV pixels (NV 1
** or 2) of xs (CG rows nb apart) into y (rows ys apart): row r's sums
** s[r] * sum + t[r], then post-ops from .. npost (channel ch + r,
** element at + r * P of its plane; NV 2 only).  MR and NV constants where
** the caller names them, so the unused sums vanish and the rest stay in
** registers. */
static inline __attribute__((always_inline))
void pw_tile(const cpu_conv *c, const float *xs, int64_t nb, const float *w, int64_t CG, float *y,
             int64_t ys, const float *s, const float *t, int from, int64_t ch, int64_t at, const int MR,
             const int NV) {
  /* twelve named sums, not an array: GCC keeps these in registers */
  const v8f zero = {0, 0, 0, 0, 0, 0, 0, 0};
  v8f a00 = zero, a01 = zero, a10 = zero, a11 = zero, a20 = zero, a21 = zero, a30 = zero, a31 = zero,
      a40 = zero, a41 = zero, a50 = zero, a51 = zero;
  const float *w0 = w, *w1 = w + CG, *w2 = w + 2 * CG, *w3 = w + 3 * CG, *w4 = w + 4 * CG, *w5 = w + 5 * CG;
  int64_t k, P = c->oh * c->ow;
  for (k = 0; k < CG; k++) {
    v8f x0 = *(const v8f_u *)(xs + k * nb), x1 = NV > 1 ? *(const v8f_u *)(xs + k * nb + 8) : zero;
    a00 += x0 * w0[k];
    if (NV > 1) a01 += x1 * w0[k];
    if (MR > 1) { a10 += x0 * w1[k]; if (NV > 1) a11 += x1 * w1[k]; }
    if (MR > 2) { a20 += x0 * w2[k]; if (NV > 1) a21 += x1 * w2[k]; }
    if (MR > 3) { a30 += x0 * w3[k]; if (NV > 1) a31 += x1 * w3[k]; }
    if (MR > 4) { a40 += x0 * w4[k]; if (NV > 1) a41 += x1 * w4[k]; }
    if (MR > 5) { a50 += x0 * w5[k]; if (NV > 1) a51 += x1 * w5[k]; }
  }
#define PW_STORE(r)                                                        \
  if (MR > r) {                                                            \
    a##r##0 = a##r##0 * s[r] + t[r];                                       \
    a##r##1 = a##r##1 * s[r] + t[r];                                       \
    if (NV > 1 && from < c->npost) pw_rest(c, from, &a##r##0, &a##r##1, ch + r, at + r * P); \
    *(v8f_u *)(y + r * ys) = a##r##0;                                      \
    if (NV > 1) *(v8f_u *)(y + r * ys + 8) = a##r##1;                      \
  }
  PW_STORE(0) PW_STORE(1) PW_STORE(2) PW_STORE(3) PW_STORE(4) PW_STORE(5)
#undef PW_STORE
}

/* Rows o .. o + mr (mr <= 6) of a column of 8 nv pixels of the strip. */
static inline __attribute__((always_inline))
void pw_rows(const cpu_conv *c, const float *xs, int64_t nb, const float *w, int64_t CG, float *y,
             int64_t ys, const float *s, const float *t, int from, int64_t ch, int64_t at, int mr, const int NV) {
  switch (mr) {
  case 6: pw_tile(c, xs, nb, w, CG, y, ys, s, t, from, ch, at, 6, NV); break;
  case 5: pw_tile(c, xs, nb, w, CG, y, ys, s, t, from, ch, at, 5, NV); break;
  case 4: pw_tile(c, xs, nb, w, CG, y, ys, s, t, from, ch, at, 4, NV); break;
  case 3: pw_tile(c, xs, nb, w, CG, y, ys, s, t, from, ch, at, 3, NV); break;
  case 2: pw_tile(c, xs, nb, w, CG, y, ys, s, t, from, ch, at, 2, NV); break;
  default: pw_tile(c, xs, nb, w, CG, y, ys, s, t, from, ch, at, 1, NV); break;
  }
}

/* One image's group g, pixels p0 .. p0 + n of every plane (st: each
** channel's s and t, pw_scale).  Whole columns of 16 pixels are read
** where they are; a last one of fewer is copied into xs [CG][16] with
** zeros after it, and its result goes through tb [6][16].  The epilogue
** runs in registers where it can (pw_posts_in_registers), else over the
** strip's rows once they are written; the last column takes the second
** way for what comes after the lead affine (its operands end before 16). */
EAGER_WIDE_FMA
static void pw_strip(const cpu_conv *c, const float *st, int64_t img, int64_t g, int64_t p0, int64_t n,
                     float *xs, float *tb) {
  int64_t P = c->h * c->w, G = c->groups, CG = c->c / G, OG = c->co / G, k, o, p;
  const float *x = c->x + (img * c->c + g * CG) * P + p0;
  int64_t q0 = img * c->co + g * OG;      /* the group's first plane of y */
  float *y = c->y + q0 * P + p0;
  int reg = pw_posts_in_registers(c), from = reg ? pw_lead(c) : c->npost;
  int64_t full = n / 16 * 16;
  for (k = 0; k < CG && full < n; k++) {
    memcpy(xs + k * 16, x + k * P + full, (size_t)(n - full) * sizeof *xs);
    memset(xs + k * 16 + n - full, 0, (size_t)(16 - n + full) * sizeof *xs);
  }
  for (o = 0; o < OG; o += 6) {
    int mr = OG - o < 6 ? (int)(OG - o) : 6, r;
    const float *w = c->wt + (g * OG + o) * CG;
    int64_t ch = g * OG + o, at = (q0 + o) * P + p0;
    float s[6], t[6];
    for (r = 0; r < mr; r++) {
      s[r] = st[2 * (ch + r)];
      t[r] = st[2 * (ch + r) + 1];
    }
    for (p = 0; p < full; p += 16)
      pw_rows(c, x + p, P, w, CG, y + o * P + p, P, s, t, from, ch, at + p, mr, 2);
    if (p < n) {              /* the last pixels, 8 at a time where they fit */
      if (n - p <= 8) pw_rows(c, xs, 16, w, CG, tb, 16, s, t, c->npost, ch, 0, mr, 1);
      else pw_rows(c, xs, 16, w, CG, tb, 16, s, t, c->npost, ch, 0, mr, 2);
      for (r = 0; r < mr; r++) {   /* the epilogue before the store: a residual may lie in y */
        if (reg) cpu_conv_posts_span(c, from, q0 + o + r, p0 + p, n - p, tb + r * 16);
        memcpy(y + (o + r) * P + p, tb + r * 16, (size_t)(n - p) * sizeof *tb);
      }
    }
  }
  for (o = 0; o < OG && !reg; o++) cpu_conv_posts_span(c, 0, q0 + o, p0, n, NULL);
}

/* --- on blocks of 8 channels ------------------------------------------ */

/* OB blocks of 8 output channels (their packed weights ws apart) x PT
** pixels (PT <= 3) of x (a group's first input channel at its first
** pixel; with XB in blocks of 8, else plain planes of P) into y (blocks
** ys apart, pixel-major): the sums, then s * sum + t per channel (s, t:
** the first block's 8 values, then the next).  OB, PT and XB constants
** where the caller names them, so the unused sums vanish. */
static inline __attribute__((always_inline))
void pwb_tile(const float *x, int64_t P, const float *w, int64_t ws, int64_t CG, float *y, int64_t ys,
              const float *s, const float *t, const int OB, const int PT, const int XB) {
  const v8f zero = {0, 0, 0, 0, 0, 0, 0, 0};
  v8f a00 = zero, a01 = zero, a02 = zero, a10 = zero, a11 = zero, a12 = zero,
      a20 = zero, a21 = zero, a22 = zero, a30 = zero, a31 = zero, a32 = zero;
  const int64_t xi = XB ? 1 : P, xp = XB ? 8 : 1;   /* between input channels, pixels */
  /* a pointer per block, so that each load's offset is a constant */
  const float *w0 = w, *w1 = w + ws, *w2 = w + 2 * ws, *w3 = w + 3 * ws;
  int64_t ib;
  int i;
  for (ib = 0; ib < CG / 8; ib++, x += 8 * P, w0 += 64, w1 += 64, w2 += 64, w3 += 64) {
    _Pragma("GCC unroll 8")
    for (i = 0; i < 8; i++) {
      /* a splat, not zero + x: adding zero is not a no-op to GCC (-0) */
      const float *xx = x + i * xi;
      float f0 = xx[0], f1 = PT > 1 ? xx[xp] : 0.0f, f2 = PT > 2 ? xx[2 * xp] : 0.0f;
      v8f b0 = {f0, f0, f0, f0, f0, f0, f0, f0}, b1 = {f1, f1, f1, f1, f1, f1, f1, f1};
      v8f b2 = {f2, f2, f2, f2, f2, f2, f2, f2}, v;
#define PWB_FMA(r)                                                         \
      if (OB > r) {                                                        \
        v = *(const v8f *)(w##r + i * 8);                                  \
        a##r##0 += v * b0;                                                 \
        if (PT > 1) a##r##1 += v * b1;                                     \
        if (PT > 2) a##r##2 += v * b2;                                     \
      }
      PWB_FMA(0) PWB_FMA(1) PWB_FMA(2) PWB_FMA(3)
#undef PWB_FMA
    }
  }
#define PWB_STORE(r)                                                       \
  if (OB > r) {                                                            \
    v8f sv = *(const v8f_u *)(s + r * 8), tv = *(const v8f_u *)(t + r * 8); \
    *(v8f_u *)(y + r * ys) = a##r##0 * sv + tv;                            \
    if (PT > 1) *(v8f_u *)(y + r * ys + 8) = a##r##1 * sv + tv;            \
    if (PT > 2) *(v8f_u *)(y + r * ys + 16) = a##r##2 * sv + tv;           \
  }
  PWB_STORE(0) PWB_STORE(1) PWB_STORE(2) PWB_STORE(3)
#undef PWB_STORE
}

/* Tiles of nob (<= 4) blocks over n pixels, 3 at a time (XB as pwb_tile). */
static inline __attribute__((always_inline))
void pwb_tiles(const float *x, int64_t P, const float *w, int64_t CG, float *y, int64_t ys, const float *s,
               const float *t, int nob, int64_t n, const int XB) {
  int64_t p, xp = XB ? 8 : 1;
  for (p = 0; p < n; p += 3) {
    int pt = n - p < 3 ? (int)(n - p) : 3;
#define PWB_CASE(ob)                                                                            \
    case ob:                                                                                    \
      if (pt == 3) pwb_tile(x + p * xp, P, w, CG * 8, CG, y + p * 8, ys, s, t, ob, 3, XB);      \
      else if (pt == 2) pwb_tile(x + p * xp, P, w, CG * 8, CG, y + p * 8, ys, s, t, ob, 2, XB); \
      else pwb_tile(x + p * xp, P, w, CG * 8, CG, y + p * 8, ys, s, t, ob, 1, XB);              \
      break;
    switch (nob) { PWB_CASE(4) PWB_CASE(3) PWB_CASE(2) default: PWB_CASE(1) }
#undef PWB_CASE
  }
}

/* One image's group g: its output blocks ob0 .. ob0 + nob (nob <= 4)
** over pixels p0 .. p0 + n (sv, tv: every channel's s and t; u: the
** thread's scratch of 4 n blocks: the tiles where y is plain, else a
** plain residual brought into blocks). */
EAGER_WIDE_FMA
static void pwb_item(const cpu_conv *c, const float *sv, const float *tv, int from, int64_t img, int64_t g,
                     int64_t ob0, int nob, int64_t p0, int64_t n, float *u) {
  int64_t P = c->h * c->w, CG = c->c / c->groups, OG = c->co / c->groups, j;
  int64_t ch = g * OG + ob0 * 8;                       /* the first output channel */
  const float *x = c->x + (img * c->c + g * CG) * P + p0 * (c->xblk ? 8 : 1);
  const float *w = c->wpk + ch * CG;
  int64_t at = (img * c->co + ch) * P + p0 * (c->yblk ? 8 : 1);
  float *y = c->yblk ? c->y + at : u;
  int64_t ys = c->yblk ? P * 8 : n * 8;
  int r;
  if (c->xblk) pwb_tiles(x, P, w, CG, y, ys, sv + ch, tv + ch, nob, n, 1);
  else pwb_tiles(x, P, w, CG, y, ys, sv + ch, tv + ch, nob, n, 0);
  for (r = 0; r < nob; r++) {
    if (c->yblk) {
      if (from < c->npost)      /* u: the plain residual's scratch */
        cpu_conv_posts8(c, from, y + r * ys, u, n, ch + r * 8, 8, at + r * ys, (img * c->co + ch + r * 8) * P + p0, P);
      continue;
    }
    planes_from8(u + r * ys, c->y + at + r * 8 * P, P, n, 8);     /* back to planes */
    for (j = 0; j < 8 && from < c->npost; j++)
      cpu_conv_posts_span(c, from, img * c->co + ch + r * 8 + j, p0, n, NULL);
  }
}

/* c on blocks: work items of an image's group, a tile of 3-4 output
** blocks (as even as they can be) and a strip of pixels whose input fits
** PW_STRIP_FLOATS, tiles innermost so that a thread's next item reads the
** same strip. */
static int pwb_run(const cpu_conv *c) {
  int64_t P = c->h * c->w, CG = c->c / c->groups, OGB = c->co / c->groups / 8;
  int64_t nt = (OGB + 3) / 4, nb, ns, q, k, co2 = (c->co * 2 + 15) / 16 * 16;
  int lead = pw_lead(c), threads = 1;
  float *sv, *tv;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  nb = PW_STRIP_FLOATS / CG / 3 * 3;
  if (nb < 3) nb = 3;
  ns = (P + nb - 1) / nb;
  nb = ((P + ns - 1) / ns + 2) / 3 * 3;
  /* every channel's s and t, then each thread's scratch */
  if (!(sv = cpu_scratch(0, (size_t)(co2 + threads * 32 * nb) * sizeof *sv)))
    return FL_ENOMEM;
  tv = sv + c->co;
  for (k = 0; k < c->co; k++) pw_scale(c, lead, k, &sv[k], &tv[k]);
  EAGER_PRAGMA(omp parallel for schedule(static) if (c->n * c->co * P * CG > EAGER_PAR_MIN))
  for (q = 0; q < c->n * c->groups * ns * nt; q++) {
    int64_t t = q % nt, s = q / nt % ns, gi = q / nt / ns, p0 = s * nb, n = P - p0 < nb ? P - p0 : nb;
    int64_t ob0 = t * OGB / nt, ob1 = (t + 1) * OGB / nt;
    float *u = sv + co2;
#ifdef _OPENMP
    u += (int64_t)omp_get_thread_num() * 32 * nb;
#endif
    if (n > 0) pwb_item(c, sv, tv, lead, gi / c->groups, gi % c->groups, ob0, (int)(ob1 - ob0), p0, n, u);
  }
  cpu_scratch_done(0, sv);
  return FL_OK;
}

int cpu_conv_pw(const cpu_conv *c) {
  int64_t P = c->h * c->w, CG = c->c / (c->groups ? c->groups : 1);
  int64_t nb, ns, q, per = (CG * 16 + 6 * 16 + 15) / 16 * 16;   /* floats of one thread's scratch */
  float *st, *xs;
  int lead, threads = 1;
  if (!cpu_conv_pw_fits(c) || ((c->xblk || c->yblk) && !c->wpk)) return FL_EUNSUPPORTED;
  if (c->xblk || c->yblk) return pwb_run(c);
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  /* the threads' scratch, then the per-channel s, t (2 co floats: filled
  ** on every call, as the scale and shift may change between calls) */
  xs = cpu_scratch(0, (size_t)(threads * per + (c->co * 2 + 15) / 16 * 16) * sizeof *xs);
  if (!xs) return FL_ENOMEM;
  st = xs + threads * per;
  lead = pw_posts_in_registers(c) ? pw_lead(c) : 0;
  for (q = 0; q < c->co; q++) pw_scale(c, lead, q, &st[2 * q], &st[2 * q + 1]);
  /* strips of whole columns of 16 pixels whose input fits
  ** PW_STRIP_FLOATS (at least one column), as even as they can be */
  nb = PW_STRIP_FLOATS / CG / 16;
  if (nb < 1) nb = 1;
  ns = ((P + 15) / 16 + nb - 1) / nb;
  nb = ((P + 15) / 16 + ns - 1) / ns * 16;
  EAGER_PRAGMA(omp parallel for schedule(static) if (c->n * c->co * P * CG > EAGER_PAR_MIN))
  for (q = 0; q < c->n * c->groups * ns; q++) {
    int64_t s = q % ns, p0 = s * nb, n = P - p0 < nb ? P - p0 : nb;
    float *mine = xs;
#ifdef _OPENMP
    mine += (int64_t)omp_get_thread_num() * per;
#endif
    if (n > 0) pw_strip(c, st, q / ns / c->groups, q / ns % c->groups, p0, n, mine, mine + CG * 16);
  }
  cpu_scratch_done(0, xs);
  return FL_OK;
}
