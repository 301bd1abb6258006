/*
** ir.h -- the graph IR: what capture produces, passes rewrite, fusion
** plans over and the pictures draw.
** A graph owns its nodes; node ids are indices into g->nodes and every
** node's inputs have smaller ids (the builder only appends), so id order is
** a topological order.  Passes never edit a graph in place: they build a
** new one.
*/
#ifndef FL_IR_H
#define FL_IR_H

#include "op.h"

typedef enum ir_kind {
  IR_INPUT,   /* a placeholder: the compiled function's argument #index */
  IR_PARAM,   /* a tensor reached through a module/upvalue/global: bound by
                 reference, so in-place changes to it are seen */
  IR_CONST,   /* a value owned by the graph (folded constants, numbers) */
  IR_OP       /* one row of the op table applied to earlier nodes */
} ir_kind;

/* A size expression (graph/sym.c): a variable (c = its number), a
** constant (c), or op applied to earlier entries a and b.  hint: its value
** at the sizes seen when captured. */
typedef enum ir_symop { SYM_VAR, SYM_CONST, SYM_ADD, SYM_SUB, SYM_MUL, SYM_DIV, SYM_MOD,
                        SYM_MAX, SYM_MIN } ir_symop;
typedef struct ir_sym {
  ir_symop op;
  int a, b;
  int64_t c, hint;
} ir_sym;

#define IR_MAX_SYMX 256                /* size expressions per graph */
#define IR_NASYM (FL_MAX_DIMS + 6)     /* attribute slots: dims[], then i[] */

typedef struct ir_node {
  ir_kind kind;
  fl_op op;                 /* IR_OP: which op */
  op_attrs attrs;           /* IR_OP: its attributes */
  int nin;                  /* IR_OP: number of inputs */
  int *in;                  /* IR_OP: input node ids, -1 = absent optional */
  fl_meta meta;             /* dtype and shape; symbolic dims hold the
                               example size seen at capture */
  int sym[FL_MAX_DIMS];     /* 0: dim is concrete; k > 0: its size is
                               size expression k-1 (a variable: any size >= 2) */
  int asym[IR_NASYM];       /* IR_OP: attribute slot j (attrs.dims[j], then
                               attrs.i[j - FL_MAX_DIMS]) is expression k-1
                               when k > 0 (a reshape to B*T) */
  int symlost;              /* a symbolic input size reached a size this
                               op computes in a way not followed (capture
                               specializes those symbols) */
  fl_tensor value;          /* IR_PARAM, IR_CONST: a shared reference */
  int index;                /* IR_INPUT: argument position */
  int requires_grad;        /* IR_INPUT, IR_PARAM: the tensor captured
                               required grad (g:joint differentiates
                               with respect to these) */
  char *name;               /* input/param name ("x", "fc1.weight") or NULL */
  char *where;              /* "file:line" of the user's code, or NULL */
  char *scope;              /* module path ("blocks.3.attn") or NULL */
} ir_node;

/* What running a graph op by op costs: each op that is not a view reads
** the buffers its inputs live in and writes its result to a buffer of its
** own.  fuse_graph_cost (fuse/) computes it; it is the "before" of every
** comparison.  A graph a pass derives from another keeps the cost of the
** graph it came from (ir_clone copies it), so a plan of
** g:decompose():optimize() is compared with g as captured. */
typedef struct ir_opcost {
  int known;                /* 0: none recorded (use the graph's own) */
  int kernels, buffers;     /* one per op that is not a view */
  int64_t bytes;            /* read + written */
  int64_t peak_bytes;       /* most op results alive at once, each freed
                               after its last reader, outputs to the end */
} ir_opcost;

typedef struct ir_graph {
  ir_node *nodes;           /* owned, n used of cap */
  int n, cap;
  int *outputs;             /* node ids returned by the graph, nout used */
  int nout, outcap;
  int ninputs;              /* IR_INPUT nodes, indices 0..ninputs-1 */
  int nsyms;                /* variables s0..s(nsyms-1): expressions 0..nsyms-1 */
  ir_sym *sx;               /* size expressions, nsx used of capsx */
  int nsx, capsx;
  int has_asym;             /* some node has a symbolic attribute */
  ir_opcost origin;         /* op-by-op cost of the graph this one was
                               derived from (known 0 when captured) */
  int nwb;                  /* write-backs: the last nwb outputs are new
                               values of inputs or params the traced code
                               wrote in place (x:copy_, a view's fill_) */
  int *wb;                  /* wb[k]: the IR_INPUT or IR_PARAM node that
                               output nout - nwb + k is written into */
  int joint_nres;           /* a joint graph (graph/joint.h): its outputs
                               are the forward's joint_nres results, then
                               the gradients of the leaves that require
                               grad, then the write-backs; 0 otherwise */
  int *joint_wrt;           /* a joint graph: the leaf node each gradient
                               output is of, in output order */
  int joint_ntan;           /* a joint graph with tangents: its last
                               joint_ntan IR_INPUT nodes (by index) are the
                               gradients reaching its results */
  int *joint_tan;           /* ...: tangent k's result position */
} ir_graph;

/* The graph's results: its outputs less the write-backs. */
#define ir_nresults(g) ((g)->nout - (g)->nwb)

/* --- size expressions (sym.c) ------------------------------------------ */
/* New entries return their index (equal expressions share one), or a
** negative status.  Variables must all be created before expressions. */
int ir_sym_var(ir_graph *g, int64_t hint, fl_err *e);
int ir_sym_const(ir_graph *g, int64_t v, fl_err *e);
int ir_sym_op(ir_graph *g, ir_symop op, int a, int b, fl_err *e);
int64_t ir_sym_hint(const ir_graph *g, int x);
int ir_sym_is_const(const ir_graph *g, int x, int64_t *v);
char *ir_sym_str(const ir_graph *g, int x, char *buf, size_t n);
/* vals[i] = expression i for these variable values. */
int ir_sym_eval(const ir_graph *g, const int64_t *vars, int64_t *vals, fl_err *e);
/* vars[k] = the size of variable k in these input metas (one per graph
** input); returns how many dims were read. */
int ir_sym_vars(const ir_graph *g, const fl_meta *const *in, int64_t *vars);
/* Rewrite every symbolic attribute slot for these inputs' sizes. */
int ir_sym_bind(const ir_graph *g, const fl_meta *const *in, fl_err *e);
/* The expression of node x's element count (the product of its dims). */
int ir_sym_numel(ir_graph *g, const ir_node *x, fl_err *e);
/* used[k] = 1 for every variable k expression x depends on. */
void ir_sym_uses(const ir_graph *g, int x, unsigned char *used);
/* Node id's attribute slots become asym (IR_NASYM entries); returns 1
** when any is symbolic. */
int ir_sym_set_attrs(ir_graph *g, int id, const int *asym);

/* Runs one op (ref_apply or eager_apply: graph/ knows no backend). */
typedef int (*ir_apply_fn)(fl_op op, const fl_tensor *const *in, int nin,
                           const op_attrs *a, fl_tensor *out, fl_err *e);

/* A new empty graph, owned by the caller (ir_free); NULL when out of
** memory. */
ir_graph *ir_new(void);
/* Frees g, its nodes, strings and the references its params and consts
** hold; NULL is fine. */
void ir_free(ir_graph *g);
/* A deep copy (params still shared by reference); NULL when out of memory. */
ir_graph *ir_clone(const ir_graph *g);

/* Builders: each returns the new node's id, or a negative status with e
** filled.  Strings are copied.  Param and const nodes take a new
** reference to t's storage. */
int ir_add_input(ir_graph *g, const fl_meta *m, const char *name, fl_err *e);
int ir_add_param(ir_graph *g, const fl_tensor *t, const char *name, fl_err *e);
/* Rename node id (a copy is kept, control characters escaped as \xNN). */
int ir_set_name(ir_graph *g, int id, const char *name, fl_err *e);
int ir_add_const(ir_graph *g, const fl_tensor *t, fl_err *e);
/* Is node n a constant iota: 1-d, at least 2 long, int64 or float32 (below
** 2^24), in host memory, element k holding k?  fl.arange under capture
** records one; the code generators read its elements as the index itself
** (a causal mask compares loop indices), and folding leaves ops over it
** alone so that stays possible. */
int ir_is_iota(const ir_node *n);
/* Infers the node's metadata with op_infer; `where` and `scope` may be
** NULL. */
/* Node i of g appended to h, its inputs through map (map[k]: h's node for
** g's node k); a leaf keeps its name, value, requires_grad and wrapped
** flag, an op its attributes, source position and scope.  Its id in h, or
** a negative status with e filled. */
int ir_copy_node(ir_graph *h, const ir_graph *g, int i, const int *map, fl_err *e);
int ir_add_op(ir_graph *g, fl_op op, const int *in, int nin,
              const op_attrs *a, const char *where, const char *scope,
              fl_err *e);
/* The same with attribute slots given by size expressions (asym:
** IR_NASYM entries, see ir_node), or NULL. */
int ir_add_op_sym(ir_graph *g, fl_op op, const int *in, int nin,
                  const op_attrs *a, const int *asym, const char *where,
                  const char *scope, fl_err *e);
int ir_add_output(ir_graph *g, int id, fl_err *e);
/* A write-back: node src becomes the last output, and every run of the
** graph copies it into leaf dst (an IR_INPUT: the caller's tensor; an
** IR_PARAM: the bound storage) after computing all outputs.  Results
** are added first: write-backs stay the last outputs. */
int ir_add_writeback(ir_graph *g, int src, int dst, fl_err *e);
/* Apply g's write-backs after a run: outs holds all g->nout outputs,
** inputs the run's inputs.  A result sharing storage with a written
** leaf is copied first (it was computed before the write).  copy(ctx,
** dst, src) is the backend's copy (NULL: ten_copy, host memory). */
typedef int (*ir_copy_fn)(void *ctx, fl_tensor *dst, const fl_tensor *src, fl_err *e);
int ir_writeback(const ir_graph *g, const fl_tensor *const *inputs, fl_tensor *outs,
                 ir_copy_fn copy, void *ctx, fl_err *e);

/* Number of IR_OP nodes. */
int ir_op_count(const ir_graph *g);
/* uses[i] = how many times node i is read (by ops and as an output);
** uses must hold g->n ints. */
void ir_count_uses(const ir_graph *g, int *uses);

/* "float32[8,128]" (symbolic dims as s0) into buf; returns buf. */
char *ir_type_str(const ir_graph *g, int id, char *buf, size_t n);
/* The readable listing, one node per line:
**   %5 = add(%3, %4) : float32[8,128]    # model.lua:12
** Returned string is malloc'd and owned by the caller; NULL when out of
** memory. */
char *ir_listing(const ir_graph *g);

/* A fingerprint of g's structure: ops, attributes, edges, types, constant
** values, and which storage each param is bound to.  Equal fingerprints
** mean the same computation on the same weights (cache keys).  hex gets
** 32 hex digits and a NUL. */
void ir_fingerprint(const ir_graph *g, char hex[33]);

/* metas[i] = node i's metadata for these inputs (one per graph input):
** each input is checked against its node (dtype, rank, and the size of
** every dim that is not symbolic), then every op's shape rule runs; all
** values are placed on dev.  The message names the input that differs. */
int ir_infer_metas(const ir_graph *g, const fl_tensor *const *in, fl_device dev,
                   fl_meta *metas, fl_err *e);

/* Evaluate g on concrete inputs with apply (ref_apply for the oracle,
** eager_apply for speed).  outs must hold g->nout tensors; on success
** each is a new reference the caller releases.  Intermediates are freed
** after their last use. */
int ir_run(const ir_graph *g, ir_apply_fn apply, const fl_tensor *const *inputs,
           int ninputs, fl_tensor *outs, fl_err *e);

#endif
