/*
** lower.c -- a group of graph nodes becomes one kernel description.
** Invariant: the steps of a kernel are in dependency order, every graph
** node computed in the kernel has exactly one step holding its value, and
** a stored value covers its buffer exactly once (no element written twice,
** none left out).  Composites (softmax, log_softmax, layer_norm, rms_norm,
** batch_norm: their one definition, graph/compose.c) and var and mean are
** lowered here into accumulators and op-table expressions, so both code
** generators only ever print op-table `expr`s.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel.h"
#include "../graph/compose.h"
#include "../graph/rng.h"

/* growing step/access arrays while building */
typedef struct builder {
  fk_kernel *k;
  fk_space sp;
  int capi, capa;
  int *val;            /* val[node] = step holding its value, or -1 */
  int oom;
} builder;

static int push(builder *b, const fk_instr *in) {
  fk_kernel *k = b->k;
  if (k->ninstr == b->capi) {
    int cap = b->capi ? b->capi * 2 : 32;
    fk_instr *n = realloc(k->instr, (size_t)cap * sizeof *n);
    if (!n) { b->oom = 1; return 0; }
    k->instr = n;
    b->capi = cap;
  }
  k->instr[k->ninstr] = *in;
  return k->ninstr++;
}

static int argfull(const builder *b, int i) { return b->k->instr[i].full; }
static int argstage(const builder *b, int i) { return b->k->instr[i].stage; }

/* An op-table expression over 1..3 earlier steps. */
static int elem(builder *b, fl_op op, const op_attrs *a, fl_dtype dt, int node,
                int x, int y, int z) {
  fk_instr in;
  int args[3] = {x, y, z}, i;
  memset(&in, 0, sizeof in);
  in.opc = FKI_ELEM;
  in.op = op;
  if (a) in.attrs = *a;
  else op_attrs_init(op, &in.attrs);
  in.dtype = dt;
  in.node = node;
  for (i = 0; i < 3 && args[i] >= 0; i++) {
    in.arg[in.narg++] = args[i];
    in.full |= argfull(b, args[i]);
    if (argstage(b, args[i]) > in.stage) in.stage = argstage(b, args[i]);
  }
  return push(b, &in);
}

static int constant(builder *b, double v, fl_dtype dt) {
  fk_instr in;
  memset(&in, 0, sizeof in);
  in.opc = FKI_CONST;
  in.value = v;
  in.dtype = dt;
  in.node = -1;
  return push(b, &in);
}

/* A one-element constant tensor as a step; int64 keeps its exact value. */
static int constant_of(builder *b, const fl_tensor *t) {
  int s = constant(b, ten_get(t, 0), t->m.dtype);
  if (!b->oom && t->m.dtype == FL_I64)
    b->k->instr[s].ivalue = dtype_load_i64(FL_I64, ten_elem_ptr(t, 0));
  return s;
}

static int nred(builder *b) {
  fk_instr in;
  memset(&in, 0, sizeof in);
  in.opc = FKI_NRED;
  in.dtype = FL_F32;
  in.node = -1;
  return push(b, &in);
}

static int reduce(builder *b, fk_red red, int x, fl_dtype dt, int node) {
  fk_instr in;
  memset(&in, 0, sizeof in);
  in.opc = FKI_REDUCE;
  in.red = red;
  in.narg = 1;
  in.arg[0] = x;
  in.dtype = dt;
  in.node = node;
  in.stage = argstage(b, x) + 1;
  return push(b, &in);
}

static int same_access(const fk_access *a, int node, const int64_t *st,
                       const int64_t *st2, int D) {
  return !a->rng && a->node == node && memcmp(st, st2, (size_t)(D + 1) * sizeof *st) == 0;
}

static int buf_slot(fk_kernel *k, int node, int *cap) {
  int i;
  for (i = 0; i < k->nbufs; i++)
    if (k->bufs[i] == node) return i;
  if (k->nbufs == *cap) {
    int c = *cap ? *cap * 2 : 8;
    int *n = realloc(k->bufs, (size_t)c * sizeof *n);
    if (!n) return -1;
    k->bufs = n;
    *cap = c;
  }
  k->bufs[k->nbufs] = node;
  return k->nbufs++;
}

/* The step reading input `in` of member `node`: the producer's step when it
** is computed here, a literal for a scalar constant, else a load. */
static int operand(builder *b, int node, int in, int64_t (*accst)[FL_MAX_DIMS + 1],
                   int *bufcap) {
  fk_kernel *k = b->k;
  const ir_graph *g = b->sp.g;
  int D = k->nkept + k->nred, src, a, d;
  int64_t st[FL_MAX_DIMS + 1];
  fk_map m;
  fk_instr li;
  if (fk_edge_map(&b->sp, node, in, &m, &src)) return -2;
  if (b->sp.member[src]) return b->val[src];
  if (g->nodes[src].kind == IR_CONST && src != b->sp.anchor &&
      meta_numel(&g->nodes[src].meta) == 1 && g->nodes[src].value.st)
    return constant_of(b, &g->nodes[src].value);
  fk_map_strides(&b->sp, &m, &b->sp.metas[src], st, &st[D]);
  for (a = 0; a < k->nacc; a++)
    if (!k->acc[a].store && same_access(&k->acc[a], src, accst[a], st, D)) break;
  if (a == k->nacc) {
    fk_access *na;
    if (k->nacc >= 64) return -3;
    na = &k->acc[k->nacc++];
    memset(na, 0, sizeof *na);
    na->node = src;
    na->buf = buf_slot(k, src, bufcap);
    if (na->buf < 0) { b->oom = 1; return -1; }
    na->via_node = node;
    na->via_in = in;
    na->iota = ir_is_iota(&g->nodes[src]);   /* fl.arange: the index itself */
    for (d = k->nkept; d < D; d++) na->full |= st[d] != 0;
    memcpy(accst[a], st, sizeof st);
  }
  /* one load step per access */
  for (d = 0; d < k->ninstr; d++)
    if (k->instr[d].opc == FKI_LOAD && k->instr[d].access == a) return d;
  memset(&li, 0, sizeof li);
  li.opc = FKI_LOAD;
  li.access = a;
  li.full = k->acc[a].full;
  li.dtype = b->sp.metas[src].dtype;
  li.node = -1;
  return push(b, &li);
}

/* A random member's stream position: an access with no buffer whose
** strides walk the node's elements as a contiguous buffer would (its
** linear index, whatever view or broadcast the kernel reads it through),
** and the FKI_CTR step holding that index. */
static int rng_counter(builder *b, int id, int64_t (*accst)[FL_MAX_DIMS + 1]) {
  fk_kernel *k = b->k;
  int D = k->nkept + k->nred, a = k->nacc, d;
  fk_access *ac;
  fk_instr ci;
  if (k->nacc >= 64) return -3;
  fk_map_strides(&b->sp, &b->sp.maps[id], &b->sp.metas[id], accst[a], &accst[a][D]);
  ac = &k->acc[k->nacc++];
  memset(ac, 0, sizeof *ac);
  ac->node = id;
  ac->buf = -1;
  ac->rng = 1;
  ac->via_node = ac->via_in = -1;
  for (d = k->nkept; d < D; d++) ac->full |= accst[a][d] != 0;
  k->nrng++;
  memset(&ci, 0, sizeof ci);
  ci.opc = FKI_CTR;
  ci.access = a;
  ci.full = ac->full;
  ci.dtype = FL_I64;
  ci.node = -1;
  return push(b, &ci);
}

/* rand, randn, dropout: the op-table expression over the counter (and x);
** the attributes it reads are float32 values, as eager computes them
** (ops.def). */
static int lower_random(builder *b, int id, const int *v,
                        int64_t (*accst)[FL_MAX_DIMS + 1]) {
  const ir_node *nd = &b->sp.g->nodes[id];
  op_attrs a = nd->attrs;
  int c = rng_counter(b, id, accst);
  if (c < 0 || b->oom) return c < 0 ? c : -1;
  if (nd->op == OP_RAND) a.i[0] = rng_mantissa_bits(nd->meta.dtype);
  if (nd->op == OP_DROPOUT) {
    a.f[0] = (double)(float)nd->attrs.f[0];
    a.f[1] = (double)rng_dropout_scale(nd->attrs.f[0]);
    return elem(b, nd->op, &a, nd->meta.dtype, id, v[0], c, -1);
  }
  return elem(b, nd->op, &a, nd->meta.dtype, id, c, -1, -1);
}

/* The composites from their one definition (graph/compose.c), as steps:
** float32 in between, reductions over the kernel's reduced dims (a mean
** is the sum over their count), the last step the node's value in its
** own dtype. */
typedef struct low_ctx {
  builder *b;
  int n;                /* the count of reduced elements, once made */
} low_ctx;

static int low_op(void *ctx, fl_op op, int x, int y) {
  return elem(((low_ctx *)ctx)->b, op, NULL, FL_F32, -1, x, y, -1);
}
static int low_reduce(void *ctx, fl_op op, int x) {
  low_ctx *c = ctx;
  int s;
  if (op == OP_AMAX) return reduce(c->b, FKR_MAX, x, FL_F32, -1);
  s = reduce(c->b, FKR_SUM, x, FL_F32, -1);
  if (op != OP_MEAN) return s;
  if (c->n < 0) c->n = nred(c->b);
  return elem(c->b, OP_DIV, NULL, FL_F32, -1, s, c->n, -1);
}
static int low_konst(void *ctx, double v) { return constant(((low_ctx *)ctx)->b, v, FL_F32); }

static int lower_composite(builder *b, const ir_node *nd, int id, const int *v) {
  low_ctx lc;
  cbuild c;
  int r;
  lc.b = b;
  lc.n = -1;
  c.ctx = &lc;
  c.op = low_op;
  c.reduce = low_reduce;
  c.konst = low_konst;
  r = compose(&c, nd->op, &nd->attrs, v, nd->nin);
  if (b->oom || r < 0) return r < 0 ? -2 : r;
  /* the last step is new (an elementwise op): it becomes the node's value */
  b->k->instr[r].dtype = nd->meta.dtype;
  b->k->instr[r].node = id;
  return r;
}

/* Lower one member into steps; its value ends in b->val[id]. */
static int lower_node(builder *b, int id, const int *v,
                      int64_t (*accst)[FL_MAX_DIMS + 1]) {
  const ir_node *nd = &b->sp.g->nodes[id];
  const op_attrs *a = &nd->attrs;
  fl_dtype dt = nd->meta.dtype, f = FL_F32;
  op_kind kind = op_info_of(nd->op)->kind;
  int r, s, t, q, n;
  if (fk_is_view(b->sp.g, id)) return v[0];
  if (rng_op(nd->op)) return lower_random(b, id, v, accst);
  switch (nd->op) {
  case OP_SUM: return reduce(b, FKR_SUM, v[0], dt, id);
  case OP_AMAX: return reduce(b, FKR_MAX, v[0], dt, id);
  case OP_AMIN: return reduce(b, FKR_MIN, v[0], dt, id);
  case OP_ARGMAX: return reduce(b, FKR_ARGMAX, v[0], dt, id);
  case OP_MEAN:
    s = reduce(b, FKR_SUM, v[0], f, -1);
    return elem(b, OP_DIV, NULL, dt, id, s, nred(b), -1);
  case OP_VAR:
    /* two passes, as the oracle: the mean, then squared deviations */
    s = reduce(b, FKR_SUM, v[0], f, -1);
    n = nred(b);
    t = elem(b, OP_SUB, NULL, f, -1, v[0], elem(b, OP_DIV, NULL, f, -1, s, n, -1), -1);
    q = reduce(b, FKR_SUM, elem(b, OP_MUL, NULL, f, -1, t, t, -1), f, -1);
    r = elem(b, OP_MAXIMUM, NULL, f, -1,
             elem(b, OP_SUB, NULL, f, -1, n, constant(b, a->f[0], f), -1),
             constant(b, 0.0, f), -1);
    return elem(b, OP_DIV, NULL, dt, id, q, r, -1);
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_LAYER_NORM: case OP_RMS_NORM:
  case OP_BATCH_NORM:
    return lower_composite(b, nd, id, v);
  default:
    break;
  }
  if ((kind == OPK_ELEMWISE || kind == OPK_BROADCAST) && op_info_of(nd->op)->expr)
    return elem(b, nd->op, a, dt, id, v[0], nd->nin > 1 ? v[1] : -1,
                nd->nin > 2 ? v[2] : -1);
  return -2;
}

/* A stored value must cover its buffer exactly once: the strides of the
** dims it uses, sorted, lay the buffer out contiguously, and it uses every
** kernel dim of its space (no element stored twice). */
static int store_ok(const builder *b, int id, const int64_t *st, int full) {
  const fk_kernel *k = b->k;
  int64_t s[FL_MAX_DIMS], z[FL_MAX_DIMS], want = 1, have = 1, space = 1;
  int n = 0, i, j, hi = full ? k->nkept + k->nred : k->nkept;
  if (meta_numel(&b->sp.metas[id]) == 0) return 1;
  for (i = 0; i < hi; i++) {
    if (b->sp.size[i] <= 1) continue;
    space *= b->sp.size[i];
    if (st[i] == 0) return 0;
    s[n] = st[i] < 0 ? -st[i] : st[i];
    z[n++] = b->sp.size[i];
  }
  for (i = 1; i < n; i++)       /* insertion sort by stride */
    for (j = i; j > 0 && s[j] < s[j - 1]; j--) {
      int64_t t = s[j]; s[j] = s[j - 1]; s[j - 1] = t;
      t = z[j]; z[j] = z[j - 1]; z[j - 1] = t;
    }
  for (i = 0; i < n; i++) {
    if (s[i] != want) return 0;
    want *= z[i];
    have *= z[i];
  }
  (void)space;
  return st[k->nkept + k->nred] == 0 && have == meta_numel(&b->sp.metas[id]);
}

static int cmp_seed(const void *pa, const void *pb, void *ctx);

/* The views between the kernel's members (and its extern op) and what
** they read: folded into indexing, listed for the pictures. */
static void collect_views(fk_kernel *k, const ir_graph *g, const char *member,
                          const char *stored) {
  int i, j, t;
  k->views = malloc((size_t)g->n * sizeof(int));
  k->nviews = 0;
  if (!k->views) return;
  for (i = -1; i < k->nnodes; i++) {
    int id = i < 0 ? k->anchor : k->nodes[i];
    if (id < 0) continue;
    for (j = 0; j < g->nodes[id].nin; j++) {
      int s = g->nodes[id].in[j];
      while (s >= 0 && !member[s] && !stored[s] && fk_is_view(g, s)) {
        int dup = 0;
        for (t = 0; t < k->nviews; t++) dup |= k->views[t] == s;
        if (!dup) k->views[k->nviews++] = s;
        s = g->nodes[s].in[0];
      }
    }
  }
}

int fk_build(fk_kernel *k, const ir_graph *g, const int *members, int nm,
             int anchor, const char *stored, char *why, size_t nwhy) {
  builder b;
  fl_meta *metas = malloc((size_t)g->n * sizeof *metas);
  char *member = calloc((size_t)g->n, 1);
  fk_map *maps = malloc((size_t)(g->n ? g->n : 1) * sizeof *maps);   /* fk_assign resets it */
  int *val = malloc((size_t)g->n * sizeof *val);
  int64_t (*accst)[FL_MAX_DIMS + 1] = malloc(64 * sizeof *accst);
  int cands[64], nc = 0, i, j, c, rc = -1, bufcap = 0, firstred = -1;
  memset(k, 0, sizeof *k);
  k->anchor = anchor;
  k->seed = -1;
  why[0] = '\0';
  if (!metas || !member || !maps || !val || !accst) {
    snprintf(why, nwhy, "out of memory");
    goto done;
  }
  for (i = 0; i < g->n; i++) metas[i] = g->nodes[i].meta;
  for (i = 0; i < nm; i++) member[members[i]] = 1;
  k->nodes = malloc((size_t)(nm ? nm : 1) * sizeof(int));
  k->acc = malloc(64 * sizeof *k->acc);
  if (!k->nodes || !k->acc) { snprintf(why, nwhy, "out of memory"); goto done; }
  for (i = 0, j = 0; i < g->n; i++) if (member[i]) k->nodes[j++] = i;
  k->nnodes = nm;
  for (i = 0; i < nm; i++)
    if (op_info_of(g->nodes[k->nodes[i]].op)->kind == OPK_REDUCTION) {
      firstred = k->nodes[i];
      break;
    }
  k->kind = anchor >= 0 ? FK_EXTERN : firstred >= 0 ? FK_REDUCE : FK_POINTWISE;
  if (anchor >= 0 && firstred >= 0) {
    snprintf(why, nwhy, "a reduction cannot be the epilogue of %s", op_name(g->nodes[anchor].op));
    goto done;
  }
  /* extern inputs are read, its result written */
  if (anchor >= 0) {
    for (i = 0; i < g->nodes[anchor].nin; i++) {
      int s = g->nodes[anchor].in[i];
      if (s < 0) continue;
      while (fk_is_view(g, s) && !stored[s]) s = g->nodes[s].in[0];
      if (buf_slot(k, s, &bufcap) < 0) goto oom;
    }
  }
  if (nm == 0) {
    k->nin = k->nbufs;
    if (buf_slot(k, anchor, &bufcap) < 0) goto oom;
    collect_views(k, g, member, stored);
    rc = 0;
    goto done;
  }
  /* the iteration space: a reduction's input, else the largest member */
  if (firstred >= 0) {
    int is_red[FL_MAX_DIMS], d, nr = 0;
    const ir_node *rn = &g->nodes[firstred];
    const fl_meta *x = &metas[rn->in[0]];
    memset(is_red, 0, sizeof is_red);
    if (rn->op == OP_SOFTMAX || rn->op == OP_LOG_SOFTMAX) { if (x->ndim) is_red[rn->attrs.i[0]] = 1; }
    else if (rn->op == OP_LAYER_NORM || rn->op == OP_RMS_NORM) {
      for (d = x->ndim - (int)rn->attrs.i[0]; d < x->ndim; d++) is_red[d] = 1;
    } else if (rn->attrs.ndims == 0) { for (d = 0; d < x->ndim; d++) is_red[d] = 1; }
    else for (d = 0; d < rn->attrs.ndims; d++) if (x->ndim) is_red[rn->attrs.dims[d]] = 1;
    for (d = 0; d < x->ndim; d++) if (!is_red[d]) k->perm[k->nkept++] = d;
    for (d = 0; d < x->ndim; d++) if (is_red[d]) { k->perm[k->nkept + nr++] = d; }
    k->nred = nr;
    cands[nc++] = rn->in[0];
  } else {
    for (i = 0; i < nm && nc < 64; i++) cands[nc++] = k->nodes[i];
    qsort_r(cands, (size_t)nc, sizeof cands[0], cmp_seed, metas);
  }
  memset(&b, 0, sizeof b);
  b.k = k;
  b.val = val;
  b.sp.g = g; b.sp.metas = metas; b.sp.member = member; b.sp.maps = maps;
  b.sp.buffer = stored;
  b.sp.anchor = anchor;
  for (c = 0; c < nc; c++) {
    b.sp.seed = cands[c];
    if (firstred < 0) {
      k->nkept = metas[cands[c]].ndim;
      for (i = 0; i < k->nkept; i++) k->perm[i] = i;
    }
    b.sp.nkept = k->nkept; b.sp.nred = k->nred;
    memcpy(b.sp.perm, k->perm, sizeof k->perm);
    if (fk_assign(&b.sp) == 0) break;
  }
  if (c == nc) { snprintf(why, nwhy, "%s", b.sp.why); goto done; }
  k->seed = cands[c];
  /* steps, in id order; loads and literals appear as operands need them */
  for (i = 0; i < g->n; i++) val[i] = -1;
  for (i = 0; i < nm; i++) {
    const ir_node *nd = &g->nodes[k->nodes[i]];
    int v[8] = {-1, -1, -1, -1, -1, -1, -1, -1}, a, r;
    for (a = 0; a < nd->nin && a < 8; a++) {
      if (nd->in[a] < 0) continue;
      v[a] = operand(&b, k->nodes[i], a, accst, &bufcap);
      if (v[a] < 0) {
        if (b.oom) goto oom;
        snprintf(why, nwhy, "%s", v[a] == -3 ? "too many distinct loads" : b.sp.why);
        goto done;
      }
    }
    r = lower_node(&b, k->nodes[i], v, accst);
    if (b.oom) goto oom;
    if (r == -3) { snprintf(why, nwhy, "too many distinct loads"); goto done; }
    if (r < 0) {
      snprintf(why, nwhy, "%%%d (%s) has no lowering inside a generated kernel",
               k->nodes[i], op_name(nd->op));
      goto done;
    }
    val[k->nodes[i]] = r;
  }
  k->nin = k->nbufs;
  if (anchor >= 0 && buf_slot(k, anchor, &bufcap) < 0) goto oom;
  /* stores */
  for (i = 0; i < nm; i++) {
    int id = k->nodes[i], D = k->nkept + k->nred, d, full = 0;
    fk_access *ac;
    if (!stored[id]) continue;
    if (k->nacc >= 64) { snprintf(why, nwhy, "too many outputs"); goto done; }
    fk_map_strides(&b.sp, &maps[id], &metas[id], accst[k->nacc], &accst[k->nacc][D]);
    for (d = k->nkept; d < D; d++) full |= accst[k->nacc][d] != 0;
    if (k->kind == FK_POINTWISE || k->kind == FK_EXTERN) full = 1;
    if (!store_ok(&b, id, accst[k->nacc], full)) {
      snprintf(why, nwhy, "%%%d is needed outside the kernel but the kernel's "
               "space would not store each of its elements exactly once", id);
      goto done;
    }
    ac = &k->acc[k->nacc++];
    memset(ac, 0, sizeof *ac);
    ac->node = id;
    ac->store = 1;
    ac->value = val[id];
    ac->full = full;
    if ((ac->buf = buf_slot(k, id, &bufcap)) < 0) goto oom;
  }
  collect_views(k, g, member, stored);
  /* the innermost stride each access had, after merging dims */
  {
    int D = k->nkept + k->nred, nargs = fk_nargs(k);
    int64_t *args = malloc((size_t)nargs * sizeof *args);
    fl_err e;
    if (!args) goto oom;
    if (fk_bind(k, g, metas, args, &e)) {
      snprintf(why, nwhy, "%s", e.msg);
      free(args);
      goto done;
    }
    for (i = 0; i < k->nacc; i++) {
      int64_t s = D ? args[D + i * (D + 1) + D - 1] : 0;
      k->acc[i].inner = s == 1 ? 1 : s == 0 ? 0 : -1;
    }
    free(args);
  }
  rc = 0;
  goto done;
oom:
  snprintf(why, nwhy, "out of memory");
  rc = -1;
done:
  if (rc) fk_kernel_clear(k);
  else fk_name(k, g);
  free(metas); free(member); free(maps); free(val); free(accst);
  return rc;
}

/* seeds to try: most elements, then most dims, then latest */
static int cmp_seed(const void *pa, const void *pb, void *ctx) {
  const fl_meta *m = ctx;
  int a = *(const int *)pa, b = *(const int *)pb;
  int64_t na = meta_numel(&m[a]), nb = meta_numel(&m[b]);
  if (na != nb) return na > nb ? -1 : 1;
  if (m[a].ndim != m[b].ndim) return m[b].ndim - m[a].ndim;
  return b - a;
}

void fk_kernel_clear(fk_kernel *k) {
  if (!k) return;
  free(k->nodes);
  free(k->views);
  free(k->bufs);
  free(k->instr);
  free(k->acc);
  memset(k, 0, sizeof *k);
  k->anchor = k->seed = -1;
}

void fk_describe(const ir_graph *g, int id, char *buf, size_t n) {
  const ir_node *nd = &g->nodes[id];
  const op_attrs *a = &nd->attrs;
  size_t len;
  int k;
  switch (nd->kind) {
  case IR_INPUT: snprintf(buf, n, "input%s%s", nd->name ? " " : "", nd->name ? nd->name : ""); return;
  case IR_PARAM: snprintf(buf, n, "param%s%s", nd->name ? " " : "", nd->name ? nd->name : ""); return;
  case IR_CONST: snprintf(buf, n, "const"); return;
  case IR_OP: break;
  }
  if (op_is_reduce(nd->op)) {
    if (a->ndims == 0) { snprintf(buf, n, "%s over all dims", op_name(nd->op)); return; }
    snprintf(buf, n, "%s over dim%s ", op_name(nd->op), a->ndims > 1 ? "s" : "");
    for (k = 0; k < a->ndims; k++) {
      len = strlen(buf);
      snprintf(buf + len, n - len, "%s%lld", k ? "," : "", (long long)a->dims[k]);
    }
    return;
  }
  switch (nd->op) {
  case OP_SOFTMAX: case OP_LOG_SOFTMAX:
    snprintf(buf, n, "%s over dim %lld", op_name(nd->op), (long long)a->i[0]);
    return;
  case OP_LAYER_NORM: case OP_RMS_NORM:
    snprintf(buf, n, "%s over the last %lld dim%s", op_name(nd->op),
             (long long)a->i[0], a->i[0] == 1 ? "" : "s");
    return;
  default:
    snprintf(buf, n, "%s", op_name(nd->op));
  }
}

void fk_name(fk_kernel *k, const ir_graph *g) {
  char ops[80] = "", last[24] = "";
  const fl_meta *m;
  const int *sym;
  int i, d, nops = 0, seed = k->seed >= 0 ? k->seed : k->anchor;
  size_t len;
  for (i = -1; i < k->nnodes; i++) {
    int id = i < 0 ? k->anchor : k->nodes[i];
    const char *nm;
    if (id < 0 || fk_is_view(g, id)) continue;
    nm = g->nodes[id].op == OP_MATMUL ? "mm" : op_name(g->nodes[id].op);
    nops++;
    if (strcmp(nm, last) == 0) continue;
    snprintf(last, sizeof last, "%s", nm);
    len = strlen(ops);
    if (len + strlen(nm) + 2 >= sizeof ops - 4) { snprintf(ops + len, sizeof ops - len, "_etc"); break; }
    snprintf(ops + len, sizeof ops - len, "%s%s", len ? "_" : "", nm);
  }
  if (nops == 0) snprintf(ops, sizeof ops, "copy");
  snprintf(k->name, sizeof k->name, "%s%s",
           nops > 1 ? "fused_" : k->kind == FK_REDUCE ? "r_" :
           k->kind == FK_EXTERN ? "x_" : "E_", ops);
  m = &g->nodes[seed].meta;
  sym = g->nodes[seed].sym;
  for (d = 0; d < m->ndim; d++) {
    len = strlen(k->name);
    if (sym[d]) {
      /* s0, s0s1 for s0*s1: an identifier once exec_c_ident has its way */
      char ex[48];
      snprintf(k->name + len, sizeof k->name - len, "%c%s", d ? 'x' : '_',
               ir_sym_str(g, sym[d] - 1, ex, sizeof ex));
    }
    else snprintf(k->name + len, sizeof k->name - len, "%c%lld", d ? 'x' : '_', (long long)m->shape[d]);
  }
  if (m->ndim == 0) {
    len = strlen(k->name);
    snprintf(k->name + len, sizeof k->name - len, "_scalar");
  }
}

void fk_rng_args(const fk_kernel *k, uint64_t key, const uint64_t *start,
                 int64_t *args) {
  int a, r = 0, base = fk_rng_arg(k);
  if (!k->nrng) return;
  args[base] = (int64_t)key;
  for (a = 0; a < k->nacc; a++)
    if (k->acc[a].rng) args[base + 1 + r++] = (int64_t)start[k->acc[a].node];
}
