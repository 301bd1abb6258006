/*
** compose.h -- the composite ops written once in primitives: softmax,
** log_softmax, layer_norm, rms_norm and batch_norm.  g:decompose() builds
** them as graph nodes (graph/pass.c), the code generators' lowering as a
** kernel's steps (fuse/lower.c): each through its own cbuild, whose three
** operations are all a definition calls.  (The reference interpreter and
** the eager kernels compute them their own way: the oracle must not share
** the code it judges, and eager fuses each into one pass.)
*/
#ifndef FL_COMPOSE_H
#define FL_COMPOSE_H

#include "op.h"

typedef struct cbuild {
  void *ctx;
  /* an elementwise op of the table over x, or x and y (y -1: unary) */
  int (*op)(void *ctx, fl_op op, int x, int y);
  /* OP_SUM, OP_MEAN or OP_AMAX over the composite's reduced dims, kept */
  int (*reduce)(void *ctx, fl_op op, int x);
  int (*konst)(void *ctx, double v);
} cbuild;

/* Composite op (OPF_COMPOSITE with a reduction, or batch_norm) over its
** inputs in[0..nin) (-1: an absent optional input); batch_norm's
** per-channel inputs must already broadcast against x.  The value's id, or
** -1 when op is not one of them. */
int compose(const cbuild *c, fl_op op, const op_attrs *a, const int *in, int nin);

#endif
