/*
** chart.c -- the pieces fuselab's pinned-node charts share (chart.h):
** text, anchors and lines as DOT, and rendering through Graphviz's no-op
** layout (neato -n), which keeps every node where the chart put it.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <graphviz/gvc.h>

#include "graph/file.h"
#include "viz/chart.h"
#include "viz/draw.h"

/* Quotes and backslashes escaped (a label's \N or \G must not be read as
** Graphviz's escapes). */
void viz_chart_esc(strbuf *b, const char *s, size_t max) {
  size_t i, n = strlen(s);
  int cut = n > max;
  if (cut) {
    n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;   /* a UTF-8 boundary */
  }
  for (i = 0; i < n; i++) {
    if (s[i] == '"' || s[i] == '\\') strbuf_printf(b, "\\%c", s[i]);
    else if ((unsigned char)s[i] < 0x20) strbuf_printf(b, " ");
    else strbuf_printf(b, "%c", s[i]);
  }
  if (cut) strbuf_printf(b, "\xe2\x80\xa6");
}

/* Digits and lower case average a bit over half the size. */
double viz_chart_text_w(size_t n, double fs) { return (double)n * fs * 0.6 + 6; }

size_t viz_chart_utf8_len(const char *s) {
  size_t n = 0;
  for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
  return n;
}

int viz_chart_text(viz_chart *c, double x, double y, double fs, const char *color,
                   const char *s, size_t max) {
  strbuf_printf(&c->b, "  n%d [shape=plaintext, margin=0, width=0, height=0, fontsize=%.0f, "
                "fontcolor=\"%s\", pos=\"%.1f,%.1f!\", label=\"", c->nodes, fs, color, x, y);
  viz_chart_esc(&c->b, s, max);
  strbuf_printf(&c->b, "\"];\n");
  return c->nodes++;
}

int viz_chart_text_left(viz_chart *c, double x, double y, double fs, const char *color,
                        const char *s, size_t max) {
  size_t n = viz_chart_utf8_len(s);
  if (n > max) n = max + 1;
  return viz_chart_text(c, x + viz_chart_text_w(n, fs) / 2, y, fs, color, s, max);
}

int viz_chart_anchor(viz_chart *c, double x, double y) {
  strbuf_printf(&c->b, "  n%d [shape=point, style=invis, width=0.01, height=0.01, "
                "pos=\"%.1f,%.1f!\"];\n", c->nodes, x, y);
  return c->nodes++;
}

void viz_chart_line(viz_chart *c, double x0, double y0, double x1, double y1, const char *color,
                    double width, const char *style) {
  int a = viz_chart_anchor(c, x0, y0), b = viz_chart_anchor(c, x1, y1);
  strbuf_printf(&c->b, "  n%d -> n%d [dir=none, headclip=false, tailclip=false, color=\"%s\", "
                "penwidth=%.1f%s%s];\n", a, b, color, width, style ? ", style=" : "",
                style ? style : "");
}

void viz_chart_html(strbuf *b, const char *s, size_t max) {
  size_t i, n = strlen(s);
  int cut = viz_chart_utf8_len(s) > max;
  if (cut) {
    size_t chars = 0;
    for (n = 0; s[n] && chars < max; n++) chars += ((unsigned char)s[n] & 0xC0) != 0x80;
    while (s[n] && ((unsigned char)s[n] & 0xC0) == 0x80) n++;
  }
  for (i = 0; i < n; i++) {
    switch (s[i]) {
    case '&': strbuf_printf(b, "&amp;"); break;
    case '<': strbuf_printf(b, "&lt;"); break;
    case '>': strbuf_printf(b, "&gt;"); break;
    case '"': strbuf_printf(b, "&quot;"); break;
    default: strbuf_printf(b, "%c", (unsigned char)s[i] < 0x20 ? ' ' : s[i]);
    }
  }
  if (cut) strbuf_printf(b, "\xe2\x80\xa6");
}

/* ---- rendering ------------------------------------------------------------- */

static char gv_msg[400];

static int gv_errf(char *msg) {
  size_t have = strlen(gv_msg);
  snprintf(gv_msg + have, sizeof gv_msg - have, "%s%s", have ? "; " : "", msg);
  return 0;
}

/* Kept for the process, as render.c keeps its own: a context made after
** another was freed measures text roughly. */
static GVC_t *context(void) {
  static GVC_t *gvc;
  if (!gvc) gvc = gvContext();
  return gvc;
}

int viz_chart_format_ok(const char *format, const char *what, fl_err *e) {
  if (!format || (strcmp(format, "svg") && strcmp(format, "png") && strcmp(format, "pdf") &&
                  strcmp(format, "dot")))
    return err_set(e, FL_EINVAL, "%s: unknown picture format \"%s\" (formats: .dot "
                   ".svg .png .pdf)", what, format ? format : "(none)");
  return FL_OK;
}

int viz_chart_render(char *src, const char *format, const char *what, char **out, size_t *len,
                     fl_err *e) {
  char *buf = NULL;
  size_t blen = 0;
  FILE *ms;
  Agraph_t *G;
  GVC_t *gvc;
  agusererrf prev_f;
  agerrlevel_t prev_l;
  int rc_ = FL_OK;
  *out = NULL;
  *len = 0;
  if (strcmp(format, "dot") == 0) {
    *out = src;
    *len = strlen(src);
    return FL_OK;
  }
  if (!(gvc = context())) {
    free(src);
    return err_set(e, FL_ENOMEM, "%s: could not start Graphviz", what);
  }
  gv_msg[0] = '\0';
  prev_f = agseterrf(gv_errf);
  prev_l = agseterr(AGERR);
  G = agmemread(src);
  free(src);
  if (!G) {
    rc_ = err_set(e, FL_ENOMEM, "%s: Graphviz could not read the chart: %s", what, gv_msg);
  } else if (gvLayout(gvc, G, "nop") != 0) {
    rc_ = err_set(e, FL_EUNSUPPORTED, "%s: Graphviz's neato -n layout failed: %s", what,
                  gv_msg[0] ? gv_msg : "no message (is the neato layout plugin installed?)");
  } else {
    if (!(ms = open_memstream(&buf, &blen))) {
      rc_ = err_set(e, FL_ENOMEM, "%s: out of memory", what);
    } else {
      if (gvRender(gvc, G, format, ms) != 0)
        rc_ = err_set(e, FL_EUNSUPPORTED, "%s: Graphviz cannot render %s here: %s", what,
                      format, gv_msg[0] ? gv_msg : "no renderer plugin for it");
      if (fclose(ms) != 0 && rc_ == FL_OK) rc_ = err_set(e, FL_ENOMEM, "%s: out of memory", what);
    }
    gvFreeLayout(gvc, G);
  }
  if (G) agclose(G);
  agseterrf(prev_f);
  agseterr(prev_l);
  if (rc_ != FL_OK) {
    free(buf);
    return rc_;
  }
  *out = buf;
  *len = blen;
  return FL_OK;
}

int viz_chart_write(const char *path, const char *what, viz_chart_render_fn render,
                    const void *chart, fl_err *e) {
  const char *fmt = viz_format_of(path);
  char *data = NULL;
  size_t len = 0;
  file_out w;
  int rc_;
  if (!path || !path[0]) return err_set(e, FL_EINVAL, "%s: no file name given", what);
  if (!fmt) {
    const char *ext = strrchr(path, '.');
    if (ext && strchr(ext, '/')) ext = NULL;
    return err_set(e, FL_EINVAL, "%s: \"%s\": unknown picture format %s%s%s "
                   "(formats: .dot .svg .png .pdf)", what, path, ext ? "\"" : "",
                   ext ? ext : "(no extension)", ext ? "\"" : "");
  }
  /* created first: a path that cannot be written fails before the layout */
  if (file_create(&w, path, e) != FL_OK) return err_prefix(e, "%s", what);
  if ((rc_ = render(chart, fmt, &data, &len, e)) != FL_OK) {
    file_abort(&w);
    return rc_;
  }
  if ((rc_ = file_write(&w, data, len, e)) == FL_OK) rc_ = file_commit(&w, e);
  else file_abort(&w);
  free(data);
  return rc_ == FL_OK ? FL_OK : err_prefix(e, "%s", what);
}
