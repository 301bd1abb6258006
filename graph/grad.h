/*
** grad.h -- derivative rules: the `grad` and `saves` columns of the op
** table.  A rule states an op's vector-Jacobian product once, as graph
** constructors (build.h) over the values the forward saved and the
** gradient of the op's output, the way PyTorch's derivatives.yaml states
** each formula once.  Eager autograd (autograd.c) builds its backward
** graph from these rules and runs it with the eager kernels; a joint
** forward+backward graph is built from the same rules.
*/
#ifndef FL_GRAD_H
#define FL_GRAD_H

#include "build.h"

typedef struct gr_ctx {
  gbuild *b;
  fl_op op;
  const op_attrs *a;
  int nin;
  const int *in;            /* node of saved input k, -1 when not saved */
  const fl_meta *in_meta;   /* every input's metadata (absent: ndim -1) */
  int out;                  /* node of the saved output, or -1 */
  const fl_meta *out_meta;
  int extra;                /* node of the saved extra tensor, or -1 */
  int g;                    /* node of the output's gradient */
  const unsigned char *need;/* need[k]: input k wants a gradient */
} gr_ctx;

/* A rule (op_grad_fn, op.h) fills gin[k] with the node of input k's
** gradient, or -1 for none (zero, or not needed).  The caller sums a
** gradient down to its input's shape (broadcasting) and casts it to its
** dtype; the rule may leave both to it.  Errors go to c->b (b->rc). */

/* c's op's rule, each wanted gradient then summed to its input's shape
** and cast to its dtype: gin[k] the node, or -1.  An error from the rule
** is prefixed "<who> of <op>: " (who: "backward", "joint"). */
int gr_apply(const gr_ctx *c, int *gin, const char *who);

#endif
