/*
** plan.h -- pictures and reports of a fusion plan: turns a fuse_plan into
** the stages draw.h draws (kernels as clusters, what is stored, the plan's
** own numbers on the title line) and into the summary, kernel and decision
** sections of a review report.  Reads the plan, changes nothing in it.
*/
#ifndef FL_VIZ_PLAN_H
#define FL_VIZ_PLAN_H

#include "fuse/plan.h"
#include "viz/draw.h"
#include "viz/report.h"

/* A plan as a stage; owns the kernel array st points to and borrows the
** plan (keep it alive while drawing). */
typedef struct viz_plan_stage {
  viz_stage st;
  viz_kernel *kernels;
  int *ids;               /* every kernel's nodes, then every kernel's views */
} viz_plan_stage;

/* Fills ps from p: one viz_kernel per plan kernel (its nodes from
** p->kernel_of, so an extern kernel's anchor is one; the views only it
** reads through; bytes read and written from its buffers; times_ms[k]
** when given, else not measured), the plan's stored flags and its
** "after" numbers. */
int viz_plan_stage_init(viz_plan_stage *ps, const fuse_plan *p,
                        const double *times_ms, fl_err *e);
void viz_plan_stage_free(viz_plan_stage *ps);

/* The plan's graph as it runs unfused, with the plan's "before" numbers
** (borrows p). */
void viz_plan_baseline(viz_stage *st, const fuse_plan *p);

int viz_draw_plan(const fuse_plan *p, const char *path, const viz_opts *o,
                  fl_err *e);
/* The graph before fusion and the plan after it, side by side. */
int viz_draw_plan_compare(const fuse_plan *p, const char *path,
                          const viz_opts *o, fl_err *e);

/* The strings, rows and pictures a report made from a plan points into. */
typedef struct viz_plan_report {
  viz_plan_stage after;
  viz_stage before;
  viz_kernel_row *rows;
  viz_decision_row *dec;
  char (*names)[96];             /* 2 per decision: producer, consumer */
  viz_kv summary[7];
  char values[7][320];
  char before_label[160], after_label[160];
  char *before_svg, *after_svg;
} viz_plan_report;

/* Fills r's summary, graphs, kernels and decisions from p, leaving r's
** other fields as they are (code, guards, timings come from elsewhere).
** times_ms, when given, holds 2 x nkernels times: per call, then per
** launch (the roofline's).  layouts, when given, is the stage collected
** from p's program: the picture shows its blocked values.
** r points into pr until viz_plan_report_free(pr). */
int viz_plan_report_fill(viz_report *r, viz_plan_report *pr, const fuse_plan *p,
                         const double *times_ms, const viz_stage *layouts, const viz_opts *o,
                         fl_err *e);
void viz_plan_report_free(viz_plan_report *pr);

#endif
