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
*/
#ifndef FL_PLAN_H
#define FL_PLAN_H

#include "kernel.h"

typedef struct fuse_opts {
  int fuse;          /* 1 (default): fuse; 0: one kernel per op node, the
                        unfused baseline (views still fold into indexing) */
  int max_nodes;     /* most ops in one kernel (default 64) */
  int explain;       /* bindings print the decisions when set */
} fuse_opts;

/* One candidate pair and what became of it. */
typedef struct fuse_decision {
  int a, b;          /* producer (or first sibling) and consumer node ids */
  int fused;         /* 1 when a and b run in one kernel */
  int horizontal;    /* 1 for sibling reductions over the same input */
  int64_t bytes_saved; /* traffic the fusion saves (0 when refused) */
  char reason[480];  /* "fused %3 (exp) with %4 (sum over dim 1): ..." or
                        "cannot fuse %7 (sum over dim 2) with %9 (matmul):
                        matmul is not an epilogue" */
} fuse_decision;

/* Cost model and memory plan, before (unfused) and after (this plan).
** bytes: every kernel's bytes read + written (a buffer read through a
** broadcast counts once).  buffers: intermediate and output buffers;
** before = one per op, after = slots of the memory planner (a slot is
** reused once the buffer in it is dead) plus the outputs.  peak: before =
** most bytes alive at once when each buffer is freed after its last use
** (what eager does); after = the planner's slots plus the outputs. */
typedef struct fuse_stats {
  int kernels;               /* kernels in this plan */
  int nodes;                 /* op nodes of the graph */
  int64_t bytes_before, bytes_after;
  int buffers_before, buffers_after;
  int64_t peak_bytes_before, peak_bytes_after;
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
  int ndec;
  fuse_decision *dec;
  fuse_stats stats;
} fuse_plan;

void fuse_opts_default(fuse_opts *o);

/* Plan g (which the plan copies; the caller keeps g).  Returns a plan the
** caller owns (fuse_plan_free), or NULL with e filled.  o may be NULL for
** the defaults. */
fuse_plan *fuse_plan_build(const ir_graph *g, const fuse_opts *o, fl_err *e);
/* Another owner of p (a program built from it takes one). */
fuse_plan *fuse_plan_ref(fuse_plan *p);
/* Drops one reference; frees at the last.  NULL is fine. */
void fuse_plan_free(fuse_plan *p);

/* Readable listing: kernels with their nodes, reads, writes and traffic,
** then (decisions != 0) every decision, then the stats.  malloc'd, owned
** by the caller; NULL when out of memory. */
char *fuse_plan_listing(const fuse_plan *p, int decisions);

/* Fills the stats, kernel bytes, last uses and slots (memplan.c); the
** planner calls it, baseline is the unfused plan of the same graph. */
void fuse_plan_measure(fuse_plan *p, const fuse_plan *baseline);

#endif
