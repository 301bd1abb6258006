/*
** collapse.c -- what a picture of a big graph leaves out.  Dot needs
** seconds for a few thousand nodes and nobody can read them anyway, so
** beyond max_nodes a stage is summarized in two steps:
**   1. repeated blocks: consecutive runs of ops whose scopes differ only in
**      the block number ("blocks.1", "blocks.2"...) and whose op sequences
**      are identical are folded, all but the first, into one summary node;
**   2. if that is not enough (or there are no scopes), the middle of the
**      graph in id order is folded into one summary, keeping a head and a
**      tail that fit the budget.
** Leaves (inputs, parameters, constants) follow their consumers: shown
** when any consumer is shown, else folded with their first consumer.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "viz/draw_impl.h"
#include "graph/joint.h"
#include "fuse/partition.h"

static int add_summary(viz_view *v) {
  if (v->nsums == v->capsums) {
    int cap = v->capsums ? v->capsums * 2 : 8;
    viz_summary *ns = realloc(v->sums, (size_t)cap * sizeof *ns);
    if (!ns) return -1;
    v->sums = ns;
    v->capsums = cap;
  }
  memset(&v->sums[v->nsums], 0, sizeof v->sums[0]);
  return v->nsums++;
}

/* Leaves follow their consumers (see above); then counts are redone.
** vis is scratch of g->n ints.  Returns the number of picture nodes. */
static int settle(viz_view *v, int *vis) {
  const ir_graph *g = v->g;
  int i, k, total = g->nout;
  memset(vis, 0, (size_t)g->n * sizeof *vis);
  for (i = 0; i < g->nout; i++) vis[g->outputs[i]] = 1;
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_OP || v->show[i] >= 0) continue;
    for (k = 0; k < nd->nin; k++)
      if (nd->in[k] >= 0) vis[nd->in[k]] = 1;
  }
  for (i = 0; i < g->n; i++) {
    if (g->nodes[i].kind == IR_OP) continue;
    v->show[i] = vis[i] || v->first_use[i] < 0 ? -1 : v->show[v->first_use[i]];
  }
  for (i = 0; i < v->nsums; i++) v->sums[i].count = 0;
  v->collapsed = 0;
  for (i = 0; i < g->n; i++) {
    if (v->show[i] < 0) total++;
    else {
      v->sums[v->show[i]].count++;
      v->collapsed++;
    }
  }
  for (i = 0; i < v->nsums; i++) total += v->sums[i].count > 0;
  return total;
}

/* The block of scope "blocks.3.attn" is "blocks.3": everything up to the
** first all-digit component; its parent is "blocks".  0 when the scope has
** no numbered component. */
static size_t block_key(const char *scope, size_t *parent) {
  size_t i = 0, start;
  if (!scope) return 0;
  while (scope[i]) {
    int digits = 1;
    start = i;
    while (scope[i] && scope[i] != '.') {
      if (scope[i] < '0' || scope[i] > '9') digits = 0;
      i++;
    }
    if (digits && i > start && start > 0) {
      *parent = start - 1;
      return i;
    }
    if (scope[i] == '.') i++;
  }
  return 0;
}

typedef struct run { int start, len; size_t key, parent; const char *scope; } run;

static int same_block(const viz_view *v, const int *ops, const run *a, const run *b) {
  int k;
  if (!a->key || !b->key || a->len != b->len || a->parent != b->parent) return 0;
  if (strncmp(a->scope, b->scope, a->parent) != 0) return 0;
  for (k = 0; k < a->len; k++) {
    const ir_node *x = &v->g->nodes[ops[a->start + k]];
    const ir_node *y = &v->g->nodes[ops[b->start + k]];
    if (x->op != y->op || x->nin != y->nin) return 0;
  }
  return 1;
}

static int collapse_blocks(viz_view *v) {
  const ir_graph *g = v->g;
  int *ops = malloc((size_t)g->n * sizeof *ops);
  run *runs = malloc((size_t)g->n * sizeof *runs);
  int nops = 0, nruns = 0, i, j, r, k;
  if (!ops || !runs) { free(ops); free(runs); return FL_ENOMEM; }
  for (i = 0; i < g->n; i++) {
    size_t parent = 0, key;
    if (g->nodes[i].kind != IR_OP) continue;
    key = block_key(g->nodes[i].scope, &parent);
    if (nruns && runs[nruns - 1].key && key == runs[nruns - 1].key &&
        strncmp(g->nodes[i].scope, runs[nruns - 1].scope, key) == 0) {
      runs[nruns - 1].len++;
    } else {
      runs[nruns].start = nops;
      runs[nruns].len = 1;
      runs[nruns].key = key;
      runs[nruns].parent = parent;
      runs[nruns].scope = g->nodes[i].scope;
      nruns++;
    }
    ops[nops++] = i;
  }
  for (i = 0; i < nruns; i = j) {
    int s;
    for (j = i + 1; j < nruns && same_block(v, ops, &runs[i], &runs[j]); j++)
      ;
    if (j - i < 2) continue;
    s = add_summary(v);
    if (s < 0) { free(ops); free(runs); return FL_ENOMEM; }
    for (r = i + 1; r < j; r++)
      for (k = 0; k < runs[r].len; k++) v->show[ops[runs[r].start + k]] = s;
    if (j - i == 2)
      snprintf(v->sums[s].note, sizeof v->sums[s].note, "%.*s: the ops of %.*s again",
               (int)runs[i + 1].key, runs[i + 1].scope, (int)runs[i].key, runs[i].scope);
    else
      snprintf(v->sums[s].note, sizeof v->sums[s].note,
               "%.*s \xe2\x80\xa6 %.*s: %d blocks repeating %.*s",
               (int)runs[i + 1].key, runs[i + 1].scope, (int)runs[j - 1].key,
               runs[j - 1].scope, j - i - 1, (int)runs[i].key, runs[i].scope);
  }
  free(ops);
  free(runs);
  return FL_OK;
}

/* Folds the middle ops (in id order) into one summary, shrinking the kept
** head and tail until the picture fits. */
static int collapse_middle(viz_view *v, int max_nodes, int *vis) {
  const ir_graph *g = v->g;
  int *saved = malloc((size_t)g->n * sizeof *saved);
  int *vops = malloc((size_t)g->n * sizeof *vops);
  int nsaved = v->nsums, keep = max_nodes / 2, i;
  if (!saved || !vops) { free(saved); free(vops); return FL_ENOMEM; }
  memcpy(saved, v->show, (size_t)g->n * sizeof *saved);
  for (;;) {
    int nv = 0, head, tail, lo, hi, s, total;
    for (i = 0; i < g->n; i++)
      if (g->nodes[i].kind == IR_OP && v->show[i] < 0) vops[nv++] = i;
    if (nv <= keep) break;
    head = keep / 2;
    tail = keep - head;
    lo = vops[head];
    hi = vops[nv - tail - 1];
    s = add_summary(v);
    if (s < 0) { free(saved); free(vops); return FL_ENOMEM; }
    for (i = lo; i <= hi; i++)
      if (g->nodes[i].kind == IR_OP) v->show[i] = s;
    snprintf(v->sums[s].note, sizeof v->sums[s].note, "ops %%%d \xe2\x80\xa6 %%%d", lo, hi);
    total = settle(v, vis);
    if (total <= max_nodes || keep <= 8) break;
    memcpy(v->show, saved, (size_t)g->n * sizeof *saved);
    v->nsums = nsaved;
    keep = keep * 2 / 3;
  }
  free(saved);
  free(vops);
  return FL_OK;
}

static int collapse(viz_view *v, int max_nodes) {
  int *vis = malloc((size_t)v->g->n * sizeof *vis);
  int rc;
  if (!vis) return FL_ENOMEM;
  rc = collapse_blocks(v);
  if (rc == FL_OK && settle(v, vis) > max_nodes) rc = collapse_middle(v, max_nodes, vis);
  if (rc == FL_OK) settle(v, vis);
  free(vis);
  return rc;
}

/* The op nodes of the piece o asks for, in mask (g->n bytes); the count,
** or a negative status with e saying what was not found. */
static int focus_mask(const viz_view *v, const viz_opts *o, unsigned char *mask, fl_err *e) {
  const ir_graph *g = v->g;
  const viz_stage *st = v->st;
  int i, k, n = 0;
  memset(mask, 0, (size_t)g->n);
  if (o->focus_kernel) {
    size_t len = strlen(o->focus_kernel);
    int num = -1, used = 0;
    /* "k15" is kernel 15, as plans and the generated code number them;
    ** else a kernel's name ("fused_conv2d_relu_1x64x56x56": the first) */
    if (sscanf(o->focus_kernel, "k%d%n", &num, &used) != 1 || (size_t)used != len) num = -1;
    for (k = 0; k < st->nkernels; k++) {
      const char *nm = st->kernels[k].name ? st->kernels[k].name : "";
      if (num >= 0 ? k == num : strcmp(nm, o->focus_kernel) == 0) break;
    }
    if (k == st->nkernels)
      return err_set(e, FL_EINVAL, "draw: no kernel named %s in this %s (k0 to k%d)", o->focus_kernel,
                     st->nkernels ? "plan" : "graph (it has no kernels: draw a plan)", st->nkernels - 1);
    for (i = 0; i < st->kernels[k].nnodes; i++) mask[st->kernels[k].nodes[i]] = 1;
    for (i = 0; i < st->kernels[k].nviews; i++) mask[st->kernels[k].views[i]] = 1;
  } else if (o->focus_around >= 0) {
    int d, changed = 1;
    if (o->focus_around >= g->n)
      return err_set(e, FL_EINVAL, "draw: around = %d names no node (the graph has %%0 to %%%d)",
                     o->focus_around, g->n - 1);
    mask[o->focus_around] = 1;
    for (d = 0; d < o->focus_depth && changed; d++) {
      unsigned char *next = malloc((size_t)g->n);
      if (!next) return err_set(e, FL_ENOMEM, "draw: out of memory");
      memcpy(next, mask, (size_t)g->n);
      for (i = 0; i < g->n; i++) {
        const ir_node *nd = &g->nodes[i];
        if (nd->kind != IR_OP) continue;
        for (k = 0; k < nd->nin; k++) {
          int j = nd->in[k];
          if (j < 0) continue;
          if (mask[i]) next[j] = 1;            /* what it reads */
          if (mask[j]) next[i] = 1;            /* what reads it */
        }
      }
      changed = memcmp(next, mask, (size_t)g->n) != 0;
      memcpy(mask, next, (size_t)g->n);
      free(next);
    }
  } else {
    size_t parent;
    for (i = 0; i < g->n; i++) {
      const char *sc = g->nodes[i].scope;
      size_t end = block_key(sc, &parent);
      if (end && atoi(sc + parent + 1) == o->focus_block) mask[i] = 1;
    }
  }
  for (i = 0; i < g->n; i++) {
    if (g->nodes[i].kind != IR_OP) mask[i] = 0;   /* leaves follow their consumers */
    n += mask[i];
  }
  if (n == 0)
    return err_set(e, FL_EINVAL, "draw: block = %d: no op has a module scope with that block "
                   "number (\"blocks.%d\")", o->focus_block, o->focus_block);
  return n;
}

/* Everything outside the piece o asks for goes into two stubs, the ops
** before it and the ops after it. */
static int focus(viz_view *v, const viz_opts *o, fl_err *e) {
  const ir_graph *g = v->g;
  unsigned char *mask = malloc((size_t)(g->n ? g->n : 1));
  int *vis = malloc((size_t)(g->n ? g->n : 1) * sizeof *vis);
  int i, first = -1, s[2] = {-1, -1}, n;
  if (!mask || !vis) { free(mask); free(vis); return err_set(e, FL_ENOMEM, "draw: out of memory"); }
  if ((n = focus_mask(v, o, mask, e)) < 0) { free(mask); free(vis); return n; }
  for (i = 0; i < g->n && first < 0; i++) if (mask[i]) first = i;
  for (i = 0; i < g->n; i++) {
    int side;
    if (g->nodes[i].kind != IR_OP || mask[i]) continue;
    side = i > first;
    if (s[side] < 0 && (s[side] = add_summary(v)) < 0) { free(mask); free(vis); return err_set(e, FL_ENOMEM, "draw: out of memory"); }
    v->show[i] = s[side];
  }
  settle(v, vis);
  for (i = 0; i < 2; i++)
    if (s[i] >= 0)
      snprintf(v->sums[s[i]].title, sizeof v->sums[0].title, "\xe2\x8b\xaf %d ops %s, not drawn \xe2\x8b\xaf",
               v->sums[s[i]].count, i ? "after (or beside) this piece" : "before this piece");
  free(mask);
  free(vis);
  return FL_OK;
}

/* Ops of a fused plan that read weights alone (no graph input reaches
** them: a batch norm folded into convolution weights) are computed once
** and kept between calls; they go into one box, not one per kernel. */
static int weights_box(viz_view *v) {
  const ir_graph *g = v->g;
  unsigned char *dep = calloc((size_t)(g->n ? g->n : 1), 1);
  int *vis = malloc((size_t)(g->n ? g->n : 1) * sizeof *vis);
  int i, k, n = 0, s;
  if (!dep || !vis) { free(dep); free(vis); return FL_ENOMEM; }
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind == IR_INPUT) dep[i] = 1;
    else if (nd->kind == IR_OP)
      for (k = 0; k < nd->nin; k++)
        if (nd->in[k] >= 0 && dep[nd->in[k]]) dep[i] = 1;
    if (nd->kind == IR_OP && !dep[i] && v->show[i] < 0 && !(op_info_of(nd->op)->flags & OPF_RANDOM)) n++;
  }
  if (n >= 2 && (s = add_summary(v)) >= 0) {
    for (i = 0; i < g->n; i++)
      if (g->nodes[i].kind == IR_OP && !dep[i] && v->show[i] < 0 &&
          !(op_info_of(g->nodes[i].op)->flags & OPF_RANDOM))
        v->show[i] = s;
    settle(v, vis);
    snprintf(v->sums[s].title, sizeof v->sums[0].title, "computed from weights, once: %d ops",
             v->sums[s].count);
    snprintf(v->sums[s].note, sizeof v->sums[0].note,
             "they read weights alone, so they run once and are kept between calls; "
             "the kernels reading their results show no edge from here");
    v->sums[s].no_edges_out = 1;
  }
  free(dep);
  free(vis);
  return FL_OK;
}

/* Marks the leaves (weights, constants) to draw inside their readers'
** labels when on: shown, not an output, every reader an op drawn as itself. */
static int inline_leaves(viz_view *v, int on) {
  const ir_graph *g = v->g;
  int i, k;
  if (!on) return FL_OK;
  v->inl = calloc((size_t)(g->n ? g->n : 1), 1);
  if (!v->inl) return FL_ENOMEM;
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if ((nd->kind == IR_PARAM || nd->kind == IR_CONST) && v->show[i] < 0 && v->first_use[i] >= 0)
      v->inl[i] = 1;
  }
  for (i = 0; i < g->nout; i++) v->inl[g->outputs[i]] = 0;
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_OP) continue;
    for (k = 0; k < nd->nin; k++)
      if (nd->in[k] >= 0 && v->show[i] >= 0) v->inl[nd->in[k]] = 0;
  }
  return FL_OK;
}

/* A joint graph's halves, and what crosses between them: under o's
** partition policy what it saves and recomputes, else (as eager autograd)
** every forward value a backward node reads, saved. */
static int joint_marks(viz_view *v, const char *pol, fl_err *e) {
  const ir_graph *g = v->g;
  size_t n = (size_t)(g->n ? g->n : 1);
  int i, k;
  v->jside = calloc(n, 1);
  v->jsaved = calloc(n, 1);
  v->jrec = calloc(n, 1);
  if (!v->jside || !v->jsaved || !v->jrec) return err_set(e, FL_ENOMEM, "draw: out of memory");
  ir_joint_forward(g, v->jside);
  for (i = 0; i < g->n; i++)
    v->jside[i] = g->nodes[i].kind != IR_OP ? 0 : v->jside[i] ? 1 : 2;
  if (pol) {
    static const char *const names[] = {"mincut", "save_all", "recompute_all"};
    ir_graph *fw, *bw;
    part_info info;
    for (k = 0; k < 3 && strcmp(pol, names[k]) != 0; k++) {}
    if (k == 3)
      return err_set(e, FL_EINVAL, "draw: partition \"%s\" (expected mincut, save_all or "
                     "recompute_all)", pol);
    if (fuse_partition(g, (part_policy)k, &fw, &bw, &info, e) != FL_OK) return e->code;
    for (i = 0; i < info.nsaved; i++) v->jsaved[info.saved[i].node] = 1;
    for (i = 0; i < info.nrec; i++) v->jrec[info.rec[i].node] = 1;
    v->jpol = names[k];
    v->jbytes = info.saved_bytes;
    v->jnrec = info.nrec;
    ir_free(fw);
    ir_free(bw);
    part_info_free(&info);
    return FL_OK;
  }
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (v->jside[i] != 2) continue;
    for (k = 0; k < nd->nin; k++)
      if (nd->in[k] >= 0 && (v->jside[nd->in[k]] == 1 || g->nodes[nd->in[k]].kind == IR_INPUT))
        v->jsaved[nd->in[k]] = 1;
  }
  return FL_OK;
}

int viz_view_init(viz_view *v, const viz_stage *st, int index, int multi,
                  int max_nodes, const viz_opts *o, fl_err *e) {
  const ir_graph *g = st ? st->g : NULL;
  size_t n;
  int i, k;
  memset(v, 0, sizeof *v);
  if (!g) return err_set(e, FL_EINVAL, "draw: stage %d has no graph", index + 1);
  if (st->nkernels < 0 || (st->nkernels > 0 && !st->kernels))
    return err_set(e, FL_EINVAL, "draw: stage %d: bad kernel list", index + 1);
  v->st = st;
  v->g = g;
  if (multi) snprintf(v->pfx, sizeof v->pfx, "s%d_", index);
  n = (size_t)(g->n ? g->n : 1);
  v->first_use = malloc(n * sizeof(int));
  v->show = malloc(n * sizeof(int));
  v->an = calloc(n, sizeof *v->an);
  v->outn = calloc((size_t)(g->nout ? g->nout : 1), sizeof *v->outn);
  if (!v->first_use || !v->show || !v->an || !v->outn) goto oom;
  for (i = 0; i < g->n; i++) {
    v->first_use[i] = -1;
    v->show[i] = -1;
  }
  for (i = g->n - 1; i >= 0; i--) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_OP) continue;
    for (k = 0; k < nd->nin; k++)
      if (nd->in[k] >= 0) v->first_use[nd->in[k]] = i;
  }
  if (st->kernels) {
    int *ext;
    for (k = 0; k < st->nkernels; k++)
      for (i = 0; i < st->kernels[k].nnodes; i++) {
        int id = st->kernels[k].nodes ? st->kernels[k].nodes[i] : -1;
        if (id < 0 || id >= g->n) {
          viz_view_free(v);
          return err_set(e, FL_EINVAL, "draw: kernel %s names node %d; the graph has %d nodes",
                         st->kernels[k].name ? st->kernels[k].name : "?", id, g->n);
        }
      }
    v->kern = malloc(n * sizeof(int));
    v->removed = calloc(n, sizeof(int));
    v->kclus = calloc((size_t)(st->nkernels ? st->nkernels : 1), sizeof *v->kclus);
    ext = malloc(n * sizeof(int));
    if (!v->kern || !v->removed || !v->kclus || !ext) { free(ext); goto oom; }
    viz_kernel_map(st, v->kern);
    viz_external_uses(g, v->kern, ext);
    /* a removed intermediate is an op a kernel computes whose value is not
    ** stored: the plan says which when it knows; else a value that never
    ** leaves its kernel is kept in registers.  A view no kernel computes
    ** carries what it views, so it is removed when its source is. */
    for (k = 0; k < st->nkernels; k++)
      for (i = 0; i < st->kernels[k].nnodes; i++) v->removed[st->kernels[k].nodes[i]] = 1;
    for (i = 0; i < g->n; i++) {
      const ir_node *nd = &g->nodes[i];
      if (nd->kind != IR_OP || v->first_use[i] < 0) v->removed[i] = 0;
      else if (v->removed[i]) v->removed[i] = st->stored ? !st->stored[i] : !ext[i];
      else if ((op_info_of(nd->op)->flags & OPF_VIEW) && nd->nin > 0 && nd->in[0] >= 0)
        v->removed[i] = v->removed[nd->in[0]];
    }
    free(ext);
  }
  {
    const char *pol = st->partition ? st->partition : o ? o->partition : NULL;
    if (pol && !g->joint_nres) {
      viz_view_free(v);
      return err_set(e, FL_EINVAL, "draw: partition= is for a joint graph (g:joint()), and "
                     "stage %d is not one", index + 1);
    }
    if (g->joint_nres && joint_marks(v, pol, e) != FL_OK) { viz_view_free(v); return e->code; }
  }
  if (o && (o->focus_kernel || o->focus_around >= 0 || o->focus_block >= 0)) {
    int rc = focus(v, o, e);           /* a piece: no further collapsing */
    if (rc != FL_OK) { viz_view_free(v); return rc; }
    return inline_leaves(v, o->inline_leaves != 0) == FL_OK ? FL_OK : (viz_view_free(v), err_set(e, FL_ENOMEM, "draw: out of memory"));
  }
  if (st->kernels && (!o || o->weights_box) && weights_box(v) != FL_OK) goto oom;
  if (max_nodes > 0 && g->n + g->nout > max_nodes && collapse(v, max_nodes) != FL_OK)
    goto oom;
  if (inline_leaves(v, o && o->inline_leaves > 0) != FL_OK) goto oom;
  return FL_OK;
oom:
  viz_view_free(v);
  return err_set(e, FL_ENOMEM, "draw: out of memory preparing a %d-node graph", g->n);
}

void viz_view_free(viz_view *v) {
  free(v->kern);
  free(v->removed);
  free(v->first_use);
  free(v->show);
  free(v->inl);
  free(v->sums);
  free(v->an);
  free(v->outn);
  free(v->kclus);
  free(v->jside);
  free(v->jsaved);
  free(v->jrec);
  memset(v, 0, sizeof *v);
}
