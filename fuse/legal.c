/*
** legal.c -- placing every node of a kernel in its iteration space.
** Invariant: a member's map, once set, is the only way the kernel computes
** that node; a second derivation that disagrees makes the fusion illegal
** (the planner then keeps the two nodes apart).  Loads may be read through
** several maps (x + x.T is two accesses to one buffer); computed values
** may not.
**
** Rules, each with the example it handles:
**   broadcast   x[4,1] + y[4,6]: x's dim 1 gets coordinate 0
**   transpose   exp(x.T): the load of x swaps the two kernel coordinates
**   expand      b.expand(8,16): the expanded dim gets coordinate 0
**   narrow      x.narrow(1, 2, 5): coordinate + 2
**   reshape     exp(x)[4,6].reshape(24): linear index 6*c0 + c1 (merging
**               dims is affine; splitting a kernel dim across two node
**               dims is only when it does not carry)
**   reduction   sum(x, dim 1): x's dim 1 is the kernel's reduced dim
**   composites  softmax/layer_norm: the normalized dims are the reduced dims
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel.h"

int fk_is_view(const ir_graph *g, int id) {
  const ir_node *nd = &g->nodes[id];
  if (nd->kind != IR_OP) return 0;
  return (op_info_of(nd->op)->flags & OPF_VIEW) || nd->op == OP_CONTIGUOUS;
}

static void map_zero(fk_map *m, int nd) {
  memset(m, 0, sizeof *m);
  m->known = 1;
  m->nd = nd;
}

static void copy_row(fk_map *dst, int j, const fk_map *src, int i) {
  memcpy(dst->A[j], src->A[i], sizeof dst->A[j]);
  dst->b[j] = src->b[i];
}

static void contig(const fl_meta *m, int64_t *cs) {
  int64_t s = 1;
  int d;
  for (d = m->ndim - 1; d >= 0; d--) {
    cs[d] = s;
    s *= m->shape[d] > 0 ? m->shape[d] : 1;
  }
}

/* Same coordinates for every point of the space (coefficients on size-1
** kernel dims do not matter: their coordinate is always 0). */
static int map_equal(const fk_space *sp, const fk_map *a, const fk_map *b) {
  int j, k, D = sp->nkept + sp->nred;
  if (a->nd != b->nd) return 0;
  for (j = 0; j < a->nd; j++) {
    if (a->b[j] != b->b[j]) return 0;
    for (k = 0; k < D; k++)
      if (sp->size[k] > 1 && a->A[j][k] != b->A[j][k]) return 0;
  }
  return 1;
}

static int fail(fk_space *sp, const char *fmt, int a, int b) {
  snprintf(sp->why, sizeof sp->why, fmt, a, b);
  return -1;
}

/* Which dims of its input a reduction or composite folds. */
static int reduced_dims(const ir_graph *g, const fl_meta *metas, int id,
                        int *is_red) {
  const ir_node *nd = &g->nodes[id];
  const fl_meta *x = &metas[nd->in[0]];
  int d, k, n = 0;
  memset(is_red, 0, FL_MAX_DIMS * sizeof(int));
  switch (nd->op) {
  case OP_SOFTMAX: case OP_LOG_SOFTMAX:
    if (x->ndim > 0) is_red[nd->attrs.i[0]] = 1;
    break;
  case OP_LAYER_NORM: case OP_RMS_NORM:
    for (d = x->ndim - (int)nd->attrs.i[0]; d < x->ndim; d++) is_red[d] = 1;
    break;
  default:
    if (nd->attrs.ndims == 0)
      for (d = 0; d < x->ndim; d++) is_red[d] = 1;
    for (k = 0; k < nd->attrs.ndims; k++)
      if (x->ndim > 0) is_red[nd->attrs.dims[k]] = 1;
    break;
  }
  for (d = 0; d < x->ndim; d++) n += is_red[d];
  return n;
}

/* The input map of a reduction must put its reduced dims, in order, on the
** kernel's reduced dims, and nothing else there. */
static int check_reduced(fk_space *sp, int id, const fk_map *mx) {
  const fl_meta *x = &sp->metas[sp->g->nodes[id].in[0]];
  int is_red[FL_MAX_DIMS], d, k, r = 0, D = sp->nkept + sp->nred;
  int nr = reduced_dims(sp->g, sp->metas, id, is_red);
  if (nr != sp->nred)
    return fail(sp, "%%%d reduces %d dims, the kernel another number", id, nr);
  for (d = 0; d < x->ndim; d++) {
    if (is_red[d]) {
      int kd = sp->nkept + r++, ok = mx->b[d] == 0;
      for (k = 0; k < D; k++)
        if (sp->size[k] > 1 && mx->A[d][k] != (k == kd)) ok = 0;
      if (sp->size[kd] != x->shape[d]) ok = 0;
      if (!ok)
        return fail(sp, "%%%d reduces over a different space than the "
                    "kernel's (dim %d)", id, d);
    } else {
      for (k = sp->nkept; k < D; k++)
        if (sp->size[k] > 1 && mx->A[d][k])
          return fail(sp, "%%%d keeps dim %d that the kernel reduces", id, d);
    }
  }
  return 0;
}

/* coord maps through a reshape: node `from` (map m) and node `to` hold the
** same row-major sequence; rewrite the linear index as `to`'s coords. */
static int relinearize(fk_space *sp, int id, const fk_map *m,
                       const fl_meta *from, const fl_meta *to, fk_map *out) {
  int64_t csf[FL_MAX_DIMS], cst[FL_MAX_DIMS], w[FL_MAX_DIMS] = {0}, w0 = 0, r;
  int j, k, i, D = sp->nkept + sp->nred;
  contig(from, csf);
  contig(to, cst);
  for (j = 0; j < from->ndim; j++) {
    if (from->shape[j] == 1) continue;
    w0 += csf[j] * m->b[j];
    for (k = 0; k < D; k++) w[k] += csf[j] * m->A[j][k];
  }
  map_zero(out, to->ndim);
  for (r = w0, i = to->ndim - 1; i >= 0; i--) {
    int64_t n = to->shape[i] > 0 ? to->shape[i] : 1;
    out->b[i] = r % n;
    r /= n;
  }
  for (k = 0; k < D; k++) {
    if (w[k] == 0 || sp->size[k] <= 1) continue;
    if (w[k] < 0) return fail(sp, "%%%d: reshape of a reversed view", id, 0);
    for (i = 0; i < to->ndim; i++)
      if (to->shape[i] > 1 && cst[i] <= w[k]) break;
    if (i == to->ndim || w[k] % cst[i])
      return fail(sp, "%%%d: reshape cannot be indexed from kernel dim %d", id, k);
    out->A[i][k] += w[k] / cst[i];
  }
  for (i = 0; i < to->ndim; i++) {
    int64_t hi = out->b[i];
    for (k = 0; k < D; k++) hi += out->A[i][k] * (sp->size[k] > 0 ? sp->size[k] - 1 : 0);
    if (hi >= (to->shape[i] > 0 ? to->shape[i] : 1))
      return fail(sp, "%%%d: reshape splits a kernel dim across node dims "
                  "(dim %d carries)", id, i);
  }
  return 0;
}

/* The linear index of a node's element, as a map (loads only). */
static void linear(fk_space *sp, const fk_map *m, const fl_meta *from, fk_map *out) {
  int64_t cs[FL_MAX_DIMS];
  int j, k, D = sp->nkept + sp->nred;
  contig(from, cs);
  map_zero(out, 1);
  out->lin = 1;
  for (j = 0; j < from->ndim; j++) {
    if (from->shape[j] == 1) continue;
    out->b[0] += cs[j] * m->b[j];
    for (k = 0; k < D; k++) out->A[0][k] += cs[j] * m->A[j][k];
  }
}

/* Map of input i of node id, given the node's map mn. */
static int down(fk_space *sp, int id, int i, const fk_map *mn, fk_map *mu) {
  const ir_node *nd = &sp->g->nodes[id];
  const op_attrs *a = &nd->attrs;
  const fl_meta *om = &sp->metas[id], *im = &sp->metas[nd->in[i]];
  int d, j, lead = om->ndim - im->ndim;
  op_kind kind = op_info_of(nd->op)->kind;
  if (mn->lin) {
    /* a linear index survives reshapes, size-1 dims and copies */
    if (nd->op == OP_RESHAPE || nd->op == OP_VIEW || nd->op == OP_CONTIGUOUS ||
        nd->op == OP_UNSQUEEZE || nd->op == OP_SQUEEZE) {
      *mu = *mn;
      return 0;
    }
    return fail(sp, "%%%d: cannot index through a reshape the kernel's "
                "coordinates cannot follow", id, 0);
  }
  map_zero(mu, im->ndim);
  switch (nd->op) {
  case OP_TRANSPOSE:
    *mu = *mn;
    if (im->ndim > 0) {
      copy_row(mu, (int)a->i[0], mn, (int)a->i[1]);
      copy_row(mu, (int)a->i[1], mn, (int)a->i[0]);
    }
    return 0;
  case OP_PERMUTE:
    for (d = 0; d < a->ndims; d++) copy_row(mu, (int)a->dims[d], mn, d);
    return 0;
  case OP_UNSQUEEZE:
    for (d = 0, j = 0; d < om->ndim; d++)
      if (d != a->i[0]) copy_row(mu, j++, mn, d);
    return 0;
  case OP_SQUEEZE:
    for (d = 0, j = 0; d < im->ndim; d++) {
      int sq = im->shape[d] == 1 && (a->i[1] ? d == a->i[0] : 1);
      if (!sq) copy_row(mu, d, mn, j++);
    }
    return 0;
  case OP_EXPAND:
    for (d = 0; d < im->ndim; d++)
      if (im->shape[d] != 1) copy_row(mu, d, mn, d + lead);
    return 0;
  case OP_NARROW:
    *mu = *mn;
    mu->b[a->i[0]] += a->i[1];
    return 0;
  case OP_SLICE: {
    /* input coordinate = start + step * output coordinate */
    int dim = (int)a->i[0], k;
    *mu = *mn;
    for (k = 0; k < FL_MAX_DIMS; k++) mu->A[dim][k] *= a->i[3];
    mu->b[dim] = mu->b[dim] * a->i[3] + a->i[1];
    return 0;
  }
  case OP_RESHAPE: case OP_VIEW:
    if (relinearize(sp, id, mn, om, im, mu) == 0) return 0;
    linear(sp, mn, om, mu);
    return 0;
  case OP_CONTIGUOUS: case OP_SOFTMAX: case OP_LOG_SOFTMAX:
    *mu = *mn;
    return nd->op == OP_CONTIGUOUS ? 0 : check_reduced(sp, id, mu);
  case OP_LAYER_NORM: case OP_RMS_NORM:
    if (i == 0) {
      *mu = *mn;
      return check_reduced(sp, id, mu);
    }
    for (d = 0; d < im->ndim; d++) copy_row(mu, d, mn, d + lead);
    return 0;
  case OP_BATCH_NORM:
    if (i == 0) { *mu = *mn; return 0; }
    if (om->ndim >= 2 && im->ndim == 1) copy_row(mu, 0, mn, 1);
    return 0;
  default:
    break;
  }
  if (kind == OPK_ELEMWISE || kind == OPK_BROADCAST) {
    /* NumPy broadcasting: dims align at the right, size-1 dims repeat */
    for (d = 0; d < im->ndim; d++)
      if (im->shape[d] != 1) copy_row(mu, d, mn, d + lead);
    return 0;
  }
  if (kind == OPK_REDUCTION) {
    int is_red[FL_MAX_DIMS], r = 0;
    reduced_dims(sp->g, sp->metas, id, is_red);
    for (d = 0, j = 0; d < im->ndim; d++) {
      if (is_red[d]) {
        if (sp->nkept + r < FL_MAX_DIMS) mu->A[d][sp->nkept + r] = 1;
        r++;
        if (a->keepdim) j++;
      } else {
        copy_row(mu, d, mn, j++);
      }
    }
    return check_reduced(sp, id, mu);
  }
  return fail(sp, "%%%d has no lowering inside a generated kernel", id, 0);
}

/* Map of view node id from the map of its input (the other direction). */
static int view_up(fk_space *sp, int id, const fk_map *mi, fk_map *mo) {
  const ir_node *nd = &sp->g->nodes[id];
  const op_attrs *a = &nd->attrs;
  const fl_meta *om = &sp->metas[id], *im = &sp->metas[nd->in[0]];
  int d, j, k, D = sp->nkept + sp->nred, lead = om->ndim - im->ndim;
  map_zero(mo, om->ndim);
  switch (nd->op) {
  case OP_TRANSPOSE:
    *mo = *mi;
    if (im->ndim > 0) {
      copy_row(mo, (int)a->i[0], mi, (int)a->i[1]);
      copy_row(mo, (int)a->i[1], mi, (int)a->i[0]);
    }
    return 0;
  case OP_PERMUTE:
    for (d = 0; d < a->ndims; d++) copy_row(mo, d, mi, (int)a->dims[d]);
    return 0;
  case OP_UNSQUEEZE:
    for (d = 0, j = 0; d < om->ndim; d++)
      if (d != a->i[0]) copy_row(mo, d, mi, j++);
    return 0;
  case OP_SQUEEZE:
    for (d = 0, j = 0; d < im->ndim; d++) {
      int sq = im->shape[d] == 1 && (a->i[1] ? d == a->i[0] : 1);
      if (!sq) { copy_row(mo, j++, mi, d); continue; }
      for (k = 0; k < D; k++)
        if (sp->size[k] > 1 && mi->A[d][k])
          return fail(sp, "%%%d squeezes a dim the kernel iterates over", id, 0);
    }
    return 0;
  case OP_EXPAND:
    for (d = 0; d < om->ndim; d++) {
      int s = d - lead;
      if (s >= 0 && im->shape[s] == om->shape[d]) copy_row(mo, d, mi, s);
      else if (om->shape[d] != 1)
        return fail(sp, "%%%d: an expanded dim cannot be derived from its "
                    "input (dim %d)", id, d);
    }
    return 0;
  case OP_RESHAPE: case OP_VIEW:
    return relinearize(sp, id, mi, im, om, mo);
  case OP_CONTIGUOUS:
    *mo = *mi;
    return 0;
  default:
    return fail(sp, "%%%d: a narrowed view cannot be derived from its input", id, 0);
  }
}

int fk_edge_map(fk_space *sp, int node, int in, fk_map *out, int *src) {
  const ir_graph *g = sp->g;
  int s = g->nodes[node].in[in];
  fk_map t;
  if (down(sp, node, in, &sp->maps[node], out)) return -1;
  while (!sp->member[s] && s != sp->anchor && !(sp->buffer && sp->buffer[s]) &&
         fk_is_view(g, s)) {
    if (down(sp, s, 0, out, &t)) return -1;
    *out = t;
    s = g->nodes[s].in[0];
  }
  *src = s;
  return 0;
}

/* Map of input `in` of node seen from its source member, if known: walks
** the views up from the source.  1 known, 0 not yet, -1 conflict. */
static int edge_up(fk_space *sp, int node, int in, fk_map *out) {
  const ir_graph *g = sp->g;
  int chain[64], n = 0, s = g->nodes[node].in[in];
  fk_map t;
  while (!sp->member[s] && !sp->maps[s].known && s != sp->anchor &&
         !(sp->buffer && sp->buffer[s]) && fk_is_view(g, s) && n < 64) {
    chain[n++] = s;
    s = g->nodes[s].in[0];
  }
  if (!sp->maps[s].known) return 0;
  *out = sp->maps[s];
  while (n-- > 0) {
    if (view_up(sp, chain[n], out, &t)) return -1;
    *out = t;
  }
  return 1;
}

/* Derive member id's map from its inputs.  1 done, 0 not yet, -1 fail. */
static int up(fk_space *sp, int id, fk_map *mo) {
  const ir_node *nd = &sp->g->nodes[id];
  const fl_meta *om = &sp->metas[id];
  op_kind kind = op_info_of(nd->op)->kind;
  fk_map mi;
  int d, i, r;
  if (fk_is_view(sp->g, id)) {
    if ((r = edge_up(sp, id, 0, &mi)) <= 0) return r;
    return view_up(sp, id, &mi, mo) ? -1 : 1;
  }
  if (kind == OPK_REDUCTION) {
    int is_red[FL_MAX_DIMS], j;
    if ((r = edge_up(sp, id, 0, &mi)) <= 0) return r;
    if (check_reduced(sp, id, &mi)) return -1;
    if (nd->op == OP_SOFTMAX || nd->op == OP_LOG_SOFTMAX ||
        nd->op == OP_LAYER_NORM || nd->op == OP_RMS_NORM) {
      *mo = mi;
      return 1;
    }
    reduced_dims(sp->g, sp->metas, id, is_red);
    map_zero(mo, om->ndim);
    for (d = 0, j = 0; d < mi.nd; d++) {
      if (!is_red[d]) copy_row(mo, j++, &mi, d);
      else if (nd->attrs.keepdim) j++;
    }
    return 1;
  }
  if (kind != OPK_ELEMWISE && kind != OPK_BROADCAST)
    return fail(sp, "%%%d has no lowering inside a generated kernel", id, 0);
  map_zero(mo, om->ndim);
  for (d = 0; d < om->ndim; d++) {
    int found = om->shape[d] == 1;
    for (i = 0; i < nd->nin && !found; i++) {
      const fl_meta *im;
      int s;
      if (nd->in[i] < 0 || (nd->op == OP_BATCH_NORM && i > 0)) continue;
      im = &sp->metas[nd->in[i]];
      s = d - (om->ndim - im->ndim);
      if (s < 0 || im->shape[s] != om->shape[d]) continue;
      if ((r = edge_up(sp, id, i, &mi)) < 0) return -1;
      if (r == 0) continue;
      copy_row(mo, d, &mi, s);
      found = 1;
    }
    if (!found) return 0;
  }
  return 1;
}

static int set_map(fk_space *sp, int id, const fk_map *m, int *changed) {
  if (m->lin)
    return fail(sp, "%%%d is read through a reshape that splits the kernel's "
                "dims (it would have to be stored first)", id, 0);
  if (!sp->maps[id].known) {
    sp->maps[id] = *m;
    *changed = 1;
    return 0;
  }
  if (!map_equal(sp, &sp->maps[id], m))
    return fail(sp, "%%%d would be computed at two different indexings "
                "(needed through different views)", id, 0);
  return 0;
}

static int place_like_seed(fk_space *sp);

int fk_assign(fk_space *sp) {
  const ir_graph *g = sp->g;
  const fl_meta *sm = &sp->metas[sp->seed];
  int id, i, k, round, changed = 1, D = sp->nkept + sp->nred;
  fk_map m;
  sp->why[0] = '\0';
  for (id = 0; id < g->n; id++) sp->maps[id].known = 0;
  for (k = 0; k < D; k++) sp->size[k] = sm->shape[sp->perm[k]];
  map_zero(&sp->maps[sp->seed], sm->ndim);
  for (k = 0; k < D; k++) sp->maps[sp->seed].A[sp->perm[k]][k] = 1;
  for (round = 0; changed && round < 2 * g->n + 4; round++) {
    changed = 0;
    for (id = g->n - 1; id >= 0; id--) {
      if (!sp->member[id] || !sp->maps[id].known) continue;
      for (i = 0; i < g->nodes[id].nin; i++) {
        int src;
        if (g->nodes[id].in[i] < 0) continue;
        if (fk_edge_map(sp, id, i, &m, &src)) return -1;
        if (sp->member[src] && set_map(sp, src, &m, &changed)) return -1;
      }
    }
    for (id = 0; id < g->n; id++) {
      int r;
      if (!sp->member[id] || sp->maps[id].known) continue;
      if ((r = up(sp, id, &m)) < 0) return -1;
      if (r > 0 && set_map(sp, id, &m, &changed)) return -1;
    }
    if (!changed) changed = place_like_seed(sp);
  }
  for (id = 0; id < g->n; id++)
    if (sp->member[id] && !sp->maps[id].known)
      return fail(sp, "%%%d cannot be placed in the kernel's iteration space", id, 0);
  return 0;
}

/* A member reached only through loads (y = x * r where x is read from
** memory) has no derivation; when its shape is the seed's, or the seed's
** with some dims 1, it lives at the same coordinates.  Any placement the
** other members agree with gives correct code, so this is a choice, and
** conflicts are still caught.  1 when a member was placed. */
static int place_like_seed(fk_space *sp) {
  const fl_meta *sm = &sp->metas[sp->seed];
  int id, d;
  for (id = sp->g->n - 1; id >= 0; id--) {
    const fl_meta *m = &sp->metas[id];
    int ok = sp->member[id] && !sp->maps[id].known && m->ndim == sm->ndim;
    for (d = 0; d < m->ndim && ok; d++) ok = m->shape[d] == sm->shape[d] || m->shape[d] == 1;
    if (!ok) continue;
    map_zero(&sp->maps[id], m->ndim);
    for (d = 0; d < m->ndim; d++)
      if (m->shape[d] != 1) copy_row(&sp->maps[id], d, &sp->maps[sp->seed], d);
    return 1;
  }
  return 0;
}

void fk_map_strides(const fk_space *sp, const fk_map *m, const fl_meta *meta,
                    int64_t *stride, int64_t *offset) {
  int64_t cs[FL_MAX_DIMS];
  int j, k, D = sp->nkept + sp->nred;
  contig(meta, cs);
  *offset = 0;
  for (k = 0; k < D; k++) stride[k] = 0;
  if (m->lin) {
    *offset = m->b[0];
    for (k = 0; k < D; k++) stride[k] = sp->size[k] <= 1 ? 0 : m->A[0][k];
    return;
  }
  for (j = 0; j < meta->ndim; j++) {
    if (meta->shape[j] == 1) continue;
    *offset += cs[j] * m->b[j];
    for (k = 0; k < D; k++) stride[k] += cs[j] * m->A[j][k];
  }
  for (k = 0; k < D; k++)
    if (sp->size[k] <= 1) stride[k] = 0;
}

/* Merge adjacent dims of one group [lo, hi) wherever every access walks
** them as one (stride[p] == stride[q] * size[q]); the merged dims end up at
** the inner end of the group, size-1 padding in front. */
static void merge_group(int lo, int hi, int D, int nacc, int64_t *args) {
  int64_t sz[FL_MAX_DIMS], st[FL_MAX_DIMS * 64];
  int list[FL_MAX_DIMS], n = 0, d, a, t;
  int64_t *size = args, *acc = args + D;
  if (nacc > 64) return;
  for (d = lo; d < hi; d++) {
    if (size[d] == 1) continue;
    if (n > 0) {
      int p = list[n - 1], ok = 1;
      for (a = 0; a < nacc && ok; a++)
        ok = acc[a * (D + 1) + p] == acc[a * (D + 1) + d] * size[d];
      if (ok && size[d] > 0 && size[p] > 0) {
        size[d] *= size[p];
        list[n - 1] = d;
        continue;
      }
    }
    list[n++] = d;
  }
  for (t = 0; t < n; t++) {
    sz[t] = size[list[t]];
    for (a = 0; a < nacc; a++) st[a * FL_MAX_DIMS + t] = acc[a * (D + 1) + list[t]];
  }
  for (d = lo; d < hi; d++) {
    t = d - (hi - n);
    size[d] = t >= 0 ? sz[t] : 1;
    for (a = 0; a < nacc; a++)
      acc[a * (D + 1) + d] = t >= 0 ? st[a * FL_MAX_DIMS + t] : 0;
  }
}

static char *buffer_of(const fk_kernel *k, const ir_graph *g, int *rc) {
  char *b = calloc((size_t)g->n, 1);
  int i;
  *rc = b ? 0 : -1;
  if (b) for (i = 0; i < k->nbufs; i++) b[k->bufs[i]] = 1;
  return b;
}

int fk_bind(const fk_kernel *k, const ir_graph *g, const fl_meta *metas,
            int64_t *args, fl_err *e) {
  fk_space sp;
  char *member = calloc((size_t)g->n, 1);
  fk_map *maps = calloc((size_t)g->n, sizeof *maps), m;
  int i, a, D = k->nkept + k->nred, rc = FL_OK;
  if (!member || !maps) {
    free(member); free(maps);
    return err_set(e, FL_ENOMEM, "%s: out of memory binding arguments", k->name);
  }
  memset(&sp, 0, sizeof sp);
  for (i = 0; i < k->nnodes; i++) member[k->nodes[i]] = 1;
  /* the buffers the kernel touches: a view among them is materialized */
  sp.buffer = buffer_of(k, g, &rc);
  if (rc) { rc = err_set(e, FL_ENOMEM, "%s: out of memory binding arguments", k->name); goto done; }
  sp.g = g; sp.metas = metas; sp.member = member; sp.maps = maps;
  sp.anchor = k->kind == FK_EXTERN ? k->anchor : -1;
  sp.seed = k->seed; sp.nkept = k->nkept; sp.nred = k->nred;
  memcpy(sp.perm, k->perm, sizeof sp.perm);
  if (fk_assign(&sp)) {
    rc = err_set(e, FL_EUNSUPPORTED, "%s: these shapes do not fit the "
                 "compiled kernel: %s", k->name, sp.why);
    goto done;
  }
  for (i = 0; i < D; i++) args[i] = sp.size[i];
  for (a = 0; a < k->nacc; a++) {
    const fk_access *ac = &k->acc[a];
    int64_t *st = args + D + a * (D + 1);
    if (ac->store || ac->rng) {
      m = maps[ac->node];
    } else {
      int src;
      if (fk_edge_map(&sp, ac->via_node, ac->via_in, &m, &src) || src != ac->node) {
        rc = err_set(e, FL_EUNSUPPORTED, "%s: cannot index %%%d for these "
                     "shapes: %s", k->name, ac->node, sp.why);
        goto done;
      }
    }
    fk_map_strides(&sp, &m, &metas[ac->node], st, &st[D]);
  }
  merge_group(0, k->nkept, D, k->nacc, args);
  merge_group(k->nkept, D, D, k->nacc, args);
done:
  free((char *)sp.buffer);
  free(member);
  free(maps);
  return rc;
}

int fk_static_args(const fk_kernel *k, const ir_graph *g, int64_t *args) {
  fl_meta *metas;
  fl_err e;
  int i, ok;
  if (g->nsyms > 0 || g->has_asym || k->nnodes == 0) return 0;
  if (!(metas = malloc((size_t)g->n * sizeof *metas))) return 0;
  for (i = 0; i < g->n; i++) metas[i] = g->nodes[i].meta;
  ok = fk_bind(k, g, metas, args, &e) == FL_OK;
  free(metas);
  return ok ? fk_static_nargs(k) : 0;
}
