/*
** cuda_codegen.h -- CUDA C from kernel descriptions (fuse/kernel.h), the
** same descriptions cpu/codegen.c renders as C.  Each kernel becomes
**     extern "C" __global__ void NAME(const fl_params<NB, NA> P)
** where P.buf[i] is the device address of the kernel's i-th buffer
** (fk_kernel.bufs) and P.arg holds what fk_bind computes (sizes, then per
** access strides and offset), followed for extern kernels by the anchor's
** own sizes and strides (cuda_extern_args).  The parameter block is passed
** by value, so a launch needs no device copy of its arguments and a CUDA
** graph captures it whole.
**
** Shapes of the generated code:
**   pointwise  a grid-stride loop over every element; a contiguous fast path
**              (one flat dim, unit or zero inner strides) with 4-wide
**              vector loads and stores when the addresses are aligned.
**   reduce     one block per row (kept dims), grid-stride over rows; per
**              stage one pass over the reduced elements, thread partials
**              combined with warp shuffles and shared memory across warps,
**              so softmax, layer_norm and rms_norm are one kernel.
**   extern     the anchor (matmul, linear, conv2d, pooling, embedding, cat,
**              rnn: one block per direction and batch row, in step order)
**              as a generated kernel whose store runs the elementwise
**              epilogue in place (a lambda given to the preamble's tiled
**              matmul, WMMA tensor cores for float16/bfloat16), plus a
**              separate pointwise epilogue kernel NAME_epi the runtime uses
**              when the epilogue's iteration space is not the anchor's.
*/
#ifndef FL_CUDA_CODEGEN_H
#define FL_CUDA_CODEGEN_H

#include "../fuse/plan.h"
#include "../graph/strbuf.h"

/* What the runtime needs to know about one generated kernel. */
typedef struct cuda_kinfo {
  int emitted;        /* 0: nothing to launch (no members, no anchor) */
  fk_kind kind;       /* the description's kind */
  int nbuf, narg;     /* sizes of the parameter block: buffers, int64 args */
  int nxarg;          /* extern: anchor args after the fk_nargs ones */
  int epi;            /* extern with members: NAME_epi exists */
  int vec;            /* pointwise: a vector path exists */
  int wmma;           /* extern matmul: tensor-core path for 16-bit inputs */
  int block;          /* default threads per block */
} cuda_kinfo;

/* Anchor argument layout (after the fk_nargs(k) epilogue args).  Every
** extern kernel starts with these three. */
enum {
  CUX_TOTAL = 0,      /* elements of the anchor's output */
  CUX_FUSE = 1,       /* 1: run the epilogue in the anchor's store */
  CUX_KEEP = 2,       /* 1: also store the anchor's own result */
  CUX_OP = 3          /* first op-specific slot */
};
/* Op-specific slots (from CUX_OP): matmul/linear */
enum {
  CUM_B = 0, CUM_M, CUM_N, CUM_K, CUM_SAM, CUM_SAK, CUM_SBK, CUM_SBN,
  CUM_OA, CUM_OB, CUM_HASBIAS, CUM_SBIAS, CUM_OBIAS, CUM_NBD,
  CUM_BSIZE,                  /* 6 batch sizes */
  CUM_BSA = CUM_BSIZE + 6,    /* 6 batch strides of A */
  CUM_BSB = CUM_BSA + 6,      /* 6 batch strides of B */
  CUM_COUNT = CUM_BSB + 6
};
/* conv2d */
enum {
  CUC_N = 0, CUC_C, CUC_H, CUC_W, CUC_CO, CUC_KH, CUC_KW, CUC_OH, CUC_OW,
  CUC_SH, CUC_SW, CUC_PH, CUC_PW,
  CUC_XS = 13,                /* 4 strides of x (n, c, h, w), then offset */
  CUC_XO = 17,
  CUC_WS = 18,                /* 4 strides of w, then offset */
  CUC_WO = 22,
  CUC_HASBIAS = 23, CUC_SBIAS, CUC_OBIAS,
  CUC_PB = 26, CUC_PR, CUC_DH, CUC_DW, CUC_G,   /* pads bottom, right; dilation; groups */
  CUC_COUNT
};
/* max_pool2d / avg_pool2d */
enum {
  CUP_C = 0, CUP_H, CUP_W, CUP_OH, CUP_OW, CUP_KH, CUP_KW, CUP_SH, CUP_SW,
  CUP_PH, CUP_PW, CUP_XS = 11, CUP_XO = 15,
  CUP_PB = 16, CUP_PR, CUP_DH, CUP_DW, CUP_CIP,  /* pads bottom, right; dilation; count_include_pad */
  CUP_GS = 21, CUP_GO = 25,        /* max_pool2d_backward: the gradient's strides, offset */
  CUP_COUNT
};
/* embedding: index tensor of up to 8 dims, weight [V, D] */
enum {
  CUE_V = 0, CUE_D, CUE_SWV, CUE_SWD, CUE_OW, CUE_ND,
  CUE_ISIZE = 6, CUE_ISTR = 14, CUE_IO = 22, CUE_COUNT
};
/* cat: the result's rank, dim, then per input (at most CUDA_CAT_MAX):
** its extent along dim, its offset, its strides */
#define CUDA_CAT_MAX 16
enum { CUT_ND = 0, CUT_DIM, CUT_OSIZE = 2, CUT_IN = CUT_OSIZE + FL_MAX_DIMS };
#define CUT_PER (2 + FL_MAX_DIMS)
#define CUT_COUNT (CUT_IN + CUDA_CAT_MAX * CUT_PER)

/* pad: rank, mode (0 constant, 1 reflect, 2 edge), x's offset, then per
** dim the result's size, x's stride, the crop, the pad before and the
** cropped size */
enum {
  CUD_ND = 0, CUD_MODE, CUD_XO, CUD_OSIZE = 3, CUD_XSTR = CUD_OSIZE + FL_MAX_DIMS,
  CUD_CROP = CUD_XSTR + FL_MAX_DIMS, CUD_BEFORE = CUD_CROP + FL_MAX_DIMS,
  CUD_M = CUD_BEFORE + FL_MAX_DIMS, CUD_COUNT = CUD_M + FL_MAX_DIMS
};
/* flip: a strided copy (the flipped dims' strides negated, the offset at
** their last element) */
enum { CUF_ND = 0, CUF_XO, CUF_OSIZE = 2, CUF_XSTR = CUF_OSIZE + FL_MAX_DIMS,
       CUF_COUNT = CUF_XSTR + FL_MAX_DIMS };
/* gather: the result's rank, x's and idx's offsets, the gathered dim's size
** and x's stride there, then per result dim its size and what one step
** moves in x and in idx */
enum {
  CUG_ND = 0, CUG_XO, CUG_IO, CUG_SIZE, CUG_XDSTR, CUG_OSIZE = 5,
  CUG_XSTR = CUG_OSIZE + FL_MAX_DIMS, CUG_ISTR = CUG_XSTR + FL_MAX_DIMS,
  CUG_COUNT = CUG_ISTR + FL_MAX_DIMS
};
/* index_add: src [A, I, R] (its strides, offset), idx [I] (stride,
** offset), n */
enum {
  CUI_A = 0, CUI_I, CUI_R, CUI_N, CUI_SS, CUI_SO = CUI_SS + 3, CUI_IS, CUI_IO,
  CUI_COUNT
};

/* matmul_int8: out [..., M, N] (rank, sizes), K, then A's, B's and the
** zero points' offsets and strides (B's batch strides 0 for a 2-d B, a
** zero point's stride 0 for one value), and whether each zero point is
** there */
enum {
  CUQ_ND = 0, CUQ_K, CUQ_AO, CUQ_BO, CUQ_ZAO, CUQ_ZBO, CUQ_ZAS, CUQ_ZBS, CUQ_HASZA, CUQ_HASZB,
  CUQ_AU, CUQ_BU, CUQ_OSIZE = 12, CUQ_ASTR = CUQ_OSIZE + FL_MAX_DIMS,
  CUQ_BSTR = CUQ_ASTR + FL_MAX_DIMS, CUQ_COUNT = CUQ_BSTR + FL_MAX_DIMS
};

/* cumsum: lines (outer * inner), the length along dim, inner, x's offset,
** exclusive, reverse, then per dim x's size and stride */
enum { CUS_LINES = 0, CUS_LEN, CUS_INNER, CUS_XO, CUS_EXCL, CUS_REV, CUS_ND,
       CUS_SIZE = 7, CUS_XSTR = CUS_SIZE + FL_MAX_DIMS, CUS_DIM = CUS_XSTR + FL_MAX_DIMS,
       CUS_COUNT };

/* rnn: the sequence length, the batch, the input and hidden sizes, then
** per input (ops.def's order: X W R B sequence_lens initial_h initial_c
** P) its strides (at most 3) and offset; 0 where the input is absent.
** The state of one (direction, batch row) lives in shared memory, so H is
** at most CUDA_RNN_HMAX (the host refuses more). */
#define CUDA_RNN_HMAX 2048
enum { CUR_T = 0, CUR_B, CUR_I, CUR_H, CUR_OPS = 4, CUR_PER = 4, CUR_COUNT = CUR_OPS + 8 * CUR_PER };

/* The includes, types and helpers every program starts with; `externs`
** (cuda_plan_has_extern's flags) adds the extern anchors' templates and
** the tensor-core matmul (mma.h) only where needed, which keeps small
** programs quick to compile. */
enum { CUDA_PRE_EXTERN = 1, CUDA_PRE_WMMA = 2 };
void cuda_emit_preamble(strbuf *b, int externs);
/* Append kernel k of plan p as CUDA C named sym (a C identifier the caller
** made; the epilogue kernel is sym_epi).  Fills *info.  Returns 1 when
** something was emitted, 0 when the kernel has nothing to run, or
** FL_EUNSUPPORTED with e naming the op that has no CUDA lowering. */
int cuda_emit_kernel(strbuf *b, const fuse_plan *p, int k, const char *sym,
                     cuda_kinfo *info, fl_err *e);
/* CUDA_PRE_* flags: which preamble parts p's kernels need. */
int cuda_plan_has_extern(const fuse_plan *p);
/* Which of extern kernel k's buffers holds its anchor's input `in` (views
** between them folded into the strides), or -1. */
int cuda_operand_slot(const fuse_plan *p, const fk_kernel *k, int in);

#endif
