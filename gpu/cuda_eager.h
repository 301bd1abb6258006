/*
** cuda_eager.h -- one op on device tensors, as eager runs it (see
** cuda_eager.c): the ir_apply_fn of everything that runs op by op there.
*/
#ifndef FL_CUDA_EAGER_H
#define FL_CUDA_EAGER_H

#include "../graph/ir.h"

/* op on in[0..nin) (any on the device) into out: a view, a generated
** kernel compiled once, or the host's kernel on copies, moved back. */
int cuda_eager_apply(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                     fl_tensor *out, fl_err *e);
/* The host's kernel on host copies of the device inputs (out on the host):
** the last resort for an op no CUDA kernel lowers. */
int cuda_host_apply(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                    fl_tensor *out, fl_err *e);
/* Every element of t (contiguous, on either device) set to v. */
int cuda_fill(fl_tensor *t, double v, fl_err *e);
/* Drop the cached one-op programs. */
void cuda_eager_free(void);

#endif
