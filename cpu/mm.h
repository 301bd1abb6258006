/*
** mm.h -- float32 products through oneDNN's matmul primitive, with their
** elementwise epilogue run inside the same call (post-ops).
**
** Why oneDNN and not sgemm: measured on the products the models run
** (bench/matmul_libs.c, 2 threads, an AVX-512 Xeon, results in
** bench/RESULTS.md), oneDNN 2.6 is 1.1-1.4x faster than OpenBLAS 0.3.21's
** best (SkylakeX) kernels on the linear layers, 2.7-2.9x on attention's
** batched 128x128x64 products (one call for all heads, where sgemm runs one
** call per matrix), and it picks its kernels from the CPU's feature bits,
** so a CPU OpenBLAS does not know (OPENBLAS_CORETYPE=Prescott emulates one:
** 6-8x slower) costs nothing.  On an AMD EPYC whose host hides AVX-512
** (oneDNN's gemm:jit kernels against OpenBLAS's Zen ones) the linears are
** even, 0.95-1.14x, and the batched products still 1.9-2.0x.  OpenBLAS
** stays for convolutions, integer-free fallbacks, and a build without
** oneDNN (cpu_mm_run then says so and the caller runs sgemm).
*/
#ifndef FL_CPU_MM_H
#define FL_CPU_MM_H

#include <stdint.h>

#include "../graph/err.h"
#include "../graph/tensor.h"

#define CPU_MM_MAXD 8        /* rank of every operand (batch dims + 2) */
#define CPU_MM_MAXPOST 4

/* one strided float32 operand, all CPU_MM operands share one rank nd */
typedef struct cpu_mm_arg {
  const float *p;                    /* element 0 */
  int64_t shape[CPU_MM_MAXD];        /* size-1 batch dims broadcast */
  int64_t stride[CPU_MM_MAXD];       /* in elements */
} cpu_mm_arg;

typedef enum cpu_mm_pkind {
  CPU_MM_RELU, CPU_MM_GELU_TANH, CPU_MM_TANH, CPU_MM_SIGMOID,
  CPU_MM_SILU, CPU_MM_EXP,
  CPU_MM_HARDSWISH,                  /* x * min(max(x / 6 + 1/2, 0), 1) */
  CPU_MM_AFFINE,                     /* alpha * x + beta */
  CPU_MM_ADD, CPU_MM_MUL,            /* with a tensor (src), broadcast to dst */
  CPU_MM_ADD_C, CPU_MM_MUL_C         /* convolutions: with one value per output
                                        channel (src.p, src.shape[0] of them:
                                        the channels, or 1 for all) */
} cpu_mm_pkind;

typedef struct cpu_mm_post {
  cpu_mm_pkind kind;                 /* what is applied to the running value */
  float alpha, beta;                 /* CPU_MM_AFFINE */
  cpu_mm_arg src;                    /* CPU_MM_ADD, CPU_MM_MUL */
  int like_dst;                      /* 1: src is laid out as dst is (its
                                        shape and strides are ignored) */
  int blk;                           /* a convolution's residual (its first
                                        CPU_MM_ADD, run as oneDNN's sum): the
                                        channel block it is laid out in, which
                                        may be y's or not; 0 plain */
} cpu_mm_post;

/* A CPU_MM_ADD_C/MUL_C post's value for output channel ch. */
static inline float cpu_mm_chan(const cpu_mm_post *po, int64_t ch) {
  return po->src.p[po->src.shape[0] == 1 ? 0 : ch];
}

/* dst = post_n(...post_1(a @ b + bias)) over nd dims: a [.., M, K],
** b [.., K, N], dst [.., M, N]; bias, when given, is N floats added to
** every row.  Shapes of a and b batch dims are equal to dst's or 1. */
typedef struct cpu_mm {
  int nd;
  cpu_mm_arg a, b, dst;
  const float *bias;                 /* N floats, or NULL */
  int npost;
  cpu_mm_post post[CPU_MM_MAXPOST];
  /* the storage b is read from in place (a linear's weight), so a copy of
  ** b in the layout oneDNN prefers can be kept while its values stay the
  ** same (its id and version, graph/tensor.h); NULL: b is not kept (an
  ** activation, a converted copy) */
  fl_storage *b_st;
} cpu_mm;

/* 1 when products run through oneDNN: built with it, and not turned off
** by FUSELAB_MATMUL=blas (to measure the difference). */
int cpu_mm_enabled(void);

/* Products of fewer multiply-adds run on one thread (cpu/mm.c). */
#define CPU_MM_PAR_MIN (1 << 19)
/* Products of at most CPU_MM_ROWS_MAX rows run on fuselab's own loop
** (cpu/mm_rows.c) where it fits: no batch (dims before the last two all
** 1), a's and dst's rows contiguous, b a linear's weight ([N, K] rows),
** no per-channel post-op, no residual in dst's own memory.  cpu_mm_run
** takes it first for 2 rows or more (oneDNN's one-row product is as
** fast), cpu_conv_run for a 1x1 convolution over a 1x1 map, unless
** FUSELAB_MATMUL=onednn. */
#define CPU_MM_ROWS_MAX 8
int cpu_mm_rows_fits(const cpu_mm *m);
int cpu_mm_rows(const cpu_mm *m);
/* Products run by cpu_mm_rows so far, and those with post-ops
** (fl.blas_info().row_products, .row_posts). */
void cpu_mm_rows_counts(int64_t *calls, int64_t *with_posts);
/* Run m.  FL_EUNSUPPORTED (e set) when this build or oneDNN cannot run
** that layout; the caller then computes it another way.  Primitives are
** made once per layout (shapes, strides, post-ops) and kept. */
int cpu_mm_run(const cpu_mm *m, fl_err *e);

/* c [batch, m, n] = a [batch, m, k] @ b [batch or 1, k, n] through
** oneDNN's int8 product: a uint8, b int8, c int32, all contiguous.  On
** CPUs without VNNI its kernels add pairs of products in 16 bits,
** saturating: the sum is exact only while every |a_i b_i + a_j b_j| stays
** below 2^15 (|b| < 64), which the caller arranges (cpu/eager_int8.c).
** FL_EUNSUPPORTED when this build or oneDNN cannot. */
int cpu_mm_int8(int64_t batch, int64_t m, int64_t k, int64_t n, const uint8_t *a, const int8_t *b,
                int b_batched, int32_t *c, fl_err *e);
/* 8-bit products run so far (tests check the path is taken) */
int64_t cpu_mm_int8_calls(void);
/* Make oneDNN ready for products (its first one generates kernels and
** starts threads) where nothing waits on it: once per process, run while
** the compiler links (exec/cache.c, cache_while_linking). */
void cpu_mm_warm(void);
/* Products run through oneDNN so far in this process, how many of them
** carried post-ops, and how many took a's rows in another order (cpu/mm.c,
** rows_canon): fl.blas_info().onednn_calls, .onednn_posts,
** .reordered_products. */
void cpu_mm_counts(int64_t *calls, int64_t *with_posts, int64_t *reordered);
/* Weights kept in oneDNN's layout (FUSELAB_PACK_MB, default 256, bounds
** their bytes; 0 turns it off): products and convolutions that read such
** a copy, weights held, their bytes, and the copies made (once per
** weight, layout it is read in and value: fl.blas_info().packed_calls,
** .packed_weights, .packed_bytes, .packed_made). */
void cpu_mm_pack_info(int64_t *calls, int64_t *weights, int64_t *bytes, int64_t *made);
/* What products run on, in a sentence (fl.blas_info().matmul); after the
** first product it names oneDNN's kernels ("brg:avx512_core" keeps weights
** in a blocked layout, "gemm:jit" reads them in place). */
const char *cpu_mm_describe(void);

/* y = post_n(...post_1(conv2d(x, w) + bias)): x [n, c, h, w], w
** [co, c/groups, kh, kw], y [n, co, oh, ow], all contiguous float32; bias,
** when given, co floats.  Post-ops here read tensors laid out as y is
** (like_dst).  x and y are plain nchw, or with xblk / yblk (8 or 16) in
** oneDNN's blocked nChw8c / nChw16c: blocks of that many channels, each
** [h, w, block] (cpu_conv_block; a convolution's result kept that way for
** the next, cpu/backend.c); x may also be channels last (CPU_NHWC).  With
** wrote, where the primitive kept writes channels last (oneDNN's brgconv
** with AVX-512) and no post-op reads a tensor, y is written so, without
** the reorder into yblk's blocks, and *wrote is set to CPU_NHWC (else
** left as the caller set it; its next convolution reads either). */
/* A layout code beside the blocks of 8 and 16: channels last ([n, h, w,
** c], oneDNN's nhwc), which no block arithmetic takes for a block size
** (every channel count is off it). */
#define CPU_NHWC 255

typedef struct cpu_conv {
  int64_t n, c, h, w, co, kh, kw, oh, ow, groups;
  int64_t sh, sw, dh, dw, pt, pl, pb, pr;     /* dilation 1 = dense */
  const float *x, *wt, *bias;
  float *y;
  int npost;
  cpu_mm_post post[CPU_MM_MAXPOST];
  fl_storage *w_st;                  /* wt read in place from it, or NULL (cpu_mm's b_st) */
  int xblk, yblk;                    /* 0 plain, else the channel block
                                        (or CPU_NHWC for x) */
  int *wrote;                        /* NULL, or y may be left channels last:
                                        CPU_NHWC written here where it was */
  const float *wpk;                  /* cpu_conv_pw on blocks: wt packed gOIhw8i8o
                                        (cpu/mm.c packs and keeps it), else NULL */
  const int64_t *xoff;               /* NULL, or x's plane (image i, channel j) is
                                        its h * w floats at x + xoff[i * c + j]:
                                        whole planes in an order no strides
                                        express (a channel shuffle, read where
                                        it lies); cpu_conv_dw alone reads it */
} cpu_conv;

/* 1 when convolutions run through oneDNN: built with it, and not turned
** off by FUSELAB_CONV=blas (im2col + sgemm then).  FUSELAB_CONV=plain
** keeps oneDNN on the callers' plain layouts (no reorders, to measure),
** FUSELAB_CONV=any on its own, FUSELAB_CONV=matmul runs every 1x1 with
** groups or an epilogue as a batched matmul; by default each shape's
** first call times them; FUSELAB_CONV=depthwise takes cpu/conv_dw.c for
** every depthwise convolution it fits. */
int cpu_conv_enabled(void);
/* Run c, as cpu_mm_run: FL_EUNSUPPORTED where this build or oneDNN cannot;
** one primitive per shapes and attributes, kept. */
int cpu_conv_run(const cpu_conv *c, fl_err *e);
/* The channel block oneDNN's direct convolution kernels read and write on
** this CPU (16 with AVX-512, else 8), or 0: oneDNN is off, or
** FUSELAB_LAYOUT=plain keeps every value plain (to measure).
** FUSELAB_LAYOUT=nChw8c or nChw16c takes that block whatever the CPU (to
** test the other one's paths; oneDNN's kernels for blocks of 16 without
** AVX-512 are its slow reference ones). */
int cpu_conv_block(void);

/* Which of a convolution's post-ops runs as oneDNN's sum, or -1: the
** first CPU_MM_ADD unless a per-channel one comes before it.  The sum's
** residual is written into y first and may come in any layout
** (cpu_mm_post.blk); a binary add reads y's.  The plan (cpu/backend.c)
** and the primitive (cpu/mm.c) ask the same question here. */
int cpu_conv_sum_post(const cpu_mm_post *post, int npost);
/* y [n, c, hw] plain from x in blocks of b channels (c % b == 0), or
** channels last (b CPU_NHWC). */
void cpu_unblock_nchw(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int b);
/* y, n images of c channels of hw pixels in layout `to`, from x in layout
** `from` (cpu/layout.c): 0 plain, CPU_NHWC channels last, 8 or 16 blocks
** of that many channels (c a multiple of the block); x and y apart. */
void cpu_relayout(const float *x, int from, float *y, int to, int64_t n, int64_t c, int64_t hw);
/* Where channel ch's first pixel lies in image img of C channels of P
** pixels each, in layout l (as cpu_relayout names them); and within a
** group of 8 channels from a multiple of 8, floats from one channel to the
** next (*cs) and from one pixel to the next (*ps). */
static inline int64_t cpu_layout_at(int l, int64_t img, int64_t C, int64_t P, int64_t ch) {
  if (l == 0) return (img * C + ch) * P;
  if (l == CPU_NHWC) return img * P * C + ch;
  return (img * C + ch - ch % l) * P + ch % l;
}
static inline void cpu_layout_steps(int l, int64_t C, int64_t P, int64_t *cs, int64_t *ps) {
  *cs = l == 0 ? P : 1;
  *ps = l == 0 ? 1 : l == CPU_NHWC ? C : l;
}
/* Depthwise convolutions (groups = channels in = channels out) whose
** input or result (or both) is plain, on fuselab's own loop
** (cpu/conv_dw.c), with any post-op but a residual in another layout
** than y's: 1 when c is one (cpu_conv_dw_fits); run it, FL_OK, or
** FL_EUNSUPPORTED / FL_ENOMEM with nothing written.  cpu_conv_run times
** it against oneDNN's forms at a shape's first call and keeps the faster
** (FUSELAB_CONV=depthwise: it, wherever it fits). */
int cpu_conv_dw_fits(const cpu_conv *c);
int cpu_conv_dw(const cpu_conv *c);
/* How many of those read their input's planes where a channel shuffle
** left them (cpu_conv.xoff; fl.blas_info().shuffles_read_in_place). */
int64_t cpu_conv_dw_shuffled(void);
/* 1x1 convolutions (stride 1, no padding, any groups) on plain layouts, or on
** blocks of 8 on both sides where each group is whole blocks (their
** weights packed in wpk), with any post-op whose operands are laid out
** as y, on fuselab's own loop
** (cpu/conv_pw.c): as cpu_conv_dw_fits / cpu_conv_dw; timed against
** oneDNN's forms the same way (FUSELAB_CONV=pointwise: it, wherever it
** fits). */
int cpu_conv_pw_fits(const cpu_conv *c);
int cpu_conv_pw(const cpu_conv *c);
/* Post-ops from .. npost of c over its plain result y (nchw), in order:
** what the matmul form of a 1x1 leaves to a pass of its own; _span: over
** len values of plane q (image * co + channel) from element off, y's or
** v's (those values on their way to y; NULL: y's). */
void cpu_conv_posts(const cpu_conv *c, int from);
/* 1 when a post-op of c reads a tensor in y's own memory: a residual the
** result is stored over (fuse/plan.c residual_over), which oneDNN's sum
** reads from dst; the loops that write part of y before they read it
** (cpu/conv_pw.c on blocks or with an epilogue it runs on stored rows,
** cpu/conv_dw.c into blocks of 8; cpu/mm_rows.c by its own check) refuse
** such a convolution. */
int cpu_conv_post_in_y(const cpu_conv *c);
void cpu_conv_posts_span(const cpu_conv *c, int from, int64_t q, int64_t off, int64_t len, float *v);
/* depthwise and 1x1 convolutions run by cpu_conv_dw and
** cpu_conv_pw so far, and of the latter how many read or wrote blocks
** (fl.blas_info().depthwise_convs, .pointwise_convs, .pointwise_blocked) */
int64_t cpu_conv_dw_calls(void);
void cpu_conv_pw_counts(int64_t *calls, int64_t *on_blocks);
/* Convolutions run through oneDNN so far, how many with post-ops, and how
** many as a batched matmul (fl.blas_info().onednn_convs,
** .onednn_conv_posts, .onednn_conv_matmuls). */
void cpu_conv_counts(int64_t *calls, int64_t *with_posts, int64_t *as_matmul);
/* Of those, how many read their input in blocks and wrote their result in
** blocks, how many values another reader had put back plain
** (cpu_unblock_nchw), and how many results were left channels last for
** the next convolution: fl.blas_info().blocked_reads, .blocked_writes,
** .unblocked, .channels_last_writes. */
void cpu_conv_block_counts(int64_t *reads, int64_t *writes, int64_t *unblocked, int64_t *nhwc);

#endif
