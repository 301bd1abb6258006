/*
** optim.h -- the optimizers' per-parameter updates as one pass over the
** elements (PyTorch's fused=True idea): fl.optim's Adam, AdamW and SGD
** (scripting/optim.lua) call these for contiguous float32 tensors on the
** CPU, and run the same formula as tensor ops otherwise.  The arithmetic
** is PyTorch's single-tensor implementation term for term, in float32,
** in the same order (scalars computed in double, then used as float32,
** as PyTorch's kernels take a Python number), so a fused step equals the
** op-by-op one.
*/
#ifndef FL_CPU_OPTIM_H
#define FL_CPU_OPTIM_H

#include "../graph/tensor.h"

typedef struct cpu_adam {
  double lr, beta1, beta2, eps, weight_decay;
  int decoupled;        /* AdamW: p *= 1 - lr * weight_decay first */
  int maximize;
  int64_t step;         /* after this update's increment (>= 1) */
} cpu_adam;

/* One Adam/AdamW update of p from grad, with its state m, v (and vmax for
** amsgrad, else NULL); FL_EUNSUPPORTED, nothing written, unless every
** tensor is float32 on the CPU with p's shape and p, m, v, vmax are
** contiguous. */
int cpu_adam_step(fl_tensor *p, const fl_tensor *grad, fl_tensor *m, fl_tensor *v,
                  fl_tensor *vmax, const cpu_adam *o, fl_err *e);

typedef struct cpu_sgd {
  double lr, momentum, dampening, weight_decay;
  int nesterov, maximize;
  int first;            /* the momentum buffer is new: it takes g as is */
} cpu_sgd;

/* One SGD update (buf NULL without momentum), as cpu_adam_step. */
int cpu_sgd_step(fl_tensor *p, const fl_tensor *grad, fl_tensor *buf, const cpu_sgd *o,
                 fl_err *e);

#endif
