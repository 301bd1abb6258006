/*
** pass.h -- graph passes.  Each takes a graph and returns a NEW graph
** (the input is unchanged) plus a readable log of what it changed, one
** line per rewrite, so a teacher can show why the graph looks different.
** Results stay identical to the reference interpreter within float
** rounding of the rewritten formulas.
*/
#ifndef FL_PASS_H
#define FL_PASS_H

#include "ir.h"

/* Composites (softmax, log_softmax, layer_norm, rms_norm, gelu, silu,
** linear, batch_norm) -> primitives.  *log (malloc'd, the caller frees) is
** set on success.  Returns NULL with e filled on failure. */
ir_graph *pass_decompose(const ir_graph *g, char **log, fl_err *e);

/* Algebraic simplification (x*1, x+0, x-0, x/1, neg(neg x), double
** transpose/permute), constant folding (ops over constants only; params
** are bound by reference and never folded), common-subexpression
** elimination, matmul(x, transpose(w)) + b -> linear, folding of a
** batch_norm or per-channel scale/shift into the conv2d before it (as
** ops computing the new weights from the params, so a later in-place
** change to a weight or statistic is seen; over constants they fold
** now), and dead-code elimination. */
ir_graph *pass_optimize(const ir_graph *g, char **log, fl_err *e);

/* optimize's rewrites, in the order its walk tries them on each node; a
** mask of (1 << rule) runs only those (all of them: pass_optimize), so a
** teacher (and the report's pass stepper) can show what each one does. */
enum {
  PASS_FOLD_BN, PASS_SIMPLIFY, PASS_FOLD_LINEAR, PASS_FOLD_SCALE, PASS_CONST_FOLD,
  PASS_CSE, PASS_DCE, PASS_NRULES
};
#define PASS_ALL_RULES ((1u << PASS_NRULES) - 1)
extern const char *const pass_rule_names[PASS_NRULES];   /* "fold_bn", ... */
ir_graph *pass_optimize_rules(const ir_graph *g, unsigned rules, char **log, fl_err *e);

#endif
