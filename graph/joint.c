/*
** joint.c -- the joint forward+backward graph (joint.h).  The forward's
** nodes are copied first, unchanged; then, from the loss's gradient (1,
** or with tangents the gradients reaching the results, inputs),
** every op in reverse id order (a reverse topological order) applies its
** row's derivative rule to the forward nodes themselves -- the values a
** rule reads are the forward's, so the partitioner sees exactly which
** forward values the backward needs.  Nodes no output needs are dropped.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "build.h"
#include "grad.h"
#include "joint.h"

static int leaf_wants(const ir_node *nd) {
  return (nd->kind == IR_INPUT || nd->kind == IR_PARAM) && nd->requires_grad &&
         dtype_is_float(nd->meta.dtype);
}

/* gsum[x] += v (a new add when x already has a gradient) */
static void accumulate(gbuild *b, int *gsum, int x, int v) {
  if (v < 0) return;
  gsum[x] = gsum[x] < 0 ? v : gb_op2(b, OP_ADD, gsum[x], v);
}

/* The rule of forward op node id, its input gradients added into gsum. */
static int step(gbuild *b, const ir_graph *g, int id, const char *rg, int *gsum) {
  const ir_node *nd = &g->nodes[id];
  int gin[64], k;
  unsigned char need[64];
  fl_meta in_meta[64];
  gr_ctx c;
  if (op_info_of(nd->op)->grad == gr_none) return FL_OK;
  for (k = 0; k < nd->nin; k++) {
    need[k] = nd->in[k] >= 0 && rg[nd->in[k]];
    if (nd->in[k] >= 0) in_meta[k] = g->nodes[nd->in[k]].meta;
    else { memset(&in_meta[k], 0, sizeof in_meta[k]); in_meta[k].ndim = -1; }
  }
  memset(&c, 0, sizeof c);
  c.b = b;
  c.op = nd->op;
  c.a = &nd->attrs;
  c.nin = nd->nin;
  c.in = nd->in;
  c.in_meta = in_meta;
  c.out = id;
  c.out_meta = &nd->meta;
  c.extra = -1;
  c.g = gsum[id];
  c.need = need;
  if (gr_apply(&c, gin, "joint") == FL_OK)
    for (k = 0; k < nd->nin; k++) accumulate(b, gsum, nd->in[k], gin[k]);
  return b->rc;
}

/* A copy of g keeping only the nodes its outputs need (ids renumbered in
** order), its joint fields mapped. */
static ir_graph *prune(const ir_graph *g, fl_err *e) {
  ir_graph *h = ir_new();
  char *live = calloc((size_t)(g->n ? g->n : 1), 1);
  int *map = malloc((size_t)(g->n ? g->n : 1) * sizeof *map);
  int i, k, rc = FL_OK, nres = ir_nresults(g);
  if (!h || !live || !map) { rc = err_set(e, FL_ENOMEM, "joint: out of memory"); goto out; }
  for (i = 0; i < g->nout; i++) live[g->outputs[i]] = 1;
  for (i = 0; i < g->nwb; i++) live[g->wb[i]] = 1;
  /* (inputs are copied in id order, so a tangent keeps its index) */
  for (i = g->n - 1; i >= 0; i--) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind == IR_INPUT) live[i] = 1;            /* the signature stays */
    if (!live[i] || nd->kind != IR_OP) continue;
    for (k = 0; k < nd->nin; k++) if (nd->in[k] >= 0) live[nd->in[k]] = 1;
  }
  for (i = 0; i < g->n && rc == FL_OK; i++) {
    map[i] = -1;
    if (live[i] && (map[i] = ir_copy_node(h, g, i, map, e)) < 0) rc = map[i];
  }
  for (i = 0; i < nres && rc == FL_OK; i++) rc = ir_add_output(h, map[g->outputs[i]], e);
  for (i = 0; i < g->nwb && rc == FL_OK; i++)
    rc = ir_add_writeback(h, map[g->outputs[nres + i]], map[g->wb[i]], e);
  if (rc == FL_OK) {
    int ng = nres - g->joint_nres;
    if (!(h->joint_wrt = malloc((size_t)(ng ? ng : 1) * sizeof *h->joint_wrt))) {
      rc = err_set(e, FL_ENOMEM, "joint: out of memory");
    } else {
      for (i = 0; i < ng; i++) h->joint_wrt[i] = map[g->joint_wrt[i]];
      h->joint_nres = g->joint_nres;
    }
    if (g->joint_ntan) {
      if (!(h->joint_tan = malloc((size_t)g->joint_ntan * sizeof *h->joint_tan))) {
        rc = err_set(e, FL_ENOMEM, "joint: out of memory");
      } else {
        memcpy(h->joint_tan, g->joint_tan, (size_t)g->joint_ntan * sizeof *h->joint_tan);
        h->joint_ntan = g->joint_ntan;
      }
    }
  }
out:
  free(live);
  free(map);
  if (rc != FL_OK) { ir_free(h); return NULL; }
  return h;
}

/* g with every dropout(x) written as x * dropout(ones): the mask becomes
** a value of the forward, which the backward reads (g * mask) and the
** partitioner saves (a random draw is never recomputed).  It draws where
** the dropout drew (random nodes keep their order), so the forward gives
** eager's values.  NULL with e set when out of memory. */
static ir_graph *joint_of(const ir_graph *g, int tangents, fl_err *e);

static ir_graph *mask_dropout(const ir_graph *g, fl_err *e) {
  ir_graph *h = ir_new();
  int *map = malloc((size_t)(g->n ? g->n : 1) * sizeof *map);
  int i, rc = FL_OK, nres = ir_nresults(g);
  gbuild b;
  if (!h || !map) { ir_free(h); free(map); err_set(e, FL_ENOMEM, "joint: out of memory"); return NULL; }
  gb_init(&b, h, e);
  for (i = 0; i < g->n && rc == FL_OK && !b.rc; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind == IR_OP && nd->op == OP_DROPOUT) {
      const fl_meta *m = &g->nodes[nd->in[0]].meta;
      int ones, mask;
      b.where = nd->where;
      b.scope = nd->scope;
      if (m->device == FL_DEV_CPU) {
        ones = gb_expand(&b, gb_cast(&b, gb_const(&b, 1.0), m->dtype), m->ndim, m->shape);
      } else {
        ones = gb_device_ones(&b, map[nd->in[0]], m->dtype, m->ndim, m->shape);
      }
      mask = gb_op(&b, OP_DROPOUT, &nd->attrs, 1, &ones);
      if (mask >= 0 && ir_set_name(h, mask, "dropout's mask", e) != FL_OK) rc = FL_ENOMEM;
      map[i] = gb_op2(&b, OP_MUL, map[nd->in[0]], mask);
    } else if ((map[i] = ir_copy_node(h, g, i, map, e)) < 0) {
      rc = map[i];
    }
  }
  if (b.rc) rc = b.rc;
  for (i = 0; i < nres && rc == FL_OK; i++) rc = ir_add_output(h, map[g->outputs[i]], e);
  for (i = 0; i < g->nwb && rc == FL_OK; i++)
    rc = ir_add_writeback(h, map[g->outputs[nres + i]], map[g->wb[i]], e);
  free(map);
  if (rc != FL_OK) { ir_free(h); return NULL; }
  return h;
}

int ir_joint_is_tangent(const ir_graph *j, int i) {
  return j->nodes[i].kind == IR_INPUT && j->nodes[i].index >= j->ninputs - j->joint_ntan;
}

ir_graph *ir_joint(const ir_graph *g, int tangents, fl_err *e) {
  ir_graph *masked = NULL;
  int i;
  for (i = 0; i < g->n && !g->nsyms; i++)   /* (joint_of refuses symbolic sizes) */
    if (g->nodes[i].kind == IR_OP && g->nodes[i].op == OP_DROPOUT) {
      ir_graph *j;
      if (!(masked = mask_dropout(g, e))) return NULL;
      j = joint_of(masked, tangents, e);
      ir_free(masked);
      return j;
    }
  return joint_of(g, tangents, e);
}

/* With tangents: a tangent input for each result that needs a gradient
** (the loss first), its gradient there; 1 for the loss otherwise. */
static int seed_results(gbuild *b, ir_graph *j, const ir_graph *g, const char *rg, int *gsum,
                        int tangents, fl_err *e) {
  int i, k, seed, nres = ir_nresults(g), *pos;
  if (!tangents) {
    const fl_meta *lm = &g->nodes[g->outputs[0]].meta;
    /* on the loss's device: a host constant there would pull the
    ** gradients it scales onto the host */
    seed = lm->device == FL_DEV_CPU ? gb_const(b, 1.0)
                                    : gb_device_ones(b, g->outputs[0], lm->dtype, lm->ndim, lm->shape);
    if (seed >= 0 && ir_set_name(j, seed, "gradient of the loss", e) != FL_OK) b->rc = FL_ENOMEM;
    if (seed >= 0) gsum[g->outputs[0]] = gb_cast(b, seed, g->nodes[g->outputs[0]].meta.dtype);
    return b->rc;
  }
  if (!(pos = malloc((size_t)nres * sizeof *pos))) return err_set(e, FL_ENOMEM, "joint: out of memory");
  for (i = 0, k = 0; i < nres && !b->rc; i++) {
    int r = g->outputs[i], t;
    char name[48];
    /* a value returned twice gets the sum of both tangents */
    if (!rg[r] || !dtype_is_float(g->nodes[r].meta.dtype)) continue;
    snprintf(name, sizeof name, i ? "gradient of result %d" : "gradient of the loss", i + 1);
    if ((t = ir_add_input(j, &g->nodes[r].meta, name, e)) < 0) { b->rc = t; break; }
    pos[k++] = i;
    accumulate(b, gsum, r, t);
  }
  if (!b->rc) {
    j->joint_tan = pos;
    j->joint_ntan = k;
  } else {
    free(pos);
  }
  return b->rc;
}

static ir_graph *joint_of(const ir_graph *g, int tangents, fl_err *e) {
  ir_graph *j = NULL, *pruned;
  char *rg = NULL;
  int *gsum = NULL, i, k, n = g->n, nres = ir_nresults(g), nleaf = 0, rc = FL_OK;
  gbuild b;
  if (nres < 1) { err_set(e, FL_EINVAL, "joint: the graph returns nothing (expected a loss)"); return NULL; }
  {
    const fl_meta *m = &g->nodes[g->outputs[0]].meta;
    char s[64];
    /* with tangents any float value seeds it (its tangent is its gradient) */
    if ((m->ndim != 0 && !tangents) || !dtype_is_float(m->dtype)) {
      err_set(e, FL_EINVAL, "joint: the graph's first result must be a float %s, got %s%s",
              tangents ? "value" : "scalar (the loss)", dtype_name(m->dtype), meta_shape_str(m, s, sizeof s));
      return NULL;
    }
  }
  if (g->nsyms) {
    err_set(e, FL_EUNSUPPORTED, "joint: the graph has symbolic sizes; capture it with static "
            "shapes to build its joint graph");
    return NULL;
  }
  if (!(j = ir_clone(g)) || !(rg = calloc((size_t)(n ? n : 1), 1)) ||
      !(gsum = malloc((size_t)(n ? n : 1) * sizeof *gsum))) {
    err_set(e, FL_ENOMEM, "joint: out of memory");
    goto fail;
  }
  /* which values depend on a leaf that requires grad, through ops with a rule */
  for (i = 0; i < n; i++) {
    const ir_node *nd = &g->nodes[i];
    gsum[i] = -1;
    if (nd->kind != IR_OP) { rg[i] = (char)leaf_wants(nd); nleaf += rg[i]; continue; }
    if (op_info_of(nd->op)->grad == gr_none || !dtype_is_float(nd->meta.dtype)) continue;
    for (k = 0; k < nd->nin; k++) if (nd->in[k] >= 0 && rg[nd->in[k]]) rg[i] = 1;
  }
  if (!nleaf) {
    err_set(e, FL_EINVAL, "joint: no input or parameter of the graph requires grad (capture "
            "a module whose parameters require grad, or inputs made with {requires_grad = true})");
    goto fail;
  }
  if (!rg[g->outputs[0]]) {
    err_set(e, FL_EINVAL, "joint: the loss does not depend on any value that requires grad");
    goto fail;
  }
  /* the outputs are rebuilt: results, gradients, write-backs */
  j->nout = 0;
  j->nwb = 0;
  free(j->wb);
  j->wb = NULL;
  gb_init(&b, j, e);
  seed_results(&b, j, g, rg, gsum, tangents, e);
  for (i = n - 1; i >= 0 && !b.rc; i--)
    if (g->nodes[i].kind == IR_OP && gsum[i] >= 0 && rg[i]) step(&b, g, i, rg, gsum);
  if ((rc = b.rc) != FL_OK) goto fail;
  for (i = 0; i < nres && rc == FL_OK; i++) rc = ir_add_output(j, g->outputs[i], e);
  if (!(j->joint_wrt = malloc((size_t)nleaf * sizeof *j->joint_wrt))) {
    err_set(e, FL_ENOMEM, "joint: out of memory");
    goto fail;
  }
  for (i = 0, k = 0; i < n && rc == FL_OK; i++) {
    int v;
    if (g->nodes[i].kind == IR_OP || !rg[i]) continue;
    /* a leaf the loss does not reach has a zero gradient, as fl.grad with
    ** allow_unused does not: PyTorch's .grad stays None there */
    if ((v = gsum[i]) < 0) continue;
    rc = ir_add_output(j, v, e);
    j->joint_wrt[k++] = i;
  }
  for (i = 0; i < g->nwb && rc == FL_OK; i++)
    rc = ir_add_writeback(j, g->outputs[nres + i], g->wb[i], e);
  if (rc != FL_OK) goto fail;
  j->joint_nres = nres;
  if (!(pruned = prune(j, e))) goto fail;
  ir_free(j);
  free(rg);
  free(gsum);
  return pruned;
fail:
  ir_free(j);
  free(rg);
  free(gsum);
  return NULL;
}

void ir_joint_forward(const ir_graph *j, char *fwd) {
  int i, k, nres = ir_nresults(j);
  memset(fwd, 0, (size_t)j->n);
  for (i = 0; i < j->joint_nres; i++) fwd[j->outputs[i]] = 1;
  for (i = 0; i < j->nwb; i++) fwd[j->outputs[nres + i]] = fwd[j->wb[i]] = 1;
  for (i = j->n - 1; i >= 0; i--) {
    const ir_node *nd = &j->nodes[i];
    if (!fwd[i] || nd->kind != IR_OP) continue;
    for (k = 0; k < nd->nin; k++) if (nd->in[k] >= 0) fwd[nd->in[k]] = 1;
  }
}
