/*
** partition.c -- the joint graph split into forward and backward
** (partition.h).  Which forward values the backward needs is read off the
** joint graph: the forward nodes a backward node reads, and the gradients
** that are forward values themselves.  The policy picks the saved set S;
** every needed value not in S is recomputed in the backward from S, the
** parameters and the constants.
**
** The minimum cut (AOTAutograd's min_cut_rematerialization_partition):
** each forward node v is an edge v_in -> v_out weighted by the bytes of
** saving it; data edges u_out -> v_in and edges from each needed value to
** the sink cannot be cut, nor the source's edges into the graph's leaves
** and into the ops never recomputed.  A cut separates what the forward
** computes from what the backward recomputes, and the v_in -> v_out edges
** it crosses are the values saved: the fewest bytes that let the backward
** run.  igraph (Debian's libigraph) computes it.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <igraph.h>

#include "kernel.h"
#include "partition.h"
#include "plan.h"
#include "../graph/joint.h"

/* an edge no cut takes: above any graph's bytes */
#define UNCUT 1e30
/* a reduction reading more elements than this is never recomputed */
#define REDUCE_RECOMPUTE_MAX 4096

/* Why op node id is never recomputed, or NULL when it may be. */
static const char *banned(const ir_graph *g, int id) {
  const ir_node *nd = &g->nodes[id];
  const op_info *oi = op_info_of(nd->op);
  if (oi->flags & OPF_RANDOM) return "a random draw: recomputing it would draw again";
  if (nd->op == OP_CONV2D) return "a convolution: never recomputed";
  if (oi->kind == OPK_OUTFUSABLE) return "a product: never recomputed";
  if (oi->kind == OPK_OPAQUE) return "an extern step: never recomputed";
  if (oi->kind == OPK_REDUCTION && nd->nin > 0 && nd->in[0] >= 0 &&
      meta_numel(&g->nodes[nd->in[0]].meta) > REDUCE_RECOMPUTE_MAX)
    return "a reduction of a large input: never recomputed";
  return NULL;
}

static int is_free_leaf(const ir_node *nd) { return nd->kind == IR_PARAM || nd->kind == IR_CONST; }

/* need[v] = 1 for the forward values the backward reads directly. */
static void needed(const ir_graph *j, const char *fwd, char *need) {
  int i, k, nres = ir_nresults(j);
  memset(need, 0, (size_t)j->n);
  for (i = 0; i < j->n; i++) {
    const ir_node *nd = &j->nodes[i];
    if (fwd[i] || nd->kind != IR_OP) continue;
    for (k = 0; k < nd->nin; k++) if (nd->in[k] >= 0 && fwd[nd->in[k]]) need[nd->in[k]] = 1;
  }
  for (i = j->joint_nres; i < nres; i++) if (fwd[j->outputs[i]]) need[j->outputs[i]] = 1;
}

/* S for the minimum cut: save[v] = 1 for each v whose v_in -> v_out edge
** the cut crosses. */
static int mincut(const ir_graph *j, const char *fwd, const char *need, char *save, fl_err *e) {
  igraph_vector_int_t edges, cut;
  igraph_vector_t cap;
  igraph_t G;
  igraph_real_t value;
  int n = j->n, src = 2 * n, snk = 2 * n + 1, i, k, rc = FL_OK;
  memset(save, 0, (size_t)n);
  igraph_set_error_handler(igraph_error_handler_ignore);
  if (igraph_vector_int_init(&edges, 0) || igraph_vector_init(&cap, 0))
    return err_set(e, FL_ENOMEM, "partition: out of memory");
#define EDGE(a, b, w)                                                             \
  do {                                                                            \
    if (igraph_vector_int_push_back(&edges, (a)) || igraph_vector_int_push_back(&edges, (b)) || \
        igraph_vector_push_back(&cap, (w)))                                       \
      rc = FL_ENOMEM;                                                             \
  } while (0)
  for (i = 0; i < n && rc == FL_OK; i++) {
    const ir_node *nd = &j->nodes[i];
    double w;
    if (!fwd[i]) continue;
    /* saving a view keeps what it shows: save that, recompute the view */
    if (is_free_leaf(nd)) w = 0;
    else if (nd->kind == IR_OP && fk_is_view(j, i)) w = UNCUT;
    else w = (double)fuse_node_bytes(j, i);
    EDGE(2 * i, 2 * i + 1, w);
    if (nd->kind != IR_OP || banned(j, i)) EDGE(src, 2 * i, UNCUT);
    if (need[i]) EDGE(2 * i + 1, snk, UNCUT);
    if (nd->kind == IR_OP)
      for (k = 0; k < nd->nin; k++)
        if (nd->in[k] >= 0) EDGE(2 * nd->in[k] + 1, 2 * i, UNCUT);
  }
#undef EDGE
  if (rc == FL_OK && igraph_create(&G, &edges, 2 * n + 2, IGRAPH_DIRECTED)) rc = FL_ENOMEM;
  if (rc == FL_OK) {
    if (igraph_vector_int_init(&cut, 0)) rc = FL_ENOMEM;
    else {
      if (igraph_st_mincut(&G, &value, &cut, NULL, NULL, src, snk, &cap)) rc = FL_ENOMEM;
      for (i = 0; rc == FL_OK && i < igraph_vector_int_size(&cut); i++) {
        igraph_integer_t eid = VECTOR(cut)[i];
        igraph_integer_t a = VECTOR(edges)[2 * eid], b = VECTOR(edges)[2 * eid + 1];
        if (a < 2 * n && b == a + 1 && a % 2 == 0) save[a / 2] = 1;
      }
      igraph_vector_int_destroy(&cut);
    }
    igraph_destroy(&G);
  }
  igraph_vector_int_destroy(&edges);
  igraph_vector_destroy(&cap);
  if (rc != FL_OK) return err_set(e, rc, "partition: the minimum cut failed (out of memory)");
  return FL_OK;
}

/* rec[v] = 1 for each forward op the backward must run again given S;
** a graph input reached is saved (nothing can recompute it). */
static void recomputed(const ir_graph *j, const char *need, char *save, char *rec) {
  int i, k;
  memset(rec, 0, (size_t)j->n);
  for (i = 0; i < j->n; i++) if (need[i] && !save[i]) rec[i] = 1;
  for (i = j->n - 1; i >= 0; i--) {
    const ir_node *nd = &j->nodes[i];
    if (!rec[i]) continue;
    if (is_free_leaf(nd)) { rec[i] = 0; continue; }
    if (nd->kind == IR_INPUT) { rec[i] = 0; save[i] = 1; continue; }
    for (k = 0; k < nd->nin; k++) {
      int s = nd->in[k];
      if (s >= 0 && !save[s]) rec[s] = 1;
    }
  }
}

static int64_t saved_bytes(const ir_graph *j, const char *save) {
  int64_t b = 0;
  int i;
  for (i = 0; i < j->n; i++) if (save[i] && !is_free_leaf(&j->nodes[i])) b += fuse_node_bytes(j, i);
  return b;
}

/* The forward: j's forward nodes; its results, the saved ops, write-backs. */
static ir_graph *build_fw(const ir_graph *j, const char *fwd, const char *save, fl_err *e) {
  ir_graph *h = ir_new();
  int *map = malloc((size_t)(j->n ? j->n : 1) * sizeof *map);
  int i, rc = FL_OK, nres = ir_nresults(j);
  if (!h || !map) { rc = err_set(e, FL_ENOMEM, "partition: out of memory"); goto out; }
  for (i = 0; i < j->n && rc == FL_OK; i++) {
    map[i] = -1;
    if (fwd[i] || (j->nodes[i].kind == IR_INPUT && !ir_joint_is_tangent(j, i))) {
      if ((map[i] = ir_copy_node(h, j, i, map, e)) < 0) rc = map[i];
    }
  }
  for (i = 0; i < j->joint_nres && rc == FL_OK; i++) rc = ir_add_output(h, map[j->outputs[i]], e);
  for (i = 0; i < j->n && rc == FL_OK; i++)
    if (save[i] && j->nodes[i].kind == IR_OP) rc = ir_add_output(h, map[i], e);
  for (i = 0; i < j->nwb && rc == FL_OK; i++)
    rc = ir_add_writeback(h, map[j->outputs[nres + i]], map[j->wb[i]], e);
out:
  free(map);
  if (rc != FL_OK) { ir_free(h); return NULL; }
  return h;
}

/* The backward: the saved values as inputs (graph inputs saved keep
** their names) and the joint graph's tangents after them, then the
** recomputed forward ops and the backward nodes; its outputs the
** gradients. */
static ir_graph *build_bw(const ir_graph *j, const char *fwd, const char *save,
                          const char *rec, fl_err *e) {
  ir_graph *h = ir_new();
  int *map = malloc((size_t)(j->n ? j->n : 1) * sizeof *map);
  int i, k, rc = FL_OK, nres = ir_nresults(j);
  char name[96], desc[64];
  if (!h || !map) { rc = err_set(e, FL_ENOMEM, "partition: out of memory"); goto out; }
  for (i = 0; i < j->n; i++) map[i] = -1;
  /* the forward's graph inputs first, then its saved ops: the order the
  ** forward returns them in */
  for (k = 0; k < 2 && rc == FL_OK; k++)
    for (i = 0; i < j->n && rc == FL_OK; i++) {
      const ir_node *nd = &j->nodes[i];
      if (!save[i] || is_free_leaf(nd) || (nd->kind == IR_INPUT) != (k == 0)) continue;
      if (nd->kind == IR_INPUT) snprintf(name, sizeof name, "%s", nd->name ? nd->name : "input");
      else {
        fk_describe(j, i, desc, sizeof desc);
        snprintf(name, sizeof name, "saved %%%d %s", i, desc);
      }
      if ((map[i] = ir_add_input(h, &nd->meta, name, e)) < 0) rc = map[i];
    }
  /* then the tangents, the gradients reaching the forward's results */
  for (i = 0; i < j->n && rc == FL_OK; i++)
    if (ir_joint_is_tangent(j, i) && (map[i] = ir_copy_node(h, j, i, map, e)) < 0) rc = map[i];
  for (i = 0; i < j->n && rc == FL_OK; i++) {
    const ir_node *nd = &j->nodes[i];
    int used = !fwd[i] || rec[i], k2;
    /* an input the backward does not read (the loss does not use it) is
    ** not in its signature: the saved values are */
    if (map[i] >= 0 || !used || nd->kind == IR_INPUT) continue;
    /* leaves the backward reads: params and constants, held by both */
    if (nd->kind == IR_OP)
      for (k2 = 0; k2 < nd->nin && rc == FL_OK; k2++) {
        int s = nd->in[k2];
        if (s >= 0 && map[s] < 0 && is_free_leaf(&j->nodes[s]) &&
            (map[s] = ir_copy_node(h, j, s, map, e)) < 0)
          rc = map[s];
      }
    if (rc == FL_OK && (map[i] = ir_copy_node(h, j, i, map, e)) < 0) rc = map[i];
  }
  for (i = j->joint_nres; i < nres && rc == FL_OK; i++) {
    int s = j->outputs[i];
    if (map[s] < 0 && (map[s] = ir_copy_node(h, j, s, map, e)) < 0) rc = map[s];
    if (rc == FL_OK) rc = ir_add_output(h, map[s], e);
  }
out:
  free(map);
  if (rc != FL_OK) { ir_free(h); return NULL; }
  return h;
}

static void explain(const ir_graph *j, part_policy pol, const char *save, const char *rec,
                    part_info *info) {
  char h[32], d[64];
  int i, k;
  for (k = 0; k < 2; k++)           /* inputs first, as the backward takes them */
    for (i = 0; i < j->n; i++) {
      const ir_node *nd = &j->nodes[i];
      part_saved *s;
      if (!save[i] || is_free_leaf(nd) || (nd->kind == IR_INPUT) != (k == 0)) continue;
      s = &info->saved[info->nsaved++];
      s->node = i;
      s->bytes = fuse_node_bytes(j, i);
      if (nd->kind == IR_INPUT) snprintf(s->why, sizeof s->why, "an input of the graph the backward reads");
      else if (pol == PART_SAVE_ALL) snprintf(s->why, sizeof s->why, "read by the backward (save_all saves every such value)");
      else if (banned(j, i)) snprintf(s->why, sizeof s->why, "%s", banned(j, i));
      else snprintf(s->why, sizeof s->why, "fewer bytes to save than what recomputing it needs");
    }
  for (i = 0; i < j->n; i++) {
    part_recomputed *r;
    if (!rec[i]) continue;
    r = &info->rec[info->nrec++];
    r->node = i;
    fk_describe(j, i, d, sizeof d);
    fuse_bytes_str(fuse_node_bytes(j, i), h, sizeof h);
    if (pol == PART_RECOMPUTE_ALL)
      snprintf(r->reason, sizeof r->reason, "%%%d %s: recompute_all runs every forward op the "
               "backward needs again", i, d);
    else if (fk_is_view(j, i))
      snprintf(r->reason, sizeof r->reason, "%%%d %s: a view, free to recompute", i, d);
    else
      snprintf(r->reason, sizeof r->reason, "%%%d %s: cheap to recompute from what is saved; "
               "saving it would keep %s more", i, d, h);
  }
}

int fuse_partition(const ir_graph *j, part_policy pol, ir_graph **fw, ir_graph **bw,
                   part_info *info, fl_err *e) {
  int n = j->n, i, rc = FL_OK;
  char *fwd = malloc((size_t)(n ? n : 1)), *need = malloc((size_t)(n ? n : 1));
  char *save = malloc((size_t)(n ? n : 1)), *rec = malloc((size_t)(n ? n : 1));
  memset(info, 0, sizeof *info);
  *fw = *bw = NULL;
  if (!j->joint_nres) {
    rc = err_set(e, FL_EINVAL, "partition: not a joint graph (make one with g:joint())");
    goto out;
  }
  if (!fwd || !need || !save || !rec) { rc = err_set(e, FL_ENOMEM, "partition: out of memory"); goto out; }
  ir_joint_forward(j, fwd);
  needed(j, fwd, need);
  /* what eager autograd keeps: every value the backward reads, a view as
  ** the storage it shows (a view saved would be copied out of a compiled
  ** forward, where the backward makes it again for free) */
  for (i = 0; i < n; i++) save[i] = need[i];
  for (i = 0; i < n; i++)
    if (save[i] && j->nodes[i].kind == IR_OP && fk_is_view(j, i)) {
      int b = i;
      while (b >= 0 && j->nodes[b].kind == IR_OP && fk_is_view(j, b)) b = j->nodes[b].in[0];
      save[i] = 0;
      if (b >= 0) save[b] = 1;
    }
  recomputed(j, need, save, rec);
  info->eager_saved_bytes = saved_bytes(j, save);
  if (pol == PART_RECOMPUTE_ALL) {
    memset(save, 0, (size_t)n);
  } else if (pol == PART_MINCUT && (rc = mincut(j, fwd, need, save, e)) != FL_OK) {
    goto out;
  }
  recomputed(j, need, save, rec);
  info->saved_bytes = saved_bytes(j, save);
  info->saved = calloc((size_t)(n ? n : 1), sizeof *info->saved);
  info->rec = calloc((size_t)(n ? n : 1), sizeof *info->rec);
  if (!info->saved || !info->rec) { rc = err_set(e, FL_ENOMEM, "partition: out of memory"); goto out; }
  explain(j, pol, save, rec, info);
  if (!(*fw = build_fw(j, fwd, save, e)) || !(*bw = build_bw(j, fwd, save, rec, e))) {
    rc = e && e->code ? e->code : FL_ENOMEM;
    goto out;
  }
out:
  if (rc != FL_OK) {
    ir_free(*fw);
    ir_free(*bw);
    *fw = *bw = NULL;
    part_info_free(info);
  }
  free(fwd); free(need); free(save); free(rec);
  return rc;
}

void part_info_free(part_info *info) {
  free(info->saved);
  free(info->rec);
  memset(info, 0, sizeof *info);
}
