/*
** view.h -- views: the strides that make reshape, transpose, permute,
** unsqueeze, squeeze, expand, narrow and slice share their input's storage.
*/
#ifndef FL_VIEW_H
#define FL_VIEW_H

#include "op.h"

/* *out = a view of in with metadata outm (already inferred for op).
** FL_EUNSUPPORTED when in's strides cannot express it without a copy
** (reshape of a non-contiguous tensor); the caller then copies. */
int view_apply(fl_op op, const fl_tensor *in, const op_attrs *a,
               const fl_meta *outm, fl_tensor *out, fl_err *e);

#endif
