/*
** roofline.h -- the roofline chart: log-log, arithmetic intensity
** (flop/byte) across, GFLOP/s up; the bandwidth roof's slope and the
** product peak's flat roof, each labelled with its measured value; one
** point per kernel, labelled with its name.  Drawn with Graphviz like
** every fuselab picture: each mark is a node pinned where it belongs and
** laid out by neato's no-op mode (`neato -n`), so the .dot file renders
** the same picture.  Sized for a 1920-pixel projector: the PNG is about
** 1850 pixels wide and its smallest text (15 points) 20 pixels.
** Knows nothing of programs or measurements: the caller fills a chart.
*/
#ifndef FL_VIZ_ROOFLINE_H
#define FL_VIZ_ROOFLINE_H

#include <stddef.h>

#include "graph/err.h"

typedef struct viz_roof_point {
  const char *name;         /* the kernel's name: "k3 fused_mul_add_4096" */
  double intensity;         /* flop/byte; <= 0: no flops (listed below the chart) */
  double gflops;            /* achieved */
  double gbps;              /* achieved bandwidth (for the kernels with no flops) */
  double roof_pct;          /* achieved / the roof over it, x 100 */
  int compute_bound;        /* right of the ridge point */
} viz_roof_point;

typedef struct viz_roof_chart {
  const char *cpu;          /* "AMD EPYC": in the title */
  int threads;
  double copy_gbs;          /* the bandwidth roof, GB/s */
  double product_gflops;    /* the flat roof, GFLOP/s */
  const char *product_path; /* "oneDNN brg:avx512_core", or NULL */
  const char *subtitle;     /* a line under the title, or NULL */
  const char *note;         /* a line under the chart, or NULL */
  const viz_roof_point *pts;
  int npts;
} viz_roof_chart;

/* The chart in format ("svg", "png", "pdf", "dot") into *out (malloc'd,
** NUL-terminated; the caller frees it). */
int viz_roof_render_mem(const viz_roof_chart *c, const char *format, char **out, size_t *len,
                        fl_err *e);
/* The chart into path, the format from its extension (as fl.draw);
** replaces path whole (graph/file.h).  Messages start "draw_roofline: ". */
int viz_roof_render_file(const viz_roof_chart *c, const char *path, fl_err *e);

#endif
