/*
** memory.c -- the memory picture (memory.h): two step curves on linear
** axes, steps across and bytes alive up, every mark a pinned node
** (viz/chart.h).  The axes leave room above the higher curve for the two
** peak labels, each a flag on a dashed pole standing on its peak; they
** are stacked in two rows and put on whichever side of their poles keeps
** a pole from crossing the other label.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "viz/chart.h"
#include "viz/memory.h"

/* Canvas and frame in points, as the roofline's: 1390 pt is about 1850 px
** at 96 dpi, so a 1920-px projector shows it unscaled and 15-pt text is
** 20 px. */
#define CANVAS_W 1390.0
#define CANVAS_H 960.0
#define PX0 150.0
#define PX1 1330.0
#define PY0 170.0
#define PY1 790.0
#define FS_TITLE 26.0
#define FS_SUB 17.0
#define FS_AXIS 20.0
#define FS_TICK 18.0
#define FS_LABEL 16.0
#define FS_NOTE 15.0
/* the higher peak stands this far below the top of the axis */
#define HEADROOM 1.75
#define LABEL_BUFS 3
#define BEFORE_COLOR "#D55E00"   /* vermillion (Okabe-Ito, colour-blind safe) */
#define AFTER_COLOR "#0072B2"    /* blue */
#define GRID_COLOR "#d9d9d9"

typedef struct mchart {
  viz_chart v;
  double f;                /* type size factor (the scale option) */
  int nmax;                /* steps across */
  double ymax;             /* bytes at the top of the axis */
  double unit;             /* bytes per axis unit */
  const char *uname;
} mchart;

static double X(const mchart *c, double step) { return PX0 + step / c->nmax * (PX1 - PX0); }
static double Y(const mchart *c, double bytes) { return PY0 + bytes / c->ymax * (PY1 - PY0); }
static double fs(const mchart *c, double size) { return size * c->f; }

/* 1, 2 or 5 times a power of ten, at least v */
static double nice_step(double v) {
  double p = pow(10, floor(log10(v))), m = v / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

static void scales(mchart *c, const fuse_mem_trace *t) {
  int64_t top = t->before.peak > t->after.peak ? t->before.peak : t->after.peak;
  double step;
  c->nmax = t->before.n > t->after.n ? t->before.n : t->after.n;
  if (c->nmax < 1) c->nmax = 1;
  c->unit = top >= (INT64_C(1) << 30) ? 1073741824.0 : top >= (1 << 20) ? 1048576.0
          : top >= 1024 ? 1024.0 : 1.0;
  c->uname = c->unit == 1073741824.0 ? "GiB" : c->unit == 1048576.0 ? "MiB"
           : c->unit == 1024.0 ? "KiB" : "bytes";
  step = nice_step((top > 0 ? (double)top : c->unit) * HEADROOM / c->unit / 6);
  c->ymax = ceil((top > 0 ? (double)top : c->unit) * HEADROOM / c->unit / step) * step * c->unit;
}

static void axes(mchart *c) {
  double ystep = nice_step(c->ymax / c->unit / 6.5), xstep = nice_step(c->nmax / 10.0), v;
  char s[64];
  if (xstep < 1) xstep = 1;
  strbuf_printf(&c->v.b, "  n%d [shape=box, label=\"\", fixedsize=true, width=%.3f, height=%.3f, "
                "color=\"#555555\", penwidth=1.5, pos=\"%.1f,%.1f!\"];\n", c->v.nodes,
                (PX1 - PX0) / 72, (PY1 - PY0) / 72, (PX0 + PX1) / 2, (PY0 + PY1) / 2);
  c->v.nodes++;
  for (v = 0; v <= c->ymax / c->unit + 1e-9; v += ystep) {
    double y = Y(c, v * c->unit);
    if (v > 0 && y < PY1 - 1) viz_chart_line(&c->v, PX0, y, PX1, y, GRID_COLOR, 1, NULL);
    snprintf(s, sizeof s, "%g", v);
    viz_chart_text(&c->v, PX0 - 10 - viz_chart_text_w(strlen(s), fs(c, FS_TICK)) / 2, y,
                   fs(c, FS_TICK), "#222222", s, 32);
  }
  /* every xstep-th step labelled: a 1300-op graph keeps ten numbers */
  for (v = 0; v <= c->nmax; v += xstep) {
    double x = X(c, v);
    if (v > 0 && x < PX1 - 1) viz_chart_line(&c->v, x, PY0, x, PY1, GRID_COLOR, 1, NULL);
    snprintf(s, sizeof s, "%g", v);
    viz_chart_text(&c->v, x, PY0 - 18 * c->f, fs(c, FS_TICK), "#222222", s, 32);
  }
  viz_chart_text(&c->v, (PX0 + PX1) / 2, PY0 - 50 * c->f, fs(c, FS_AXIS), "#000000",
                 "step of the schedule (op by op: one op; fused: one kernel)", 100);
  snprintf(s, sizeof s, "alive (%s)", c->uname);
  viz_chart_text_left(&c->v, 12, PY1 + 26 * c->f, fs(c, FS_AXIS), "#000000", s, 32);
}

/* The curve as a chain of pinned vertices: across each step at its
** bytes, up or down where the next step's differ. */
static void curve(mchart *c, const fuse_mem_curve *cv, const char *color) {
  int i, prev, v;
  double w = 3 * (c->f > 1 ? c->f : 1);
  if (cv->n == 0) return;
  prev = viz_chart_anchor(&c->v, X(c, 0), Y(c, 0));
  for (i = 0; i < cv->n; i++) {
    int j = i;
    while (j + 1 < cv->n && cv->steps[j + 1].bytes == cv->steps[i].bytes) j++;
    v = viz_chart_anchor(&c->v, X(c, i), Y(c, (double)cv->steps[i].bytes));
    strbuf_printf(&c->v.b, "  n%d -> n%d [dir=none, headclip=false, tailclip=false, "
                  "color=\"%s\", penwidth=%.1f];\n", prev, v, color, w);
    prev = v;
    v = viz_chart_anchor(&c->v, X(c, j + 1), Y(c, (double)cv->steps[i].bytes));
    strbuf_printf(&c->v.b, "  n%d -> n%d [dir=none, headclip=false, tailclip=false, "
                  "color=\"%s\", penwidth=%.1f];\n", prev, v, color, w);
    prev = v;
    i = j;
  }
}

/* A peak's flag: its lines (DOT-escaped, each ending \l), their count and
** the widest in characters. */
typedef struct flag {
  strbuf b;
  int lines;
  size_t widest;
  double x0, y0, x1, y1;     /* where it is drawn */
  double px, py;             /* the peak */
} flag;

static void flag_line(flag *fl, const char *s) {
  size_t n = viz_chart_utf8_len(s);
  viz_chart_esc(&fl->b, s, 90);
  strbuf_printf(&fl->b, "\\l");
  if (n > 91) n = 91;
  if (n > fl->widest) fl->widest = n;
  fl->lines++;
}

static void flag_text(flag *fl, const char *what, const fuse_mem_curve *cv) {
  char s[300], h[32];
  int i;
  int64_t rest = 0;
  fuse_bytes_str(cv->peak, h, sizeof h);
  snprintf(s, sizeof s, "%s peak %s at step %d of %d (%s)", what, h, cv->peak_at + 1, cv->n,
           cv->steps[cv->peak_at].name);
  flag_line(fl, s);
  for (i = 0; i < cv->nbufs; i++) {
    const fuse_mem_buf *b = &cv->bufs[i];
    if (i >= LABEL_BUFS) { rest += b->bytes; continue; }
    fuse_bytes_str(b->bytes, h, sizeof h);
    snprintf(s, sizeof s, "   %s  %%%d %s%s%s", h, b->id, b->name, b->scope ? " in " : "",
             b->scope ? b->scope : "");
    flag_line(fl, s);
  }
  if (cv->nbufs > LABEL_BUFS) {
    fuse_bytes_str(rest, h, sizeof h);
    snprintf(s, sizeof s, "   and %d more (%s)", cv->nbufs - LABEL_BUFS, h);
    flag_line(fl, s);
  }
}

/* The flag's box with its top at y, beside its pole on side 0 (right) or
** 1 (left), kept inside the frame. */
static void flag_place(const mchart *c, flag *fl, double top, int side) {
  double w = viz_chart_text_w(fl->widest, fs(c, FS_LABEL)) * 0.92 + 10;
  double h = fl->lines * fs(c, FS_LABEL) * 1.2 + 10;
  fl->x0 = side == 0 ? fl->px : fl->px - w;
  if (fl->x0 + w > PX1 - 6) fl->x0 = PX1 - 6 - w;
  if (fl->x0 < PX0 + 6) fl->x0 = PX0 + 6;
  fl->x1 = fl->x0 + w;
  fl->y1 = top;
  fl->y0 = top - h;
}

/* True when a's pole (from its peak up to its flag) crosses b's box. */
static int pole_crosses(const flag *a, const flag *b) {
  return a->px > b->x0 - 4 && a->px < b->x1 + 4 && a->py < b->y1 && a->y1 > b->y0;
}

static void flag_draw(mchart *c, const flag *fl, const char *color) {
  int dot = c->v.nodes;
  strbuf_printf(&c->v.b, "  n%d [shape=circle, style=filled, fillcolor=\"%s\", color=\"white\", "
                "penwidth=1.5, label=\"\", fixedsize=true, width=0.22, height=0.22, "
                "pos=\"%.1f,%.1f!\"];\n", c->v.nodes++, color, fl->px, fl->py);
  {
    int top = viz_chart_anchor(&c->v, fl->px, fl->y0);
    strbuf_printf(&c->v.b, "  n%d -> n%d [dir=none, headclip=false, color=\"%s\", "
                  "penwidth=1.5, style=dashed];\n", dot, top, color);
  }
  /* a box of the estimated size, so the pole meets its edge; \\l keeps
  ** the lines at its left */
  strbuf_printf(&c->v.b, "  n%d [shape=box, style=filled, fillcolor=\"#ffffffdd\", color=\"%s\", "
                "penwidth=1, fixedsize=true, width=%.3f, height=%.3f, fontsize=%.0f, "
                "fontcolor=\"%s\", pos=\"%.1f,%.1f!\", label=\"%s\"];\n", c->v.nodes++, color,
                (fl->x1 - fl->x0) / 72, (fl->y1 - fl->y0) / 72, fs(c, FS_LABEL), color,
                (fl->x0 + fl->x1) / 2, (fl->y0 + fl->y1) / 2, fl->b.p ? fl->b.p : "");
}

static void flags(mchart *c, const fuse_mem_trace *t) {
  flag f[2];
  const fuse_mem_curve *cv[2] = {&t->before, &t->after};
  static const char *const what[2] = {"op by op:", "fused:"};
  static const char *const col[2] = {BEFORE_COLOR, AFTER_COLOR};
  int i, k, n = 0, idx[2];
  double row1 = PY1 - 10;
  memset(f, 0, sizeof f);
  for (i = 0; i < 2; i++) {
    if (cv[i]->peak_at < 0) continue;
    f[n].px = X(c, cv[i]->peak_at + 0.5);
    f[n].py = Y(c, (double)cv[i]->peak);
    flag_text(&f[n], what[i], cv[i]);
    idx[n++] = i;
  }
  /* row order x sides: the first placement where no pole crosses a flag */
  for (k = 0; k < 8; k++) {
    int upper = n == 2 ? (k >> 2) & 1 : 0;
    flag_place(c, &f[upper], row1, (k >> upper) & 1);
    for (i = 0; i < n; i++)
      if (i != upper) flag_place(c, &f[i], f[upper].y0 - 12, (k >> i) & 1);
    if (n < 2 || (!pole_crosses(&f[0], &f[1]) && !pole_crosses(&f[1], &f[0]))) break;
  }
  if (k == 8) {   /* nothing fits: the default placement */
    flag_place(c, &f[0], row1, 0);
    if (n == 2) flag_place(c, &f[1], f[0].y0 - 12, 0);
  }
  for (i = 0; i < n; i++) {
    flag_draw(c, &f[i], col[idx[i]]);
    if (f[i].b.oom) c->v.b.oom = 1;
    strbuf_free(&f[i].b);
  }
}

/* One node, so Graphviz measures it: a stroke of each colour and its
** words, centred over the frame. */
static void legend(mchart *c, const fuse_mem_trace *t) {
  char s[200];
  strbuf_printf(&c->v.b, "  n%d [shape=plaintext, margin=0, fontsize=%.0f, pos=\"%.1f,%.1f!\", "
                "label=<<table border=\"0\" cellborder=\"0\" cellspacing=\"6\" "
                "cellpadding=\"0\"><tr>", c->v.nodes++, fs(c, FS_LABEL), (PX0 + PX1) / 2 + 40,
                PY1 + 26 * c->f);
  snprintf(s, sizeof s, "op by op: %s, %d op%s", t->before_own ? "the planned graph"
           : "the captured graph", t->before.n, t->before.n == 1 ? "" : "s");
  strbuf_printf(&c->v.b, "<td><font color=\"%s\"><b>\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81"
                "</b></font></td><td align=\"left\">", BEFORE_COLOR);
  viz_chart_html(&c->v.b, s, 100);
  snprintf(s, sizeof s, "fused: the plan's %d kernel%s in run order", t->after.n,
           t->after.n == 1 ? "" : "s");
  strbuf_printf(&c->v.b, "</td><td>    </td><td><font color=\"%s\"><b>\xe2\x94\x81\xe2\x94\x81"
                "\xe2\x94\x81</b></font></td><td align=\"left\">", AFTER_COLOR);
  viz_chart_html(&c->v.b, s, 100);
  strbuf_printf(&c->v.b, "</td></tr></table>>];\n");
}

static char *dot_source(const viz_mem_chart *mc) {
  const fuse_mem_trace *t = mc->t;
  mchart c;
  char sub[300], a[32], b[32];
  memset(&c, 0, sizeof c);
  c.f = mc->scale > 1 ? 1 + (mc->scale - 1) * 0.3 : mc->scale > 0 ? mc->scale : 1;
  strbuf_printf(&c.v.b, "/* fuselab memory picture: every node is pinned; render with neato -n, "
                "e.g.\n** neato -n -Tpng mem.dot -o mem.png */\n"
                "digraph memory {\n"
                "  graph [splines=line, outputorder=edgesfirst, bgcolor=white, "
                "pad=0.1, fontname=\"%s\"];\n"
                "  node [fontname=\"%s\"];\n  edge [arrowhead=none];\n",
                VIZ_CHART_FONT, VIZ_CHART_FONT);
  viz_chart_anchor(&c.v, 0, 0);
  viz_chart_anchor(&c.v, CANVAS_W, CANVAS_H);
  scales(&c, t);
  viz_chart_text(&c.v, CANVAS_W / 2, CANVAS_H - 32, fs(&c, FS_TITLE), "#000000",
                 mc->title ? mc->title : "Memory alive at each step: op by op against fused", 120);
  fuse_bytes_str(t->before.peak, a, sizeof a);
  fuse_bytes_str(t->after.peak, b, sizeof b);
  if (t->before.peak > 0)
    snprintf(sub, sizeof sub, "peak %s op by op, %s fused (%+.0f%%)%s", a, b,
             100.0 * ((double)t->after.peak - (double)t->before.peak) / (double)t->before.peak,
             t->before_own ? "; op by op is the planned graph (the captured graph is not at hand)"
                           : "");
  else
    snprintf(sub, sizeof sub, "peak %s op by op, %s fused", a, b);
  viz_chart_text(&c.v, CANVAS_W / 2, CANVAS_H - 68 * c.f, fs(&c, FS_SUB), "#333333", sub, 200);
  axes(&c);
  curve(&c, &t->before, BEFORE_COLOR);
  curve(&c, &t->after, AFTER_COLOR);
  flags(&c, t);
  legend(&c, t);
  viz_chart_text(&c.v, (PX0 + PX1) / 2, PY0 - 86 * c.f, fs(&c, FS_NOTE), "#333333",
                      mc->note ? mc->note : "p:stats()'s rule: a result dies after its last "
                      "reader, outputs live on, views are free; fused, a call's operands die after "
                      "it, epilogues overwrite their product, kept values stay.", 200);
  strbuf_printf(&c.v.b, "}\n");
  return strbuf_take(&c.v.b);
}

int viz_mem_render_mem(const viz_mem_chart *c, const char *format, char **out, size_t *len,
                       fl_err *e) {
  char *src;
  *out = NULL;
  *len = 0;
  if (viz_chart_format_ok(format, "draw_memory", e) != FL_OK) return e->code;
  if (!(src = dot_source(c))) return err_set(e, FL_ENOMEM, "draw_memory: out of memory");
  return viz_chart_render(src, format, "draw_memory", out, len, e);
}

static int render(const void *c, const char *format, char **out, size_t *len, fl_err *e) {
  return viz_mem_render_mem((const viz_mem_chart *)c, format, out, len, e);
}

int viz_mem_render_file(const viz_mem_chart *c, const char *path, fl_err *e) {
  return viz_chart_write(path, "draw_memory", render, c, e);
}
