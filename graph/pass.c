/*
** pass.c -- decompose and optimize.  Both walk the old graph in id order
** and build a new one, keeping map[old id] = new id; a rewrite emits its
** replacement nodes and points map[old] at the last of them.  Since the
** builder only appends, the new graph is topologically ordered too.
*/
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "build.h"
#include "compose.h"
#include "pass.h"
#include "ref.h"
#include "strbuf.h"

/* Rewriting state shared by both passes. */
typedef struct rw {
  gbuild b;             /* the graph being built, its first failure (the
                           constructors do nothing after it), and the
                           where/scope of the old node being rewritten */
  const ir_graph *old;
  int *map;             /* old id -> new id */
  strbuf log;
  const ir_node *cur;   /* old node being rewritten */
  signed char *wmemo;   /* optimize: new id -> depends on weights only (-1: unknown) */
  int wcap;
  char *own;            /* optimize: old id -> became a node of its own (not
                           shared with other nodes through cse or simplify) */
  unsigned rules;       /* optimize: the rewrites to try (1 << PASS_*) */
} rw;

const char *const pass_rule_names[PASS_NRULES] = {
  "fold_bn", "simplify", "fold_linear", "fold_scale", "const_fold", "cse", "dce"
};

#define RULE(r, x) ((r)->rules & (1u << (x)))

/* The old node being rewritten: what the nodes made for it inherit
** (its source position and module scope). */
static void set_cur(rw *r, const ir_node *nd) {
  int k;
  r->cur = nd;
  r->b.where = nd ? nd->where : NULL;
  r->b.scope = nd ? nd->scope : NULL;
  r->b.wide = nd && nd->meta.dtype == FL_F64;
  for (k = 0; nd && k < nd->nin; k++)
    if (nd->in[k] >= 0 && r->old->nodes[nd->in[k]].meta.dtype == FL_F64) r->b.wide = 1;
}

/* Emit op over new-graph ids (-1 = absent) with the current node's source
** position and module scope (build.h).  Returns the new id or -1. */
static int emit_sym(rw *r, fl_op op, const op_attrs *a, int nin, const int *in,
                    const int *asym) {
  return gb_op_sym(&r->b, op, a, nin, in, asym);
}

static int emit(rw *r, fl_op op, const op_attrs *a, int nin, const int *in) {
  return gb_op(&r->b, op, a, nin, in);
}

/* A node whose attributes hold size expressions (reshape(B, T*h)): its
** attrs are only the sizes seen at capture, so it is never folded or
** compared by attrs alone. */
static int sym_attrs(const ir_node *nd) {
  int j;
  for (j = 0; j < IR_NASYM; j++) if (nd->asym[j]) return 1;
  return 0;
}

#define emit1(r, op, x) gb_op1(&(r)->b, op, x)
#define emit2(r, op, x, y) gb_op2(&(r)->b, op, x, y)
#define konst(r, v) gb_const(&(r)->b, v)
#define reduce_tail(r, op, x, from) gb_reduce_tail(&(r)->b, op, x, from)
#define reduce_dim(r, op, x, dim) gb_reduce_dim(&(r)->b, op, x, dim)

/* Copies one old node into the new graph unchanged (inputs remapped). */
static int copy_node(rw *r, const ir_node *nd) {
  int in[64], k;
  if (nd->kind != IR_OP)             /* a backward graph's saved value keeps its name */
    return ir_copy_node(r->b.g, r->old, (int)(nd - r->old->nodes), r->map, r->b.e);
  for (k = 0; k < nd->nin; k++) in[k] = nd->in[k] < 0 ? -1 : r->map[nd->in[k]];
  return emit_sym(r, nd->op, &nd->attrs, nd->nin, in, nd->asym);
}

static int finish_outputs(rw *r) {
  int i, nres = ir_nresults(r->old);
  for (i = 0; i < nres && !r->b.rc; i++) {
    int rc = ir_add_output(r->b.g, r->map[r->old->outputs[i]], r->b.e);
    if (rc) r->b.rc = rc;
  }
  /* write-backs go on into the same leaves, whatever the pass did */
  for (i = 0; i < r->old->nwb && !r->b.rc; i++) {
    int rc = ir_add_writeback(r->b.g, r->map[r->old->outputs[nres + i]], r->map[r->old->wb[i]], r->b.e);
    if (rc) r->b.rc = rc;
  }
  /* a joint graph stays one: its gradients' leaves are copied too */
  if (r->old->joint_nres && !r->b.rc) {
    int ng = nres - r->old->joint_nres;
    if (!(r->b.g->joint_wrt = malloc((size_t)(ng ? ng : 1) * sizeof(int))))
      return r->b.rc = err_set(r->b.e, FL_ENOMEM, "pass: out of memory");
    for (i = 0; i < ng; i++) r->b.g->joint_wrt[i] = r->map[r->old->joint_wrt[i]];
    r->b.g->joint_nres = r->old->joint_nres;
  }
  return r->b.rc;
}

static int rw_begin(rw *r, const ir_graph *old, fl_err *e) {
  memset(r, 0, sizeof *r);
  r->old = old;
  r->b.e = e;
  r->b.g = ir_new();
  r->map = malloc((size_t)(old->n ? old->n : 1) * sizeof(int));
  if (r->b.g && old->nsx && (r->b.g->sx = malloc((size_t)old->nsx * sizeof *old->sx))) {
    /* the same size expressions, so node sym[] and asym[] keep meaning */
    memcpy(r->b.g->sx, old->sx, (size_t)old->nsx * sizeof *old->sx);
    r->b.g->nsx = r->b.g->capsx = old->nsx;
  }
  if (r->b.g) r->b.g->nsyms = old->nsyms;
  if (!r->b.g || !r->map || (old->nsx && !r->b.g->sx)) {
    ir_free(r->b.g);
    free(r->map);
    return err_set(e, FL_ENOMEM, "pass: out of memory");
  }
  return FL_OK;
}

/* Ends a pass: on success hands over the graph and log, else frees all. */
static ir_graph *rw_end(rw *r, char **log) {
  ir_graph *g = r->b.g;
  free(r->map);
  free(r->wmemo);
  if (r->b.rc) {
    strbuf_free(&r->log);
    ir_free(g);
    return NULL;
  }
  if (r->log.n == 0) strbuf_printf(&r->log, "(nothing changed)\n");
  *log = strbuf_take(&r->log);
  return g;
}

/* ---- decompose ------------------------------------------------------- */

/* The composites softmax, log_softmax, layer_norm, rms_norm and
** batch_norm come from their one definition (graph/compose.c), built here
** as graph nodes: a reduction over the softmax's dim, or the norm's
** trailing dims, kept. */
typedef struct dec_ctx {
  rw *r;
  const ir_node *nd;
  int ndim;             /* of x */
} dec_ctx;

static int dec_op(void *ctx, fl_op op, int x, int y) {
  rw *r = ((dec_ctx *)ctx)->r;
  return y < 0 ? emit1(r, op, x) : emit2(r, op, x, y);
}
static int dec_reduce(void *ctx, fl_op op, int x) {
  dec_ctx *d = ctx;
  if (d->nd->op == OP_SOFTMAX || d->nd->op == OP_LOG_SOFTMAX)
    return reduce_dim(d->r, op, x, (int)d->nd->attrs.i[0]);
  return reduce_tail(d->r, op, x, d->ndim - (int)d->nd->attrs.i[0]);
}
static int dec_konst(void *ctx, double v) { return konst(((dec_ctx *)ctx)->r, v); }

static int dec_composite(rw *r, const ir_node *nd, const int *in) {
  dec_ctx d;
  cbuild c;
  d.r = r;
  d.nd = nd;
  d.ndim = r->b.g->nodes[in[0]].meta.ndim;
  c.ctx = &d;
  c.op = dec_op;
  c.reduce = dec_reduce;
  c.konst = dec_konst;
  return compose(&c, nd->op, &nd->attrs, in, nd->nin);
}

/* gelu(x) = x * 0.5 * (1 + erf(x / sqrt 2)); the tanh form likewise. */
static int dec_gelu(rw *r, const ir_node *nd, int x) {
  int inner;
  if (nd->op == OP_GELU) {
    inner = emit1(r, OP_ERF, emit2(r, OP_MUL, x, konst(r, M_SQRT1_2)));
  } else {
    int x3 = emit2(r, OP_MUL, emit2(r, OP_MUL, x, x), x);
    int t = emit2(r, OP_ADD, x, emit2(r, OP_MUL, x3, konst(r, 0.044715)));
    inner = emit1(r, OP_TANH, emit2(r, OP_MUL, t, konst(r, 0.79788456080286535588)));
  }
  return emit2(r, OP_MUL, emit2(r, OP_MUL, x, konst(r, 0.5)),
               emit2(r, OP_ADD, inner, konst(r, 1.0)));
}

/* linear(x, w, b) = matmul(x, transpose(w)) + b */
static int dec_linear(rw *r, const ir_node *nd, const int *in) {
  op_attrs a;
  int wt, y;
  op_attrs_init(OP_TRANSPOSE, &a);
  a.i[0] = 0;
  a.i[1] = 1;
  wt = emit(r, OP_TRANSPOSE, &a, 1, &in[1]);
  y = emit2(r, OP_MATMUL, in[0], wt);
  if (nd->nin > 2 && in[2] >= 0) y = emit2(r, OP_ADD, y, in[2]);
  return y;
}

/* batch_norm: per-channel vectors [C] are reshaped to [C,1,...,1] so
** they broadcast over dim 1 of x [N,C,...]; then its definition. */
static int dec_batch_norm(rw *r, const ir_node *nd, const int *in) {
  int nd_x = r->b.g->nodes[in[0]].meta.ndim, k, ch[5];
  op_attrs a;
  op_attrs_init(OP_RESHAPE, &a);
  a.ndims = nd_x - 1;
  a.dims[0] = -1;
  for (k = 1; k < a.ndims; k++) a.dims[k] = 1;
  ch[0] = in[0];
  for (k = 1; k < 5; k++)
    ch[k] = (k < nd->nin && in[k] >= 0) ? emit(r, OP_RESHAPE, &a, 1, &in[k]) : -1;
  return dec_composite(r, nd, ch);
}

ir_graph *pass_decompose(const ir_graph *old, char **log, fl_err *e) {
  rw r;
  int i, k;
  if (rw_begin(&r, old, e)) return NULL;
  for (i = 0; i < old->n && !r.b.rc; i++) {
    const ir_node *nd = &old->nodes[i];
    int in[64], first = r.b.g->n, id;
    set_cur(&r, nd);
    if (nd->kind != IR_OP) { id = copy_node(&r, nd); if (id < 0) r.b.rc = id; r.map[i] = id; continue; }
    for (k = 0; k < nd->nin; k++) in[k] = nd->in[k] < 0 ? -1 : r.map[nd->in[k]];
    switch (nd->op) {
    case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_LAYER_NORM: case OP_RMS_NORM:
      id = dec_composite(&r, nd, in);
      break;
    case OP_GELU: case OP_GELU_TANH: id = dec_gelu(&r, nd, in[0]); break;
    case OP_SILU: id = emit2(&r, OP_MUL, in[0], emit1(&r, OP_SIGMOID, in[0])); break;
    case OP_LINEAR: id = dec_linear(&r, nd, in); break;
    case OP_BATCH_NORM: id = dec_batch_norm(&r, nd, in); break;
    default: id = copy_node(&r, nd); r.map[i] = id; continue;
    }
    if (r.b.rc) break;
    r.map[i] = id;
    strbuf_printf(&r.log, "%%%d %s ->", i, op_name(nd->op));
    for (k = first; k < r.b.g->n; k++)
      if (r.b.g->nodes[k].kind == IR_OP)
        strbuf_printf(&r.log, " %s", op_name(r.b.g->nodes[k].op));
    strbuf_printf(&r.log, "  (%%%d..%%%d)\n", first, r.b.g->n - 1);
  }
  if (!r.b.rc) finish_outputs(&r);
  return rw_end(&r, log);
}

/* ---- optimize -------------------------------------------------------- */

/* Value of a node when it is a one-element constant, else NAN. */
static double const_scalar(const ir_graph *g, int id) {
  const ir_node *nd = &g->nodes[id];
  if (nd->kind != IR_CONST || meta_numel(&nd->meta) != 1) return NAN;
  return ten_get(&nd->value, 0);
}

static int same_type(const ir_graph *g, int a, const fl_meta *m) {
  const fl_meta *x = &g->nodes[a].meta;
  return x->dtype == m->dtype && meta_same_shape(x, m);
}

/* Algebraic identities on the new graph.  Returns the id that replaces
** the node about to be emitted, or -1 for none.  An identity applies only
** when the surviving operand already has the result's dtype and shape:
** `x * 1` with x [3] and 1 [2,3] broadcasts, so it is not x. */
static int simplify(rw *r, const ir_node *nd, const int *in, const fl_meta *out,
                    const char **why) {
  const ir_graph *g = r->b.g;
  double c0, c1;
  switch (nd->op) {
  case OP_MUL: case OP_ADD: case OP_SUB: case OP_DIV:
    c0 = const_scalar(g, in[0]);
    c1 = const_scalar(g, in[1]);
    if ((nd->op == OP_MUL || nd->op == OP_DIV) && c1 == 1.0 && same_type(g, in[0], out)) { *why = nd->op == OP_MUL ? "x * 1 = x" : "x / 1 = x"; return in[0]; }
    if (nd->op == OP_MUL && c0 == 1.0 && same_type(g, in[1], out)) { *why = "1 * x = x"; return in[1]; }
    if ((nd->op == OP_ADD || nd->op == OP_SUB) && c1 == 0.0 && same_type(g, in[0], out)) { *why = nd->op == OP_ADD ? "x + 0 = x" : "x - 0 = x"; return in[0]; }
    if (nd->op == OP_ADD && c0 == 0.0 && same_type(g, in[1], out)) { *why = "0 + x = x"; return in[1]; }
    break;
  case OP_NEG: {
    const ir_node *p = &g->nodes[in[0]];
    if (p->kind == IR_OP && p->op == OP_NEG) { *why = "neg(neg(x)) = x"; return p->in[0]; }
    break;
  }
  case OP_TRANSPOSE: {
    const ir_node *p = &g->nodes[in[0]];
    if (p->kind == IR_OP && p->op == OP_TRANSPOSE &&
        ((p->attrs.i[0] == nd->attrs.i[0] && p->attrs.i[1] == nd->attrs.i[1]) ||
         (p->attrs.i[0] == nd->attrs.i[1] && p->attrs.i[1] == nd->attrs.i[0]))) {
      *why = "transpose(transpose(x)) = x";
      return p->in[0];
    }
    break;
  }
  case OP_PERMUTE: {
    const ir_node *p = &g->nodes[in[0]];
    int d, ident = 1;
    if (p->kind == IR_OP && p->op == OP_PERMUTE && p->attrs.ndims == nd->attrs.ndims) {
      for (d = 0; d < nd->attrs.ndims; d++)
        if (p->attrs.dims[nd->attrs.dims[d]] != d) ident = 0;
      if (ident) { *why = "permute(permute(x)) = x"; return p->in[0]; }
    }
    break;
  }
  case OP_CONTIGUOUS: case OP_RESHAPE: case OP_VIEW:
    if (same_type(g, in[0], out) && nd->op == OP_CONTIGUOUS) { *why = "contiguous is a no-op on values"; return in[0]; }
    /* the same shape for every size the graph serves: a symbolic dim
    ** reshaped to a concrete one is not an identity at other sizes */
    if (nd->op != OP_CONTIGUOUS && same_type(g, in[0], out) &&
        memcmp(g->nodes[in[0]].sym, nd->sym, sizeof nd->sym) == 0) {
      *why = "reshape to the same shape";
      return in[0];
    }
    break;
  default:
    break;
  }
  return -1;
}

/* CSE: an earlier op node of the new graph with the same op, attributes
** and inputs.  A linear scan over a hash bucket chain. */
typedef struct cse_tab { int *head, *next; size_t nb, ncap; } cse_tab;

static uint64_t node_hash(fl_op op, const op_attrs *a, int nin, const int *in) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t)op;
  const unsigned char *p = (const unsigned char *)a;
  size_t k;
  for (k = 0; k < sizeof *a; k++) h = (h ^ p[k]) * 1099511628211ull;
  for (k = 0; k < (size_t)nin; k++) h = (h ^ (uint64_t)(in[k] + 7)) * 1099511628211ull;
  return h;
}

static int cse_find(const cse_tab *t, const ir_graph *g, fl_op op, const op_attrs *a,
                    int nin, const int *in) {
  int id = t->head[node_hash(op, a, nin, in) % t->nb];
  for (; id >= 0; id = t->next[id]) {
    const ir_node *c = &g->nodes[id];
    if (c->op == op && c->nin == nin && memcmp(&c->attrs, a, sizeof *a) == 0 &&
        memcmp(c->in, in, (size_t)nin * sizeof(int)) == 0)
      return id;
  }
  return -1;
}

/* Remembers op node id; 0, or -1 when out of memory.  next[] grows with
** the new graph (a fold emits several nodes for one). */
static int cse_add(cse_tab *t, const ir_graph *g, int id) {
  const ir_node *c = &g->nodes[id];
  size_t b = node_hash(c->op, &c->attrs, c->nin, c->in) % t->nb;
  if ((size_t)id >= t->ncap) {
    size_t cap = (size_t)id * 2 + 64;
    int *nx = realloc(t->next, cap * sizeof(int));
    if (!nx) return -1;
    t->next = nx;
    t->ncap = cap;
  }
  t->next[id] = t->head[b];
  t->head[b] = id;
  return 0;
}

/* ---- folding per-channel affine ops into a convolution ------------------
**
** conv2d(x, w, b) * s + t, with s and t one value per output channel (or
** one value) computed from weights only, is conv2d(x, w * s, b * s + t):
** the activation-sized ops disappear.  The new weights are emitted as ops
** over the old ones, not computed here, because params are bound by
** reference: a weight or batch-norm statistic changed in place after
** compilation must still be seen, so w * s is recomputed on each run (a
** weight-sized kernel).  Over constants only, these ops fold right away.
** A batch_norm after a conv is the same rule with s = gamma / sqrt(var +
** eps) and t = beta - mean * s, so folding works before decompose (the
** batch_norm node) and after it (its sub, mul, add). */

/* Emit op, or when every input is a constant evaluate it now (constant
** folding, as optimize_forward does for the user's ops). */
static int emit_fold(rw *r, fl_op op, const op_attrs *a, int nin, const int *in) {
  const fl_tensor *args[8];
  fl_tensor v = {0};
  int k, id, allwrapped = 1;
  if (r->b.rc) return -1;
  for (k = 0; k < nin; k++) {
    if (in[k] < 0 || r->b.g->nodes[in[k]].kind != IR_CONST) return emit(r, op, a, nin, in);
    args[k] = &r->b.g->nodes[in[k]].value;
    allwrapped &= r->b.g->nodes[in[k]].meta.wrapped;
  }
  if ((r->b.rc = ref_apply(op, args, nin, a, &v, r->b.e))) return -1;
  v.m.wrapped = allwrapped;
  id = ir_add_const(r->b.g, &v, r->b.e);
  ten_release(&v);
  if (id < 0) { r->b.rc = id; return -1; }
  return id;
}

static int emit_fold2(rw *r, fl_op op, int x, int y) {
  op_attrs a;
  int in[2] = {x, y};
  op_attrs_init(op, &a);
  return emit_fold(r, op, &a, 2, in);
}

/* x reshaped to [n, 1, ..., 1] (ndim dims); x itself when it has that
** shape already. */
static int chan_shape(rw *r, int x, int64_t n, int ndim) {
  const fl_meta *m = &r->b.g->nodes[x].meta;
  op_attrs a;
  int d, same = m->ndim == ndim;
  op_attrs_init(OP_RESHAPE, &a);
  a.ndims = ndim;
  for (d = 0; d < ndim; d++) {
    a.dims[d] = d == 0 ? n : 1;
    if (same && m->shape[d] != a.dims[d]) same = 0;
  }
  return same ? x : emit_fold(r, OP_RESHAPE, &a, 1, &x);
}

/* Depends on params and constants only (no graph input)?  Memoized over
** the new graph's ids, which only grow. */
static int weights_only(rw *r, int id) {
  const ir_node *nd;
  int k, yes = 1;
  if (id >= r->wcap) {
    int cap = r->b.g->cap > id ? r->b.g->cap : id + 1, j;
    signed char *w = realloc(r->wmemo, (size_t)cap);
    if (!w) return 0;                        /* not folding is always right */
    for (j = r->wcap; j < cap; j++) w[j] = -1;
    r->wmemo = w;
    r->wcap = cap;
  }
  if (r->wmemo[id] >= 0) return r->wmemo[id];
  nd = &r->b.g->nodes[id];
  if (nd->kind == IR_INPUT) yes = 0;
  else if (nd->kind == IR_OP)
    for (k = 0; k < nd->nin && yes; k++)
      if (nd->in[k] >= 0) yes = weights_only(r, nd->in[k]);
  r->wmemo[id] = (signed char)yes;
  return yes;
}

/* Number of values of v when it holds one per output channel of conv
** output out [N,C,H,W] (C) or a single one (1), as a broadcast operand;
** 0 otherwise. */
static int64_t chan_count(const fl_meta *v, const fl_meta *out, fl_dtype dt) {
  int64_t n = 1;
  int d;
  if (v->ndim > out->ndim || (v->dtype != dt && !v->wrapped)) return 0;
  for (d = 0; d < v->ndim; d++) {
    int od = out->ndim - v->ndim + d;
    int64_t s = v->shape[d];
    if (s == 1) continue;
    if (od != 1 || s != out->shape[1]) return 0;
    n = s;
  }
  return n;
}

static int emit_fold1(rw *r, fl_op op, int x);

/* s * conv + t over conv's channels (s, t weights only, [C, 1, 1] or one
** value; -1 when absent): a conv whose result is scaled and shifted, not
** its weights (conv_affine). */
static int out_affine(rw *r, int conv, int s, int t) {
  int id = conv;
  if (s >= 0) id = emit_fold2(r, OP_MUL, id, s);
  if (t >= 0) id = emit_fold2(r, OP_ADD, id, t);
  return id;
}

/* Did old node `old`, read only by the op being rewritten, become
** out_affine(conv, s, t) with s or t?  Fills them. */
static int out_affine_of(rw *r, int old, const int *olduses, int *conv, int *s, int *t) {
  int id = old >= 0 ? r->map[old] : -1, k;
  const ir_node *n;
  if (old < 0 || olduses[old] != 1 || !r->own[old] || id < 0) return 0;
  *s = *t = -1;
  for (k = 0; k < 2; k++) {
    fl_op op = k == 0 ? OP_ADD : OP_MUL;
    int *v = k == 0 ? t : s;
    n = &r->b.g->nodes[id];
    if (n->kind == IR_OP && n->op == op && n->nin == 2 && n->in[1] >= 0 && weights_only(r, n->in[1]) &&
        r->b.g->nodes[n->in[1]].meta.ndim == 3 && r->b.g->nodes[n->in[0]].meta.ndim == 4) {
      *v = n->in[1];
      id = n->in[0];
    }
  }
  n = &r->b.g->nodes[id];
  if ((*s < 0 && *t < 0) || n->kind != IR_OP || n->op != OP_CONV2D) return 0;
  *conv = id;
  return 1;
}

/* op v (v: n values per channel, weights only) after out_affine(conv, s,
** t), as one out_affine again. */
static int fold_out_affine(rw *r, int conv, int s, int t, fl_op op, int v, int64_t n,
                           const fl_meta *out) {
  int vv = chan_shape(r, v, n, 3), id;
  if (op == OP_MUL || op == OP_DIV) {
    int f = op == OP_MUL ? vv : emit_fold2(r, OP_DIV, konst(r, 1.0), vv);
    s = s >= 0 ? emit_fold2(r, OP_MUL, s, f) : f;
    if (t >= 0) t = emit_fold2(r, op, t, vv);
  } else {
    int a = op == OP_ADD ? vv : emit_fold1(r, OP_NEG, vv);
    t = t >= 0 ? emit_fold2(r, OP_ADD, t, a) : a;
  }
  id = out_affine(r, conv, s, t);
  return r->b.rc || id < 0 || !same_type(r->b.g, id, out) ? -1 : id;
}

/* A new conv2d: conv (a conv2d node of the new graph) followed by
** `mop m` (OP_MUL/OP_DIV, m = -1 for none) then `aop t` (OP_ADD/OP_SUB,
** t = -1 for none); m and t hold nm and nt values (1 or the channels).
** Returns the new id, or -1 (then nothing needed is emitted: what was
** emitted is dead, and dce removes it). */
static int conv_affine(rw *r, int conv, fl_op mop, int m, int64_t nm,
                       fl_op aop, int t, int64_t nt) {
  const ir_node *c = &r->b.g->nodes[conv];
  int x = c->in[0], w = c->in[1], b = c->nin > 2 ? c->in[2] : -1, in[3], id;
  op_attrs ca = c->attrs;
  int64_t co = r->b.g->nodes[w].meta.shape[0];
  fl_meta cm = c->meta;
  /* Weights bound by reference are scaled again on every run, and scaled
  ** weights are kept between calls only while they fit the plan's peak
  ** memory (fuse/plan.c, plan_keep_budget); where the conv's result has
  ** fewer elements than its weights (late layers at small batch:
  ** ResNet-50's [1, 2048, 7, 7] from 1M weights), scaling the result is
  ** the smaller pass.  It is written s * conv + t (out_affine), which
  ** later ops fold into and the CPU runs inside the conv's call (a
  ** per-channel post-op, cpu/backend.c). */
  if (m >= 0 && r->b.g->nodes[w].kind != IR_CONST && meta_numel(&cm) < meta_numel(&r->b.g->nodes[w].meta)) {
    int s = chan_shape(r, m, nm, 3), tt = t >= 0 ? chan_shape(r, t, nt, 3) : -1;
    if (mop == OP_DIV) s = emit_fold2(r, OP_DIV, konst(r, 1.0), s);
    if (tt >= 0 && aop == OP_SUB) tt = emit_fold1(r, OP_NEG, tt);
    id = out_affine(r, conv, s, tt);
    return r->b.rc || id < 0 || !same_type(r->b.g, id, &cm) ? -1 : id;
  }
  if (m >= 0) {
    w = emit_fold2(r, mop, w, chan_shape(r, m, nm, 4));
    if (b >= 0) b = emit_fold2(r, mop, b, chan_shape(r, m, nm, 1));
  }
  if (t >= 0) {
    int tv = chan_shape(r, t, nt, 1);
    if (b < 0 && nt == co && aop == OP_ADD) {
      b = tv;
    } else {
      if (b < 0) {                             /* no bias: start from zeros */
        fl_tensor z = {0};
        fl_meta bm = r->b.g->nodes[w].meta;
        if (r->b.rc) return -1;
        bm.ndim = 1;
        bm.shape[0] = co;
        bm.wrapped = 0;
        if ((r->b.rc = ten_empty(&z, &bm, r->b.e))) return -1;
        b = ir_add_const(r->b.g, &z, r->b.e);
        ten_release(&z);
        if (b < 0) { r->b.rc = b; return -1; }
      }
      b = emit_fold2(r, aop, b, tv);
    }
  }
  if (r->b.rc) return -1;
  in[0] = x;
  in[1] = w;
  in[2] = b;
  id = emit(r, OP_CONV2D, &ca, b >= 0 ? 3 : 2, in);
  if (id < 0) return -1;
  /* the rewrite must not change the result's type (a float16 conv with
  ** float32 statistics would) */
  return same_type(r->b.g, id, &cm) ? id : -1;
}

/* The new-graph conv2d that old node `old` (an input of the op being
** rewritten) became, when its result feeds only that op; else -1. */
static int sole_conv(rw *r, int old, const int *olduses) {
  int id = r->map[old];
  const ir_node *c;
  if (old < 0 || olduses[old] != 1 || !r->own[old] || id < 0) return -1;
  c = &r->b.g->nodes[id];
  if (c->kind != IR_OP || c->op != OP_CONV2D || !weights_only(r, c->in[1])) return -1;
  if (c->nin > 2 && c->in[2] >= 0 && !weights_only(r, c->in[2])) return -1;
  return id;
}

/* conv2d op v, v per channel and weights only: add/sub/mul/div. */
static int fold_conv_elemwise(rw *r, const ir_node *nd, const int *in, const fl_meta *out,
                              const int *olduses) {
  int side, conv, v;
  int64_t n;
  if (nd->nin != 2 || in[0] < 0 || in[1] < 0) return -1;
  if (nd->op != OP_ADD && nd->op != OP_SUB && nd->op != OP_MUL && nd->op != OP_DIV) return -1;
  for (side = 0; side < 2; side++) {
    int os, ot;
    if (side == 1 && (nd->op == OP_SUB || nd->op == OP_DIV)) break;
    conv = sole_conv(r, nd->in[side], olduses);
    if (conv < 0 && out_affine_of(r, nd->in[side], olduses, &conv, &os, &ot)) {
      v = in[1 - side];
      if (!weights_only(r, v)) continue;
      n = chan_count(&r->b.g->nodes[v].meta, out, out->dtype);
      if (n) return fold_out_affine(r, conv, os, ot, nd->op, v, n, out);
      continue;
    }
    if (conv < 0) continue;
    v = in[1 - side];
    if (!weights_only(r, v) || !same_type(r->b.g, conv, out)) continue;
    n = chan_count(&r->b.g->nodes[v].meta, out, out->dtype);
    if (!n) continue;
    if (nd->op == OP_MUL || nd->op == OP_DIV)
      return conv_affine(r, conv, nd->op, v, n, OP_ADD, -1, 0);
    return conv_affine(r, conv, OP_MUL, -1, 0, nd->op, v, n);
  }
  return -1;
}

/* matmul(x, transpose(w)) + b -> linear(x, w, b): decompose's linear put
** back together, as one extern call that adds the bias while it writes;
** the matmul and the add would move the product through memory twice. */
static int fold_linear(rw *r, const ir_node *nd, const int *in, const fl_meta *out,
                       const int *olduses) {
  int side;
  if (nd->op != OP_ADD || nd->nin != 2 || in[0] < 0 || in[1] < 0) return -1;
  for (side = 0; side < 2; side++) {
    int old = nd->in[side], b = in[1 - side], w, id, lin[3];
    const ir_node *m = &r->b.g->nodes[in[side]], *t;
    const fl_meta *bm = &r->b.g->nodes[b].meta;
    op_attrs a;
    if (olduses[old] != 1 || !r->own[old] || m->kind != IR_OP || m->op != OP_MATMUL) continue;
    t = &r->b.g->nodes[m->in[1]];
    if (t->kind != IR_OP || t->op != OP_TRANSPOSE) continue;
    w = t->in[0];
    if (r->b.g->nodes[w].meta.ndim != 2 || r->b.g->nodes[m->in[0]].meta.ndim < 2 ||
        (t->attrs.i[0] + 2) % 2 == (t->attrs.i[1] + 2) % 2)
      continue;
    if (bm->ndim != 1 || bm->wrapped || bm->dtype != out->dtype ||
        bm->shape[0] != r->b.g->nodes[w].meta.shape[0] || !same_type(r->b.g, in[side], out))
      continue;
    lin[0] = m->in[0];
    lin[1] = w;
    lin[2] = b;
    op_attrs_init(OP_LINEAR, &a);
    id = emit(r, OP_LINEAR, &a, 3, lin);
    if (id >= 0 && same_type(r->b.g, id, out)) return id;
    return -1;
  }
  return -1;
}

static int emit_fold1(rw *r, fl_op op, int x) {
  op_attrs a;
  op_attrs_init(op, &a);
  return emit_fold(r, op, &a, 1, &x);
}

/* conv2d + batch_norm: s = rsqrt(var + eps) * gamma, t = beta - mean * s;
** the statistics are [C] vectors of the conv's dtype. */
static int fold_conv_bn(rw *r, const ir_node *bn, const int *in, const fl_meta *out,
                        const int *olduses) {
  int conv = sole_conv(r, bn->in[0], olduses), k, s, t;
  int64_t co;
  if (conv < 0 || in[1] < 0 || in[2] < 0 || !same_type(r->b.g, conv, out)) return -1;
  co = out->shape[1];
  for (k = 1; k < bn->nin; k++) {
    const fl_meta *m;
    if (in[k] < 0) continue;
    m = &r->b.g->nodes[in[k]].meta;
    if (!weights_only(r, in[k]) || m->ndim != 1 || m->shape[0] != co || m->dtype != out->dtype)
      return -1;
  }
  s = emit_fold1(r, OP_RSQRT, emit_fold2(r, OP_ADD, in[2], konst(r, bn->attrs.f[0])));
  if (bn->nin > 3 && in[3] >= 0) s = emit_fold2(r, OP_MUL, s, in[3]);
  t = emit_fold2(r, OP_MUL, in[1], s);
  t = bn->nin > 4 && in[4] >= 0 ? emit_fold2(r, OP_SUB, in[4], t) : emit_fold1(r, OP_NEG, t);
  if (r->b.rc) return -1;
  return conv_affine(r, conv, OP_MUL, s, co, OP_ADD, t, co);
}

/* what conv_affine scaled, for the log */
static const char *fold_target(rw *r, int id) {
  return r->b.g->nodes[id].op == OP_CONV2D ? "weights"
                                         : "result (per channel: smaller than its weights)";
}

/* Pass 1 of optimize: rewrite forward.  Pass 2 (dce) drops what became
** unreachable. */
static int optimize_forward(rw *r) {
  const ir_graph *old = r->old;
  int *olduses = malloc((size_t)(old->n ? old->n : 1) * sizeof(int));
  cse_tab t = {0};
  int i, k;
  t.nb = (size_t)old->n * 2 + 17;
  t.head = malloc(t.nb * sizeof(int));
  t.ncap = (size_t)old->n * 4 + 64;
  t.next = malloc(t.ncap * sizeof(int));
  r->own = calloc((size_t)(old->n ? old->n : 1), 1);
  if (!olduses || !t.head || !t.next || !r->own) {
    free(olduses); free(t.head); free(t.next); free(r->own);
    r->own = NULL;
    return r->b.rc = err_set(r->b.e, FL_ENOMEM, "optimize: out of memory");
  }
  for (k = 0; k < (int)t.nb; k++) t.head[k] = -1;
  ir_count_uses(old, olduses);
  for (i = 0; i < old->n && !r->b.rc; i++) {
    const ir_node *nd = &old->nodes[i];
    int in[64], allconst = 1, allwrapped = 1, id;
    const char *why = NULL;
    fl_meta out;
    const fl_meta *ms[64];
    set_cur(r, nd);
    if (nd->kind != IR_OP) {
      id = copy_node(r, nd);
      if (id < 0) r->b.rc = id;
      r->map[i] = id;
      continue;
    }
    for (k = 0; k < nd->nin; k++) {
      in[k] = nd->in[k] < 0 ? -1 : r->map[nd->in[k]];
      ms[k] = in[k] < 0 ? NULL : &r->b.g->nodes[in[k]].meta;
      if (in[k] >= 0 && r->b.g->nodes[in[k]].kind != IR_CONST) allconst = 0;
      if (in[k] >= 0 && !r->b.g->nodes[in[k]].meta.wrapped) allwrapped = 0;
    }
    if ((r->b.rc = op_infer(nd->op, ms, nd->nin, &nd->attrs, &out, r->b.e))) break;
    /* conv + batch_norm */
    if (RULE(r, PASS_FOLD_BN) && nd->op == OP_BATCH_NORM && (id = fold_conv_bn(r, nd, in, &out, olduses)) >= 0) {
      r->map[i] = id;
      r->own[i] = 1;
      strbuf_printf(&r->log, "%%%d batch_norm folded into conv2d %%%d's %s -> %%%d\n",
                    i, nd->in[0], fold_target(r, id), id);
      continue;
    }
    if (r->b.rc) break;
    if (RULE(r, PASS_SIMPLIFY) && (id = simplify(r, nd, in, &out, &why)) >= 0) {
      r->map[i] = id;
      strbuf_printf(&r->log, "%%%d %s: %s\n", i, op_name(nd->op), why);
      continue;
    }
    if (RULE(r, PASS_FOLD_LINEAR) && (id = fold_linear(r, nd, in, &out, olduses)) >= 0) {
      r->map[i] = id;
      r->own[i] = 1;
      strbuf_printf(&r->log, "%%%d add: matmul(x, transpose(w)) + b = linear(x, w, b)\n", i);
      continue;
    }
    if (r->b.rc) break;
    /* conv + a per-channel scale or shift (a decomposed batch_norm) */
    if (RULE(r, PASS_FOLD_SCALE) && (id = fold_conv_elemwise(r, nd, in, &out, olduses)) >= 0) {
      r->map[i] = id;
      r->own[i] = 1;
      strbuf_printf(&r->log, "%%%d %s folded into conv2d's %s -> %%%d\n",
                    i, op_name(nd->op), fold_target(r, id), id);
      continue;
    }
    if (r->b.rc) break;
    /* constant folding: evaluate with the reference interpreter now (not
    ** a random op: it draws anew at every run) */
    /* ... but not over an iota: gt(arange(T)[:, None], arange(T)) costs
    ** nothing as loop indices and a T x T table of loads folded */
    for (k = 0; k < nd->nin && allconst; k++)
      if (in[k] >= 0 && ir_is_iota(&r->b.g->nodes[in[k]])) allconst = 0;
    if (RULE(r, PASS_CONST_FOLD) && allconst && nd->nin > 0 && meta_numel(&out) <= (1 << 16) && !sym_attrs(nd) &&
        !(op_info_of(nd->op)->flags & OPF_RANDOM)) {
      const fl_tensor *args[64];
      fl_tensor v = {0};
      for (k = 0; k < nd->nin; k++) args[k] = in[k] < 0 ? NULL : &r->b.g->nodes[in[k]].value;
      if ((r->b.rc = ref_apply(nd->op, args, nd->nin, &nd->attrs, &v, r->b.e))) break;
      v.m.wrapped = allwrapped;  /* 2 * 0.5 stays a weak scalar */
      id = ir_add_const(r->b.g, &v, r->b.e);
      ten_release(&v);
      if (id < 0) { r->b.rc = id; break; }
      r->map[i] = id;
      strbuf_printf(&r->log, "%%%d %s of constants folded\n", i, op_name(nd->op));
      continue;
    }
    /* two rand(4) are two draws, never one */
    if (RULE(r, PASS_CSE) && !sym_attrs(nd) && !(op_info_of(nd->op)->flags & OPF_RANDOM) &&
        (id = cse_find(&t, r->b.g, nd->op, &nd->attrs, nd->nin, in)) >= 0) {
      r->map[i] = id;
      strbuf_printf(&r->log, "%%%d %s: same as an earlier %s (cse)\n", i,
                    op_name(nd->op), op_name(nd->op));
      continue;
    }
    id = emit_sym(r, nd->op, &nd->attrs, nd->nin, in, nd->asym);
    if (id < 0) break;
    r->map[i] = id;
    r->own[i] = 1;
    if (!sym_attrs(nd) && cse_add(&t, r->b.g, id)) {
      r->b.rc = err_set(r->b.e, FL_ENOMEM, "optimize: out of memory");
      break;
    }
  }
  free(olduses);
  free(t.head);
  free(t.next);
  free(r->own);
  r->own = NULL;
  return r->b.rc;
}

/* Dead-code elimination: keep inputs (the call signature) and whatever
** the outputs reach. */
static ir_graph *dce(const ir_graph *g, strbuf *log, fl_err *e) {
  char *live = calloc((size_t)(g->n ? g->n : 1), 1);
  rw r;
  int i, k, removed = 0;
  if (!live) { err_set(e, FL_ENOMEM, "optimize: out of memory"); return NULL; }
  for (i = 0; i < g->nout; i++) live[g->outputs[i]] = 1;
  for (i = 0; i < g->nwb; i++) live[g->wb[i]] = 1;
  for (i = g->n - 1; i >= 0; i--) {
    const ir_node *nd = &g->nodes[i];
    /* a random op unused still advances the stream, as in eager code, so
    ** the draws after it stay the same numbers */
    if (nd->kind == IR_INPUT || (nd->kind == IR_OP && (op_info_of(nd->op)->flags & OPF_RANDOM)))
      live[i] = 1;
    if (!live[i] || nd->kind != IR_OP) continue;
    for (k = 0; k < nd->nin; k++)
      if (nd->in[k] >= 0) live[nd->in[k]] = 1;
  }
  if (rw_begin(&r, g, e)) { free(live); return NULL; }
  for (i = 0; i < g->n && !r.b.rc; i++) {
    if (!live[i]) { r.map[i] = -1; removed += g->nodes[i].kind == IR_OP; continue; }
    set_cur(&r, &g->nodes[i]);
    r.map[i] = copy_node(&r, &g->nodes[i]);
    if (r.map[i] < 0) r.b.rc = r.map[i];
  }
  if (!r.b.rc) finish_outputs(&r);
  if (removed && !r.b.rc) strbuf_printf(log, "removed %d unused node(s) (dce)\n", removed);
  free(live);
  free(r.map);
  strbuf_free(&r.log);
  if (r.b.rc) { ir_free(r.b.g); return NULL; }
  return r.b.g;
}

ir_graph *pass_optimize(const ir_graph *old, char **log, fl_err *e) {
  return pass_optimize_rules(old, PASS_ALL_RULES, log, e);
}

ir_graph *pass_optimize_rules(const ir_graph *old, unsigned rules, char **log, fl_err *e) {
  rw r;
  ir_graph *mid, *out;
  char *l;
  if (rw_begin(&r, old, e)) return NULL;
  r.rules = rules;
  if (!optimize_forward(&r)) finish_outputs(&r);
  mid = rw_end(&r, &l);
  if (!mid) return NULL;
  {
    strbuf sb = {0};
    if (strcmp(l, "(nothing changed)\n") != 0) strbuf_printf(&sb, "%s", l);
    free(l);
    /* without dce the dead nodes stay, as the walk left them */
    if (RULE(&r, PASS_DCE)) {
      out = dce(mid, &sb, e);
      ir_free(mid);
    } else {
      out = mid;
    }
    if (!out) { strbuf_free(&sb); return NULL; }
    if (sb.n == 0) strbuf_printf(&sb, "(nothing changed)\n");
    *log = strbuf_take(&sb);
  }
  return out;
}
