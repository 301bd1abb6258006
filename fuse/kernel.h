/*
** kernel.h -- the backend-neutral kernel description: what the fusion
** planner hands to the C generator (cpu/codegen.c) and to the CUDA one.
**
** A kernel iterates over one N-d space, the shape of its seed node with
** the dims put in order "kept dims, then reduced dims".  Every value the
** kernel touches is indexed by an affine map from that space: views,
** transposes, broadcasts, expand and narrow are folded into these maps, so
** they cost no copy.  The body is a short SSA list of steps (fk_instr):
** loads, constants, op-table expressions, and row accumulators.  A step is
** FULL when it varies along the reduced dims (it runs inside the inner
** loops) and a row value otherwise.
**
** Sizes are never baked in: at launch, fk_bind re-derives the maps from the
** real shapes and passes sizes, strides and offsets as kernel arguments, so
** one compiled kernel serves every size with the same structure.
*/
#ifndef FL_KERNEL_H
#define FL_KERNEL_H

#include "../graph/ir.h"

typedef enum fk_kind {
  FK_POINTWISE,   /* a loop nest over the space, one element per iteration */
  FK_REDUCE,      /* rows (kept dims) x reduced dims: accumulate, then store */
  FK_EXTERN       /* anchor op run by an existing kernel (sgemm, conv, eager),
                     then an optional pointwise epilogue over its result */
} fk_kind;

typedef enum fk_opc {
  FKI_LOAD,       /* element of a buffer at one access */
  FKI_CONST,      /* a literal (scalar graph constants, eps, 0) */
  FKI_NRED,       /* number of elements in the reduced space (a runtime size) */
  FKI_ELEM,       /* the op table's `expr` over 1..3 earlier steps */
  FKI_REDUCE,     /* accumulate a step over the reduced dims: a row value */
  FKI_CTR         /* a random node's element index at one access (fl_i64):
                     with the kernel's key and that access's start block,
                     its position in the Philox stream (graph/rng.h) */
} fk_opc;

typedef enum fk_red { FKR_SUM, FKR_MAX, FKR_MIN, FKR_ARGMAX } fk_red;

typedef struct fk_instr {
  fk_opc opc;
  int full;            /* 1: varies along the reduced dims */
  fl_dtype dtype;      /* element type of the value (rounding, bool 0/1) */
  fl_op op;            /* FKI_ELEM: the op-table row whose expr is used */
  op_attrs attrs;      /* FKI_ELEM: $f0 $f1 come from here */
  int narg;            /* FKI_ELEM, FKI_REDUCE: number of args */
  int arg[3];          /* indices of earlier steps */
  fk_red red;          /* FKI_REDUCE: which accumulator */
  int stage;           /* FKI_REDUCE: 1-based pass over the reduced dims;
                          other steps: last stage they depend on (0 = none) */
  int access;          /* FKI_LOAD, FKI_CTR: index into fk_kernel.acc */
  double value;        /* FKI_CONST */
  int64_t ivalue;      /* FKI_CONST of dtype int64: its exact value */
  int node;            /* graph node this step computes, -1 for the inner
                          steps of a composite (softmax's max, ...) */
} fk_instr;

/* One strided access to a buffer: a load or a store.  Its strides are
** computed at launch; `inner` records what the plan saw for the innermost
** kernel dim so a generator can emit a unit-stride fast path. */
typedef struct fk_access {
  int node;            /* graph node whose buffer this is */
  int buf;             /* slot in fk_kernel.bufs */
  int store;           /* 0 load, 1 store */
  int value;           /* store: the step stored */
  int full;            /* varies along reduced dims (loads and stores) */
  int inner;           /* innermost stride seen by the plan: 1, 0, or -1 */
  int via_node, via_in;/* load: the edge (consumer node, input index) it was
                          derived from, replayed by fk_bind */
  int iota;            /* load of a constant iota (element k holds k, int64
                          or float32): the generators emit the index
                          itself, no memory read -- a mask built from
                          fl.arange compares loop indices */
  int rng;             /* 1: no buffer (buf -1): the element index of random
                          node `node`, strides as if it were stored
                          contiguously; its start block is a launch argument */
} fk_access;

typedef struct fk_kernel {
  fk_kind kind;
  char name[112];      /* e.g. fused_sub_exp_sum_div_4096x1024 */
  int nnodes;          /* graph nodes computed here, id order */
  int *nodes;
  int nviews;          /* view nodes folded into this kernel's indexing */
  int *views;
  int anchor;          /* FK_EXTERN: the op run externally, else -1 */
  int seed;            /* node whose shape is the iteration space */
  int nkept, nred;     /* space rank = nkept + nred */
  int perm[FL_MAX_DIMS];  /* kernel dim k is seed dim perm[k] */
  int nbufs, nin;      /* bufs[0..nin) are read, bufs[nin..nbufs) written */
  int *bufs;           /* graph node ids */
  int ninstr;
  fk_instr *instr;
  int nacc;
  fk_access *acc;
  int nrng;            /* accesses with rng set (random nodes computed here) */
  int64_t bytes;       /* cost model: bytes read + written (plan's sizes) */
} fk_kernel;

/* --- maps: node coordinates as affine functions of kernel coordinates -- */

typedef struct fk_map {
  int known;
  int lin;                                 /* 1: row 0 is the linear index
                                              into a contiguous buffer (a
                                              reshape the coordinates cannot
                                              follow; loads only) */
  int nd;                                  /* rank of the node */
  int64_t A[FL_MAX_DIMS][FL_MAX_DIMS];     /* coord[j] = sum_k A[j][k] c_k + b[j] */
  int64_t b[FL_MAX_DIMS];
} fk_map;

/* The context a map derivation works in: graph, the shapes it uses (the
** plan's or a launch's), the nodes computed in the kernel and its space. */
typedef struct fk_space {
  const ir_graph *g;
  const fl_meta *metas;    /* one per graph node */
  const char *member;      /* member[id]: 1 when computed in the kernel */
  const char *buffer;      /* buffer[id]: 1 when it lives in memory (a view
                              materialized elsewhere stops the walk), or NULL */
  int anchor;              /* extern result read as a buffer, or -1 */
  int seed, nkept, nred;
  int perm[FL_MAX_DIMS];
  int64_t size[FL_MAX_DIMS];  /* kernel dim sizes */
  fk_map *maps;            /* one per graph node, filled for members */
  char why[256];           /* why a derivation failed */
} fk_space;

/* Derive a map for every member from the seed (identity on the permuted
** dims), through elementwise broadcasting, views, reductions and
** composites, down to inputs and up to consumers.  0 on success, else -1
** with sp->why explaining the conflict. */
int fk_assign(fk_space *sp);
/* Map of input `in` of member `node` after the views between them, and
** the node the chain ends at (a member or a buffer).  -1 on failure. */
int fk_edge_map(fk_space *sp, int node, int in, fk_map *out, int *src);
/* True when node m is a view that the kernel folds into indexing. */
int fk_is_view(const ir_graph *g, int id);
/* Strides over the kernel dims and offset of a map into a contiguous
** buffer of shape meta. */
void fk_map_strides(const fk_space *sp, const fk_map *m, const fl_meta *meta,
                    int64_t *stride, int64_t *offset);

/* --- launch ------------------------------------------------------------ */

/* Number of int64 arguments a kernel takes: sizes, then per access its
** strides and offset, then (a kernel computing random nodes) the Philox
** key and, per rng access in access order, its start block.  fk_bind
** leaves those last ones 0: a program fills them at every run
** (fk_rng_args), since every run draws anew. */
static inline int fk_nargs(const fk_kernel *k) {
  int d = k->nkept + k->nred;
  return d + k->nacc * (d + 1) + (k->nrng ? 1 + k->nrng : 0);
}
/* Index of the key argument (the start blocks follow). */
static inline int fk_rng_arg(const fk_kernel *k) {
  int d = k->nkept + k->nred;
  return d + k->nacc * (d + 1);
}
/* Write the key and start blocks into args (fk_nargs entries, bound):
** start[id] is the block node id's draw begins at in this run. */
void fk_rng_args(const fk_kernel *k, uint64_t key, const uint64_t *start,
                 int64_t *args);
/* Fill args (fk_nargs entries) for the shapes in metas: re-derive the maps,
** compute strides, merge adjacent dims wherever every access allows (so a
** contiguous elementwise kernel runs as one flat loop).  FL_EUNSUPPORTED
** when these shapes do not fit the kernel's structure. */
int fk_bind(const fk_kernel *k, const ir_graph *g, const fl_meta *metas,
            int64_t *args, fl_err *e);

/* The arguments of a kernel whose sizes cannot change: those before the
** random ones (sizes, strides, offsets).  A graph without symbolic sizes
** runs only on its own shapes (a guard or the input check stops others),
** so fk_bind gives the same values every call and the source may hold
** them as constants. */
static inline int fk_static_nargs(const fk_kernel *k) {
  return k->nrng ? fk_rng_arg(k) : fk_nargs(k);
}
/* Fill args with them (room for fk_nargs) and return how many
** (fk_static_nargs); 0 when the graph has symbolic sizes or they cannot
** be computed (out of memory), and the kernel then takes them all. */
int fk_static_args(const fk_kernel *k, const ir_graph *g, int64_t *args);

/* Build the kernel for a group: members are the nodes computed in it (id
** order not required), anchor the extern op or -1, stored[id] marks values
** needed outside it.  0 on success; else -1 with `why` saying what makes
** the group illegal (iteration spaces that disagree, a value that would be
** needed at two indexings, an op with no lowering).  k owns what it holds
** afterwards (fk_kernel_clear). */
int fk_build(fk_kernel *k, const ir_graph *g, const int *members, int nm,
             int anchor, const char *stored, char *why, size_t nwhy);

/* Fill k->name from its ops and the seed's shape (symbolic dims as s0). */
void fk_name(fk_kernel *k, const ir_graph *g);
/* Frees what k owns (not k itself); NULL is fine. */
void fk_kernel_clear(fk_kernel *k);

/* Short description of a node for decisions and listings, e.g.
** "sum over dim 2", "softmax over dim 1", "matmul". */
void fk_describe(const ir_graph *g, int id, char *buf, size_t n);

#endif
