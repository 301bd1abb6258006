/*
** chart.h -- what fuselab's charts share (the roofline, the memory
** picture): a Graphviz graph whose every node is pinned where it belongs
** (pos="x,y!", in points) and laid out by the no-op engine (neato -n), so
** the .dot file renders the same picture.  Text, invisible anchors and
** straight lines as nodes and edges; rendering to a format in memory and
** to a file named by its extension, as fl.draw does.
*/
#ifndef FL_VIZ_CHART_H
#define FL_VIZ_CHART_H

#include <stddef.h>

#include "graph/err.h"
#include "graph/strbuf.h"

#define VIZ_CHART_FONT "Helvetica,Arial,sans-serif"

/* The DOT text being written and the next node's number (n<k>). */
typedef struct viz_chart {
  strbuf b;
  int nodes;
} viz_chart;

/* A DOT string's body: quotes and backslashes escaped, cut at max
** characters with an ellipsis. */
void viz_chart_esc(strbuf *b, const char *s, size_t max);
/* The same for a Graphviz HTML label. */
void viz_chart_html(strbuf *b, const char *s, size_t max);
/* Rough width in points of n characters at fs points in Helvetica. */
double viz_chart_text_w(size_t n, double fs);
/* Characters (not bytes) of a UTF-8 string. */
size_t viz_chart_utf8_len(const char *s);

/* A text node centred at x, y; returns its number. */
int viz_chart_text(viz_chart *c, double x, double y, double fs, const char *color,
                   const char *s, size_t max);
/* A text node whose left edge is at x. */
int viz_chart_text_left(viz_chart *c, double x, double y, double fs, const char *color,
                        const char *s, size_t max);
/* An invisible point: the end of a line. */
int viz_chart_anchor(viz_chart *c, double x, double y);
/* A straight line; style NULL or "dashed". */
void viz_chart_line(viz_chart *c, double x0, double y0, double x1, double y1, const char *color,
                    double width, const char *style);

/* Checks format: "svg", "png", "pdf" or "dot" (what: the caller's name in
** the message). */
int viz_chart_format_ok(const char *format, const char *what, fl_err *e);
/* src (freed here) rendered in format ("dot": src itself) into *out
** (malloc'd, NUL-terminated).  Messages start "<what>: ". */
int viz_chart_render(char *src, const char *format, const char *what, char **out, size_t *len,
                     fl_err *e);

/* Renders a chart in a format into memory (the chart's own function). */
typedef int (*viz_chart_render_fn)(const void *chart, const char *format, char **out,
                                   size_t *len, fl_err *e);
/* The chart into path, the format from its extension; path is created
** first (a path that cannot be written fails before the layout) and
** replaced whole (graph/file.h). */
int viz_chart_write(const char *path, const char *what, viz_chart_render_fn render,
                    const void *chart, fl_err *e);

#endif
