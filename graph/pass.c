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

#include "pass.h"
#include "ref.h"
#include "strbuf.h"

/* Rewriting state shared by both passes. */
typedef struct rw {
  const ir_graph *old;
  ir_graph *g;          /* the graph being built */
  int *map;             /* old id -> new id */
  strbuf log;
  fl_err *e;
  int rc;               /* first failure; emitters do nothing after it */
  const ir_node *cur;   /* old node being rewritten: where/scope source */
} rw;

/* Emit op over new-graph ids (-1 = absent), copying the current node's
** source position and module scope.  Returns the new id or -1. */
static int emit(rw *r, fl_op op, const op_attrs *a, int nin, const int *in) {
  int id;
  if (r->rc) return -1;
  id = ir_add_op(r->g, op, in, nin, a, r->cur ? r->cur->where : NULL,
                 r->cur ? r->cur->scope : NULL, r->e);
  if (id < 0) { r->rc = id; return -1; }
  return id;
}

static int emit1(rw *r, fl_op op, int x) {
  op_attrs a;
  op_attrs_init(op, &a);
  return emit(r, op, &a, 1, &x);
}

static int emit2(rw *r, fl_op op, int x, int y) {
  op_attrs a;
  int in[2] = {x, y};
  op_attrs_init(op, &a);
  return emit(r, op, &a, 2, in);
}

/* A wrapped 0-dim float32 constant: the weakest operand in type
** promotion, so `x * 0.5` keeps x's dtype (float16 stays float16). */
static int konst(rw *r, double v) {
  fl_tensor t = {0};
  fl_meta m;
  int id, rc;
  if (r->rc) return -1;
  memset(&m, 0, sizeof m);
  m.dtype = FL_F32;
  m.wrapped = 1;
  rc = ten_empty(&t, &m, r->e);
  if (rc) { r->rc = rc; return -1; }
  ten_set(&t, 0, v);
  id = ir_add_const(r->g, &t, r->e);
  ten_release(&t);
  if (id < 0) { r->rc = id; return -1; }
  return id;
}

/* Reduction over dims [from, ndim) keeping them, as norms need. */
static int reduce_tail(rw *r, fl_op op, int x, int from) {
  op_attrs a;
  int d, nd = r->g->nodes[x].meta.ndim;
  op_attrs_init(op, &a);
  for (d = from; d < nd; d++) a.dims[a.ndims++] = d;
  a.keepdim = 1;
  if (op == OP_VAR) a.f[0] = 0;
  return emit(r, op, &a, 1, &x);
}

static int reduce_dim(rw *r, fl_op op, int x, int dim) {
  op_attrs a;
  op_attrs_init(op, &a);
  a.ndims = 1;
  a.dims[0] = dim;
  a.keepdim = 1;
  return emit(r, op, &a, 1, &x);
}

/* Copies one old node into the new graph unchanged (inputs remapped). */
static int copy_node(rw *r, const ir_node *nd) {
  int in[64], k;
  switch (nd->kind) {
  case IR_INPUT: {
    int id = ir_add_input(r->g, &nd->meta, nd->name, r->e);
    if (id >= 0) memcpy(r->g->nodes[id].sym, nd->sym, sizeof nd->sym);
    return id;
  }
  case IR_PARAM: return ir_add_param(r->g, &nd->value, nd->name, r->e);
  case IR_CONST: return ir_add_const(r->g, &nd->value, r->e);
  case IR_OP:
    for (k = 0; k < nd->nin; k++) in[k] = nd->in[k] < 0 ? -1 : r->map[nd->in[k]];
    return emit(r, nd->op, &nd->attrs, nd->nin, in);
  }
  return -1;
}

static int finish_outputs(rw *r) {
  int i;
  for (i = 0; i < r->old->nout && !r->rc; i++) {
    int rc = ir_add_output(r->g, r->map[r->old->outputs[i]], r->e);
    if (rc) r->rc = rc;
  }
  r->g->nsyms = r->old->nsyms;
  return r->rc;
}

static int rw_begin(rw *r, const ir_graph *old, fl_err *e) {
  memset(r, 0, sizeof *r);
  r->old = old;
  r->e = e;
  r->g = ir_new();
  r->map = malloc((size_t)(old->n ? old->n : 1) * sizeof(int));
  if (!r->g || !r->map) {
    ir_free(r->g);
    free(r->map);
    return err_set(e, FL_ENOMEM, "pass: out of memory");
  }
  return FL_OK;
}

/* Ends a pass: on success hands over the graph and log, else frees all. */
static ir_graph *rw_end(rw *r, char **log) {
  ir_graph *g = r->g;
  free(r->map);
  if (r->rc) {
    strbuf_free(&r->log);
    ir_free(g);
    return NULL;
  }
  if (r->log.n == 0) strbuf_printf(&r->log, "(nothing changed)\n");
  *log = strbuf_take(&r->log);
  return g;
}

/* ---- decompose ------------------------------------------------------- */

/* softmax(x, d)     = e / sum(e, d)          with e = exp(x - amax(x, d))
** log_softmax(x, d) = (x - m) - log(sum(exp(x - m), d))
** Subtracting the row max keeps exp from overflowing, as every real
** implementation does. */
static int dec_softmax(rw *r, const ir_node *nd, int x) {
  int d = (int)nd->attrs.i[0];
  int m = reduce_dim(r, OP_AMAX, x, d);
  int z = emit2(r, OP_SUB, x, m);
  int ez = emit1(r, OP_EXP, z);
  int s = reduce_dim(r, OP_SUM, ez, d);
  if (nd->op == OP_SOFTMAX) return emit2(r, OP_DIV, ez, s);
  return emit2(r, OP_SUB, z, emit1(r, OP_LOG, s));
}

/* layer_norm: (x - mean) * rsqrt(mean((x - mean)^2) + eps) * w + b over
** the last i0 dims (population variance, as PyTorch). */
static int dec_layer_norm(rw *r, const ir_node *nd, const int *in) {
  int from = r->g->nodes[in[0]].meta.ndim - (int)nd->attrs.i[0];
  int mu = reduce_tail(r, OP_MEAN, in[0], from);
  int xc = emit2(r, OP_SUB, in[0], mu);
  int v = reduce_tail(r, OP_MEAN, emit2(r, OP_MUL, xc, xc), from);
  int y = emit2(r, OP_MUL, xc, emit1(r, OP_RSQRT, emit2(r, OP_ADD, v, konst(r, nd->attrs.f[0]))));
  if (nd->nin > 1 && in[1] >= 0) y = emit2(r, OP_MUL, y, in[1]);
  if (nd->nin > 2 && in[2] >= 0) y = emit2(r, OP_ADD, y, in[2]);
  return y;
}

/* rms_norm: x * rsqrt(mean(x^2) + eps) * w */
static int dec_rms_norm(rw *r, const ir_node *nd, const int *in) {
  int from = r->g->nodes[in[0]].meta.ndim - (int)nd->attrs.i[0];
  int ms = reduce_tail(r, OP_MEAN, emit2(r, OP_MUL, in[0], in[0]), from);
  int y = emit2(r, OP_MUL, in[0], emit1(r, OP_RSQRT, emit2(r, OP_ADD, ms, konst(r, nd->attrs.f[0]))));
  if (nd->nin > 1 && in[1] >= 0) y = emit2(r, OP_MUL, y, in[1]);
  return y;
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

/* batch_norm (inference): per-channel vectors [C] are reshaped to
** [C,1,...,1] so they broadcast over dim 1 of x [N,C,...]. */
static int dec_batch_norm(rw *r, const ir_node *nd, const int *in) {
  int nd_x = r->g->nodes[in[0]].meta.ndim, k, ch[5];
  op_attrs a;
  op_attrs_init(OP_RESHAPE, &a);
  a.ndims = nd_x - 1;
  a.dims[0] = -1;
  for (k = 1; k < a.ndims; k++) a.dims[k] = 1;
  for (k = 1; k < 5; k++)
    ch[k] = (k < nd->nin && in[k] >= 0) ? emit(r, OP_RESHAPE, &a, 1, &in[k]) : -1;
  {
    int y = emit2(r, OP_SUB, in[0], ch[1]);
    y = emit2(r, OP_MUL, y, emit1(r, OP_RSQRT, emit2(r, OP_ADD, ch[2], konst(r, nd->attrs.f[0]))));
    if (ch[3] >= 0) y = emit2(r, OP_MUL, y, ch[3]);
    if (ch[4] >= 0) y = emit2(r, OP_ADD, y, ch[4]);
    return y;
  }
}

ir_graph *pass_decompose(const ir_graph *old, char **log, fl_err *e) {
  rw r;
  int i, k;
  if (rw_begin(&r, old, e)) return NULL;
  for (i = 0; i < old->n && !r.rc; i++) {
    const ir_node *nd = &old->nodes[i];
    int in[64], first = r.g->n, id;
    r.cur = nd;
    if (nd->kind != IR_OP) { id = copy_node(&r, nd); if (id < 0) r.rc = id; r.map[i] = id; continue; }
    for (k = 0; k < nd->nin; k++) in[k] = nd->in[k] < 0 ? -1 : r.map[nd->in[k]];
    switch (nd->op) {
    case OP_SOFTMAX: case OP_LOG_SOFTMAX: id = dec_softmax(&r, nd, in[0]); break;
    case OP_LAYER_NORM: id = dec_layer_norm(&r, nd, in); break;
    case OP_RMS_NORM: id = dec_rms_norm(&r, nd, in); break;
    case OP_GELU: case OP_GELU_TANH: id = dec_gelu(&r, nd, in[0]); break;
    case OP_SILU: id = emit2(&r, OP_MUL, in[0], emit1(&r, OP_SIGMOID, in[0])); break;
    case OP_LINEAR: id = dec_linear(&r, nd, in); break;
    case OP_BATCH_NORM: id = dec_batch_norm(&r, nd, in); break;
    default: id = copy_node(&r, nd); r.map[i] = id; continue;
    }
    if (r.rc) break;
    r.map[i] = id;
    strbuf_printf(&r.log, "%%%d %s ->", i, op_name(nd->op));
    for (k = first; k < r.g->n; k++)
      if (r.g->nodes[k].kind == IR_OP)
        strbuf_printf(&r.log, " %s", op_name(r.g->nodes[k].op));
    strbuf_printf(&r.log, "  (%%%d..%%%d)\n", first, r.g->n - 1);
  }
  if (!r.rc) finish_outputs(&r);
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
  const ir_graph *g = r->g;
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
    if (nd->op != OP_CONTIGUOUS && same_type(g, in[0], out)) { *why = "reshape to the same shape"; return in[0]; }
    break;
  default:
    break;
  }
  return -1;
}

/* CSE: an earlier op node of the new graph with the same op, attributes
** and inputs.  A linear scan over a hash bucket chain. */
typedef struct cse_tab { int *head, *next; size_t nb; } cse_tab;

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

static void cse_add(cse_tab *t, const ir_graph *g, int id) {
  const ir_node *c = &g->nodes[id];
  size_t b = node_hash(c->op, &c->attrs, c->nin, c->in) % t->nb;
  t->next[id] = t->head[b];
  t->head[b] = id;
}

static int is_value(const ir_graph *g, int id) {
  return id >= 0 && (g->nodes[id].kind == IR_PARAM || g->nodes[id].kind == IR_CONST);
}

/* conv2d + batch_norm -> conv2d with folded weights:
**   s = gamma / sqrt(var + eps);  w' = w * s[co];  b' = (b - mean) * s + beta
** Applies when the conv's output feeds only this batch_norm and every
** weight is a param or constant (read now, see pass.h). */
static int fold_conv_bn(rw *r, const ir_node *bn, const int *in, const int *olduses) {
  const ir_graph *g = r->g;
  const ir_node *bnin = &r->old->nodes[bn->in[0]];
  const ir_node *conv;
  fl_tensor w2 = {0}, b2 = {0};
  fl_meta bm;
  int64_t co, per, c, j;
  int k, ids[3], cin[3];
  if (bnin->kind != IR_OP || bnin->op != OP_CONV2D || olduses[bn->in[0]] != 1) return -1;
  conv = &g->nodes[in[0]];
  if (conv->kind != IR_OP || conv->op != OP_CONV2D) return -1;
  if (!is_value(g, conv->in[1]) || (conv->nin > 2 && conv->in[2] >= 0 && !is_value(g, conv->in[2])))
    return -1;
  for (k = 1; k < bn->nin; k++)
    if (in[k] >= 0 && !is_value(g, in[k])) return -1;
  if (in[1] < 0 || in[2] < 0) return -1;
  {
    const fl_tensor *w = &g->nodes[conv->in[1]].value;
    const fl_tensor *b = conv->nin > 2 && conv->in[2] >= 0 ? &g->nodes[conv->in[2]].value : NULL;
    const fl_tensor *mean = &g->nodes[in[1]].value, *var = &g->nodes[in[2]].value;
    const fl_tensor *gam = bn->nin > 3 && in[3] >= 0 ? &g->nodes[in[3]].value : NULL;
    const fl_tensor *bet = bn->nin > 4 && in[4] >= 0 ? &g->nodes[in[4]].value : NULL;
    co = w->m.shape[0];
    per = meta_numel(&w->m) / (co ? co : 1);
    bm = w->m;
    bm.ndim = 1;
    bm.shape[0] = co;
    if (ten_empty(&w2, &w->m, r->e) || ten_empty(&b2, &bm, r->e)) {
      ten_release(&w2);
      r->rc = r->e ? r->e->code : FL_ENOMEM;
      return -1;
    }
    for (c = 0; c < co; c++) {
      double s = (gam ? ten_get(gam, c) : 1.0) / sqrt(ten_get(var, c) + bn->attrs.f[0]);
      for (j = 0; j < per; j++) ten_set(&w2, c * per + j, ten_get(w, c * per + j) * s);
      ten_set(&b2, c, ((b ? ten_get(b, c) : 0.0) - ten_get(mean, c)) * s + (bet ? ten_get(bet, c) : 0.0));
    }
  }
  ids[0] = ir_add_const(r->g, &w2, r->e);
  ids[1] = ir_add_const(r->g, &b2, r->e);
  ten_release(&w2);
  ten_release(&b2);
  if (ids[0] < 0 || ids[1] < 0) { r->rc = FL_ENOMEM; return -1; }
  cin[0] = g->nodes[in[0]].in[0];
  cin[1] = ids[0];
  cin[2] = ids[1];
  ids[2] = emit(r, OP_CONV2D, &g->nodes[in[0]].attrs, 3, cin);
  return ids[2];
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
  t.next = malloc(((size_t)old->n * 4 + 64) * sizeof(int));
  if (!olduses || !t.head || !t.next) {
    free(olduses); free(t.head); free(t.next);
    return r->rc = err_set(r->e, FL_ENOMEM, "optimize: out of memory");
  }
  for (k = 0; k < (int)t.nb; k++) t.head[k] = -1;
  ir_count_uses(old, olduses);
  for (i = 0; i < old->n && !r->rc; i++) {
    const ir_node *nd = &old->nodes[i];
    int in[64], allconst = 1, allwrapped = 1, id;
    const char *why = NULL;
    fl_meta out;
    const fl_meta *ms[64];
    r->cur = nd;
    if (nd->kind != IR_OP) {
      id = copy_node(r, nd);
      if (id < 0) r->rc = id;
      r->map[i] = id;
      continue;
    }
    for (k = 0; k < nd->nin; k++) {
      in[k] = nd->in[k] < 0 ? -1 : r->map[nd->in[k]];
      ms[k] = in[k] < 0 ? NULL : &r->g->nodes[in[k]].meta;
      if (in[k] >= 0 && r->g->nodes[in[k]].kind != IR_CONST) allconst = 0;
      if (in[k] >= 0 && !r->g->nodes[in[k]].meta.wrapped) allwrapped = 0;
    }
    if ((r->rc = op_infer(nd->op, ms, nd->nin, &nd->attrs, &out, r->e))) break;
    /* conv + batch_norm */
    if (nd->op == OP_BATCH_NORM && (id = fold_conv_bn(r, nd, in, olduses)) >= 0) {
      r->map[i] = id;
      strbuf_printf(&r->log, "%%%d batch_norm folded into conv2d %%%d's weights -> %%%d\n",
                    i, nd->in[0], id);
      continue;
    }
    if ((id = simplify(r, nd, in, &out, &why)) >= 0) {
      r->map[i] = id;
      strbuf_printf(&r->log, "%%%d %s: %s\n", i, op_name(nd->op), why);
      continue;
    }
    /* constant folding: evaluate with the reference interpreter now (not
    ** a random op: it draws anew at every run) */
    if (allconst && nd->nin > 0 && meta_numel(&out) <= (1 << 16) &&
        !(op_info_of(nd->op)->flags & OPF_RANDOM)) {
      const fl_tensor *args[64];
      fl_tensor v = {0};
      for (k = 0; k < nd->nin; k++) args[k] = in[k] < 0 ? NULL : &r->g->nodes[in[k]].value;
      if ((r->rc = ref_apply(nd->op, args, nd->nin, &nd->attrs, &v, r->e))) break;
      v.m.wrapped = allwrapped;  /* 2 * 0.5 stays a weak scalar */
      id = ir_add_const(r->g, &v, r->e);
      ten_release(&v);
      if (id < 0) { r->rc = id; break; }
      r->map[i] = id;
      strbuf_printf(&r->log, "%%%d %s of constants folded\n", i, op_name(nd->op));
      continue;
    }
    /* two rand(4) are two draws, never one */
    if (!(op_info_of(nd->op)->flags & OPF_RANDOM) &&
        (id = cse_find(&t, r->g, nd->op, &nd->attrs, nd->nin, in)) >= 0) {
      r->map[i] = id;
      strbuf_printf(&r->log, "%%%d %s: same as an earlier %s (cse)\n", i,
                    op_name(nd->op), op_name(nd->op));
      continue;
    }
    id = emit(r, nd->op, &nd->attrs, nd->nin, in);
    if (id < 0) break;
    r->map[i] = id;
    cse_add(&t, r->g, id);
  }
  free(olduses);
  free(t.head);
  free(t.next);
  return r->rc;
}

/* Dead-code elimination: keep inputs (the call signature) and whatever
** the outputs reach. */
static ir_graph *dce(const ir_graph *g, strbuf *log, fl_err *e) {
  char *live = calloc((size_t)(g->n ? g->n : 1), 1);
  rw r;
  int i, k, removed = 0;
  if (!live) { err_set(e, FL_ENOMEM, "optimize: out of memory"); return NULL; }
  for (i = 0; i < g->nout; i++) live[g->outputs[i]] = 1;
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
  for (i = 0; i < g->n && !r.rc; i++) {
    if (!live[i]) { r.map[i] = -1; removed += g->nodes[i].kind == IR_OP; continue; }
    r.cur = &g->nodes[i];
    r.map[i] = copy_node(&r, &g->nodes[i]);
    if (r.map[i] < 0) r.rc = r.map[i];
  }
  if (!r.rc) finish_outputs(&r);
  if (removed && !r.rc) strbuf_printf(log, "removed %d unused node(s) (dce)\n", removed);
  free(live);
  free(r.map);
  strbuf_free(&r.log);
  if (r.rc) { ir_free(r.g); return NULL; }
  return r.g;
}

ir_graph *pass_optimize(const ir_graph *old, char **log, fl_err *e) {
  rw r;
  ir_graph *mid, *out;
  char *l;
  if (rw_begin(&r, old, e)) return NULL;
  if (!optimize_forward(&r)) finish_outputs(&r);
  mid = rw_end(&r, &l);
  if (!mid) return NULL;
  {
    strbuf sb = {0};
    if (strcmp(l, "(nothing changed)\n") != 0) strbuf_printf(&sb, "%s", l);
    free(l);
    out = dce(mid, &sb, e);
    ir_free(mid);
    if (!out) { strbuf_free(&sb); return NULL; }
    if (sb.n == 0) strbuf_printf(&sb, "(nothing changed)\n");
    *log = strbuf_take(&sb);
  }
  return out;
}
