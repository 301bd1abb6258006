/*
** pipeline.c -- the one compile pipeline (see pipeline.h).
*/
#include <stdlib.h>
#include <string.h>

#include "exec/pipeline.h"
#include "exec/measure.h"
#include "fuse/plan.h"
#include "graph/pass.h"

const char *const exec_stage_names[EXEC_NSTAGES] = {
  "decompose + optimize", "fuse", "generate code", "compile (or load)"
};

void exec_pipeline_clear(exec_pipeline *p) {
  ir_free(p->decomposed);
  ir_free(p->optimized);
  free(p->log);
  fuse_plan_free(p->plan);
  exec_program_free(p->pr);
  memset(p, 0, sizeof *p);
}

/* A pass's result is compared with the graph as captured: it keeps the
** captured graph's op-by-op cost (the plan's "before"). */
static void keep_origin(const ir_graph *from, ir_graph *to) {
  if (from->origin.known) to->origin = from->origin;
  else if (fuse_graph_cost(from, &to->origin) != FL_OK) to->origin.known = 0;
}

int exec_pipeline_build(const ir_graph *g, const exec_pipeline_opts *o, exec_pipeline *out,
                        fl_err *e) {
  const ir_graph *planned = g;
  fuse_opts fo;
  double t = meas_now(), now;
  char *dlog = NULL;
  memset(out, 0, sizeof *out);
  if (o->passes) {
    if (!(out->decomposed = pass_decompose(g, &dlog, e))) goto fail;
    free(dlog);
    keep_origin(g, out->decomposed);
    if (!(out->optimized = pass_optimize(out->decomposed, &out->log, e))) goto fail;
    keep_origin(out->decomposed, out->optimized);
    planned = out->optimized;
  }
  now = meas_now();
  out->ms[EXEC_STAGE_PASSES] = (now - t) * 1e3;
  t = now;
  fuse_opts_default(&fo);
  fo.fuse = o->fuse;
  /* a CPU program's concatenations are written in place by their inputs'
  ** kernels (cpu/backend.c reconciles the layouts they chose) */
  fo.cat_in_place = o->be && o->be->dev == FL_DEV_CPU;
  if (!(out->plan = fuse_plan_build(planned, &fo, e))) goto fail;
  now = meas_now();
  out->ms[EXEC_STAGE_FUSE] = (now - t) * 1e3;
  t = now;
  if (!(out->pr = exec_codegen(o->be, out->plan, NULL, e))) goto fail;
  now = meas_now();
  out->ms[EXEC_STAGE_GENERATE] = (now - t) * 1e3;
  t = now;
  err_clear(&out->compile_err);
  out->compile_rc = exec_program_compile(out->pr, &out->compile_err);
  out->ms[EXEC_STAGE_COMPILE] = (meas_now() - t) * 1e3;
  return FL_OK;
fail:
  exec_pipeline_clear(out);
  return e->code ? e->code : FL_ENOMEM;
}
