/*
** pipeline.h -- the one compile pipeline: a graph decomposed and optimized
** (the passes a class steps through by hand), fused into a plan, generated
** for a backend and compiled through the cache.  fl.compile's graphs, the
** halves of its training pairs, eager ops on the device and the op-by-op
** fallback of a device graph all get their programs here; running them is
** exec_program_run, the same for every backend (its run hook: CUDA graphs).
*/
#ifndef FL_EXEC_PIPELINE_H
#define FL_EXEC_PIPELINE_H

#include "program.h"

typedef struct exec_pipeline_opts {
  const exec_backend *be;
  int passes;            /* decompose and optimize first; 0: the graph as given */
  int fuse;              /* 0: one kernel per op (the unfused plan) */
} exec_pipeline_opts;

enum { EXEC_STAGE_PASSES, EXEC_STAGE_FUSE, EXEC_STAGE_GENERATE, EXEC_STAGE_COMPILE, EXEC_NSTAGES };
extern const char *const exec_stage_names[EXEC_NSTAGES];   /* "decompose + optimize", ... */

/* What a build made, every stage kept for pictures and debug folders. */
typedef struct exec_pipeline {
  ir_graph *decomposed;  /* with passes: the graphs after each (owned) */
  ir_graph *optimized;
  char *log;             /* what optimize did (malloc'd), or NULL */
  fuse_plan *plan;       /* owned */
  exec_program *pr;      /* owned: generated; compiled when compile_rc is FL_OK */
  int compile_rc;        /* FL_OK, or why compiling failed (compile_err says) */
  fl_err compile_err;
  double ms[EXEC_NSTAGES];
} exec_pipeline;

/* Build g (unchanged) into *out as o says.  A failure of the passes, the
** planner or the generator (FL_EUNSUPPORTED: a backend that cannot lower
** an op) is returned, *out cleared; a failure of the compiler is not: the
** program is there, uncompiled, with compile_rc and compile_err (a caller
** falls back to the eager kernels and shows the log). */
int exec_pipeline_build(const ir_graph *g, const exec_pipeline_opts *o, exec_pipeline *out,
                        fl_err *e);
/* Drop what *p still owns (each field a caller took is set to NULL). */
void exec_pipeline_clear(exec_pipeline *p);

#endif
