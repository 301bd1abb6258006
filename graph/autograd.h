/*
** autograd.h -- the tape of eager autograd and its backward.
** Every op run in grad mode on a tensor that requires grad records an
** ag_fn (PyTorch's Node): the op, its attributes, its inputs' metadata,
** the fns their gradients flow to, and what its derivative rule reads
** (the op table's saves column), no more.  A leaf that requires grad has
** an AG_LEAF fn that accumulates its .grad.  backward walks the fns
** reachable from the roots in reverse creation order (a topological
** order: a fn's inputs were made before it), builds ONE backward graph
** from the derivative rules (grad.h) and runs it with the backend's
** kernels; intermediates are freed after their last use, as ir_run does.
** With create_graph it runs that graph node by node instead, recording
** each op it runs on the tape, so gradients can be differentiated again.
** graph/ knows no backend: the caller passes the apply function.
*/
#ifndef FL_AUTOGRAD_H
#define FL_AUTOGRAD_H

#include "ir.h"

typedef enum ag_kind { AG_OP, AG_LEAF, AG_CALL } ag_kind;

/* AG_CALL: a function whose backward is a program, not rules (a compiled
** forward's backward graph, AOTAutograd's CompiledFunction).  call fills
** gin[0..nin) with the gradients of its inputs (left empty: none) from
** gout, the gradient of its one output; release drops what it saved (a
** backward without retain_graph), free_ctx everything (the fn is freed). */
typedef struct ag_call {
  int (*call)(void *ctx, const fl_tensor *gout, fl_tensor *gin, ir_apply_fn apply, fl_err *e);
  void (*release)(void *ctx);
  void (*free_ctx)(void *ctx);
  void *ctx;
  const char *name;     /* "CompiledFunctionBackward" */
} ag_call;

typedef struct ag_fn ag_fn;
struct ag_fn {
  int refs;             /* tensors and later fns holding it */
  ag_kind kind;
  uint64_t seq;         /* creation order */
  fl_op op;             /* AG_OP: the op recorded, its attributes */
  op_attrs attrs;
  int nin;
  fl_meta *in_meta;     /* nin inputs' metadata (absent optional: ndim -1) */
  ag_fn **next;         /* nin: where input k's gradient goes, NULL: nowhere */
  fl_tensor *saved;     /* nin + 2: inputs, the output, the extra; empty
                           where the rule does not read them */
  uint64_t *ver;        /* each saved storage's version when saved */
  fl_meta out_meta;
  int freed;            /* saved values released by a backward */
  int retain;           /* AG_OP: keep the gradient reaching it (retain_grad) */
  fl_tensor grad;       /* AG_LEAF: .grad; AG_OP: the retained gradient */
  ag_fn *grad_fn;       /* the fn of grad when a backward with create_graph
                           made it differentiable (a reference), or NULL */
  ag_call call;         /* AG_CALL: its backward; grad holds the gradient
                           reaching it until the call runs */
  int node;             /* backward's scratch: the gradient's node, -1 */
  int mark;
  int pending;          /* AG_CALL: waiting in a backward for its call */
};

/* Grad mode (fl.no_grad turns it off): ops record only while it is on. */
int ag_grad_enabled(void);
void ag_set_grad_enabled(int on);

/* An AG_CALL fn (refs 1) for an output of metadata out whose nin inputs'
** gradients go to next[k] (references taken; NULL: nowhere); it owns
** c's ctx from here on, even on failure. */
ag_fn *ag_call_new(const fl_meta *out, int nin, ag_fn *const *next, const ag_call *c, fl_err *e);

/* *acc = *acc + v, a new tensor (a gradient accumulated out of place,
** as PyTorch's grad = grad + new). */
int ag_add_into(fl_tensor *acc, const fl_tensor *v, ir_apply_fn apply, fl_err *e);

/* A leaf's accumulator for a tensor of metadata m (refs 1). */
ag_fn *ag_leaf(const fl_meta *m, fl_err *e);
/* Record op applied to in[0..nin) giving out (refs 1): next[k] is input
** k's fn or NULL; extra is what the forward made for backward (NULL:
** none).  Takes references to next's fns and to what the rule reads. */
ag_fn *ag_record(fl_op op, const op_attrs *a, const fl_tensor *const *in, int nin,
                 ag_fn *const *next, const fl_tensor *out, const fl_tensor *extra,
                 fl_err *e);
void ag_ref(ag_fn *f);
/* How many fns are alive now (a tape freed after backward returns it to
** where it was). */
long ag_live(void);
/* Drop a reference; the last frees the fn, its saved values and the
** references it holds (iteratively: a chain of a million ops is fine). */
void ag_unref(ag_fn *f);

/* "MulBackward" for a fn of mul, "AccumulateGrad" for a leaf (PyTorch's
** names, so a class can follow a PyTorch tutorial). */
const char *ag_fn_name(const ag_fn *f, char *buf, size_t n);

/* Backward from roots[0..n) seeded with seeds[k] (each root's output
** gradient, its out_meta's shape).  want NULL: every leaf reached
** accumulates into its .grad, retained fns keep theirs.  want given:
** wout[j] gets the gradient reaching want[j] (empty when none does) and
** no .grad changes (fl.grad).  Without retain the saved values of every
** fn run are released: a second backward through them is an error.
** Errors name the op (a saved value modified in place, freed values, an
** op without a rule yet).
** create (PyTorch's create_graph): the backward's own ops are recorded
** on the tape, whatever the grad mode, so the gradients can be
** differentiated again: a saved input's fn is the next fn of its input,
** the saved output's the fn itself, seed k's seed_fns[k] (NULL: none).
** wfn[j] (given with wout) then gets a reference to wout[j]'s fn, a .grad
** its fn in grad_fn (NULL: a constant); never a leaf's own fn (such a
** gradient is recorded as a view of the leaf).  Without create seed_fns
** and wfn are ignored and accumulating drops .grad's grad_fn. */
int ag_backward(ag_fn *const *roots, const fl_tensor *const *seeds, ag_fn *const *seed_fns,
                int n, ag_fn *const *want, int nwant, fl_tensor *wout, ag_fn **wfn,
                int retain, int create, ir_apply_fn apply, fl_err *e);

/* The backward graph ag_backward would run, unrun (for pictures and
** listings): its outputs are the leaves' gradients in reach order, output
** j that of (*who)[j] when who is given (a malloc'd array the caller
** frees). */
ir_graph *ag_backward_graph(ag_fn *const *roots, const fl_tensor *const *seeds, int n,
                            ag_fn ***who, fl_err *e);

#endif
