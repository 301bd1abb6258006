/*
** plan.h -- the fusion planner: which graph nodes run together in one
** kernel, why, and what that saves (TVM's FuseOps + Inductor's scheduler,
** small enough to read).
**
** Nodes are classified by their op-table kind; candidate pairs (a producer
** and its consumer, or two sibling reductions over one input) are scored
** by the bytes of memory traffic fusing them saves, tried best first (ties
** by program order), and merged when legal: no cycle between kernels, one
** iteration space every member can be indexed from, at most one reduced
** space per kernel, at most max_nodes ops.  Views never become kernels:
** they are folded into the indexing of the kernel that reads them.
** Memory is part of the objective: kernels run in the order that peaks
** lowest, and a plan that would need more memory at its peak than the
** captured graph op by op takes fusions back (fuse_decision.memory).
*/
#ifndef FL_PLAN_H
#define FL_PLAN_H

#include "kernel.h"

typedef struct fuse_opts {
  int fuse;          /* 1 (default): fuse; 0: one kernel per op node, the
                        unfused baseline (views still fold into indexing) */
  int max_nodes;     /* most ops in one kernel (default 64) */
  int explain;       /* bindings print the decisions when set */
  int cat_in_place;  /* 1: concatenations written in place by their inputs'
                        kernels (plan_into; the CPU's programs); 0 (default) */
} fuse_opts;

/* One candidate pair and what became of it. */
typedef struct fuse_decision {
  int a, b;          /* producer (or first sibling) and consumer node ids */
  int fused;         /* 1 when a and b run in one kernel */
  int memory;        /* 1 when refused because the plan with it would move
                        more bytes or need more memory at its peak */
  int horizontal;    /* 1 for sibling reductions over the same input */
  int64_t bytes_saved; /* traffic the fusion saves (0 when refused) */
  char reason[480];  /* "fused %3 (exp) with %4 (sum over dim 1): ..." or
                        "cannot fuse %7 (sum over dim 2) with %9 (matmul):
                        matmul is not an epilogue" */
} fuse_decision;

/* Cost model and memory plan, before (the captured graph run op by op,
** fuse_reference_cost) and after (this plan), counted alike:
** bytes: every kernel's bytes read + written (fuse_kernel_traffic: a
** buffer read through a broadcast counts once; an extern's product an
** epilogue reads back is written and read).  buffers: intermediate and
** output buffers; before = one per op, after = slots of the memory planner
** (a slot is reused once the buffer in it is dead) plus the outputs.
** peak: most bytes of op results alive at once when each is freed after
** its last reader and outputs live to the end; after, as the plan runs
** (fuse_plan_walk): an extern's operands are freed once its library call
** has read them, an epilogue stored over its product takes no new memory,
** and kept values are held from the start. */
typedef struct fuse_stats {
  int kernels_before;        /* ops of the captured graph that are not views */
  int kernels;               /* kernels in this plan */
  int nodes;                 /* op nodes of the graph */
  int64_t bytes_before, bytes_after;
  int buffers_before, buffers_after;
  int64_t peak_bytes_before, peak_bytes_after;
  /* bytes_before - bytes_after by cause (fuse_bytes_causes):
  ** decisions: the fused pairs' bytes_saved summed; graph: the planned
  ** graph op by op, which the passes before fusion (decompose, optimize)
  ** made larger or smaller than the captured graph's bytes_before */
  int64_t bytes_decisions, bytes_graph;
  char note[480];            /* why bytes_after > bytes_before (or the peak
                                after the one before), else "" */
} fuse_stats;

typedef struct fuse_plan {
  int refs;                  /* fuse_plan_ref / fuse_plan_free */
  ir_graph *g;               /* owned copy of the planned graph */
  fuse_opts opts;
  int nkernels;
  fk_kernel *kernels;        /* in execution order */
  int *kernel_of;            /* per node: kernel computing it, or -1 */
  char *stored;              /* per node: 1 when it lives in a buffer */
  int *last_use;             /* per node: last kernel reading it, -1 none;
                                nkernels for graph outputs */
  int *slot;                 /* per node: memory-planner slot, -1 when it
                                is an input, param, output or not stored */
  int nslots;
  int64_t *slot_bytes;
  int *inplace;              /* per node: the leaf a write-back copies it
                                into, when its kernel may store it there
                                directly (the copy then has nothing to do),
                                else -1 (plan_inplace in plan.c) */
  int *alias;                /* per node: the product an extern kernel's
                                epilogue stores this value over, element
                                for element (the product's only reader:
                                one buffer for both), or the residual a
                                convolution's epilogue adds first (read
                                by nothing after it), else -1 (plan_alias) */
  int *into;                 /* per node: the concatenation whose memory it
                                is stored in, at element into_off of it
                                (its producer writes it there, the
                                concatenation copies nothing), else -1;
                                NULL when none (plan_into in plan.c) */
  int64_t *into_off;
  char *keep;                /* per kernel: 1 when all it computes comes from
                                params, consts and sizes alone: it runs once
                                and its values are kept between calls
                                (exec/program.c), memory held all along */
  char *rewrites;            /* what fuse rewrote in the graph before
                                planning (a decomposed linear re-formed),
                                ids of the graph given; NULL when nothing */
  int ndec;
  fuse_decision *dec;
  int nrefused;              /* pairs taken back for memory (plan_within_peak) */
  fuse_decision *refused;    /* with their reasons, kept across replanning */
  fuse_stats stats;
} fuse_plan;

void fuse_opts_default(fuse_opts *o);

/* Is kernel k a concatenation whose inputs were all stored in its memory
** (plan_into): nothing left for it to copy. */
int fuse_cat_in_place(const fuse_plan *p, int k);

/* The node whose memory id is stored in: id itself, or the outermost
** concatenation it is written into (plan_into). */
int fuse_home(const fuse_plan *p, int id);

/* Plan g (which the plan copies; the caller keeps g).  Returns a plan the
** caller owns (fuse_plan_free), or NULL with e filled.  o may be NULL for
** the defaults. */
fuse_plan *fuse_plan_build(const ir_graph *g, const fuse_opts *o, fl_err *e);
/* Another owner of p (a program built from it takes one). */
fuse_plan *fuse_plan_ref(fuse_plan *p);
/* Drops one reference; frees at the last.  NULL is fine. */
void fuse_plan_free(fuse_plan *p);

/* Where bytes_before - bytes_after comes from, when the fusion decisions
** alone do not add up to it: "" when they do, else one sentence naming the
** decisions' sum, the reads a fused kernel shares between its ops, and what
** the passes before fusion added (or removed).  The parts sum exactly. */
void fuse_bytes_causes(const fuse_stats *s, char *buf, size_t n);

/* Readable listing: kernels with their nodes, reads, writes and traffic,
** then (decisions != 0) every decision, then the stats.  malloc'd, owned
** by the caller; NULL when out of memory. */
char *fuse_plan_listing(const fuse_plan *p, int decisions);

/* Fills the stats, kernel bytes, last uses and slots (memplan.c); the
** planner calls it. */
void fuse_plan_measure(fuse_plan *p);

/* The memory plan's one walk of p's kernels in run order (memplan.c):
** returns the peak of bytes alive; at[k] (may be NULL) the most alive
** while kernel k runs; *peak_at the first kernel reaching the peak (-1
** when none); alive (may be NULL, per node) the bytes of each buffer alive
** at the top of kernel `stop` (-1: none).  p:stats(), the slots and the
** memory picture all count with it. */
int64_t fuse_plan_walk(const fuse_plan *p, int64_t *at, int64_t *alive, int stop, int *peak_at);

/* The plan's peak as it stands: its last uses found again, then the walk
** (-1 out of memory). */
int64_t fuse_plan_peak(fuse_plan *p);

/* --- the cost model (memplan.c): the only place bytes are counted ------ */

/* Bytes of node id's value (example sizes for symbolic dims). */
int64_t fuse_node_bytes(const ir_graph *g, int id);
/* Bytes kernel k reads (*rd) and writes (*wr) from and to memory. */
void fuse_kernel_traffic(const ir_graph *g, const fk_kernel *k, int64_t *rd, int64_t *wr);
/* Floating-point operations of node id and of kernel k (an extern step's
** product included), at the plan's sizes: the roofline's work. */
int64_t fuse_node_flops(const ir_graph *g, int id);
int64_t fuse_kernel_flops(const ir_graph *g, const fk_kernel *k);
/* g run op by op (see ir_opcost); FL_ENOMEM when out of memory. */
int fuse_graph_cost(const ir_graph *g, ir_opcost *c);
/* The "before" of a comparison: g->origin when recorded, else g's own. */
void fuse_reference_cost(const ir_graph *g, ir_opcost *c);
/* "512 B", "4 KiB", "1.5 MiB", "2.25 GiB". */
char *fuse_bytes_str(int64_t bytes, char *buf, size_t n);

#endif
