/*
** op.h -- the op table (generated from ops.def) and the one entry point
** every layer uses to ask what an op does: op_infer for shapes and dtypes,
** op_info for kind, arity, reference kernel and scalar expression.
*/
#ifndef FL_OP_H
#define FL_OP_H

#include "tensor.h"

typedef enum fl_op {
#define OP(id, name, mn, mx, kind, flags, infer, ref, sc, expr, isc, iexpr, grad, saves) OP_##id,
#include "ops.def"
#undef OP
  OP_COUNT
} fl_op;

/* What fusion may do with an op (after TVM's FuseOps pattern kinds). */
typedef enum op_kind {
  OPK_ELEMWISE,   /* one input element -> one output element, same shape */
  OPK_BROADCAST,  /* elementwise after NumPy broadcasting of inputs */
  OPK_INJECTIVE,  /* each output element copies one input element */
  OPK_REDUCTION,  /* reduces some dims (softmax & norms: with elementwise) */
  OPK_OUTFUSABLE, /* matmul, conv: elementwise epilogues fuse into output */
  OPK_OPAQUE      /* fuses with nothing */
} op_kind;

enum {
  OPF_COMPOSITE = 1,  /* g:decompose() rewrites it into primitives */
  OPF_VIEW = 2,       /* eager result is a view sharing input 0's storage */
  OPF_RANDOM = 4      /* draws from the Philox stream (graph/rng.h): never
                         folded, merged or dropped by a pass */
};

/* Op-specific attributes; ops.def says which fields each op reads. */
typedef struct op_attrs {
  int ndims;                    /* entries used in dims[] */
  int64_t dims[FL_MAX_DIMS];    /* reduce dims / permutation / shape */
  int64_t i[12];                /* op-specific integers */
  double f[2];                  /* op-specific reals */
  int keepdim;                  /* reductions keep reduced dims as 1 */
  fl_dtype dtype;               /* target of "to" */
} op_attrs;

/* Shape/dtype rule: fill *out from the inputs' metadata (in[k] NULL for an
** absent optional input); errors name the op, the shapes and what was
** expected. */
typedef int (*op_infer_fn)(fl_op op, const fl_meta *const *in, int nin,
                           const op_attrs *a, fl_meta *out, fl_err *e);
/* Reference kernel: out is already allocated (contiguous) with the
** inferred metadata; compute it naively, accumulating in double. */
typedef int (*op_ref_fn)(fl_op op, const fl_tensor *const *in, int nin,
                         const op_attrs *a, fl_tensor *out, fl_err *e);
/* Scalar reference of an elementwise op. */
typedef double (*op_scalar_fn)(const double *x, const op_attrs *a);
/* The same in int64 arithmetic (wrapping on overflow). */
typedef int64_t (*op_iscalar_fn)(const int64_t *x, const op_attrs *a);

/* Derivative rule (graph/grad.h). */
struct gr_ctx;
typedef void (*op_grad_fn)(const struct gr_ctx *c, int *gin);
/* What a rule reads besides the output's gradient (the saves column):
** inputs by position, the output, and an extra tensor the forward made
** for backward (dropout's mask).  Only these are kept alive for it. */
enum {
  GS_IN0 = 1, GS_IN1 = 2, GS_IN2 = 4, GS_IN3 = 8, GS_IN4 = 16,
  GS_INS = 31,          /* every input (five at most are saved) */
  GS_OUT = 1 << 5,
  GS_EXTRA = 1 << 6
};

typedef struct op_info {
  const char *name;
  int min_args, max_args;
  op_kind kind;
  int flags;
  op_infer_fn infer;
  op_ref_fn ref;
  op_scalar_fn scalar;          /* elementwise ops only, else NULL */
  const char *expr;             /* elementwise ops only, else NULL */
  op_iscalar_fn iscalar;        /* elementwise ops with an int64 form */
  const char *iexpr;            /* its expression, else NULL */
  op_grad_fn grad;              /* derivative rule; gr_none: none */
  int saves;                    /* GS_*: what the rule reads */
} op_info;

extern const op_info op_table[OP_COUNT];

static inline const op_info *op_info_of(fl_op op) { return &op_table[op]; }
const char *op_name(fl_op op);
const char *op_kind_name(op_kind k);
/* OP_COUNT when no op has that name */
fl_op op_by_name(const char *name);
/* A zeroed attribute record with op's defaults: clamp bounds infinite,
** layer_norm/batch_norm eps 1e-5, rms_norm eps FLT_EPSILON (PyTorch's
** finfo(float32).eps), var correction 1. */
void op_attrs_init(fl_op op, op_attrs *a);

/* The window of conv2d, max_pool2d or avg_pool2d, decoded from its
** attributes (the layout is in ops.def): kh, kw the kernel (a conv's from
** its weight, passed in), strides (a pool's 0 = the kernel), pads top,
** left, bottom, right, dilations, groups (conv), ceil_mode and
** count_include_pad (pools).  Every consumer reads attributes through it. */
typedef struct op_win2d {
  int64_t kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, groups;
  int ceil_mode, count_include_pad;
} op_win2d;
void op_win2d_of(fl_op op, const op_attrs *a, int64_t kh, int64_t kw, op_win2d *w);
/* Output extent of a sliding window over n elements (PyTorch's
** pooling_output_shape): floor or, with ceil_mode, ceil of
** (n + pb + pe - d (k - 1) - 1) / s, plus 1, where a ceil-mode window
** must start inside the input or its leading padding; <= 0 when no
** window fits; INT64_MAX when the sizes overflow. */
int64_t op_win_out(int64_t n, int64_t k, int64_t s, int64_t pb, int64_t pe,
                   int64_t d, int ceil_mode);

/* rnn (ops.def): its attributes decoded, defaults resolved.  Every
** consumer (shape rule, oracle, eager kernel, listing) reads them here. */
enum { OP_RNN_CELL_RNN, OP_RNN_CELL_GRU, OP_RNN_CELL_LSTM };
enum { OP_RNN_ACT_DEFAULT, OP_RNN_ACT_SIGMOID, OP_RNN_ACT_TANH, OP_RNN_ACT_RELU,
       OP_RNN_ACT_SOFTSIGN, OP_RNN_ACT_SOFTPLUS, OP_RNN_ACT_COUNT };
typedef struct op_rnn {
  int cell;                 /* OP_RNN_CELL_* */
  int gates;                /* 1, 3, 4 (ONNX's order: RNN i; GRU z r h; LSTM i o f c) */
  int dirs;                 /* 1 or 2 */
  int reverse;              /* the single direction runs backward */
  int states;               /* rows of out before Y: 1 (Y_h), 2 with Y_c */
  int lbr;                  /* GRU's linear_before_reset */
  int clip_on;
  double clip;
  int act[2][3];            /* per direction: f, g, h (OP_RNN_ACT_*, never DEFAULT) */
} op_rnn;
void op_rnn_of(const op_attrs *a, op_rnn *r);
/* The activation at x in double (the oracle's); its ONNX name; the code of
** an ONNX name (OP_RNN_ACT_DEFAULT when rnn has no such activation). */
double op_rnn_act(int act, double x);
const char *op_rnn_act_name(int act);
int op_rnn_act_by_name(const char *name);

/* 1 when elementwise op over operands of dtypes dt[0..nin) computes in
** exact int64 arithmetic (its iscalar / iexpr): it has an int64 form, an
** operand is int64 and the others int64 or bool (where's condition
** aside).  Eager, the oracle and both generators decide by this alone. */
int op_int_compute(fl_op op, const fl_dtype *dt, int nin);

/* Checks the input count and runs the op's shape rule. */
int op_infer(fl_op op, const fl_meta *const *in, int nin, const op_attrs *a,
             fl_meta *out, fl_err *e);

/* NumPy broadcasting of two shapes into out (ndim and shape only); the
** message names the op and both shapes. */
int op_broadcast_shapes(const char *opname, const fl_meta *a,
                        const fl_meta *b, fl_meta *out, fl_err *e);

/* 1 when op has a derivative (its grad column is not gr_none). */
int op_differentiable(fl_op op);
/* 1 for a plain reduction row (OPK_REDUCTION, not a composite): sum,
** mean, amax, amin, var, argmax, and any reduction added to the table. */
int op_is_reduce(fl_op op);

/* The shape rules, reference kernels and derivative rules named in ops.def. */
#define OP(id, name, mn, mx, kind, flags, infer, ref, sc, expr, isc, iexpr, grad, saves) \
  int infer(fl_op, const fl_meta *const *, int, const op_attrs *, fl_meta *, fl_err *); \
  int ref(fl_op, const fl_tensor *const *, int, const op_attrs *, fl_tensor *, fl_err *); \
  void grad(const struct gr_ctx *, int *);
#include "ops.def"
#undef OP

#endif
