/*
** memtrace.h -- bytes alive at each step: the two peaks of p:stats()
** (peak_bytes_before, peak_bytes_after) as the curves they are the tops
** of.  "Op by op" steps through the captured graph one op at a time, as
** eager runs it; "fused" steps through the plan's kernels in run order.
** Both count as the planner's peaks count (fuse/memplan.c): an op result
** lives from its kernel until its last reader has run, outputs to the
** end, views cost nothing.  fl.draw_memory, p:memory(), the REPL's
** :memory and the report's Memory section all read one trace.
*/
#ifndef FL_FUSE_MEMTRACE_H
#define FL_FUSE_MEMTRACE_H

#include "plan.h"

typedef struct fuse_mem_step {
  char name[128];       /* "k3 fused_add_relu_4096" or "%12 add" */
  int id;               /* the kernel's index (fused) or the op's node id */
  int64_t bytes;        /* op results alive while it runs */
} fuse_mem_step;

typedef struct fuse_mem_buf {
  int id;               /* node id in the curve's graph (%N) */
  char name[64];        /* its op: "conv2d" */
  const char *scope;    /* its module path ("layer1.0.conv1"), or NULL; borrowed
                           from the graph */
  int64_t bytes;
} fuse_mem_buf;

typedef struct fuse_mem_curve {
  const ir_graph *g;    /* the graph the ids name (borrowed) */
  fuse_mem_step *steps;
  int n;
  int64_t peak;         /* the most bytes alive at once */
  int peak_at;          /* the first step that reaches it; -1 when no step */
  fuse_mem_buf *bufs;   /* alive at the peak, largest first; their bytes sum
                           to peak */
  int nbufs;
} fuse_mem_curve;

typedef struct fuse_mem_trace {
  fuse_mem_curve before, after;
  /* 1: the captured graph was not at hand (a plan of g:decompose() whose
  ** g is gone), so "before" is the planned graph run op by op, and its
  ** peak may differ from p:stats().peak_bytes_before */
  int before_own;
} fuse_mem_trace;

/* The trace of p.  captured: the graph p's "before" was counted from
** (p->g->origin), or NULL; used only when its op-by-op cost is the one
** recorded, else (or when p->g was never derived) p->g is stepped.
** FL_ENOMEM with e filled when out of memory; t is then empty. */
int fuse_mem_trace_build(const fuse_plan *p, const ir_graph *captured, fuse_mem_trace *t,
                         fl_err *e);
void fuse_mem_trace_free(fuse_mem_trace *t);

/* The trace as text: each peak, where and the buffers alive there, then
** per-step tables: every step when a side has at most `rows` steps, else
** the steps near each peak.  malloc'd; NULL when out of memory. */
char *fuse_mem_text(const fuse_mem_trace *t, int rows);

/* "%7 add (blocks.0.attn), 512 KiB" for the largest `most` buffers alive at
** the curve's peak, then "and N more" (the picture's labels). */
void fuse_mem_bufs_str(const fuse_mem_curve *c, int most, char *buf, size_t n);

/* --- the peak's rules one step at a time (fuse/memplan.c) -------------- */
int fuse_mem_op_source(const ir_graph *g, int id, int in);
int fuse_mem_first_read(const ir_graph *g, int id, int in);

#endif
