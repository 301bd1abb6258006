/*
** style.c -- the palette and the small text formatters every picture and
** the report share.  Fills are light and borders the same hue darker, so
** dark text stays readable on a projector and in print; hues are far
** apart so that the six op kinds can be told apart at a glance.
*/
#include <stdio.h>
#include <string.h>

#include "viz/style.h"
#include "fuse/plan.h"

static const viz_colors palette[VIZ_NCLASSES] = {
  {"#d8f0d8", "#4f8a4f", "elementwise"},
  {"#fdf0c2", "#a88a1c", "broadcast (re-reads 16 KiB or more)"},
  {"#e4e9ee", "#6b7b8c", "view / data movement"},
  {"#f8d7da", "#a5474f", "reduction"},
  {"#d3e3f8", "#3d6aa8", "matmul / conv"},
  {"#e7dcf3", "#7050a0", "opaque"},
  {"#ffe2c2", "#c46a1a", "input"},
  {"#f3ecdc", "#8a7350", "parameter"},
  {"#f2f2f2", "#8c8c8c", "constant"},
  {"#ffd3b0", "#b35414", "output"},
};

const viz_colors *viz_class_colors(viz_class c) {
  if ((int)c < 0 || c >= VIZ_NCLASSES) c = VIZ_OPAQUE;
  return &palette[c];
}

viz_class viz_class_of(const ir_node *nd) {
  switch (nd->kind) {
  case IR_INPUT: return VIZ_INPUT;
  case IR_PARAM: return VIZ_PARAM;
  case IR_CONST: return VIZ_CONST;
  case IR_OP: break;
  }
  if ((int)nd->op < 0 || nd->op >= OP_COUNT) return VIZ_OPAQUE;
  switch (op_info_of(nd->op)->kind) {
  case OPK_ELEMWISE: return VIZ_ELEMWISE;
  case OPK_BROADCAST: return VIZ_BROADCAST;
  case OPK_INJECTIVE: return VIZ_INJECTIVE;
  case OPK_REDUCTION: return VIZ_REDUCTION;
  case OPK_OUTFUSABLE: return VIZ_OUTFUSABLE;
  case OPK_OPAQUE: return VIZ_OPAQUE;
  }
  return VIZ_OPAQUE;
}

/* A binary op is drawn as a broadcast only when it really re-reads
** something big: an operand of VIZ_BROADCAST_BYTES or more that is read
** again for every slice of the result, because a dim outside one of its
** own dims is expanded (a [T,T] mask over every head, a [T,C] position
** table over the batch).  A bias vector re-read along the rows, a scalar,
** or a per-row value used across its row ([B,T,1] over [B,T,C]: each
** element read once) stays in cache or is read once: plain elementwise. */
#define VIZ_BROADCAST_BYTES (16 * 1024)

static int rereads_big(const ir_graph *g, int id, int in) {
  const fl_meta *o = &g->nodes[id].meta, *m;
  int s = g->nodes[id].in[in], d, off, expanded = 0;
  if (s < 0) return 0;
  m = &g->nodes[s].meta;
  if (m->ndim > o->ndim || fuse_node_bytes(g, s) < VIZ_BROADCAST_BYTES) return 0;
  off = o->ndim - m->ndim;
  for (d = 0; d < o->ndim; d++) {
    int64_t md = d < off ? 1 : m->shape[d - off];
    if (md == 1 && o->shape[d] > 1) expanded = 1;
    else if (md > 1 && expanded) return 1;   /* re-read for each outer slice */
  }
  return 0;
}

viz_class viz_class_in(const ir_graph *g, int id) {
  const ir_node *nd = &g->nodes[id];
  viz_class c = viz_class_of(nd);
  int i;
  if (c != VIZ_BROADCAST) return c;
  for (i = 0; i < nd->nin; i++)
    if (rereads_big(g, id, i)) return VIZ_BROADCAST;
  return VIZ_ELEMWISE;
}

/* Appends dim d of node nd ("128", "s0" or "s0*s1") at buf+*len. */
static void put_dim(const ir_graph *g, const ir_node *nd, int d, char *buf, size_t n, size_t *len) {
  int w;
  char ex[64];
  if (*len >= n) return;
  if (nd->sym[d] > 0)
    w = snprintf(buf + *len, n - *len, "%s%s", d ? "," : "", ir_sym_str(g, nd->sym[d] - 1, ex, sizeof ex));
  else
    w = snprintf(buf + *len, n - *len, "%s%lld", d ? "," : "",
                 (long long)nd->meta.shape[d]);
  if (w > 0) *len += (size_t)w;
}

/* Netron keeps shapes short enough to fit a node: four dims are shown in
** full, longer ones keep the two leading dims and the last. */
char *viz_shape_str(const ir_graph *g, int id, char *buf, size_t n) {
  const ir_node *nd = &g->nodes[id];
  size_t len = 0;
  int d, nd_ = nd->meta.ndim;
  if (n == 0) return buf;
  buf[0] = '[';
  buf[1 < n ? 1 : 0] = '\0';
  len = n > 1 ? 1 : 0;
  if (nd_ <= 4) {
    for (d = 0; d < nd_; d++) put_dim(g, nd, d, buf, n, &len);
  } else {
    put_dim(g, nd, 0, buf, n, &len);
    put_dim(g, nd, 1, buf, n, &len);
    if (len < n) {
      int w = snprintf(buf + len, n - len, ",\xe2\x80\xa6");  /* "…" */
      if (w > 0) len += (size_t)w;
    }
    put_dim(g, nd, nd_ - 1, buf, n, &len);
  }
  if (len < n) snprintf(buf + len, n - len, "]");
  return buf;
}

char *viz_type_str(const ir_graph *g, int id, char *buf, size_t n) {
  char sh[96];
  snprintf(buf, n, "%s%s", dtype_name(g->nodes[id].meta.dtype),
           viz_shape_str(g, id, sh, sizeof sh));
  return buf;
}

/* Both are the cost model's (fuse/memplan.c), so every view counts and
** writes bytes alike. */
int64_t viz_node_bytes(const ir_graph *g, int id) { return fuse_node_bytes(g, id); }

char *viz_bytes_str(int64_t bytes, char *buf, size_t n) { return fuse_bytes_str(bytes, buf, n); }

static void esc_n(strbuf *b, const char *s, size_t len) {
  size_t i, start = 0;
  for (i = 0; i < len; i++) {
    const char *rep = NULL;
    switch (s[i]) {
    case '&': rep = "&amp;"; break;
    case '<': rep = "&lt;"; break;
    case '>': rep = "&gt;"; break;
    case '"': rep = "&quot;"; break;
    case '\'': rep = "&#39;"; break;
    default:
      /* control characters other than tab/newline would make the XML of
      ** an SVG (and Graphviz's HTML-label parser) reject the document */
      if ((unsigned char)s[i] < 0x20 && s[i] != '\n' && s[i] != '\t') rep = " ";
      break;
    }
    if (rep) {
      if (i > start) strbuf_printf(b, "%.*s", (int)(i - start), s + start);
      strbuf_printf(b, "%s", rep);
      start = i + 1;
    }
  }
  if (len > start) strbuf_printf(b, "%.*s", (int)(len - start), s + start);
}

void viz_esc(strbuf *b, const char *s) {
  if (s) esc_n(b, s, strlen(s));
}

void viz_esc_max(strbuf *b, const char *s, size_t max) {
  size_t len;
  if (!s) return;
  len = strlen(s);
  if (len <= max) { esc_n(b, s, len); return; }
  /* back up to the start of a UTF-8 sequence so no character is split */
  while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80) max--;
  esc_n(b, s, max);
  strbuf_printf(b, "\xe2\x80\xa6");
}
