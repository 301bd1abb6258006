/*
** eager.h -- eager execution on the CPU: one reasonably fast kernel per op
** (vectorizable contiguous loops, OpenMP, CBLAS sgemm for matmul).  This is
** the fair baseline compiled code is measured against, not the oracle.
*/
#ifndef FL_EAGER_H
#define FL_EAGER_H

#include "../graph/op.h"
#include "mm.h"

/* Infer, allocate *out and run op.  View ops (OPF_VIEW) return a view
** sharing in[0]'s storage when the strides allow, else a copy, as PyTorch's
** reshape does (view refuses instead).  On failure *out is left empty. */
int eager_apply(fl_op op, const fl_tensor *const *in, int nin,
                const op_attrs *a, fl_tensor *out, fl_err *e);
/* The same into a caller's buffer: when *out already holds a contiguous
** tensor of the result's dtype and shape (a compiled program's planned
** slot), a product (matmul, linear), a convolution or a pool (one that
** no input shares) writes there instead of into fresh pages on every
** call.  Any other op or out: *out is released and eager_apply runs. */
int eager_apply_into(fl_op op, const fl_tensor *const *in, int nin,
                     const op_attrs *a, fl_tensor *out, fl_err *e);
/* max_pool2d / avg_pool2d (attributes a) of float32 x [N, C, H, W] into y
** [N, C, OH, OW], both in blocks of b channels (nChw<b>c, C % b == 0);
** FL_EUNSUPPORTED for another op or block. */
int eager_pool2d_blocked(fl_op op, const op_attrs *a, const float *x, float *y, int64_t N, int64_t C,
                         int64_t H, int64_t W, int64_t OH, int64_t OW, int b);
/* A float32 product (matmul, linear) or convolution (conv2d, with its
** attributes a) into *out, a contiguous float32 tensor of its shape, with posts applied inside the library call (a
** fused epilogue that writes the product once).  FL_EUNSUPPORTED, out
** unwritten, where oneDNN cannot run it: the caller runs the epilogue.
** A convolution's x (in[0]) and out may be laid out otherwise (lay; NULL:
** both plain, as the products take them):
** xblk, yblk channels per block (cpu_conv_block), 0 plain; x may also be
** channels last (CPU_NHWC, cpu/mm.h).  With wrote (and yblk), out may be
** left channels last where oneDNN's kernel writes it so (the caller's
** next convolution alone reads it): *wrote is set to CPU_NHWC then, and
** left as the caller set it otherwise.  With xoff, x's planes lie where
** a channel shuffle left them (cpu_conv.xoff, offsets from in[0]'s
** first element; in[0] gives only the shape): a depthwise convolution
** reads them there, anything else is FL_EUNSUPPORTED. */
typedef struct eager_layouts {
  int xblk, yblk;
  int *wrote;
  const int64_t *xoff;
} eager_layouts;
int eager_product_posts(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                        const cpu_mm_post *posts, int npost, const eager_layouts *lay,
                        fl_tensor *out, fl_err *e);

#endif
