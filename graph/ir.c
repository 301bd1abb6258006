/*
** ir.c -- building, copying, printing and interpreting graphs.
** Invariant: for every IR_OP node i, each in[k] is -1 or < i, so walking
** nodes by id is a valid execution order; outputs name existing nodes.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "ir.h"
#include "strbuf.h"

static char *dupstr(const char *s) {
  char *d;
  size_t n;
  if (!s) return NULL;
  n = strlen(s) + 1;
  d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* A copy of s quoted by err_quote (control characters as \xNN).  Names,
** source places and scopes come from users (Lua keys, file names) and
** reach terminals, pictures and generated comments: an escape sequence in
** a weight's name must print as text, not recolour the screen.  Stored
** quoted, so a clone copies them as they are. */
static char *dupsafe(const char *s) {
  size_t n;
  char *d;
  if (!s) return NULL;
  n = 4 * strlen(s) + 4;           /* \xNN is the longest spelling of a byte */
  if ((d = malloc(n))) err_quote(s, d, n);
  return d;
}

int ir_set_name(ir_graph *g, int id, const char *name, fl_err *e) {
  char *c;
  if (id < 0 || id >= g->n) return err_set(e, FL_EINVAL, "graph: no node %d", id);
  if (!(c = dupsafe(name))) return err_set(e, FL_ENOMEM, "graph: out of memory");
  free(g->nodes[id].name);
  g->nodes[id].name = c;
  return FL_OK;
}

ir_graph *ir_new(void) {
  return calloc(1, sizeof(ir_graph));
}

static void node_clear(ir_node *nd) {
  free(nd->in);
  free(nd->name);
  free(nd->where);
  free(nd->scope);
  ten_release(&nd->value);
}

void ir_free(ir_graph *g) {
  int i;
  if (!g) return;
  for (i = 0; i < g->n; i++) node_clear(&g->nodes[i]);
  free(g->nodes);
  free(g->outputs);
  free(g->wb);
  free(g->sx);
  free(g->joint_wrt);
  free(g->joint_tan);
  free(g);
}

/* Appends a zeroed node; returns its id or FL_ENOMEM. */
static int new_node(ir_graph *g, ir_kind kind, fl_err *e) {
  if (g->n == g->cap) {
    int cap = g->cap ? g->cap * 2 : 16;
    ir_node *nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
    if (!nn) return err_set(e, FL_ENOMEM, "graph: out of memory growing to %d nodes", cap);
    g->nodes = nn;
    g->cap = cap;
  }
  memset(&g->nodes[g->n], 0, sizeof g->nodes[0]);
  g->nodes[g->n].kind = kind;
  return g->n++;
}

int ir_add_input(ir_graph *g, const fl_meta *m, const char *name, fl_err *e) {
  int id = new_node(g, IR_INPUT, e);
  if (id < 0) return id;
  g->nodes[id].meta = *m;
  g->nodes[id].meta.wrapped = 0;
  g->nodes[id].index = g->ninputs++;
  g->nodes[id].name = dupsafe(name);
  return id;
}

static int add_value(ir_graph *g, ir_kind kind, const fl_tensor *t,
                     const char *name, fl_err *e) {
  int id = new_node(g, kind, e);
  if (id < 0) return id;
  ten_share(&g->nodes[id].value, t);
  g->nodes[id].meta = t->m;
  g->nodes[id].name = dupsafe(name);
  return id;
}

int ir_add_param(ir_graph *g, const fl_tensor *t, const char *name, fl_err *e) {
  return add_value(g, IR_PARAM, t, name, e);
}

int ir_add_const(ir_graph *g, const fl_tensor *t, fl_err *e) {
  return add_value(g, IR_CONST, t, NULL, e);
}

int ir_is_iota(const ir_node *n) {
  const fl_tensor *t = &n->value;
  int64_t k, len;
  if (n->kind != IR_CONST || !t->st || n->meta.ndim != 1 || t->m.device != FL_DEV_CPU) return 0;
  if (t->m.dtype != FL_I64 && t->m.dtype != FL_F32) return 0;
  len = n->meta.shape[0];
  if (len < 2 || (t->m.dtype == FL_F32 && len > ((int64_t)1 << 24))) return 0;
  for (k = 0; k < len; k++)
    if (ten_get_i64(t, k) != k) return 0;
  return 1;
}

/* Symbolic dims follow the values through every op, so a size Lua reads
** from any tensor of a capture is the expression it really is (the
** scores of attention are [B, h, T, T], not [2, 4, 7, 7]).  Right-aligned
** for broadcasting ops; permuted for transpose/permute; inserted/removed
** for unsqueeze/squeeze; taken from the attribute's expression where the
** caller gave one (reshape(B, T*h), narrow(d, 1, T)); summed along cat's
** dim.  An op whose sizes are computed in ways not followed here (conv's
** spatial dims) sets symlost when a symbolic size reaches them: capture
** then specializes the inputs' symbols rather than guess. */
static int has_sym(const ir_node *x) {
  int d;
  for (d = 0; d < x->meta.ndim; d++) if (x->sym[d]) return 1;
  return 0;
}

static int reshape_syms(ir_graph *g, ir_node *nd, const ir_node *x, fl_err *e) {
  const op_attrs *a = &nd->attrs;
  int d, hole = -1, any = 0;
  for (d = 0; d < nd->meta.ndim; d++) {
    if (d < a->ndims && nd->asym[d]) { nd->sym[d] = nd->asym[d]; any = 1; }
    else if (d < a->ndims && a->dims[d] == -1) hole = d;
  }
  if (hole >= 0 && (any || has_sym(x))) {
    /* the inferred dim: numel(x) / the product of the others */
    int n = ir_sym_numel(g, x, e), k = -1, q;
    if (n < 0) return n;
    for (d = 0; d < nd->meta.ndim; d++) {
      int f;
      if (d == hole) continue;
      f = nd->sym[d] ? nd->sym[d] - 1 : ir_sym_const(g, nd->meta.shape[d], e);
      if (f < 0 || (k = k < 0 ? f : ir_sym_op(g, SYM_MUL, k, f, e)) < 0) return f < 0 ? f : k;
    }
    q = k < 0 ? n : ir_sym_op(g, SYM_DIV, n, k, e);
    if (q < 0) return q;
    /* worth 0 or 1 here, it would broadcast: kept only at these sizes */
    if (!ir_sym_is_const(g, q, NULL) && ir_sym_hint(g, q) < 2) nd->symlost = 1;
    else if (!ir_sym_is_const(g, q, NULL)) nd->sym[hole] = q + 1;
    any = 1;
  }
  if (!any && has_sym(x)) nd->symlost = 1;     /* sizes Lua computed itself */
  return 0;
}

static int infer_syms(ir_graph *g, int id, fl_err *e) {
  ir_node *nd = &g->nodes[id];
  const op_attrs *a = &nd->attrs;
  const ir_node *x = nd->in[0] >= 0 ? &g->nodes[nd->in[0]] : NULL;
  int d, k, on = nd->meta.ndim;
  if (!x) return 0;
  switch (op_info_of(nd->op)->kind) {
  case OPK_ELEMWISE: case OPK_BROADCAST:
    for (k = 0; k < nd->nin; k++) {
      const ir_node *p = nd->in[k] >= 0 ? &g->nodes[nd->in[k]] : NULL;
      if (!p) continue;
      for (d = 0; d < p->meta.ndim && d < on; d++)
        if (p->sym[p->meta.ndim - 1 - d]) nd->sym[on - 1 - d] = p->sym[p->meta.ndim - 1 - d];
    }
    return 0;
  case OPK_REDUCTION:
    if (op_info_of(nd->op)->flags & OPF_COMPOSITE) {
      memcpy(nd->sym, x->sym, sizeof nd->sym);
    } else {
      int o = 0, all = a->ndims == 0;
      for (d = 0; d < x->meta.ndim; d++) {
        int red = all;
        for (k = 0; k < a->ndims; k++) red |= a->dims[k] == d;
        if (!red) nd->sym[o++] = x->sym[d];
        else if (a->keepdim) nd->sym[o++] = 0;
      }
    }
    return 0;
  default:
    break;
  }
  switch (nd->op) {
  case OP_TRANSPOSE:
    memcpy(nd->sym, x->sym, sizeof nd->sym);
    nd->sym[a->i[0]] = x->sym[a->i[1]];
    nd->sym[a->i[1]] = x->sym[a->i[0]];
    break;
  case OP_PERMUTE:
    for (d = 0; d < a->ndims; d++) nd->sym[d] = x->sym[a->dims[d]];
    break;
  case OP_UNSQUEEZE:
    for (d = 0, k = 0; d < on; d++) nd->sym[d] = d == a->i[0] ? 0 : x->sym[k++];
    break;
  case OP_SQUEEZE:
    /* symbolic dims are never 1, so they are never the ones removed */
    for (d = 0, k = 0; d < x->meta.ndim && k < on; d++)
      if (!(x->meta.shape[d] == 1 && !x->sym[d] && (!a->i[1] || a->i[0] == d))) nd->sym[k++] = x->sym[d];
    break;
  case OP_RESHAPE: case OP_VIEW:
    return reshape_syms(g, nd, x, e);
  case OP_EXPAND:
    for (d = 0; d < on; d++) {
      int xd = d - (on - x->meta.ndim);
      if (d < a->ndims && nd->asym[d]) nd->sym[d] = nd->asym[d];
      else if (xd >= 0 && x->meta.shape[xd] == nd->meta.shape[d]) nd->sym[d] = x->sym[xd];
    }
    break;
  case OP_NARROW:
    memcpy(nd->sym, x->sym, sizeof nd->sym);
    nd->sym[a->i[0]] = nd->asym[FL_MAX_DIMS + 2];
    break;
  case OP_SLICE: case OP_FLIP:          /* the sliced dim is specialized */
    memcpy(nd->sym, x->sym, sizeof nd->sym);
    if (nd->op == OP_SLICE) {
      nd->symlost |= x->sym[a->i[0]] != 0;
      nd->sym[a->i[0]] = 0;
    }
    break;
  case OP_CONTIGUOUS:
    memcpy(nd->sym, x->sym, sizeof nd->sym);
    break;
  case OP_PAD:
    /* a dim keeps its symbol, grown by its pads (before in dims[d],
    ** after in i[d]): the batch of a padded image stays dynamic */
    memcpy(nd->sym, x->sym, sizeof nd->sym);
    for (d = 0; d < a->ndims && d < x->meta.ndim; d++) {
      int64_t grow = a->dims[d] + a->i[d];
      int c, s;
      if (!x->sym[d] || grow == 0) continue;
      if ((c = ir_sym_const(g, grow, e)) < 0) return c;
      if ((s = ir_sym_op(g, SYM_ADD, x->sym[d] - 1, c, e)) < 0) return s;
      if (!ir_sym_is_const(g, s, NULL) && ir_sym_hint(g, s) < 2) nd->symlost = 1;
      else nd->sym[d] = ir_sym_is_const(g, s, NULL) ? 0 : s + 1;
    }
    break;
  case OP_CAT: {
    int sum = -1;
    memcpy(nd->sym, x->sym, sizeof nd->sym);
    for (k = 0; k < nd->nin; k++) {
      const ir_node *p = &g->nodes[nd->in[k]];
      int f = p->sym[a->i[0]] ? p->sym[a->i[0]] - 1 : ir_sym_const(g, p->meta.shape[a->i[0]], e);
      if (f < 0 || (sum = sum < 0 ? f : ir_sym_op(g, SYM_ADD, sum, f, e)) < 0) return f < 0 ? f : sum;
    }
    if (!ir_sym_is_const(g, sum, NULL) && ir_sym_hint(g, sum) < 2) nd->symlost = 1;
    else nd->sym[a->i[0]] = ir_sym_is_const(g, sum, NULL) ? 0 : sum + 1;
    break;
  }
  case OP_EMBEDDING:
    /* idx dims, then the weight's row */
    for (d = 0; d < x->meta.ndim; d++) nd->sym[d] = x->sym[d];
    break;
  case OP_MATMUL: case OP_LINEAR: case OP_MATMUL_INT8: {
    const ir_node *w = nd->nin > 1 && nd->in[1] >= 0 ? &g->nodes[nd->in[1]] : NULL;
    /* batch and row dims from x (batch dims of w where x has none), the
    ** columns from w: its last dim for matmul, its rows for linear */
    for (d = 0; d < on - 1 && d < x->meta.ndim; d++)
      nd->sym[on - 2 - d] = x->meta.ndim >= 2 + d ? x->sym[x->meta.ndim - 2 - d] : 0;
    if (w && nd->op != OP_LINEAR && w->meta.ndim >= 2) {
      nd->sym[on - 1] = w->sym[w->meta.ndim - 1];
      for (d = 2; d < w->meta.ndim && d < on; d++)
        if (!nd->sym[on - 1 - d]) nd->sym[on - 1 - d] = w->sym[w->meta.ndim - 1 - d];
    } else if (w && nd->op == OP_MATMUL && w->meta.ndim == 1 && x->meta.ndim >= 2) {
      nd->sym[on - 1] = x->sym[x->meta.ndim - 2];
    } else if (w && nd->op == OP_LINEAR) {
      nd->sym[on - 1] = w->sym[0];
    }
    break;
  }
  case OP_RNN: {
    /* [S + T, D, B, H]: the sequence length (grown by the state rows) and
    ** the batch keep X's symbols, H R's; the input size (a symbol where an
    ** earlier layer's output was reshaped) is not in the result */
    op_rnn c;
    op_rnn_of(a, &c);
    nd->sym[2] = x->sym[1];
    if (nd->nin > 2 && nd->in[2] >= 0) nd->sym[3] = g->nodes[nd->in[2]].sym[2];
    if (x->sym[0]) {
      int cs = ir_sym_const(g, c.states, e), s;
      if (cs < 0) return cs;
      if ((s = ir_sym_op(g, SYM_ADD, cs, x->sym[0] - 1, e)) < 0) return s;
      nd->sym[0] = s + 1;
    }
    break;
  }
  case OP_MAX_POOL2D_BACKWARD:               /* x's shape, x's sizes */
    for (d = 0; d < nd->meta.ndim; d++) nd->sym[d] = g->nodes[nd->in[1]].sym[d];
    break;
  case OP_CONV2D: case OP_MAX_POOL2D: case OP_AVG_POOL2D:
    nd->sym[0] = x->sym[0];                  /* the batch */
    for (d = 1; d < x->meta.ndim; d++) nd->symlost |= x->sym[d] != 0 && d >= 2;
    if (nd->op == OP_CONV2D && nd->nin > 1 && nd->in[1] >= 0) {
      const ir_node *w = &g->nodes[nd->in[1]];
      nd->sym[1] = w->sym[0];
      nd->symlost |= w->sym[2] || w->sym[3];
    }
    break;
  default:
    for (k = 0; k < nd->nin; k++)
      if (nd->in[k] >= 0 && has_sym(&g->nodes[nd->in[k]])) nd->symlost = 1;
    break;
  }
  return 0;
}

int ir_add_op(ir_graph *g, fl_op op, const int *in, int nin,
              const op_attrs *a, const char *where, const char *scope,
              fl_err *e) {
  return ir_add_op_sym(g, op, in, nin, a, NULL, where, scope, e);
}

int ir_add_op_sym(ir_graph *g, fl_op op, const int *in, int nin,
                  const op_attrs *a, const int *asym, const char *where,
                  const char *scope, fl_err *e) {
  const fl_meta *metas[64];
  fl_meta out;
  int k, id, rc;
  if (nin < 0 || nin > 64)
    return err_set(e, FL_EINVAL, "%s: %d inputs (at most 64)", op_name(op), nin);
  for (k = 0; k < nin; k++) {
    if (in[k] < -1 || in[k] >= g->n)
      return err_set(e, FL_EINVAL, "%s: input %d names no node (%d)", op_name(op), k, in[k]);
    metas[k] = in[k] < 0 ? NULL : &g->nodes[in[k]].meta;
  }
  rc = op_infer(op, metas, nin, a, &out, e);
  if (rc) return rc;
  id = new_node(g, IR_OP, e);
  if (id < 0) return id;
  g->nodes[id].op = op;
  g->nodes[id].attrs = *a;
  g->nodes[id].meta = out;
  g->nodes[id].nin = nin;
  g->nodes[id].in = malloc((size_t)(nin ? nin : 1) * sizeof(int));
  g->nodes[id].where = dupsafe(where);
  g->nodes[id].scope = dupsafe(scope);
  if (!g->nodes[id].in) {
    g->n--;
    node_clear(&g->nodes[id]);
    return err_set(e, FL_ENOMEM, "graph: out of memory");
  }
  memcpy(g->nodes[id].in, in, (size_t)nin * sizeof(int));
  if (asym && ir_sym_set_attrs(g, id, asym) && nin == 0) {
    int d;                        /* a source op (rand): its shape is its dims */
    for (d = 0; d < g->nodes[id].meta.ndim; d++) g->nodes[id].sym[d] = asym[d];
  }
  if (nin > 0 && (g->nsyms > 0 || g->has_asym) && (rc = infer_syms(g, id, e)) < 0) {
    g->n--;
    node_clear(&g->nodes[id]);
    return rc;
  }
  return id;
}

int ir_add_output(ir_graph *g, int id, fl_err *e) {
  if (id < 0 || id >= g->n)
    return err_set(e, FL_EINVAL, "graph: output names no node (%d)", id);
  if (g->nout == g->outcap) {
    int cap = g->outcap ? g->outcap * 2 : 4;
    int *no = realloc(g->outputs, (size_t)cap * sizeof *no);
    if (!no) return err_set(e, FL_ENOMEM, "graph: out of memory");
    g->outputs = no;
    g->outcap = cap;
  }
  g->outputs[g->nout++] = id;
  return FL_OK;
}

int ir_add_writeback(ir_graph *g, int src, int dst, fl_err *e) {
  int *nw, rc;
  if (dst < 0 || dst >= g->n || (g->nodes[dst].kind != IR_INPUT && g->nodes[dst].kind != IR_PARAM))
    return err_set(e, FL_EINVAL, "graph: a write-back goes into an input or a param (%d)", dst);
  if (!(nw = realloc(g->wb, (size_t)(g->nwb + 1) * sizeof *nw)))
    return err_set(e, FL_ENOMEM, "graph: out of memory");
  g->wb = nw;
  if ((rc = ir_add_output(g, src, e)) != FL_OK) return rc;
  g->wb[g->nwb++] = dst;
  return FL_OK;
}

static int host_copy(void *ctx, fl_tensor *dst, const fl_tensor *src, fl_err *e) {
  (void)ctx;
  return ten_copy(dst, src, e);
}

/* a and b are the same elements of the same storage */
static int same_memory(const fl_tensor *a, const fl_tensor *b) {
  int d;
  if (!a->st || a->st != b->st || a->offset != b->offset || a->m.dtype != b->m.dtype ||
      !meta_same_shape(&a->m, &b->m))
    return 0;
  for (d = 0; d < a->m.ndim; d++)
    if (a->m.shape[d] > 1 && a->stride[d] != b->stride[d]) return 0;
  return 1;
}

int ir_writeback(const ir_graph *g, const fl_tensor *const *inputs, fl_tensor *outs,
                 ir_copy_fn copy, void *ctx, fl_err *e) {
  int k, i, rc = FL_OK, nres = ir_nresults(g);
  if (!copy) copy = host_copy;
  for (k = 0; k < g->nwb && rc == FL_OK; k++) {
    const ir_node *d = &g->nodes[g->wb[k]];
    fl_tensor *dst = (fl_tensor *)(d->kind == IR_INPUT ? inputs[d->index] : &d->value);
    /* a result that is the written storage itself (an identity the
    ** passes removed, a view) held the value from before the write */
    for (i = 0; i < nres && rc == FL_OK; i++)
      if (outs[i].st && outs[i].st == dst->st) {
        fl_tensor c;
        fl_meta m = outs[i].m;
        c.st = NULL;
        if ((rc = ten_empty(&c, &m, e)) != FL_OK) break;
        if ((rc = copy(ctx, &c, &outs[i], e)) != FL_OK) { ten_release(&c); break; }
        ten_release(&outs[i]);
        outs[i] = c;
      }
    /* stored in place already (plan_inplace): the same memory, nothing to copy */
    if (rc == FL_OK && !same_memory(dst, &outs[nres + k])) rc = copy(ctx, dst, &outs[nres + k], e);
    if (rc != FL_OK) err_prefix(e, "write-back into %s", d->name ? d->name : "an input");
  }
  return rc;
}

ir_graph *ir_clone(const ir_graph *g) {
  ir_graph *c = ir_new();
  int i;
  if (!c) return NULL;
  c->nodes = malloc((size_t)(g->cap ? g->cap : 1) * sizeof *c->nodes);
  c->outputs = malloc((size_t)(g->outcap ? g->outcap : 1) * sizeof(int));
  if (!c->nodes || !c->outputs) { ir_free(c); return NULL; }
  c->cap = g->cap;
  c->outcap = g->outcap;
  c->ninputs = g->ninputs;
  c->nsyms = g->nsyms;
  c->has_asym = g->has_asym;
  c->origin = g->origin;
  if (g->joint_nres) {
    size_t ng = (size_t)(ir_nresults(g) - g->joint_nres);
    if (!(c->joint_wrt = malloc((ng ? ng : 1) * sizeof *c->joint_wrt))) { ir_free(c); return NULL; }
    memcpy(c->joint_wrt, g->joint_wrt, ng * sizeof *c->joint_wrt);
    c->joint_nres = g->joint_nres;
  }
  if (g->joint_ntan) {
    if (!(c->joint_tan = malloc((size_t)g->joint_ntan * sizeof *c->joint_tan))) { ir_free(c); return NULL; }
    memcpy(c->joint_tan, g->joint_tan, (size_t)g->joint_ntan * sizeof *c->joint_tan);
    c->joint_ntan = g->joint_ntan;
  }
  if (g->nsx) {
    if (!(c->sx = malloc((size_t)g->nsx * sizeof *c->sx))) { ir_free(c); return NULL; }
    memcpy(c->sx, g->sx, (size_t)g->nsx * sizeof *c->sx);
    c->nsx = c->capsx = g->nsx;
  }
  c->nout = g->nout;
  if (g->nout) memcpy(c->outputs, g->outputs, (size_t)g->nout * sizeof(int));
  if (g->nwb) {
    if (!(c->wb = malloc((size_t)g->nwb * sizeof *c->wb))) { ir_free(c); return NULL; }
    memcpy(c->wb, g->wb, (size_t)g->nwb * sizeof *c->wb);
    c->nwb = g->nwb;
  }
  for (i = 0; i < g->n; i++) {
    const ir_node *s = &g->nodes[i];
    ir_node *d = &c->nodes[i];
    *d = *s;
    d->in = NULL; d->name = d->where = d->scope = NULL;
    d->value.st = NULL;
    c->n = i + 1;
    if (s->kind == IR_OP) {
      d->in = malloc((size_t)(s->nin ? s->nin : 1) * sizeof(int));
      if (!d->in) { ir_free(c); return NULL; }
      memcpy(d->in, s->in, (size_t)s->nin * sizeof(int));
    }
    if (s->value.st) ten_share(&d->value, &s->value);
    d->name = dupstr(s->name);
    d->where = dupstr(s->where);
    d->scope = dupstr(s->scope);
  }
  return c;
}

int ir_op_count(const ir_graph *g) {
  int i, n = 0;
  for (i = 0; i < g->n; i++) n += g->nodes[i].kind == IR_OP;
  return n;
}

void ir_count_uses(const ir_graph *g, int *uses) {
  int i, k;
  memset(uses, 0, (size_t)g->n * sizeof(int));
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_OP) continue;
    for (k = 0; k < nd->nin; k++)
      if (nd->in[k] >= 0) uses[nd->in[k]]++;
  }
  for (i = 0; i < g->nout; i++) uses[g->outputs[i]]++;
}

char *ir_type_str(const ir_graph *g, int id, char *buf, size_t n) {
  const ir_node *nd = &g->nodes[id];
  size_t len;
  int d;
  snprintf(buf, n, "%s[", dtype_name(nd->meta.dtype));
  for (d = 0; d < nd->meta.ndim; d++) {
    len = strlen(buf);
    if (nd->sym[d]) {
      char ex[64];
      snprintf(buf + len, n - len, "%s%s", d ? "," : "", ir_sym_str(g, nd->sym[d] - 1, ex, sizeof ex));
    } else
      snprintf(buf + len, n - len, "%s%lld", d ? "," : "", (long long)nd->meta.shape[d]);
  }
  len = strlen(buf);
  snprintf(buf + len, n - len, "]");
  return buf;
}

/* Attributes worth showing in a listing line, e.g. "dim=1, keepdim". */
static void attrs_str(const ir_node *nd, char *buf, size_t n) {
  const op_attrs *a = &nd->attrs;
  size_t len;
  int k;
  buf[0] = '\0';
  if (op_is_reduce(nd->op)) {
    snprintf(buf, n, "dims=[");
    for (k = 0; k < a->ndims; k++) {
      len = strlen(buf);
      snprintf(buf + len, n - len, "%s%lld", k ? "," : "", (long long)a->dims[k]);
    }
    len = strlen(buf);
    snprintf(buf + len, n - len, "]%s", a->keepdim ? ", keepdim" : "");
    if (nd->op == OP_VAR) {
      len = strlen(buf);
      snprintf(buf + len, n - len, ", correction=%g", a->f[0]);
    }
    return;
  }
  switch (nd->op) {
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_UNSQUEEZE: case OP_CAT:
    snprintf(buf, n, "dim=%lld", (long long)a->i[0]);
    break;
  case OP_TRANSPOSE:
    snprintf(buf, n, "dims=%lld,%lld", (long long)a->i[0], (long long)a->i[1]);
    break;
  case OP_NARROW:
    snprintf(buf, n, "dim=%lld, start=%lld, length=%lld",
             (long long)a->i[0], (long long)a->i[1], (long long)a->i[2]);
    break;
  case OP_SLICE:
    snprintf(buf, n, "dim=%lld, start=%lld, length=%lld, step=%lld", (long long)a->i[0],
             (long long)a->i[1], (long long)a->i[2], (long long)a->i[3]);
    break;
  case OP_GATHER:
    snprintf(buf, n, "dim=%lld", (long long)a->i[0]);
    break;
  case OP_MATMUL_INT8:
    snprintf(buf, n, "A %s, B %s", a->i[0] ? "uint8" : "int8", a->i[1] ? "uint8" : "int8");
    break;
  case OP_CUMSUM:
    snprintf(buf, n, "dim=%lld%s%s", (long long)a->i[0], a->i[1] ? ", exclusive" : "",
             a->i[2] ? ", reverse" : "");
    break;
  case OP_RNN: {
    static const char *const cells[] = {"RNN", "GRU", "LSTM"}, *const dirs[] = {"forward", "reverse", "bidirectional"};
    op_rnn c;
    int at, d, j;
    op_rnn_of(a, &c);
    at = snprintf(buf, n, "%s, %s", cells[c.cell], dirs[c.dirs == 2 ? 2 : c.reverse]);
    if (at > 0 && (size_t)at < n && c.lbr) at += snprintf(buf + at, n - (size_t)at, ", linear_before_reset");
    if (at > 0 && (size_t)at < n && c.clip_on) at += snprintf(buf + at, n - (size_t)at, ", clip=%g", c.clip);
    for (d = 0; d < 2; d++)
      for (j = 0; j < 3; j++)
        if (a->i[4 + 3 * d + j] && at > 0 && (size_t)at < n)
          at += snprintf(buf + at, n - (size_t)at, ", %c%d=%s", "fgh"[j], d, op_rnn_act_name(c.act[d][j]));
    break;
  }
  case OP_FLIP:
    snprintf(buf, n, "dims=[");
    for (k = 0; k < a->ndims; k++) {
      len = strlen(buf);
      snprintf(buf + len, n - len, "%s%lld", k ? "," : "", (long long)a->dims[k]);
    }
    len = strlen(buf);
    snprintf(buf + len, n - len, "]");
    break;
  case OP_PAD:
    snprintf(buf, n, "%s, pads=[", a->i[8] == 1 ? "reflect" : a->i[8] == 2 ? "edge" : "constant");
    for (k = 0; k < 2 * a->ndims && k < 2 * FL_MAX_DIMS; k++) {
      len = strlen(buf);
      snprintf(buf + len, n - len, "%s%lld", k ? "," : "",
               (long long)(k < a->ndims ? a->dims[k] : a->i[k - a->ndims]));
    }
    len = strlen(buf);
    if (a->i[8] == 0) snprintf(buf + len, n - len, "], value=%g", a->f[0]);
    else snprintf(buf + len, n - len, "]");
    break;
  case OP_LAYER_NORM: case OP_RMS_NORM: case OP_BATCH_NORM:
    snprintf(buf, n, "eps=%g%s", a->f[0], nd->op == OP_BATCH_NORM && a->i[0] ? ", batch_stats" : "");
    break;
  case OP_CLAMP:
    snprintf(buf, n, "min=%g, max=%g", a->f[0], a->f[1]);
    break;
  case OP_TO:
    snprintf(buf, n, "%s", dtype_name(a->dtype));
    break;
  case OP_MAX_POOL2D: case OP_AVG_POOL2D: case OP_MAX_POOL2D_BACKWARD: {
    op_win2d w;
    int at;
    op_win2d_of(nd->op, a, 0, 0, &w);
    at = snprintf(buf, n, "kernel=%lld,%lld, stride=%lld,%lld", (long long)w.kh, (long long)w.kw,
                  (long long)w.sh, (long long)w.sw);
    if (at > 0 && (size_t)at < n && (w.pt || w.pl || w.pb || w.pr))
      at += snprintf(buf + at, n - (size_t)at, ", padding=%lld,%lld,%lld,%lld", (long long)w.pt,
                     (long long)w.pl, (long long)w.pb, (long long)w.pr);
    if (at > 0 && (size_t)at < n && (w.dh != 1 || w.dw != 1))
      at += snprintf(buf + at, n - (size_t)at, ", dilation=%lld,%lld", (long long)w.dh,
                     (long long)w.dw);
    if (at > 0 && (size_t)at < n && w.ceil_mode)
      at += snprintf(buf + at, n - (size_t)at, ", ceil_mode");
    if (at > 0 && (size_t)at < n && nd->op == OP_AVG_POOL2D && !w.count_include_pad)
      snprintf(buf + at, n - (size_t)at, ", count_include_pad=false");
    break;
  }
  case OP_CONV2D: {
    int at = snprintf(buf, n, "stride=%lld,%lld, padding=%lld,%lld", (long long)a->i[0],
                      (long long)a->i[1], (long long)a->i[2], (long long)a->i[3]);
    /* the rest only where it differs from the defaults, so old listings read the same */
    if (at > 0 && (size_t)at < n && (a->i[4] != a->i[2] || a->i[5] != a->i[3]))
      at += snprintf(buf + at, n - (size_t)at, ",%lld,%lld", (long long)a->i[4], (long long)a->i[5]);
    if (at > 0 && (size_t)at < n && (a->i[6] != 1 || a->i[7] != 1))
      at += snprintf(buf + at, n - (size_t)at, ", dilation=%lld,%lld", (long long)a->i[6],
                     (long long)a->i[7]);
    if (at > 0 && (size_t)at < n && a->i[8] != 1)
      snprintf(buf + at, n - (size_t)at, ", groups=%lld", (long long)a->i[8]);
    break;
  }
  default:
    break;
  }
}

char *ir_listing(const ir_graph *g) {
  strbuf b = {0};
  char ty[128], at[160];
  int i, k;
  strbuf_printf(&b, "graph(");
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_INPUT) continue;
    strbuf_printf(&b, "%s%%%d: %s%s%s", nd->index ? ", " : "", i,
              ir_type_str(g, i, ty, sizeof ty), nd->name ? " " : "",
              nd->name ? nd->name : "");
  }
  strbuf_printf(&b, ") {\n");
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    ir_type_str(g, i, ty, sizeof ty);
    switch (nd->kind) {
    case IR_INPUT:
      break;
    case IR_PARAM:
      strbuf_printf(&b, "  %%%d = param %s : %s\n", i, nd->name ? nd->name : "?", ty);
      break;
    case IR_CONST:
      if (meta_numel(&nd->meta) == 1 && nd->value.st && nd->value.m.dtype == FL_I64)
        strbuf_printf(&b, "  %%%d = const %lld : %s\n", i,
                      (long long)dtype_load_i64(FL_I64, ten_elem_ptr(&nd->value, 0)), ty);
      else if (meta_numel(&nd->meta) == 1 && nd->value.st)
        strbuf_printf(&b, "  %%%d = const %.9g : %s\n", i, ten_get(&nd->value, 0), ty);
      else
        strbuf_printf(&b, "  %%%d = const : %s%s%s\n", i, ty, nd->name ? "    # " : "",
                      nd->name ? nd->name : "");
      break;
    case IR_OP:
      strbuf_printf(&b, "  %%%d = %s(", i, op_name(nd->op));
      for (k = 0; k < nd->nin; k++) {
        if (nd->in[k] < 0) strbuf_printf(&b, "%sNone", k ? ", " : "");
        else strbuf_printf(&b, "%s%%%d", k ? ", " : "", nd->in[k]);
      }
      attrs_str(nd, at, sizeof at);
      strbuf_printf(&b, "%s%s) : %s", at[0] && nd->nin ? ", " : "", at, ty);
      if (nd->where) strbuf_printf(&b, "    # %s", nd->where);
      strbuf_printf(&b, "\n");
      break;
    }
  }
  /* written back after the graph ran: the in-place updates it captured */
  for (k = 0; k < g->nwb; k++) {
    const ir_node *d = &g->nodes[g->wb[k]];
    strbuf_printf(&b, "  write %%%d into %%%d (%s %s)\n", g->outputs[ir_nresults(g) + k], g->wb[k],
                  d->kind == IR_INPUT ? "input" : "param", d->name ? d->name : "?");
  }
  strbuf_printf(&b, "  return ");
  for (i = 0; i < ir_nresults(g); i++) strbuf_printf(&b, "%s%%%d", i ? ", " : "", g->outputs[i]);
  strbuf_printf(&b, "\n}");
  return strbuf_take(&b);
}

int ir_run(const ir_graph *g, ir_apply_fn apply, const fl_tensor *const *inputs,
           int ninputs, fl_tensor *outs, fl_err *e) {
  fl_tensor *vals;
  int *uses;
  int i, k, rc = FL_OK;
  if (ninputs != g->ninputs)
    return err_set(e, FL_EINVAL, "graph: expected %d input(s), got %d", g->ninputs, ninputs);
  if (g->has_asym) {
    const fl_meta *im[64];
    for (i = 0; i < ninputs && i < 64; i++) im[i] = &inputs[i]->m;
    if ((rc = ir_sym_bind(g, im, e)) != FL_OK) return rc;
  }
  vals = calloc((size_t)(g->n ? g->n : 1), sizeof *vals);
  uses = malloc((size_t)(g->n ? g->n : 1) * sizeof *uses);
  if (!vals || !uses) {
    free(vals); free(uses);
    return err_set(e, FL_ENOMEM, "graph: out of memory");
  }
  ir_count_uses(g, uses);
  for (i = 0; i < g->n && rc == FL_OK; i++) {
    const ir_node *nd = &g->nodes[i];
    const fl_tensor *args[64];
    switch (nd->kind) {
    case IR_INPUT:
      ten_share(&vals[i], inputs[nd->index]);
      break;
    case IR_PARAM: case IR_CONST:
      ten_share(&vals[i], &nd->value);
      break;
    case IR_OP:
      for (k = 0; k < nd->nin; k++) args[k] = nd->in[k] < 0 ? NULL : &vals[nd->in[k]];
      rc = apply(nd->op, args, nd->nin, &nd->attrs, &vals[i], e);
      /* free inputs after their last use: peak memory as in eager mode */
      for (k = 0; k < nd->nin && rc == FL_OK; k++)
        if (nd->in[k] >= 0 && --uses[nd->in[k]] == 0) ten_release(&vals[nd->in[k]]);
      break;
    }
  }
  if (rc == FL_OK)
    for (i = 0; i < g->nout; i++) ten_share(&outs[i], &vals[g->outputs[i]]);
  for (i = 0; i < g->n; i++) ten_release(&vals[i]);
  free(vals);
  free(uses);
  if (rc == FL_OK && g->nwb) rc = ir_writeback(g, inputs, outs, NULL, NULL, e);
  return rc;
}

void ir_fingerprint(const ir_graph *g, char hex[33]) {
  XXH3_state_t *st = XXH3_createState();
  XXH128_hash_t h;
  int i;
  if (!st) { snprintf(hex, 33, "%032x", 0); return; }
  XXH3_128bits_reset(st);
  XXH3_128bits_update(st, &g->n, sizeof g->n);
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    XXH3_128bits_update(st, &nd->kind, sizeof nd->kind);
    XXH3_128bits_update(st, &nd->meta, sizeof nd->meta);
    XXH3_128bits_update(st, nd->sym, sizeof nd->sym);
    XXH3_128bits_update(st, nd->asym, sizeof nd->asym);
    switch (nd->kind) {
    case IR_INPUT:
      XXH3_128bits_update(st, &nd->index, sizeof nd->index);
      break;
    case IR_PARAM:
      /* bound by reference: the storage and view, not the values */
      XXH3_128bits_update(st, &nd->value.st, sizeof nd->value.st);
      XXH3_128bits_update(st, &nd->value.offset, sizeof nd->value.offset);
      XXH3_128bits_update(st, nd->value.stride, sizeof nd->value.stride);
      break;
    case IR_CONST: {
      int64_t k, n = meta_numel(&nd->meta);
      for (k = 0; k < n; k++) {
        /* int64 by its bits: through double TS and TS + 1 would collide */
        if (nd->value.m.dtype == FL_I64) {
          int64_t v = dtype_load_i64(FL_I64, ten_elem_ptr(&nd->value, k));
          XXH3_128bits_update(st, &v, sizeof v);
        } else {
          double v = ten_get(&nd->value, k);
          XXH3_128bits_update(st, &v, sizeof v);
        }
      }
      break;
    }
    case IR_OP:
      XXH3_128bits_update(st, &nd->op, sizeof nd->op);
      XXH3_128bits_update(st, &nd->attrs, sizeof nd->attrs);
      XXH3_128bits_update(st, &nd->nin, sizeof nd->nin);
      XXH3_128bits_update(st, nd->in, (size_t)nd->nin * sizeof(int));
      break;
    }
  }
  XXH3_128bits_update(st, g->outputs, (size_t)g->nout * sizeof(int));
  XXH3_128bits_update(st, &g->nwb, sizeof g->nwb);
  if (g->nwb) XXH3_128bits_update(st, g->wb, (size_t)g->nwb * sizeof(int));
  for (i = 0; i < g->nsx; i++) {
    /* the expressions, not their hints: one graph serves every size */
    const ir_sym *x = &g->sx[i];
    XXH3_128bits_update(st, &x->op, sizeof x->op);
    XXH3_128bits_update(st, &x->a, sizeof x->a);
    XXH3_128bits_update(st, &x->b, sizeof x->b);
    XXH3_128bits_update(st, &x->c, sizeof x->c);
  }
  h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.high64,
           (unsigned long long)h.low64);
}

/* The graph's own shape rules re-run from real inputs: what a compiled
** program does before binding sizes, since symbolic dims may differ. */
int ir_infer_metas(const ir_graph *g, const fl_tensor *const *in, fl_device dev,
                   fl_meta *metas, fl_err *e) {
  int i, k, d, rc0;
  char want[128], got[96];
  if (g->has_asym) {
    const fl_meta *im[64];
    for (i = 0; i < g->ninputs && i < 64; i++) im[i] = &in[i]->m;
    if ((rc0 = ir_sym_bind(g, im, e)) != FL_OK) return rc0;
  }
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    const fl_meta *args[64];
    int rc;
    switch (nd->kind) {
    case IR_INPUT: {
      const fl_meta *m = &in[nd->index]->m;
      int bad = m->dtype != nd->meta.dtype || m->ndim != nd->meta.ndim;
      for (d = 0; d < m->ndim && !bad; d++)
        bad = !nd->sym[d] && m->shape[d] != nd->meta.shape[d];
      if (bad)
        return err_set(e, FL_EINVAL, "run: input %d: expected %s, got %s %s", nd->index + 1,
                       ir_type_str(g, i, want, sizeof want), dtype_name(m->dtype),
                       meta_shape_str(m, got, sizeof got));
      metas[i] = *m;
      metas[i].wrapped = 0;
      break;
    }
    case IR_PARAM: case IR_CONST:
      metas[i] = nd->value.m;
      break;
    case IR_OP:
      for (k = 0; k < nd->nin && k < 64; k++) args[k] = nd->in[k] < 0 ? NULL : &metas[nd->in[k]];
      if ((rc = op_infer(nd->op, args, nd->nin, &nd->attrs, &metas[i], e)) != FL_OK) return rc;
      break;
    }
    metas[i].device = dev;
  }
  return FL_OK;
}

int ir_copy_node(ir_graph *h, const ir_graph *g, int i, const int *map, fl_err *e) {
  const ir_node *nd = &g->nodes[i];
  int in[64], k, id = -1;
  switch (nd->kind) {
  case IR_INPUT:
    id = ir_add_input(h, &nd->meta, nd->name, e);
    if (id >= 0) memcpy(h->nodes[id].sym, nd->sym, sizeof nd->sym);
    break;
  case IR_PARAM: id = ir_add_param(h, &nd->value, nd->name, e); break;
  case IR_CONST:
    id = ir_add_const(h, &nd->value, e);
    if (id >= 0 && nd->name && ir_set_name(h, id, nd->name, e) != FL_OK) return FL_ENOMEM;
    break;
  case IR_OP:
    for (k = 0; k < nd->nin; k++) in[k] = nd->in[k] < 0 ? -1 : map[nd->in[k]];
    return ir_add_op(h, nd->op, in, nd->nin, &nd->attrs, nd->where, nd->scope, e);
  }
  if (id >= 0) {
    h->nodes[id].requires_grad = nd->requires_grad;
    h->nodes[id].meta.wrapped = nd->meta.wrapped;
  }
  return id;
}
