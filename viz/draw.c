/*
** draw.c -- builds the cgraph picture of a scene: one cluster per stage
** when there are several, kernel clusters or module clusters inside it,
** one Graphviz node per visible graph node, output and summary, edges
** from each input to its consumer.
** Invariant: every graph node is drawn exactly once, either as itself or
** folded into one summary node (collapse.c decides which); so the picture's
** node count and the graph's always reconcile through "N nodes collapsed".
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <graphviz/cgraph.h>

#include "viz/draw_impl.h"
#include "fuse/plan.h"

#define FONT "Helvetica,Arial,sans-serif"
#define KERNEL_PEN "#3d6aa8"
#define BREAK_PEN "#c62828"
#define COLLAPSED_PEN "#a0a0a0"
/* a joint graph: forward blue, backward orange, the saved edges red */
#define JOINT_FW_FILL "#dcebfa"
#define JOINT_FW_PEN "#3b6fb6"
#define JOINT_BW_FILL "#fde4cc"
#define JOINT_BW_PEN "#c2611f"
#define JOINT_SAVED_PEN "#b01e3c"
/* a value kept in a blocked channel layout (nChw8c) between kernels */
#define BLOCKED_PEN "#7b3fa0"

static Agnode_t *disp(viz_view *v, int id);

void viz_opts_init(viz_opts *o) {
  memset(o, 0, sizeof *o);
  o->rankdir = "TB";
  o->legend = 1;
  o->max_nodes = VIZ_DEFAULT_MAX_NODES;
  o->focus_around = o->focus_block = -1;
  o->focus_depth = 2;
  o->weights_box = 1;
  o->inline_leaves = -1;
  o->edge_labels = 1;
  o->scale = 1.0;
}

/* "10" times the picture's scale, for an attribute. */
static char *scaled(viz_builder *b, double v, char *buf, size_t n) {
  double sc = b->o->scale > 0 ? b->o->scale : 1.0;
  snprintf(buf, n, "%.3g", v * sc);
  return buf;
}

/* cgraph takes char * for strings it only reads. */
static void set(void *obj, const char *name, const char *value) {
  agsafeset(obj, (char *)name, (char *)value, "");
}

/* Every point-size="N" (and POINT-SIZE) of label b times scale: the one
** place a projector's larger type is applied to the labels. */
static void scale_sizes(strbuf *b, double scale) {
  strbuf out;
  const char *p = b->p, *q;
  memset(&out, 0, sizeof out);
  for (;;) {
    const char *a = strstr(p, "oint-size=\""), *c = strstr(p, "OINT-SIZE=\"");
    char *end;
    long v;
    q = !a ? c : !c ? a : a < c ? a : c;
    if (!q) break;
    q += 11;
    v = strtol(q, &end, 10);
    strbuf_printf(&out, "%.*s%ld", (int)(q - p), p, (long)(v * scale + 0.5));
    p = end;
  }
  strbuf_printf(&out, "%s", p);
  if (out.oom || !out.p) { free(out.p); b->oom = 1; return; }
  free(b->p);
  *b = out;
}

/* Sets an HTML-like label.  agstrdup_html interns the text as HTML; the
** agxset inside agsafeset then finds that interned string and keeps its
** HTML mark, which is the documented way to set one through cgraph. */
static void set_html(viz_builder *bd, void *obj, const char *name) {
  strbuf *b = &bd->tmp;
  char *h;
  if (b->oom || !b->p) return;
  if (bd->o->scale > 0 && bd->o->scale != 1.0) scale_sizes(b, bd->o->scale);
  if (b->oom || !b->p) return;
  h = agstrdup_html(bd->G, b->p);
  agsafeset(obj, (char *)name, h, "");
  agstrfree(bd->G, h);
}

static void sb_reset(strbuf *b) {
  if (b->p) b->p[0] = '\0';
  b->n = 0;
}

void viz_stage_numbers(const viz_stage *st, int *kernels, int *buffers,
                       int64_t *bytes) {
  const ir_graph *g = st->g;
  int i, k;
  int64_t moved = 0;
  if (st->has_stats) {
    *kernels = st->stat_kernels;
    *buffers = st->stat_buffers;
    *bytes = st->stat_bytes;
    return;
  }
  if (st->kernels) {
    int nb = 0, *kern, *ext;
    for (k = 0; k < st->nkernels; k++)
      moved += st->kernels[k].bytes_read + st->kernels[k].bytes_written;
    kern = malloc((size_t)(g->n ? g->n : 1) * sizeof *kern);
    ext = calloc((size_t)(g->n ? g->n : 1), sizeof *ext);
    if (kern && ext) {
      /* a buffer for every op result that is stored (by default: that
      ** leaves its kernel); views are never buffers */
      viz_kernel_map(st, kern);
      viz_external_uses(g, kern, ext);
      for (i = 0; i < g->n; i++) {
        const ir_node *nd = &g->nodes[i];
        if (nd->kind != IR_OP || (op_info_of(nd->op)->flags & OPF_VIEW)) continue;
        nb += st->stored ? st->stored[i] != 0 : (kern[i] < 0 || ext[i]);
      }
    }
    free(kern);
    free(ext);
    *kernels = st->nkernels;
    *buffers = nb;
    *bytes = moved;
    return;
  }
  /* a plain graph runs op by op: the cost model's reference for it */
  {
    ir_opcost c;
    fuse_reference_cost(g, &c);
    *kernels = c.kernels;
    *buffers = c.buffers;
    *bytes = c.bytes;
  }
}

/* kern[i] = the kernel computing node i, or -1.  A view belongs to the
** kernel folding it only when no other kernel folds it too. */
void viz_kernel_map(const viz_stage *st, int *kern) {
  int i, k, n = st->g->n;
  for (i = 0; i < n; i++) kern[i] = -1;
  for (k = 0; k < st->nkernels; k++)
    for (i = 0; i < st->kernels[k].nviews; i++) {
      int id = st->kernels[k].views ? st->kernels[k].views[i] : -1;
      if (id < 0 || id >= n) continue;
      kern[id] = kern[id] == -1 || kern[id] == k ? k : -2;
    }
  for (i = 0; i < n; i++)
    if (kern[i] == -2) kern[i] = -1;
  for (k = 0; k < st->nkernels; k++)
    for (i = 0; i < st->kernels[k].nnodes; i++) {
      int id = st->kernels[k].nodes ? st->kernels[k].nodes[i] : -1;
      if (id >= 0 && id < n) kern[id] = k;
    }
}

/* ext[i] = 1 when node i's value is read outside its kernel or returned:
** then it must live in memory.  An op inside a kernel with ext 0 is an
** intermediate fusion removed. */
void viz_external_uses(const ir_graph *g, const int *kern, int *ext) {
  int i, k;
  memset(ext, 0, (size_t)g->n * sizeof *ext);
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_OP) continue;
    for (k = 0; k < nd->nin; k++) {
      int j = nd->in[k];
      if (j >= 0 && (kern[j] < 0 || kern[j] != kern[i])) ext[j] = 1;
    }
  }
  for (i = 0; i < g->nout; i++) ext[g->outputs[i]] = 1;
}

/* ---- clusters ---------------------------------------------------------- */

static Agraph_t *cluster(Agraph_t *parent, const char *name) {
  return agsubg(parent, (char *)name, 1);
}

/* The nested module clusters for scope "blocks.3.attn": "blocks.3" and
** "blocks.3.attn".  A prefix followed by a number ("blocks" before "3") is
** a container of repeated blocks and gets no cluster of its own: it would
** only add a frame around frames. */
static Agraph_t *scope_cluster(viz_builder *b, viz_view *v, const char *scope) {
  Agraph_t *cur = v->root;
  char name[320], label[256];
  size_t len = strlen(scope), i;
  int depth = 0;
  static const char *fills[] = {"#f7f7f7", "#efefef", "#e8e8e8", "#e0e0e0"};
  for (i = 0; i <= len; i++) {
    size_t j;
    int numeric = 1;
    if (i < len && scope[i] != '.') continue;
    /* the next component: is it a number? */
    for (j = i + 1; j < len && scope[j] != '.'; j++)
      if (scope[j] < '0' || scope[j] > '9') numeric = 0;
    if (i < len && numeric && j > i + 1) continue;
    if (i >= sizeof label) break;
    memcpy(label, scope, i);
    label[i] = '\0';
    snprintf(name, sizeof name, "cluster_%sm_%s", v->pfx, label);
    /* a new subgraph starts with its parent's attribute values, so only a
    ** lookup tells a new cluster from one met before */
    if (agsubg(cur, name, 0)) {
      cur = agsubg(cur, name, 0);
    } else {
      cur = cluster(cur, name);
      sb_reset(&b->tmp);
      strbuf_printf(&b->tmp, "<font point-size=\"9\" color=\"#555555\">");
      viz_esc(&b->tmp, label);
      strbuf_printf(&b->tmp, "</font>");
      set_html(b, cur, "label");
      set(cur, "style", "rounded,filled");
      set(cur, "fillcolor", fills[depth < 3 ? depth : 3]);
      set(cur, "color", "#b0b0b0");
      set(cur, "labeljust", "l");
    }
    depth++;
  }
  return cur;
}

static void kernel_cluster(viz_view *v, int k) {
  char name[64];
  Agraph_t *c;
  snprintf(name, sizeof name, "cluster_%sk%d", v->pfx, k);
  c = cluster(v->root, name);
  v->kclus[k] = c;
  set(c, "label", "");  /* a new subgraph would show its parent's label */
  set(c, "style", "rounded,filled");
  set(c, "fillcolor", "#f5f8fd");
  set(c, "color", KERNEL_PEN);
  set(c, "penwidth", "1.2");
}

/* The kernel's name and traffic, as a text node at the top of its cluster
** rather than as the cluster's label: dot routes edges around nodes but
** straight through cluster labels, and every edge into a kernel would
** strike its name out.  Invisible edges keep it above the kernel's entry
** nodes (those reading nothing else from the same kernel) and below
** whatever the kernel reads: were it level with a producer, the kernel's
** frame would share that rank with the producer's frame, and frames
** sharing a rank go side by side, a staircase across the page. */
static void kernel_header(viz_builder *b, viz_view *v, int k) {
  const viz_kernel *kn = &v->st->kernels[k];
  const ir_graph *g = v->g;
  char name[64], r[32], w[32];
  Agnode_t *h = NULL;
  int i, j, shown = 0;
  for (i = 0; i < g->n; i++) shown += v->kern[i] == k && v->show[i] < 0;
  if (!shown) return;
  snprintf(name, sizeof name, "%skh%d", v->pfx, k);
  h = agnode(v->kclus[k], name, 1);
  sb_reset(&b->tmp);
  /* a table, not a <br/>: rows keep the name's descenders (the
  ** underscores of fused_add_relu) clear of the line below */
  strbuf_printf(&b->tmp, "<table border=\"0\" cellborder=\"0\" cellspacing=\"0\" "
                "cellpadding=\"1\"><tr><td><font point-size=\"11\"><b>");
  if (kn->name) viz_esc_max(&b->tmp, kn->name, 60);
  else strbuf_printf(&b->tmp, "kernel %d", k);
  strbuf_printf(&b->tmp, "</b></font></td></tr><tr><td><font point-size=\"9\">%d node%s",
                kn->nnodes, kn->nnodes == 1 ? "" : "s");
  if (kn->nviews > 0)
    strbuf_printf(&b->tmp, " + %d view%s", kn->nviews, kn->nviews == 1 ? "" : "s");
  strbuf_printf(&b->tmp, " \xc2\xb7 read %s \xc2\xb7 wrote %s",
                viz_bytes_str(kn->bytes_read, r, sizeof r),
                viz_bytes_str(kn->bytes_written, w, sizeof w));
  if (kn->time_ms >= 0) strbuf_printf(&b->tmp, " \xc2\xb7 %.3g ms", kn->time_ms);
  if (kn->in_place)
    strbuf_printf(&b->tmp, "</font></td></tr><tr><td><font point-size=\"9\">"
                  "in place: its inputs were stored in it");
  if (kn->layout) {
    strbuf_printf(&b->tmp, "</font></td></tr><tr><td><font point-size=\"9\" color=\"%s\">writes ",
                  BLOCKED_PEN);
    viz_esc_max(&b->tmp, kn->layout, 32);
  }
  strbuf_printf(&b->tmp, "</font></td></tr></table>");
  set_html(b, h, "label");
  set(h, "shape", "plaintext");
  set(h, "style", "");
  set(h, "margin", "0.02,0.02");
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    int entry = 1;
    Agedge_t *ed;
    if (v->kern[i] != k || v->show[i] >= 0) continue;
    for (j = 0; nd->kind == IR_OP && j < nd->nin; j++) {
      int src = nd->in[j];
      Agnode_t *t;
      if (src < 0) continue;
      if (v->kern[src] == k && v->show[src] < 0) {
        entry = 0;
        continue;
      }
      if (v->show[src] >= 0 && v->sums[v->show[src]].no_edges_out) continue;   /* the weights box */
      t = disp(v, src);
      if (t && !agedge(b->G, t, h, NULL, 0)) set(agedge(b->G, t, h, NULL, 1), "style", "invis");
    }
    if (!entry) continue;
    ed = agedge(b->G, h, v->an[i], NULL, 1);
    set(ed, "style", "invis");
  }
}

/* ---- nodes --------------------------------------------------------------- */

/* Where node id lives: its kernel's cluster, its module's cluster, or the
** stage.  Leaves (parameters too) stay outside module clusters: dot ranks
** a parameter just above its consumer, which would stretch the module's
** frame up into the ranks of the module before it; two frames sharing a
** rank are placed side by side, and a model's blocks would drift into a
** staircase many times wider than the graph. */
static Agraph_t *home_of(viz_builder *b, viz_view *v, int id) {
  const ir_node *nd = &v->g->nodes[id];
  if (v->kern && v->kern[id] >= 0) return v->kclus[v->kern[id]];
  if (v->st->kernels || !b->o->group_modules || nd->kind != IR_OP) return v->root;
  if (!nd->scope || !nd->scope[0]) return v->root;
  return scope_cluster(b, v, nd->scope);
}

static void style_node(viz_builder *b, Agnode_t *n, viz_class c) {
  const viz_colors *col = viz_class_colors(c);
  char num[16];
  static const char *shapes[VIZ_NCLASSES] = {
    "box", "box", "box", "box", "box", "box",
    "invhouse", "cylinder", "box", "house"};
  b->used[c] = 1;
  set(n, "fillcolor", col->fill);
  set(n, "color", col->pen);
  if (shapes[c][0] != 'b') set(n, "shape", shapes[c]);
  if (c == VIZ_CONST) set(n, "style", "filled");
  if (c == VIZ_INPUT || c == VIZ_OUTPUT) set(n, "penwidth", scaled(b, 1.6, num, sizeof num));
}

/* A weight or constant drawn inside its reader's label, not as a box. */
static int inlined(const viz_view *v, int id) { return v->inl && v->inl[id]; }

/* The reader's lines for the leaves it reads: "w blocks.1.attn.q_proj.weight
** [64,64]", "+ 1e-05", in the leaf's own colour. */
static void inlined_inputs(viz_builder *b, viz_view *v, int id) {
  const ir_graph *g = v->g;
  const ir_node *nd = &g->nodes[id];
  char ty[128];
  int k;
  for (k = 0; k < nd->nin; k++) {
    const ir_node *in;
    if (nd->in[k] < 0 || !inlined(v, nd->in[k])) continue;
    in = &g->nodes[nd->in[k]];
    strbuf_printf(&b->tmp, "<br/><font point-size=\"9\" color=\"%s\">",
                  in->kind == IR_PARAM ? "#7a5a1e" : "#555555");
    if (in->kind == IR_CONST && meta_numel(&in->meta) == 1 && in->value.st) {
      strbuf_printf(&b->tmp, "%.6g", ten_get(&in->value, 0));
    } else {
      /* the module path's last two parts ("q_proj.weight"): the reader's
      ** tooltip and the listing have the rest, and width is what a
      ** projector scales down */
      const char *nm = in->name ? in->name : in->kind == IR_CONST ? "const" : "param";
      const char *p = nm + strlen(nm);
      int dots = 0;
      while (p > nm && !(p[-1] == '.' && ++dots == 2)) p--;
      if (p > nm) strbuf_printf(&b->tmp, "\xe2\x80\xa6");
      viz_esc_max(&b->tmp, p, 40);
      strbuf_printf(&b->tmp, " ");
      viz_esc(&b->tmp, viz_shape_str(g, nd->in[k], ty, sizeof ty));
    }
    strbuf_printf(&b->tmp, "</font>");
  }
}

static void draw_node(viz_builder *b, viz_view *v, int id) {
  const ir_graph *g = v->g;
  const ir_node *nd = &g->nodes[id];
  char name[48], ty[128];
  Agnode_t *n;
  snprintf(name, sizeof name, "%sn%d", v->pfx, id);
  n = agnode(home_of(b, v, id), name, 1);
  v->an[id] = n;
  viz_type_str(g, id, ty, sizeof ty);
  sb_reset(&b->tmp);
  switch (nd->kind) {
  case IR_INPUT:
    strbuf_printf(&b->tmp, "<b>");
    if (nd->name) viz_esc_max(&b->tmp, nd->name, 40);
    else strbuf_printf(&b->tmp, "input");
    strbuf_printf(&b->tmp, "</b> <font point-size=\"8\" color=\"#666666\">input %d</font>",
                  nd->index);
    break;
  case IR_PARAM:
    strbuf_printf(&b->tmp, "<b>");
    if (nd->name) viz_esc_max(&b->tmp, nd->name, 40);
    else strbuf_printf(&b->tmp, "param");
    strbuf_printf(&b->tmp, "</b>");
    break;
  case IR_CONST:
    if (nd->name) {                  /* a backward graph's saved value */
      strbuf_printf(&b->tmp, "<b>");
      viz_esc_max(&b->tmp, nd->name, 40);
      strbuf_printf(&b->tmp, "</b>");
    } else if (meta_numel(&nd->meta) == 1 && nd->value.st)
      strbuf_printf(&b->tmp, "<b>%.6g</b>", ten_get(&nd->value, 0));
    else
      strbuf_printf(&b->tmp, "<b>const</b>");
    break;
  case IR_OP:
    strbuf_printf(&b->tmp, "<b>%s</b> <font point-size=\"8\" color=\"#666666\">%%%d</font>",
                  op_name(nd->op), id);
    break;
  }
  strbuf_printf(&b->tmp, "<br/><font point-size=\"9\">");
  viz_esc(&b->tmp, ty);
  strbuf_printf(&b->tmp, "</font>");
  if (nd->kind == IR_OP && v->inl) inlined_inputs(b, v, id);
  if (v->jrec && v->jrec[id])
    strbuf_printf(&b->tmp, "<br/><font point-size=\"9\" color=\"%s\">recomputed by the backward</font>",
                  JOINT_SAVED_PEN);
  set_html(b, n, "label");
  style_node(b, n, viz_class_in(g, id));
  if (v->jside && v->jside[id]) {     /* a joint graph: its two halves */
    char num[16];
    int fw = v->jside[id] == 1;
    set(n, "fillcolor", fw ? JOINT_FW_FILL : JOINT_BW_FILL);
    set(n, "color", fw ? JOINT_FW_PEN : JOINT_BW_PEN);
    b->any_joint = 1;
    b->used[viz_class_in(g, id)] = 0;   /* the halves' colours replace the kinds' */
    if (v->jrec && v->jrec[id]) {
      set(n, "style", "filled,dashed");
      set(n, "penwidth", scaled(b, 2, num, sizeof num));
    }
  }
  if (nd->where) set(n, "tooltip", nd->where);
}

static void draw_summary(viz_builder *b, viz_view *v, int s) {
  viz_summary *sm = &v->sums[s];
  char name[48], num[16];
  snprintf(name, sizeof name, "%sc%d", v->pfx, s);
  sm->an = agnode(v->root, name, 1);
  sb_reset(&b->tmp);
  if (sm->title[0]) {
    strbuf_printf(&b->tmp, "<b>");
    viz_esc(&b->tmp, sm->title);
    strbuf_printf(&b->tmp, "</b>");
  } else {
    strbuf_printf(&b->tmp, "<b>\xe2\x8b\xaf %d nodes collapsed \xe2\x8b\xaf</b>", sm->count);
  }
  if (sm->note[0]) {
    strbuf_printf(&b->tmp, "<br/><font point-size=\"9\">");
    viz_esc(&b->tmp, sm->note);
    strbuf_printf(&b->tmp, "</font>");
  }
  set_html(b, sm->an, "label");
  set(sm->an, "shape", "box");
  set(sm->an, "style", "dashed,filled,rounded");
  set(sm->an, "fillcolor", "#ffffff");
  set(sm->an, "color", "#777777");
  set(sm->an, "penwidth", scaled(b, 1.5, num, sizeof num));
  b->any_summary = 1;
}

static Agnode_t *disp(viz_view *v, int id) {
  return v->show[id] < 0 ? v->an[id] : v->sums[v->show[id]].an;
}

static void draw_edge(viz_builder *b, viz_view *v, int src, int dst, Agnode_t *t, Agnode_t *h,
                      int summary) {
  Agedge_t *ed;
  char sh[96], by[32], lab[160], num[16];
  const char *lay;
  if (summary) {
    /* many graph edges fold into one picture edge */
    if (agedge(b->G, t, h, NULL, 0)) return;
    ed = agedge(b->G, t, h, NULL, 1);
    /* thick grey with an open arrowhead: nothing like the thin dashed blue
    ** of an intermediate a kernel keeps */
    set(ed, "style", "solid");
    set(ed, "color", COLLAPSED_PEN);
    set(ed, "penwidth", scaled(b, 3, num, sizeof num));
    set(ed, "arrowhead", "empty");
    b->any_summary_edge = 1;
    return;
  }
  ed = agedge(b->G, t, h, NULL, 1);
  if (v->removed && v->removed[src]) {
    set(ed, "style", "dashed");
    set(ed, "color", KERNEL_PEN);
    b->any_dashed = 1;
  }
  /* a joint graph's cut: a forward value the backward reads, saved */
  if (v->jside && dst >= 0 && v->jside[dst] == 2 && v->jsaved[src] &&
      (v->jside[src] == 1 || v->g->nodes[src].kind == IR_INPUT)) {
    set(ed, "color", JOINT_SAVED_PEN);
    set(ed, "fontcolor", JOINT_SAVED_PEN);
    set(ed, "penwidth", scaled(b, 3, num, sizeof num));
    b->any_saved = 1;
    viz_shape_str(v->g, src, sh, sizeof sh);
    snprintf(lab, sizeof lab, "saved %s %s", sh, viz_bytes_str(viz_node_bytes(v->g, src), by, sizeof by));
    set(ed, "label", lab);
    return;
  }
  /* where layouts change: a blocked value goes from kernel to kernel
  ** without a reorder, and a plain edge into or out of it is one */
  lay = v->st->layout ? v->st->layout[src] : NULL;
  if (lay) {
    set(ed, "color", BLOCKED_PEN);
    set(ed, "fontcolor", BLOCKED_PEN);
    set(ed, "penwidth", scaled(b, 2, num, sizeof num));
    b->any_blocked = 1;
  }
  if (!b->o->edge_labels) return;
  viz_shape_str(v->g, src, sh, sizeof sh);
  if (v->removed && v->removed[src])
    snprintf(lab, sizeof lab, "%s fused", sh);
  else
    snprintf(lab, sizeof lab, "%s %s%s%s", sh, viz_bytes_str(viz_node_bytes(v->g, src), by, sizeof by),
             lay ? " " : "", lay ? lay : "");
  set(ed, "label", lab);
}

/* Draws one stage into v->root. */
static int draw_stage(viz_builder *b, viz_view *v) {
  const ir_graph *g = v->g;
  int i, k;
  char name[48], ty[128];
  /* a frame for each kernel with a node shown (an empty frame costs dot
  ** time and shows nothing: its nodes are in a summary) */
  for (i = 0; i < g->n && v->kern; i++)
    if (v->show[i] < 0 && v->kern[i] >= 0 && !v->kclus[v->kern[i]]) kernel_cluster(v, v->kern[i]);
  for (i = 0; i < g->n; i++)
    if (v->show[i] < 0 && !inlined(v, i)) draw_node(b, v, i);
  for (i = 0; i < v->nsums; i++)
    if (v->sums[i].count > 0) draw_summary(b, v, i);
  for (k = 0; k < v->st->nkernels && v->st->kernels; k++) kernel_header(b, v, k);
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_OP) continue;
    for (k = 0; k < nd->nin; k++) {
      int j = nd->in[k];
      Agnode_t *t, *h;
      if (j < 0 || inlined(v, j)) continue;
      t = disp(v, j);
      h = disp(v, i);
      if (t == h) continue;
      /* the weights box feeds dozens of kernels across the graph: its
      ** edges would be most of the picture (and of dot's time) */
      if (v->show[j] >= 0 && v->sums[v->show[j]].no_edges_out) continue;
      draw_edge(b, v, j, i, t, h, v->show[i] >= 0 || v->show[j] >= 0);
    }
  }
  for (i = 0; i < g->nout; i++) {
    int src = g->outputs[i];
    Agnode_t *n;
    snprintf(name, sizeof name, "%sout%d", v->pfx, i);
    n = agnode(v->root, name, 1);
    v->outn[i] = n;
    sb_reset(&b->tmp);
    if (g->joint_nres && i >= g->joint_nres && i < ir_nresults(g)) {
      const ir_node *leaf = &g->nodes[g->joint_wrt[i - g->joint_nres]];
      strbuf_printf(&b->tmp, "<b>grad of ");      /* a joint graph's gradient */
      viz_esc_max(&b->tmp, leaf->name ? leaf->name : "?", 40);
      strbuf_printf(&b->tmp, "</b><br/><font point-size=\"9\">");
    } else if (i < ir_nresults(g) && g->nodes[src].kind == IR_OP && g->nodes[src].name) {
      strbuf_printf(&b->tmp, "<b>");  /* a backward graph's "grad of 0.weight" */
      viz_esc_max(&b->tmp, g->nodes[src].name, 40);
      strbuf_printf(&b->tmp, "</b><br/><font point-size=\"9\">");
    } else if (i < ir_nresults(g)) {
      strbuf_printf(&b->tmp, "<b>output %d</b><br/><font point-size=\"9\">", i);
    } else {
      /* a captured in-place update: copied into the input or weight after
      ** the graph ran, drawn as an arrow back to it */
      const ir_node *d = &g->nodes[g->wb[i - ir_nresults(g)]];
      strbuf_printf(&b->tmp, "<b>write-back into ");
      viz_esc(&b->tmp, d->name ? d->name : "?");
      strbuf_printf(&b->tmp, "</b><br/><font point-size=\"9\">");
    }
    viz_esc(&b->tmp, viz_type_str(g, src, ty, sizeof ty));
    strbuf_printf(&b->tmp, "</font>");
    set_html(b, n, "label");
    style_node(b, n, VIZ_OUTPUT);
    draw_edge(b, v, src, -1, disp(v, src), n, v->show[src] >= 0);
    if (i >= ir_nresults(g)) {
      Agedge_t *ed = agedge(b->G, n, disp(v, g->wb[i - ir_nresults(g)]), NULL, 1);
      set(ed, "style", "dashed");
      set(ed, "constraint", "false");
      set(ed, "color", "#b03030");
      set(ed, "fontcolor", "#b03030");
      set(ed, "label", "in place");
    }
  }
  if (g->n == 0) {
    /* an empty graph still makes a picture that says what it is */
    snprintf(name, sizeof name, "%sempty", v->pfx);
    set(agnode(v->root, name, 1), "label", "empty graph (no nodes)");
    set(agnode(v->root, name, 0), "style", "dashed");
  }
  return b->tmp.oom ? FL_ENOMEM : FL_OK;
}

/* ---- legend, title, breaks ---------------------------------------------- */

static void legend(viz_builder *b, const viz_view *last) {
  Agnode_t *n = agnode(b->G, "legend", 1);
  int c;
  /* under the last stage's outputs (invisible edges): beside a tall graph
  ** it makes the picture wider, and the width is what a projector scales
  ** down */
  for (c = 0; last && c < last->g->nout; c++)
    if (last->outn[c]) set(agedge(b->G, last->outn[c], n, NULL, 1), "style", "invis");
  sb_reset(&b->tmp);
  strbuf_printf(&b->tmp, "<TABLE BORDER=\"1\" COLOR=\"#bbbbbb\" CELLBORDER=\"0\" "
                "CELLSPACING=\"2\" CELLPADDING=\"2\" BGCOLOR=\"#ffffff\">"
                "<TR><TD COLSPAN=\"2\" ALIGN=\"LEFT\"><B>legend</B></TD></TR>");
  for (c = 0; c < VIZ_NCLASSES; c++) {
    const viz_colors *col = viz_class_colors((viz_class)c);
    if (!b->used[c]) continue;
    strbuf_printf(&b->tmp, "<TR><TD BGCOLOR=\"%s\" BORDER=\"1\" COLOR=\"%s\" "
                  "WIDTH=\"24\" HEIGHT=\"12\"> </TD><TD ALIGN=\"LEFT\">"
                  "<FONT POINT-SIZE=\"9\">%s</FONT></TD></TR>",
                  col->fill, col->pen, col->name);
  }
  if (b->any_kernel)
    strbuf_printf(&b->tmp, "<TR><TD BGCOLOR=\"#f5f8fd\" BORDER=\"1\" COLOR=\"%s\"> </TD>"
                  "<TD ALIGN=\"LEFT\"><FONT POINT-SIZE=\"9\">fused kernel</FONT></TD></TR>",
                  KERNEL_PEN);
  if (b->any_dashed)
    strbuf_printf(&b->tmp, "<TR><TD><FONT COLOR=\"%s\">- - -</FONT></TD><TD ALIGN=\"LEFT\">"
                  "<FONT POINT-SIZE=\"9\">intermediate kept in the kernel</FONT></TD></TR>",
                  KERNEL_PEN);
  if (b->any_summary)
    strbuf_printf(&b->tmp, "<TR><TD BORDER=\"1\" COLOR=\"#777777\"> </TD><TD ALIGN=\"LEFT\">"
                  "<FONT POINT-SIZE=\"9\">collapsed nodes</FONT></TD></TR>");
  if (b->any_summary_edge)
    strbuf_printf(&b->tmp, "<TR><TD><FONT COLOR=\"%s\"><B>\xe2\x94\x81\xe2\x94\x81\xe2\x96\xb7</B></FONT></TD>"
                  "<TD ALIGN=\"LEFT\"><FONT POINT-SIZE=\"9\">edges into or out of collapsed nodes"
                  "</FONT></TD></TR>", COLLAPSED_PEN);
  if (b->any_break)
    strbuf_printf(&b->tmp, "<TR><TD><FONT COLOR=\"%s\">- - -</FONT></TD><TD ALIGN=\"LEFT\">"
                  "<FONT POINT-SIZE=\"9\">graph break</FONT></TD></TR>", BREAK_PEN);
  if (b->any_joint)
    strbuf_printf(&b->tmp, "<TR><TD BGCOLOR=\"%s\" BORDER=\"1\" COLOR=\"%s\"> </TD><TD ALIGN=\"LEFT\">"
                  "<FONT POINT-SIZE=\"9\">forward</FONT></TD></TR>"
                  "<TR><TD BGCOLOR=\"%s\" BORDER=\"1\" COLOR=\"%s\"> </TD><TD ALIGN=\"LEFT\">"
                  "<FONT POINT-SIZE=\"9\">backward (from the op table's derivative rules)</FONT></TD></TR>",
                  JOINT_FW_FILL, JOINT_FW_PEN, JOINT_BW_FILL, JOINT_BW_PEN);
  if (b->any_blocked)
    strbuf_printf(&b->tmp, "<TR><TD><FONT COLOR=\"%s\"><B>\xe2\x94\x81\xe2\x94\x81\xe2\x96\xb6</B></FONT></TD>"
                  "<TD ALIGN=\"LEFT\"><FONT POINT-SIZE=\"9\">kept in blocks of channels: no reorder"
                  "</FONT></TD></TR>", BLOCKED_PEN);
  if (b->any_saved)
    strbuf_printf(&b->tmp, "<TR><TD><FONT COLOR=\"%s\"><B>\xe2\x94\x81\xe2\x94\x81\xe2\x96\xb6</B></FONT></TD>"
                  "<TD ALIGN=\"LEFT\"><FONT POINT-SIZE=\"9\">saved: kept from forward to backward"
                  "</FONT></TD></TR>", JOINT_SAVED_PEN);
  strbuf_printf(&b->tmp, "</TABLE>");
  set(n, "shape", "plaintext");
  set(n, "margin", "0");
  set_html(b, n, "label");
}

/* The heading: the caller's title, what was collapsed, and for a picture
** of one plan, why it moves or holds more than the captured graph (a
** compare picture says that in the plan's own frame). */
static void esc_wrapped(strbuf *b, const char *text, size_t width);

static void title(viz_builder *b, int total, int collapsed, const char *note) {
  int any = b->o->title || collapsed || note;
  if (!any) return;
  sb_reset(&b->tmp);
  if (b->o->title) {
    strbuf_printf(&b->tmp, "<font point-size=\"16\"><b>");
    viz_esc_max(&b->tmp, b->o->title, 200);
    strbuf_printf(&b->tmp, "</b></font>");
  }
  if (collapsed && (b->o->focus_kernel || b->o->focus_around >= 0 || b->o->focus_block >= 0)) {
    char what[64];
    if (b->o->focus_kernel) snprintf(what, sizeof what, "kernel %s", b->o->focus_kernel);
    else if (b->o->focus_around >= 0)
      snprintf(what, sizeof what, "%%%d and %d step%s around it", b->o->focus_around,
               b->o->focus_depth, b->o->focus_depth == 1 ? "" : "s");
    else snprintf(what, sizeof what, "block %d", b->o->focus_block);
    strbuf_printf(&b->tmp, "%s<font point-size=\"10\" color=\"#555555\">a piece: %s; "
                  "the other %d of %d nodes are the stubs</font>",
                  b->o->title ? "<br/>" : "", what, collapsed, total);
  } else if (collapsed) {
    strbuf_printf(&b->tmp, "%s<font point-size=\"10\" color=\"#555555\">%d of %d nodes "
                  "collapsed to stay within max_nodes %d</font>",
                  b->o->title ? "<br/>" : "", collapsed, total, b->max_nodes);
  }
  if (note) {
    strbuf_printf(&b->tmp, "%s<font point-size=\"10\" color=\"%s\">", b->o->title || collapsed ?
                  "<br/>" : "", BREAK_PEN);
    strbuf_printf(&b->tmp, "this plan ");
    esc_wrapped(&b->tmp, note, 110);
    strbuf_printf(&b->tmp, "</font>");
  }
  set_html(b, b->G, "label");
  set(b->G, "labelloc", "t");
}

/* The visible cut between piece i and piece i+1: a red marker node, red
** dashed edges from the outputs before it to the inputs after it. */
static void graph_break(viz_builder *b, viz_view *before, viz_view *after,
                        const viz_break *br, int i) {
  char name[48];
  Agnode_t *m;
  int k, any = 0;
  snprintf(name, sizeof name, "break%d", i);
  m = agnode(b->G, name, 1);
  sb_reset(&b->tmp);
  strbuf_printf(&b->tmp, "<font color=\"%s\"><b>\xe2\x9c\x82 graph break</b>: ", BREAK_PEN);
  viz_esc_max(&b->tmp, br && br->reason ? br->reason : "(no reason given)", 160);
  if (br && br->where) {
    strbuf_printf(&b->tmp, " (");
    viz_esc_max(&b->tmp, br->where, 120);
    strbuf_printf(&b->tmp, ")");
  }
  strbuf_printf(&b->tmp, "</font>");
  set_html(b, m, "label");
  set(m, "shape", "box");
  set(m, "style", "dashed,filled,rounded");
  set(m, "color", BREAK_PEN);
  set(m, "fillcolor", "#fff1f1");
  set(m, "penwidth", scaled(b, 2, name, sizeof name));
  b->any_break = 1;
  for (k = 0; k < before->g->nout; k++) {
    Agedge_t *ed = agedge(b->G, before->outn[k], m, NULL, 1);
    set(ed, "style", "dashed");
    set(ed, "color", BREAK_PEN);
    any = 1;
  }
  if (!any && before->g->n > 0) {
    Agedge_t *ed = agedge(b->G, disp(before, before->g->n - 1), m, NULL, 1);
    set(ed, "style", "dashed");
    set(ed, "color", BREAK_PEN);
  }
  any = 0;
  for (k = 0; k < after->g->n; k++) {
    Agedge_t *ed;
    if (after->g->nodes[k].kind != IR_INPUT) continue;
    ed = agedge(b->G, m, disp(after, k), NULL, 1);
    set(ed, "style", "dashed");
    set(ed, "color", BREAK_PEN);
    any = 1;
  }
  if (!any && after->g->n > 0) {
    Agedge_t *ed = agedge(b->G, m, disp(after, 0), NULL, 1);
    set(ed, "style", "dashed");
    set(ed, "color", BREAK_PEN);
  }
}

/* text escaped, broken into lines of about width bytes at spaces, so a
** long note does not stretch its frame across the page. */
static void esc_wrapped(strbuf *b, const char *text, size_t width) {
  size_t col = 0;
  while (*text) {
    size_t w = strcspn(text, " ");
    char word[512];
    if (col > 0 && col + 1 + w > width) {
      strbuf_printf(b, "<br/>");
      col = 0;
    } else if (col > 0) {
      strbuf_printf(b, " ");
      col++;
    }
    snprintf(word, sizeof word, "%.*s", (int)(w < sizeof word ? w : sizeof word - 1), text);
    viz_esc(b, word);
    col += w;
    text += w;
    while (*text == ' ') text++;
  }
}

/* The frame around stage i when a scene has several. */
static void stage_frame(viz_builder *b, const viz_scene *s, viz_view *v, int i) {
  char name[48], by[32];
  int kernels, buffers;
  int64_t bytes;
  const viz_stage *st = &s->stages[i];
  snprintf(name, sizeof name, "cluster_s%d", i);
  v->root = cluster(b->G, name);
  sb_reset(&b->tmp);
  if (s->compare) {
    viz_stage_numbers(st, &kernels, &buffers, &bytes);
    strbuf_printf(&b->tmp, "<font point-size=\"14\"><b>");
    if (st->label) viz_esc_max(&b->tmp, st->label, 80);
    else strbuf_printf(&b->tmp, "%s", i > 0 ? "after" : st->kernels ? "before" : "before (op by op)");
    strbuf_printf(&b->tmp, "</b></font><br/><font point-size=\"11\">");
    if (!st->kernels && st->g && ir_op_count(st->g) != kernels) {
      /* the drawing shows every op; views and constants run no kernel */
      int ops = ir_op_count(st->g);
      strbuf_printf(&b->tmp, "%d op%s drawn, %d of them kernel%s (views run none) \xc2\xb7 ",
                    ops, ops == 1 ? "" : "s", kernels, kernels == 1 ? "" : "s");
    } else {
      strbuf_printf(&b->tmp, "%d kernel%s \xc2\xb7 ", kernels, kernels == 1 ? "" : "s");
    }
    strbuf_printf(&b->tmp, "%d buffer%s \xc2\xb7 %s moved</font>", buffers, buffers == 1 ? "" : "s",
                  viz_bytes_str(bytes, by, sizeof by));
    if (v->jpol) {
      strbuf_printf(&b->tmp, "<br/><font point-size=\"12\" color=\"%s\"><b>partition %s: the forward "
                    "keeps %s for the backward", JOINT_SAVED_PEN, v->jpol,
                    viz_bytes_str(v->jbytes, by, sizeof by));
      if (v->jnrec)
        strbuf_printf(&b->tmp, " \xc2\xb7 %d op%s recomputed", v->jnrec, v->jnrec == 1 ? "" : "s");
      strbuf_printf(&b->tmp, "</b></font>");
    }
    if (st->note) {
      strbuf_printf(&b->tmp, "<br/><font point-size=\"10\" color=\"%s\">", BREAK_PEN);
      strbuf_printf(&b->tmp, "this plan ");
      esc_wrapped(&b->tmp, st->note, 90);
      strbuf_printf(&b->tmp, "</font>");
    }
  } else {
    strbuf_printf(&b->tmp, "<b>graph %d of %d</b>", i + 1, s->nstages);
    if (st->label) {
      /* a plain space next to a tag is dropped from SVG text ("graph 1 of
      ** 2before fusion"): a no-break space and a dot keep them apart */
      strbuf_printf(&b->tmp, "&#160;\xc2\xb7&#160;");
      viz_esc_max(&b->tmp, st->label, 80);
    }
  }
  set_html(b, v->root, "label");
  set(v->root, "style", "rounded");
  set(v->root, "color", s->compare ? "#888888" : "#bbbbbb");
  set(v->root, "labeljust", "l");
}

/* Builds the whole picture into b->G (already open). */
int viz_build_scene(viz_builder *b, const viz_scene *s, viz_view *views) {
  int i, rc, total = 0, collapsed = 0;
  char num[16];
  Agraph_t *G = b->G;
  agattr(G, AGRAPH, "rankdir", b->o->rankdir && strcmp(b->o->rankdir, "LR") == 0 ? "LR" : "TB");
  agattr(G, AGRAPH, "fontname", FONT);
  agattr(G, AGRAPH, "nodesep", "0.25");
  agattr(G, AGRAPH, "ranksep", "0.3");
  agattr(G, AGRAPH, "newrank", "true");
  agattr(G, AGRAPH, "bgcolor", "white");
  agattr(G, AGRAPH, "pad", "0.2");
  agattr(G, AGNODE, "shape", "box");
  agattr(G, AGNODE, "style", "rounded,filled");
  agattr(G, AGNODE, "fontname", FONT);
  agattr(G, AGNODE, "fontsize", scaled(b, 10, num, sizeof num));
  agattr(G, AGNODE, "fontcolor", "#1a1a1a");
  agattr(G, AGNODE, "margin", "0.10,0.04");
  agattr(G, AGNODE, "height", "0.3");
  agattr(G, AGEDGE, "fontname", FONT);
  agattr(G, AGEDGE, "fontsize", scaled(b, 8, num, sizeof num));
  agattr(G, AGEDGE, "fontcolor", "#555555");
  agattr(G, AGEDGE, "color", "#666666");
  agattr(G, AGEDGE, "arrowsize", scaled(b, 0.6, num, sizeof num));
  agattr(G, AGEDGE, "penwidth", scaled(b, 1, num, sizeof num));
  agattr(G, AGNODE, "penwidth", scaled(b, 1, num, sizeof num));
  for (i = 0; i < s->nstages; i++) {
    viz_view *v = &views[i];
    v->root = G;
    if (s->nstages > 1) stage_frame(b, s, v, i);
    if (v->st->kernels) b->any_kernel = 1;
    rc = draw_stage(b, v);
    if (rc) return err_set(b->e, rc, "draw: out of memory building the picture");
    total += v->g->n;
    collapsed += v->collapsed;
    if (i > 0 && !s->compare) graph_break(b, &views[i - 1], v, s->breaks ? &s->breaks[i - 1] : NULL, i - 1);
  }
  if (b->o->legend) legend(b, s->nstages > 0 ? &views[s->nstages - 1] : NULL);
  title(b, total, collapsed, s->nstages == 1 ? s->stages[0].note : NULL);
  return b->tmp.oom ? err_set(b->e, FL_ENOMEM, "draw: out of memory building the picture") : FL_OK;
}
