/*
** report.h -- the review report: ONE self-contained HTML file (inline SVG,
** CSS and a small pan/zoom script; nothing fetched from anywhere) that an
** engineer takes to a design review and prints to PDF.
**
** The caller fills a viz_report with what it knows (a compiled function
** knows more than a plan); every section is optional except the title, and
** a section with nothing in it says so.  All strings are borrowed for the
** call and escaped on output; SVG text is trusted to come from
** viz_render_mem (Graphviz escapes the labels inside it).
*/
#ifndef FL_VIZ_REPORT_H
#define FL_VIZ_REPORT_H

#include <stdint.h>

#include "viz/draw.h"

typedef struct viz_kv {
  const char *key;
  const char *value;
} viz_kv;

typedef struct viz_kernel_row {
  const char *name;
  const char *kind;          /* "pointwise", "reduce", "extern", or NULL */
  int nodes;                 /* graph nodes it computes */
  int64_t bytes_read, bytes_written;
  double time_ms;            /* < 0: not measured */
  int64_t flops;             /* the cost model's floating-point operations */
  double launch_ms;          /* per launch (a kernel computed from weights once
                                runs once in many calls), for the roofline;
                                <= 0: not measured */
} viz_kernel_row;

typedef struct viz_decision_row {
  const char *a, *b;         /* what was considered for fusing */
  int fused;                 /* 1 fused, 0 kept apart */
  const char *reason;
  int64_t bytes_saved;
} viz_decision_row;

typedef struct viz_break_row {
  const char *reason;
  const char *hint;          /* how to avoid it, or NULL */
  const char *where;         /* "file:line", or NULL */
} viz_break_row;

typedef struct viz_check_row {
  const char *item;          /* "operator coverage" */
  const char *value;         /* "41/42 (var unsupported)" */
  int verdict;               /* 1 good, 0 neutral, -1 a concern */
} viz_check_row;

/* One step of the pass stepper: a stage's listing (the text print(g)
** gives; each listing is on the page once) and what the step changed, as
** line numbers (1-based) from fl._graph_diff, so a big graph costs its
** listings and not a copy per step. */
enum { VIZ_LINE_SAME = 0, VIZ_LINE_ADDED = '+', VIZ_LINE_CHANGED = '~' };

typedef struct viz_step {
  const char *name;          /* "decompose", "graph 2: optimize" */
  const char *summary;       /* the one line: "optimize: 53 nodes removed, ..." */
  const char *const *notes;  /* lines under it (what optimize's log says it did), or NULL */
  int nnotes;
  const char *listing;       /* the stage's text, or NULL: see ref */
  const char *ref;           /* NULL, or the id of a section holding the stage's text
                                (the generated code is on the page once) */
  const char *mark;          /* per listing line: VIZ_LINE_*; NULL: nothing marked */
  int nmark;
  int prev;                  /* the step (0-based) whose listing the lines below refer
                                to, or -1 */
  const int *gone;           /* pairs: a removed line of prev's listing, the line of this
                                listing it shows after */
  int ngone;
  const int *was;            /* pairs: a changed line here, its line in prev's listing */
  int nwas;
  int added, removed, changed;   /* the counts fl._graph_diff gives; -1: not a graph pass */
} viz_step;

typedef struct viz_report {
  const char *title;               /* required */
  const char *subtitle;            /* what was compiled, when; or NULL */
  const viz_kv *summary;           /* headline numbers */
  int nsummary;
  const char *before_svg;          /* from viz_render_mem(..., "svg"), or NULL */
  const char *memory_svg;          /* bytes alive at each step (viz/memory.h), or NULL */
  const char *memory_label;
  const char *before_label;        /* "captured: 42 kernels ..." */
  const char *after_svg;
  const char *after_label;
  const viz_kernel_row *kernels;
  int nkernels;
  /* this machine's peaks (exec/roofline.h), or NULL: the kernel table then
  ** has no roofline columns */
  const struct roof_peaks *peaks;
  const viz_decision_row *decisions;
  int ndecisions;
  const char *code;                /* generated source, or NULL */
  const char *code_lang;           /* "C", "CUDA" */
  const char *const *guards;
  int nguards;
  const char *const *recompiles;   /* "x.shape[2]: expected 128, got 256" */
  int nrecompiles;
  const viz_break_row *breaks;
  int nbreaks;
  /* timings in milliseconds; < 0 when not measured */
  double cold_ms;                  /* first call: capture + compile + run */
  double warm_ms;                  /* second call */
  double steady_ms;                /* median of later calls */
  double eager_ms;                 /* the same work uncompiled */
  const char *cold_label;          /* the first row's name: "first call: warm (kernels from
                                      the disk cache)" or cold; NULL: the cold wording */
  const char *timing_notes[4];     /* beside cold, warm, steady, eager: spread, runs, where
                                      measured; NULL for none */
  const char *verdict;             /* steady against eager with a margin above the noise;
                                      NULL: the plain ratio */
  const char *break_even;          /* the page's one break-even sentence; NULL: computed from
                                      cold, steady, eager */
  const viz_check_row *checklist;  /* go-live checklist, or NULL */
  int nchecklist;
  const char *recommendation;      /* the checklist's conclusion */
  const viz_step *steps;           /* the pass stepper: capture, each pass, fusion, code */
  int nsteps;
} viz_report;

/* Zeroes r and marks every timing as not measured. */
void viz_report_init(viz_report *r);

/* The report as one HTML document; the caller frees the result.  NULL on
** failure with e filled. */
char *viz_report_html(const viz_report *r, fl_err *e);

/* Writes the report to path (FL_EIO naming the path and reason when it
** cannot be written). */
int viz_report_write(const viz_report *r, const char *path, fl_err *e);

/* A stage as SVG text for before_svg/after_svg; the caller frees *svg. */
int viz_stage_svg(const viz_stage *st, const viz_opts *o, char **svg, fl_err *e);

#endif
