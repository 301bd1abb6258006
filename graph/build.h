/*
** build.h -- small graph constructors: what a rewrite (pass.c) or a
** derivative rule (grad.c) writes to add a few ops to a graph.  Every
** constructor takes node ids and returns the new node's id; the first
** failure is kept in b->rc and every later call returns -1 and does
** nothing, so a rule is written as straight-line expressions and checked
** once at the end.  -1 as an input means an absent optional input, as in
** ir_add_op.
*/
#ifndef FL_BUILD_H
#define FL_BUILD_H

#include "ir.h"

typedef struct gbuild {
  ir_graph *g;          /* the graph being built (appended to) */
  fl_err *e;
  int rc;               /* first failure, FL_OK until then */
  const char *where;    /* source position and module scope copied onto */
  const char *scope;    /* every node made (NULL: none) */
  int wide;             /* gb_const makes float64 constants: the values
                           being built are float64, and a float32 constant
                           would round theirs */
} gbuild;

void gb_init(gbuild *b, ir_graph *g, fl_err *e);
/* The metadata of node x (x must be a node of b->g). */
const fl_meta *gb_meta(const gbuild *b, int x);

int gb_op(gbuild *b, fl_op op, const op_attrs *a, int nin, const int *in);
int gb_op_sym(gbuild *b, fl_op op, const op_attrs *a, int nin, const int *in,
              const int *asym);
/* op with its default attributes over one or two nodes */
int gb_op1(gbuild *b, fl_op op, int x);
int gb_op2(gbuild *b, fl_op op, int x, int y);
int gb_op3(gbuild *b, fl_op op, int x, int y, int z);
/* A wrapped 0-dim float32 (float64 when b->wide) constant: the weakest operand in type
** promotion, so `x * 0.5` keeps x's dtype (float16 stays float16). */
int gb_const(gbuild *b, double v);
/* The same as a wrapped int64 (index arithmetic stays integer). */
int gb_iconst(gbuild *b, int64_t v);
/* A constant tensor (a new reference to t's storage). */
int gb_tensor(gbuild *b, const fl_tensor *t);
/* Reduction op over the listed dims (0-based, distinct), keeping them or not. */
int gb_reduce(gbuild *b, fl_op op, int x, const int *dims, int nd, int keepdim);
/* Reduction over dims [from, ndim) keeping them, as norms need. */
int gb_reduce_tail(gbuild *b, fl_op op, int x, int from);
/* Reduction over one dim, kept. */
int gb_reduce_dim(gbuild *b, fl_op op, int x, int dim);
/* reshape to ndim dims */
int gb_reshape(gbuild *b, int x, int ndim, const int64_t *shape);
int gb_transpose(gbuild *b, int x, int d0, int d1);
int gb_permute(gbuild *b, int x, int ndim, const int *perm);
int gb_expand(gbuild *b, int x, int ndim, const int64_t *shape);
int gb_cast(gbuild *b, int x, fl_dtype dt);
/* Ones of dtype dt and shape[ndim] on like's device, which is not the host
** (graph/ can put no constant on a device): where(v == v, 1, 1) of a
** one-element view v of like -- 1 for NaN too -- expanded. */
int gb_device_ones(gbuild *b, int like, fl_dtype dt, int ndim, const int64_t *shape);
/* x summed down to shape m (the inverse of broadcasting m to x's shape:
** leading dims summed away, dims of size 1 in m summed and kept), then
** reshaped to m's shape; x itself when the shapes already agree. */
int gb_sum_to(gbuild *b, int x, const fl_meta *m);

#endif
