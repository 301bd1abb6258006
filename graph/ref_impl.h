/*
** ref_impl.h -- index helpers the reference kernels share (ref.c and
** ref_nn.c); not part of the oracle's public face (ref.h).
*/
#ifndef FL_REF_IMPL_H
#define FL_REF_IMPL_H

#include "op.h"

/* Coordinates c[0..ndim) of row-major index i in shape m, and back. */
void ref_unravel(const fl_meta *m, int64_t i, int64_t *c);
int64_t ref_ravel(const fl_meta *m, const int64_t *c);
/* Product of m's sizes over dims [from, to). */
int64_t ref_prod(const fl_meta *m, int from, int to);
/* Optional input k: NULL when absent or beyond nin. */
const fl_tensor *ref_opt(const fl_tensor *const *in, int nin, int k);
/* FL_OK when t has want elements, else an error naming op, what and t's
** shape. */
int ref_check_numel(const char *op, const fl_tensor *t, int64_t want,
                    const char *what, fl_err *e);

#endif
