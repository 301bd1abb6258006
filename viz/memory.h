/*
** memory.h -- the memory picture: bytes of op results alive at each step
** of a schedule, the captured graph op by op against the fused plan's
** kernels, as two step curves; each peak marked and labelled with its
** bytes and the buffers alive there (fuse/memtrace.h counts them).
** Drawn as the roofline is (viz/chart.h: pinned nodes, neato -n), sized
** for a 1920-pixel projector: the PNG is about 1850 pixels wide and its
** smallest text 15 points (20 pixels); scale > 1 makes the type larger.
*/
#ifndef FL_VIZ_MEMORY_H
#define FL_VIZ_MEMORY_H

#include <stddef.h>

#include "fuse/memtrace.h"

typedef struct viz_mem_chart {
  const fuse_mem_trace *t;
  const char *title;        /* NULL: "Memory alive at each step" */
  const char *note;         /* a line under the chart, or NULL */
  double scale;             /* 1; VIZ_SCALE_PROJECTOR for a room */
} viz_mem_chart;

/* The chart in format ("svg", "png", "pdf", "dot") into *out (malloc'd;
** the caller frees it).  Messages start "draw_memory: ". */
int viz_mem_render_mem(const viz_mem_chart *c, const char *format, char **out, size_t *len,
                       fl_err *e);
/* The chart into path, the format from its extension (as fl.draw). */
int viz_mem_render_file(const viz_mem_chart *c, const char *path, fl_err *e);

#endif
