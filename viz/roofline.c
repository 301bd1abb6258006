/*
** roofline.c -- the roofline chart (roofline.h) as a Graphviz graph whose
** every node is pinned (pos="x,y!", points) and laid out by the no-op
** engine (neato -n): axes, grid, roofs and points are nodes and straight
** edges drawn where the log-log scales put them.  Labels of points are
** placed greedily where they overlap nothing already drawn, with a thin
** leader line when one had to move away from its point.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "viz/chart.h"
#include "viz/roofline.h"

#define FONT VIZ_CHART_FONT
/* Canvas and plot frame in points (72 per inch; the PNG is rendered at 96
** dpi, 4/3 pixel a point): 1390 pt is about 1850 px, so a 1920-px
** projector shows it unscaled and the smallest text, 15 pt, is 20 px. */
#define CANVAS_W 1390.0
#define CANVAS_H 960.0
#define PX0 150.0
#define PX1 1230.0
/* with the key: the frame ends here and the key fills the rest */
#define PX1_KEY 930.0
/* more points than this, or a label with no free place: the key */
#define FULL_LABELS_MAX 12
#define KEY_LINES 34
#define PY0 190.0
#define PY1 820.0
#define FS_TITLE 26.0
#define FS_AXIS 20.0
#define FS_TICK 18.0
#define FS_ROOF 18.0
#define FS_POINT 16.0
#define FS_NOTE 15.0
/* a point label's longest name, in characters (then "...") */
#define LABEL_MAX 42
#define NOTE_LINE 130
#define MEM_COLOR "#0072B2"       /* blue: memory-bound (Okabe-Ito, colour-blind safe) */
#define COMPUTE_COLOR "#D55E00"   /* vermillion: compute-bound */
#define ROOF_COLOR "#333333"
#define GRID_COLOR "#d9d9d9"

typedef struct rbox { double x0, y0, x1, y1; } rbox;

typedef struct chart {
  viz_chart v;                 /* the DOT text and node count (chart.h) */
  double px1;                  /* the plot frame's right edge */
  int key;                     /* points labelled k<i>, names in a key beside */
  int failed;                  /* labels that found no free place */
  double lx0, lx1, ly0, ly1;   /* log10 of the axes' ends */
  rbox *used;                   /* what labels must not cover */
  int nused, capused;
} chart;

static double X(const chart *c, double v) {
  return PX0 + (log10(v) - c->lx0) / (c->lx1 - c->lx0) * (c->px1 - PX0);
}

static double Y(const chart *c, double v) {
  return PY0 + (log10(v) - c->ly0) / (c->ly1 - c->ly0) * (PY1 - PY0);
}

#define esc viz_chart_esc
#define text_w viz_chart_text_w
#define utf8_len viz_chart_utf8_len

static void use(chart *c, rbox bx) {
  if (c->nused == c->capused) {
    int cap = c->capused ? 2 * c->capused : 64;
    rbox *u = realloc(c->used, (size_t)cap * sizeof *u);
    if (!u) return;      /* labels may overlap: the picture is still right */
    c->used = u;
    c->capused = cap;
  }
  c->used[c->nused++] = bx;
}

static int free_at(const chart *c, rbox bx) {
  int i;
  if (bx.x0 < 4 || bx.x1 > CANVAS_W - 4 || bx.y0 < PY0 + 2 || bx.y1 > PY1 + 40) return 0;
  for (i = 0; i < c->nused; i++) {
    const rbox *u = &c->used[i];
    if (bx.x0 < u->x1 && u->x0 < bx.x1 && bx.y0 < u->y1 && u->y0 < bx.y1) return 0;
  }
  return 1;
}

static int text(chart *c, double x, double y, double fs, const char *color, const char *s,
                size_t max) {
  return viz_chart_text(&c->v, x, y, fs, color, s, max);
}

static int text_left(chart *c, double x, double y, double fs, const char *color, const char *s,
                     size_t max) {
  return viz_chart_text_left(&c->v, x, y, fs, color, s, max);
}

static int anchor(chart *c, double x, double y) { return viz_chart_anchor(&c->v, x, y); }

static void line(chart *c, double x0, double y0, double x1, double y1, const char *color,
                 double width, const char *style) {
  viz_chart_line(&c->v, x0, y0, x1, y1, color, width, style);
}

/* "0.01", "1", "1000", "1e+06" */
static void tick_str(double v, char *buf, size_t n) {
  if (v >= 1e-3 && v < 1e5) snprintf(buf, n, "%g", v);
  else snprintf(buf, n, "1e%+d", (int)lround(log10(v)));
}

static void fmt_rate(double v, char *buf, size_t n) {
  snprintf(buf, n, v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v);
}

/* The axes' decades: every point, both roofs and the ridge with room
** around it. */
static void ranges(chart *c, const viz_roof_chart *rc, double ridge) {
  double xlo = ridge / 30, xhi = ridge * 30, ylo, yhi = rc->product_gflops * 2.5;
  int i;
  for (i = 0; i < rc->npts; i++) {
    const viz_roof_point *p = &rc->pts[i];
    if (!(p->intensity > 0) || !(p->gflops > 0)) continue;
    if (p->intensity / 2 < xlo) xlo = p->intensity / 2;
    if (p->intensity * 2 > xhi) xhi = p->intensity * 2;
    if (p->gflops * 2.5 > yhi) yhi = p->gflops * 2.5;
  }
  c->lx0 = floor(log10(xlo));
  c->lx1 = ceil(log10(xhi));
  if (c->lx1 - c->lx0 > 9) c->lx0 = c->lx1 - 9;     /* past 9 decades nothing reads */
  ylo = pow(10, c->lx0) * rc->copy_gbs;              /* the slope starts on the frame */
  for (i = 0; i < rc->npts; i++)
    if (rc->pts[i].intensity > 0 && rc->pts[i].gflops > 0 && rc->pts[i].gflops / 2 < ylo)
      ylo = rc->pts[i].gflops / 2;
  c->ly0 = floor(log10(ylo));
  c->ly1 = ceil(log10(yhi));
  if (c->ly1 - c->ly0 > 9) c->ly0 = c->ly1 - 9;
  if (c->lx1 - c->lx0 < 2) c->lx1 = c->lx0 + 2;
  if (c->ly1 - c->ly0 < 2) c->ly0 = c->ly1 - 2;
}

static void axes(chart *c) {
  int d;
  char t[32];
  strbuf_printf(&c->v.b, "  n%d [shape=box, label=\"\", fixedsize=true, width=%.3f, height=%.3f, "
                "color=\"#555555\", penwidth=1.5, pos=\"%.1f,%.1f!\"];\n", c->v.nodes,
                (c->px1 - PX0) / 72, (PY1 - PY0) / 72, (PX0 + c->px1) / 2, (PY0 + PY1) / 2);
  c->v.nodes++;
  for (d = (int)c->lx0; d <= (int)c->lx1; d++) {
    double x = X(c, pow(10, d));
    if (d > c->lx0 && d < c->lx1) line(c, x, PY0, x, PY1, GRID_COLOR, 1, NULL);
    tick_str(pow(10, d), t, sizeof t);
    text(c, x, PY0 - 18, FS_TICK, "#222222", t, 32);
  }
  for (d = (int)c->ly0; d <= (int)c->ly1; d++) {
    double y = Y(c, pow(10, d));
    if (d > c->ly0 && d < c->ly1) line(c, PX0, y, c->px1, y, GRID_COLOR, 1, NULL);
    tick_str(pow(10, d), t, sizeof t);
    text(c, PX0 - 10 - text_w(strlen(t), FS_TICK) / 2, y, FS_TICK, "#222222", t, 32);
  }
  text(c, (PX0 + c->px1) / 2, PY0 - 52, FS_AXIS, "#000000",
       "arithmetic intensity (flop per byte moved, log scale)", 80);
  text(c, PX0 - 10 - text_w(8, FS_AXIS) / 2, PY1 + 30, FS_AXIS, "#000000", "GFLOP/s", 16);
}

static void roofs(chart *c, const viz_roof_chart *rc, double ridge) {
  double xmin = pow(10, c->lx0), xmax = pow(10, c->lx1), xm, ym, w;
  char s[240], v[32];
  size_t n;
  line(c, X(c, xmin), Y(c, xmin * rc->copy_gbs), X(c, ridge), Y(c, rc->product_gflops),
       ROOF_COLOR, 4, NULL);
  line(c, X(c, ridge), Y(c, rc->product_gflops), X(c, xmax), Y(c, rc->product_gflops),
       ROOF_COLOR, 4, NULL);
  /* the ridge: where a kernel stops being bound by memory */
  line(c, X(c, ridge), PY0, X(c, ridge), Y(c, rc->product_gflops), "#888888", 1.5, "dashed");
  /* labels keep off the lines: the flat roof, the ridge, the slope in steps */
  use(c, (rbox){X(c, ridge), Y(c, rc->product_gflops) - 3, c->px1, Y(c, rc->product_gflops) + 3});
  use(c, (rbox){X(c, ridge) - 2, PY0, X(c, ridge) + 2, Y(c, rc->product_gflops)});
  {
    double x0 = X(c, xmin), y0 = Y(c, xmin * rc->copy_gbs), x1 = X(c, ridge),
           y1 = Y(c, rc->product_gflops);
    int i;
    for (i = 0; i < 40; i++) {
      double xa = x0 + (x1 - x0) * i / 40, xb = x0 + (x1 - x0) * (i + 1) / 40;
      double ya = y0 + (y1 - y0) * i / 40, yb = y0 + (y1 - y0) * (i + 1) / 40;
      use(c, (rbox){xa, ya - 3, xb, yb + 3});
    }
  }
  fmt_rate(ridge, v, sizeof v);
  snprintf(s, sizeof s, "ridge %s flop/B", v);
  n = utf8_len(s);
  text_left(c, X(c, ridge) + 6, PY0 + 14, FS_POINT, "#555555", s, 64);
  use(c, (rbox){X(c, ridge), PY0, X(c, ridge) + 6 + text_w(n, FS_POINT), PY0 + 28});
  /* the slope's label sits above it, ending at its middle (in log space) */
  fmt_rate(rc->copy_gbs, v, sizeof v);
  snprintf(s, sizeof s, "memory bandwidth %s GB/s", v);
  n = utf8_len(s);
  w = text_w(n, FS_ROOF);
  xm = sqrt(xmin * ridge);
  if (X(c, xm) - w - 8 < PX0 + 4) xm = pow(10, c->lx0 + (PX0 + 12 + w - PX0) / (c->px1 - PX0) * (c->lx1 - c->lx0));
  if (xm > ridge) xm = ridge;
  ym = xm * rc->copy_gbs;
  text(c, X(c, xm) - 8 - w / 2, Y(c, ym) + 16, FS_ROOF, ROOF_COLOR, s, 200);
  use(c, (rbox){X(c, xm) - 8 - w, Y(c, ym) + 3, X(c, xm) - 8, Y(c, ym) + 29});
  /* the peak's label above the flat roof, at its right end */
  fmt_rate(rc->product_gflops, v, sizeof v);
  snprintf(s, sizeof s, "product peak %s GFLOP/s%s%s%s", v, rc->product_path ? " (" : "",
           rc->product_path ? rc->product_path : "", rc->product_path ? ")" : "");
  n = utf8_len(s);
  w = text_w(n, FS_ROOF);
  {
    /* left of the ridge the slope is below the peak: room for a long label */
    double x1 = c->px1 - 8, y = Y(c, rc->product_gflops) + 16;
    if (x1 - w < PX0 + 8) x1 = PX0 + 8 + w;
    text(c, x1 - w / 2, y, FS_ROOF, ROOF_COLOR, s, 200);
    use(c, (rbox){x1 - w, y - 13, x1, y + 13});
  }
}

static void legend(chart *c) {
  double x = PX0 + 18, y = PY1 - 22;
  int i;
  static const char *const what[] = {"memory-bound kernel", "compute-bound kernel"};
  static const char *const col[] = {MEM_COLOR, COMPUTE_COLOR};
  for (i = 0; i < 2; i++, y -= 28) {
    strbuf_printf(&c->v.b, "  n%d [shape=circle, style=filled, fillcolor=\"%s\", color=\"%s\", "
                  "label=\"\", fixedsize=true, width=0.2, height=0.2, pos=\"%.1f,%.1f!\"];\n",
                  c->v.nodes++, col[i], col[i], x, y);
    text_left(c, x + 14, y, FS_POINT, "#222222", what[i], 40);
  }
  use(c, (rbox){PX0, y + 14, PX0 + 30 + text_w(20, FS_POINT), PY1});
}

/* "k3 fused_mul_add_4096 · 41%"; with the key only "k3" (the name's
** first word). */
static void point_label(const chart *c, const viz_roof_point *p, char *s, size_t n) {
  size_t k = 0;
  if (c->key) {
    while (p->name[k] && p->name[k] != ' ') k++;
    snprintf(s, n, "%.*s", (int)k, p->name);
    return;
  }
  if (utf8_len(p->name) > LABEL_MAX) {
    while (p->name[k] && utf8_len(p->name) - utf8_len(p->name + k) < LABEL_MAX) k++;
    snprintf(s, n, "%.*s\xe2\x80\xa6 \xc2\xb7 %.0f%%", (int)k, p->name, p->roof_pct);
  } else {
    snprintf(s, n, "%s \xc2\xb7 %.0f%%", p->name, p->roof_pct);
  }
}

static int plotted(const viz_roof_point *p) { return p->intensity > 0 && p->gflops > 0; }

static int by_height(const void *a, const void *b) {
  const viz_roof_point *p = *(const viz_roof_point *const *)a, *q = *(const viz_roof_point *const *)b;
  return p->gflops < q->gflops ? 1 : p->gflops > q->gflops ? -1 : 0;
}

static void points(chart *c, const viz_roof_chart *rc) {
  const viz_roof_point **order = malloc((size_t)(rc->npts ? rc->npts : 1) * sizeof *order);
  int i, n = 0, k;
  if (!order) { c->v.b.oom = 1; return; }
  for (i = 0; i < rc->npts; i++)
    if (plotted(&rc->pts[i])) order[n++] = &rc->pts[i];
  /* from the top down: the fastest kernels, which matter most, are
  ** labelled first, where they are */
  qsort(order, (size_t)n, sizeof *order, by_height);
  for (i = 0; i < n; i++)                      /* every dot first: labels avoid them all */
    use(c, (rbox){X(c, order[i]->intensity) - 8, Y(c, order[i]->gflops) - 8,
                 X(c, order[i]->intensity) + 8, Y(c, order[i]->gflops) + 8});
  for (i = 0; i < n; i++) {
    const viz_roof_point *p = order[i];
    double px = X(c, p->intensity), py = Y(c, p->gflops), w, h = FS_POINT * 1.35;
    const char *col = p->compute_bound ? COMPUTE_COLOR : MEM_COLOR;
    char s[LABEL_MAX * 4 + 64];
    rbox best = {0, 0, 0, 0};
    int found = 0, dot;
    point_label(c, p, s, sizeof s);
    w = text_w(utf8_len(s), FS_POINT);
    dot = c->v.nodes;
    strbuf_printf(&c->v.b, "  n%d [shape=circle, style=filled, fillcolor=\"%s\", color=\"white\", "
                  "penwidth=1.5, label=\"\", fixedsize=true, width=0.24, height=0.24, "
                  "pos=\"%.1f,%.1f!\"];\n", c->v.nodes++, col, px, py);
    /* right of the dot, else left, then ever further up or down */
    for (k = 0; k <= 30 && !found; k++) {
      double dy = (k + 1) / 2 * h * (k % 2 ? 1 : -1);
      int side;
      for (side = 0; side < 2 && !found; side++) {
        rbox bx;
        bx.x0 = side == 0 ? px + 16 : px - 16 - w;
        bx.x1 = bx.x0 + w;
        bx.y0 = py + dy - h / 2;
        bx.y1 = bx.y0 + h;
        if (bx.x1 > c->px1 + (c->key ? 0 : CANVAS_W)) continue;    /* the key's side is its own */
        if (free_at(c, bx)) { best = bx; found = 1; }
      }
    }
    if (!found) {
      best = (rbox){px + 16, py - h / 2, px + 16 + w, py + h / 2};
      c->failed++;
    }
    use(c, best);
    text(c, (best.x0 + best.x1) / 2, (best.y0 + best.y1) / 2, FS_POINT, col, s, sizeof s);
    if (fabs((best.y0 + best.y1) / 2 - py) > h * 0.6) {
      /* moved away: a leader from the dot to the label's near end */
      double lx = best.x0 > px ? best.x0 - 2 : best.x1 + 2;
      int a = anchor(c, lx, (best.y0 + best.y1) / 2);
      strbuf_printf(&c->v.b, "  n%d -> n%d [dir=none, color=\"#999999\", penwidth=1, "
                    "headclip=false];\n", dot, a);
    }
  }
  free(order);
}

#define html viz_chart_html

/* The key beside the frame: every plotted kernel in run order, its name
** and share of the roof, in its point's colour. */
static void key(chart *c, const viz_roof_chart *rc) {
  double x0 = c->px1 + 24, lh = FS_NOTE * 1.32, w = 0;
  int i, rows = 0, left = 0, total = 0;
  size_t chars = (size_t)((CANVAS_W - 12 - x0 - 6) / (FS_NOTE * 0.6)) - 7;
  strbuf_printf(&c->v.b, "  n%d [shape=plaintext, margin=0, fontsize=%.0f, label=<<table border=\"0\" "
                "cellborder=\"0\" cellspacing=\"0\" cellpadding=\"1\">", c->v.nodes, FS_NOTE);
  for (i = 0; i < rc->npts; i++) {
    const viz_roof_point *p = &rc->pts[i];
    double lw;
    if (!plotted(p)) continue;
    total++;
    if (rows >= KEY_LINES) { left++; continue; }
    strbuf_printf(&c->v.b, "<tr><td align=\"left\"><font color=\"%s\">",
                  p->compute_bound ? COMPUTE_COLOR : MEM_COLOR);
    html(&c->v.b, p->name, chars);
    strbuf_printf(&c->v.b, " \xc2\xb7 %.0f%%</font></td></tr>", p->roof_pct);
    lw = text_w((utf8_len(p->name) < chars ? utf8_len(p->name) : chars + 1) + 7, FS_NOTE);
    if (lw > w) w = lw;
    rows++;
  }
  if (left) {
    strbuf_printf(&c->v.b, "<tr><td align=\"left\">and %d more (k:profile() lists them)</td></tr>", left);
    rows++;
  }
  strbuf_printf(&c->v.b, "</table>>, pos=\"%.1f,%.1f!\"];\n", x0 + w / 2, PY1 - rows * lh / 2);
  c->v.nodes++;
  (void)total;
}

/* The lines under the chart: one left-aligned block (Graphviz's \l ends
** a left-justified line), so they line up whatever the font's widths. */
typedef struct lines { strbuf b; int n; size_t widest; } lines;

static void add_line(lines *l, const char *s, size_t n) {
  size_t i, chars = 0;
  for (i = 0; i < n; i++) {
    if (s[i] == '"' || s[i] == '\\') strbuf_printf(&l->b, "\\%c", s[i]);
    else if ((unsigned char)s[i] < 0x20) strbuf_printf(&l->b, " ");
    else strbuf_printf(&l->b, "%c", s[i]);
    chars += ((unsigned char)s[i] & 0xC0) != 0x80;
  }
  strbuf_printf(&l->b, "\\l");
  if (chars > l->widest) l->widest = chars;
  l->n++;
}

/* s broken at spaces into lines of at most NOTE_LINE characters. */
static void add_wrapped(lines *l, const char *s) {
  while (*s) {
    size_t n = 0, brk = 0, chars = 0;
    while (s[n] && chars < NOTE_LINE) {
      if (s[n] == ' ') brk = n;
      chars += ((unsigned char)s[n] & 0xC0) != 0x80;
      n++;
    }
    if (s[n] && brk > 0) n = brk;
    add_line(l, s, n);
    s += n;
    while (*s == ' ') s++;
  }
}

/* Kernels that cannot be drawn on log axes (no flops) or were not timed. */
static void unplotted(const viz_roof_chart *rc, lines *l) {
  strbuf t = {0};
  int i, shown = 0, left = 0;
  for (i = 0; i < rc->npts; i++) {
    const viz_roof_point *p = &rc->pts[i];
    if (p->intensity > 0 && p->gflops > 0) continue;
    if (shown >= 12) { left++; continue; }
    strbuf_printf(&t, "%s", shown ? "; " : "Not on the chart: ");
    if (p->intensity > 0 || !(p->gbps > 0)) strbuf_printf(&t, "%s (not timed)", p->name);
    else strbuf_printf(&t, "%s (no flops: %.1f GB/s, %.0f%% of the bandwidth)", p->name, p->gbps,
                       p->roof_pct);
    shown++;
  }
  if (left) strbuf_printf(&t, "; and %d more", left);
  if (t.n) add_wrapped(l, t.p);
  strbuf_free(&t);
}

static void bottom(chart *c, const viz_roof_chart *rc) {
  lines l;
  double w;
  memset(&l, 0, sizeof l);
  unplotted(rc, &l);
  if (rc->note) add_wrapped(&l, rc->note);
  if (l.n) {
    w = text_w(l.widest, FS_NOTE);
    strbuf_printf(&c->v.b, "  n%d [shape=plaintext, margin=0, width=0, height=0, fontsize=%.0f, "
                  "fontcolor=\"#333333\", pos=\"%.1f,%.1f!\", label=\"%s\"];\n", c->v.nodes++,
                  FS_NOTE, 40 + w / 2, PY0 - 92 - (l.n - 1) * FS_NOTE * 0.6, l.b.p);
  }
  if (l.b.oom) c->v.b.oom = 1;
  strbuf_free(&l.b);
}

static char *dot_pass(const viz_roof_chart *rc, int with_key, int *failed) {
  chart c;
  double ridge = rc->product_gflops / rc->copy_gbs;
  char title[300];
  memset(&c, 0, sizeof c);
  c.key = with_key;
  c.px1 = with_key ? PX1_KEY : PX1;
  strbuf_printf(&c.v.b, "/* fuselab roofline: every node is pinned; render with neato -n, e.g.\n"
                "** neato -n -Tpng roofline.dot -o roofline.png */\n"
                "digraph roofline {\n"
                "  graph [splines=line, outputorder=edgesfirst, bgcolor=white, "
                "pad=0.1, fontname=\"%s\"];\n"
                "  node [fontname=\"%s\"];\n  edge [arrowhead=none];\n", FONT, FONT);
  /* the canvas's corners: the picture keeps its size whatever is drawn */
  anchor(&c, 0, 0);
  anchor(&c, CANVAS_W, CANVAS_H);
  ranges(&c, rc, ridge);
  snprintf(title, sizeof title, "Roofline: %s, %d thread%s", rc->cpu ? rc->cpu : "this CPU",
           rc->threads, rc->threads == 1 ? "" : "s");
  text(&c, CANVAS_W / 2, CANVAS_H - 32, FS_TITLE, "#000000", title, 200);
  if (rc->subtitle) text(&c, CANVAS_W / 2, CANVAS_H - 68, FS_NOTE + 1, "#333333", rc->subtitle, 240);
  axes(&c);
  roofs(&c, rc, ridge);
  legend(&c);
  points(&c, rc);
  if (with_key) key(&c, rc);
  bottom(&c, rc);
  strbuf_printf(&c.v.b, "}\n");
  free(c.used);
  *failed = c.failed;
  return strbuf_take(&c.v.b);
}

/* Names beside their points when there are few and they all find room;
** else short labels and the key. */
static char *dot_source(const viz_roof_chart *rc) {
  int i, n = 0, failed = 0;
  char *src;
  for (i = 0; i < rc->npts; i++) n += plotted(&rc->pts[i]);
  if (n <= FULL_LABELS_MAX) {
    src = dot_pass(rc, 0, &failed);
    if (!src || !failed) return src;
    free(src);
  }
  return dot_pass(rc, 1, &failed);
}

/* ---- rendering ------------------------------------------------------------- */

int viz_roof_render_mem(const viz_roof_chart *rc, const char *format, char **out, size_t *len,
                        fl_err *e) {
  char *src;
  *out = NULL;
  *len = 0;
  if (viz_chart_format_ok(format, "draw_roofline", e) != FL_OK) return e->code;
  if (!(rc->copy_gbs > 0) || !(rc->product_gflops > 0))
    return err_set(e, FL_EINVAL, "draw_roofline: the peaks must be above 0 (bandwidth %g GB/s, "
                   "product %g GFLOP/s)", rc->copy_gbs, rc->product_gflops);
  if (!(src = dot_source(rc))) return err_set(e, FL_ENOMEM, "draw_roofline: out of memory");
  return viz_chart_render(src, format, "draw_roofline", out, len, e);
}

static int render(const void *rc, const char *format, char **out, size_t *len, fl_err *e) {
  return viz_roof_render_mem((const viz_roof_chart *)rc, format, out, len, e);
}

int viz_roof_render_file(const viz_roof_chart *rc, const char *path, fl_err *e) {
  return viz_chart_write(path, "draw_roofline", render, rc, e);
}
