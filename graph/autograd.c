/*
** autograd.c -- the tape and backward of autograd.h.
*/
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "grad.h"
#include "pass.h"

static int grad_on = 1;
static uint64_t next_seq = 1;
static long live;               /* fns not yet freed: tests see leaks */

long ag_live(void) { return live; }

int ag_grad_enabled(void) { return grad_on; }
void ag_set_grad_enabled(int on) { grad_on = on != 0; }

static ag_fn *fn_new(ag_kind kind, int nin, fl_err *e) {
  ag_fn *f = calloc(1, sizeof *f);
  int slots = nin + 2;
  if (f) {
    f->in_meta = calloc((size_t)(nin ? nin : 1), sizeof *f->in_meta);
    f->next = calloc((size_t)(nin ? nin : 1), sizeof *f->next);
    f->saved = calloc((size_t)slots, sizeof *f->saved);
    f->ver = calloc((size_t)slots, sizeof *f->ver);
  }
  if (!f || !f->in_meta || !f->next || !f->saved || !f->ver) {
    if (f) { free(f->in_meta); free(f->next); free(f->saved); free(f->ver); }
    free(f);
    err_set(e, FL_ENOMEM, "autograd: out of memory recording an op");
    return NULL;
  }
  live++;
  f->refs = 1;
  f->kind = kind;
  f->nin = nin;
  f->seq = next_seq++;
  f->node = -1;
  return f;
}

ag_fn *ag_leaf(const fl_meta *m, fl_err *e) {
  ag_fn *f = fn_new(AG_LEAF, 0, e);
  if (f) f->out_meta = *m;
  return f;
}

static void save(ag_fn *f, int slot, const fl_tensor *t) {
  if (!t || !t->st) return;
  ten_share(&f->saved[slot], t);
  f->ver[slot] = t->st->version;
}

ag_fn *ag_record(fl_op op, const op_attrs *a, const fl_tensor *const *in, int nin,
                 ag_fn *const *next, const fl_tensor *out, const fl_tensor *extra,
                 fl_err *e) {
  int saves = op_info_of(op)->saves, k;
  ag_fn *f = fn_new(AG_OP, nin, e);
  if (!f) return NULL;
  f->op = op;
  f->attrs = *a;
  f->out_meta = out->m;
  for (k = 0; k < nin; k++) {
    if (in[k]) f->in_meta[k] = in[k]->m;
    else f->in_meta[k].ndim = -1;
    if ((f->next[k] = next[k]) != NULL) ag_ref(next[k]);
    if (k < 5 && (saves & (GS_IN0 << k))) save(f, k, in[k]);
  }
  if (saves & GS_OUT) save(f, nin, out);
  if (saves & GS_EXTRA) save(f, nin + 1, extra);
  return f;
}

ag_fn *ag_call_new(const fl_meta *out, int nin, ag_fn *const *next, const ag_call *c, fl_err *e) {
  ag_fn *f = fn_new(AG_CALL, nin, e);
  int k;
  if (!f) { c->free_ctx(c->ctx); return NULL; }
  f->out_meta = *out;
  f->call = *c;
  for (k = 0; k < nin; k++)
    if ((f->next[k] = next[k]) != NULL) ag_ref(next[k]);
  return f;
}

void ag_ref(ag_fn *f) { if (f) f->refs++; }

static void release_saved(ag_fn *f) {
  int k;
  for (k = 0; k < f->nin + 2; k++) ten_release(&f->saved[k]);
  if (f->kind == AG_CALL && f->call.release) f->call.release(f->call.ctx);
}

/* Iterative: freeing the head of a long chain frees the chain. */
void ag_unref(ag_fn *f) {
  ag_fn **stack = NULL;
  int n = 0, cap = 0;
  if (!f || --f->refs > 0) return;
  for (;;) {
    int k;
    for (k = 0; k <= f->nin; k++) {       /* the next fns, then grad_fn */
      ag_fn *x = k < f->nin ? f->next[k] : f->grad_fn;
      if (x && --x->refs == 0) {
        if (n == cap) {
          int nc = cap ? cap * 2 : 16;
          ag_fn **ns = realloc(stack, (size_t)nc * sizeof *ns);
          if (!ns) { x->refs = 1; continue; }   /* leaks x rather than crash */
          stack = ns;
          cap = nc;
        }
        stack[n++] = x;
      }
    }
    release_saved(f);
    if (f->kind == AG_CALL) f->call.free_ctx(f->call.ctx);
    ten_release(&f->grad);
    free(f->in_meta);
    free(f->next);
    free(f->saved);
    free(f->ver);
    free(f);
    live--;
    if (n == 0) break;
    f = stack[--n];
  }
  free(stack);
}

const char *ag_fn_name(const ag_fn *f, char *buf, size_t n) {
  const char *s;
  size_t i = 0;
  int up = 1;
  if (f->kind == AG_LEAF) { snprintf(buf, n, "AccumulateGrad"); return buf; }
  if (f->kind == AG_CALL) { snprintf(buf, n, "%s", f->call.name); return buf; }
  /* log_softmax -> LogSoftmaxBackward */
  for (s = op_name(f->op); *s && i + 1 < n; s++) {
    if (*s == '_') { up = 1; continue; }
    buf[i++] = up ? (char)toupper((unsigned char)*s) : *s;
    up = 0;
  }
  buf[i] = '\0';
  if (i + 9 < n) strcat(buf, "Backward");
  return buf;
}

/* --- backward --------------------------------------------------------- */

typedef struct walk {
  ag_fn **fns;          /* every fn reached, then sorted newest first */
  int n, cap;
} walk;

static int push(walk *w, ag_fn *f, fl_err *e) {
  if (w->n == w->cap) {
    int nc = w->cap ? w->cap * 2 : 64;
    ag_fn **nf = realloc(w->fns, (size_t)nc * sizeof *nf);
    if (!nf) return err_set(e, FL_ENOMEM, "backward: out of memory");
    w->fns = nf;
    w->cap = nc;
  }
  w->fns[w->n++] = f;
  return FL_OK;
}

static int newest_first(const void *p, const void *q) {
  uint64_t a = (*(ag_fn *const *)p)->seq, b = (*(ag_fn *const *)q)->seq;
  return a < b ? 1 : a > b ? -1 : 0;
}

/* Every fn reachable from the roots, marked, newest first. */
static int reach(walk *w, ag_fn *const *roots, int n, fl_err *e) {
  int k, i, rc;
  for (k = 0; k < n; k++)
    if (roots[k] && !roots[k]->mark) {
      roots[k]->mark = 1;
      if ((rc = push(w, roots[k], e)) != FL_OK) return rc;
    }
  for (i = 0; i < w->n; i++) {
    ag_fn *f = w->fns[i];
    /* a call's inputs are reached once it has run (ag_backward's loop) */
    for (k = 0; k < f->nin && f->kind != AG_CALL; k++)
      if (f->next[k] && !f->next[k]->mark) {
        f->next[k]->mark = 1;
        if ((rc = push(w, f->next[k], e)) != FL_OK) return rc;
      }
  }
  qsort(w->fns, (size_t)w->n, sizeof *w->fns, newest_first);
  return FL_OK;
}

static void unmark(walk *w) {
  int i;
  for (i = 0; i < w->n; i++) { w->fns[i]->mark = 0; w->fns[i]->node = -1; }
  free(w->fns);
}

/* v joins f's gradient (a sum when several uses reach it). */
static void accumulate(gbuild *b, ag_fn *f, int v) {
  if (v < 0) return;
  f->node = f->node < 0 ? v : gb_op2(b, OP_ADD, f->node, v);
}

/* create_graph: the fn of each constant of the backward graph that is a
** value with a history (a saved value, a seed), by node id; no references
** (the tape being walked holds them all). */
typedef struct fnmap {
  ag_fn **fn;
  int n, cap;
} fnmap;

static int fm_set(gbuild *b, fnmap *fm, int id, ag_fn *f) {
  if (!fm || id < 0 || !f) return id;
  if (id >= fm->cap) {
    int nc = fm->cap ? fm->cap : 64, i;
    ag_fn **nf;
    while (nc <= id) nc *= 2;
    if (!(nf = realloc(fm->fn, (size_t)nc * sizeof *nf))) {
      b->rc = err_set(b->e, FL_ENOMEM, "backward: out of memory");
      return -1;
    }
    for (i = fm->cap; i < nc; i++) nf[i] = NULL;
    fm->fn = nf;
    fm->cap = nc;
  }
  fm->fn[id] = f;
  if (id >= fm->n) fm->n = id + 1;
  return id;
}

/* A saved value as a constant of the backward graph, named for the
** pictures: "saved by mul: input 1", "saved by exp: output".  Its fn:
** saved input k's is the fn input k's gradient goes to, the output's f
** itself, the extra (a mask) has none. */
static int saved_node(gbuild *b, ag_fn *f, int slot, fnmap *fm) {
  char name[96];
  int id;
  if (!f->saved[slot].st) return -1;
  id = gb_tensor(b, &f->saved[slot]);
  if (id < 0) return id;
  if (fm_set(b, fm, id, slot < f->nin ? f->next[slot] : slot == f->nin ? f : NULL) < 0)
    return -1;
  if (slot < f->nin) snprintf(name, sizeof name, "saved by %s: input %d", op_name(f->op), slot + 1);
  else snprintf(name, sizeof name, "saved by %s: %s", op_name(f->op),
                slot == f->nin ? "output" : "mask");
  if (ir_set_name(b->g, id, name, b->e) != FL_OK) b->rc = FL_ENOMEM;
  return id;
}

/* The rule of one fn, its gradients passed on to the fns of its inputs. */
static int step(gbuild *b, ag_fn *f, fnmap *fm) {
  const op_info *oi = op_info_of(f->op);
  int in[64], gin[64], out = -1, extra = -1, k;
  unsigned char need[64];
  gr_ctx c;
  char s1[64];
  /* only a backward with create_graph records an op without a rule (the
  ** gradient of embedding, gather, max_pool2d): reaching it is an error,
  ** not a zero */
  if (oi->grad == gr_none)
    return err_set(b->e, FL_EINVAL, "backward: %s has no derivative: it computed a "
                   "gradient (a backward with create_graph recorded it), and the "
                   "gradient of that gradient through it is not supported",
                   op_name(f->op));
  if (f->freed && oi->saves)
    return err_set(b->e, FL_EINVAL, "backward: %s's saved values were freed by an earlier "
                   "backward (pass retain_graph = true to the first backward to run "
                   "backward through the graph twice)", op_name(f->op));
  for (k = 0; k < f->nin + 2; k++)
    if (f->saved[k].st && f->saved[k].st->version != f->ver[k]) {
      char what[32];
      if (k < f->nin) snprintf(what, sizeof what, "input %d", k + 1);
      else snprintf(what, sizeof what, "%s", k == f->nin ? "output" : "mask");
      return err_set(b->e, FL_EINVAL, "backward: %s's %s %s%s was modified in place after %s "
                     "used it (version %llu, saved at %llu): its gradient needs the old "
                     "values; clone it first, or change it after backward",
                     op_name(f->op), what, dtype_name(f->saved[k].m.dtype),
                     meta_shape_str(&f->saved[k].m, s1, sizeof s1), op_name(f->op),
                     (unsigned long long)f->saved[k].st->version,
                     (unsigned long long)f->ver[k]);
    }
  for (k = 0; k < f->nin; k++) {
    in[k] = saved_node(b, f, k, fm);
    need[k] = f->next[k] != NULL;
  }
  out = saved_node(b, f, f->nin, fm);
  extra = saved_node(b, f, f->nin + 1, fm);
  memset(&c, 0, sizeof c);
  c.b = b;
  c.op = f->op;
  c.a = &f->attrs;
  c.nin = f->nin;
  c.in = in;
  c.in_meta = f->in_meta;
  c.out = out;
  c.out_meta = &f->out_meta;
  c.extra = extra;
  c.g = f->node;
  c.need = need;
  if (gr_apply(&c, gin, "backward") == FL_OK)
    for (k = 0; k < f->nin; k++) accumulate(b, f->next[k], gin[k]);
  return b->rc;
}

typedef struct built {
  ir_graph *g;
  ag_fn **who;          /* output j is the gradient of who[j] */
  int n;
} built;

int ag_add_into(fl_tensor *acc, const fl_tensor *v, ir_apply_fn apply, fl_err *e) {
  const fl_tensor *two[2] = {acc, v};
  fl_tensor sum = {0};
  op_attrs a;
  int rc;
  op_attrs_init(OP_ADD, &a);
  if ((rc = apply(OP_ADD, two, 2, &a, &sum, e)) != FL_OK) return rc;
  ten_release(acc);
  *acc = sum;
  return FL_OK;
}

/* Whether f is one of fl.grad's wanted fns (a wanted call's output stops
** the gradient there: its call does not run). */
static int wanted(const ag_fn *f, ag_fn *const *want, int nwant) {
  int k;
  for (k = 0; want && k < nwant; k++) if (want[k] == f) return 1;
  return 0;
}

/* The backward graph: outputs the gradients of the wanted fns (want
** NULL: the leaves and retained fns reached).  fm given (create_graph):
** the fns of its constants, and no DCE (node ids stay those of fm; the
** run skips what no output reads). */
static int build(walk *w, ag_fn *const *roots, const fl_tensor *const *seeds,
                 ag_fn *const *seed_fns, int n, ag_fn *const *want, int nwant, built *out,
                 fnmap *fm, fl_err *e) {
  gbuild b;
  int i, k, rc;
  memset(out, 0, sizeof *out);
  if ((rc = reach(w, roots, n, e)) != FL_OK) return rc;
  if (!(out->g = ir_new()) || !(out->who = calloc((size_t)w->n + (size_t)nwant + 1, sizeof *out->who)))
    return err_set(e, FL_ENOMEM, "backward: out of memory");
  gb_init(&b, out->g, e);
  for (k = 0; k < n; k++)
    if (roots[k]) {
      int s = gb_tensor(&b, seeds[k]);
      if (s >= 0 && ir_set_name(out->g, s, "gradient of the output", e) != FL_OK)
        return FL_ENOMEM;
      if (seed_fns) fm_set(&b, fm, s, seed_fns[k]);
      accumulate(&b, roots[k], s);
    }
  for (i = 0; i < w->n && !b.rc; i++) {
    ag_fn *f = w->fns[i];
    if (f->node < 0) continue;
    if (f->kind == AG_OP && (rc = step(&b, f, fm)) != FL_OK) return rc;
  }
  if (b.rc) return b.rc;
  for (i = 0; i < w->n; i++)
    if (w->fns[i]->kind == AG_CALL && w->fns[i]->node >= 0 && fm)
      return err_set(e, FL_EUNSUPPORTED, "backward: create_graph through a compiled function is "
                     "not supported yet (call backward() without create_graph, or run the "
                     "function uncompiled)");
  if (want) {
    for (k = 0; k < nwant; k++)
      if (want[k]->mark && want[k]->node >= 0) {
        if ((rc = ir_add_output(out->g, want[k]->node, e)) != FL_OK) return rc;
        out->who[out->n++] = want[k];
      }
    /* and the calls the gradient reaches: fl.grad goes on through them */
    for (i = 0; i < w->n; i++) {
      ag_fn *f = w->fns[i];
      if (f->kind != AG_CALL || f->node < 0 || wanted(f, want, nwant)) continue;
      if ((rc = ir_add_output(out->g, f->node, e)) != FL_OK) return rc;
      out->who[out->n++] = f;
    }
  } else {
    for (i = 0; i < w->n; i++) {
      ag_fn *f = w->fns[i];
      if (f->node < 0 || !(f->kind == AG_LEAF || f->kind == AG_CALL || f->retain)) continue;
      if ((rc = ir_add_output(out->g, f->node, e)) != FL_OK) return rc;
      out->who[out->n++] = f;
    }
  }
  /* values saved but not read this time (a rule skips the gradient of an
  ** input that needs none: linear's weight without x's gradient) go, and
  ** with them their hold on memory */
  if (!fm) {
    char *log = NULL;
    ir_graph *d = pass_optimize_rules(out->g, 1u << PASS_DCE, &log, e);
    free(log);
    if (!d) return e && e->code ? e->code : FL_ENOMEM;
    ir_free(out->g);
    out->g = d;
  }
  return FL_OK;
}

ir_graph *ag_backward_graph(ag_fn *const *roots, const fl_tensor *const *seeds, int n,
                            ag_fn ***who, fl_err *e) {
  walk w = {0};
  built bt;
  int rc = build(&w, roots, seeds, NULL, n, NULL, 0, &bt, NULL, e);
  unmark(&w);
  if (rc != FL_OK) { free(bt.who); ir_free(bt.g); return NULL; }
  if (who) *who = bt.who;
  else free(bt.who);
  return bt.g;
}

/* A gradient a leaf keeps must not share storage with anything else (the
** seed, a saved value): later changes to either would show in the other.
** The copy of a device tensor is the backend's (apply's contiguous makes
** a new buffer where the host cannot read). */
static int own(fl_tensor *t, ir_apply_fn apply, fl_err *e) {
  fl_tensor c = {0};
  int rc;
  if (!t->st || (t->st->refs == 1 && ten_is_contiguous(t) && t->offset == 0 &&
                 t->st->nbytes == (size_t)meta_numel(&t->m) * dtype_size(t->m.dtype)))
    return FL_OK;
  if (t->m.device != FL_DEV_CPU) {
    const fl_tensor *in[1];
    op_attrs a;
    in[0] = t;
    op_attrs_init(OP_CONTIGUOUS, &a);
    if ((rc = apply(OP_CONTIGUOUS, in, 1, &a, &c, e)) != FL_OK) return rc;
    if (c.st == t->st) {
      ten_release(&c);
      return err_set(e, FL_EUNSUPPORTED, "backward: the device's contiguous kept the storage "
                     "of a gradient a leaf must own");
    }
  } else {
    if ((rc = ten_uninit(&c, &t->m, e)) != FL_OK) return rc;
    if ((rc = ten_copy(&c, t, e)) != FL_OK) { ten_release(&c); return rc; }
  }
  ten_release(t);
  *t = c;
  return FL_OK;
}

/* create_graph: the op node i just ran records itself on the tape when an
** input has a fn and its result is floating (whatever the grad mode, as
** PyTorch's engine runs a create_graph backward in grad mode). */
static int record_node(const ir_node *nd, const fl_tensor *const *args, ag_fn **fns,
                       const fl_tensor *val, ag_fn **fn, fl_err *e) {
  ag_fn *next[64];
  int k, any = 0;
  for (k = 0; k < nd->nin; k++) {
    next[k] = nd->in[k] >= 0 ? fns[nd->in[k]] : NULL;
    if (next[k]) any = 1;
  }
  if (!any || !dtype_is_float(val->m.dtype)) return FL_OK;
  if (op_info_of(nd->op)->saves & GS_EXTRA)
    return err_set(e, FL_EINVAL, "backward with create_graph: %s in a gradient cannot be "
                   "recorded (its rule reads a value only its forward makes)", op_name(nd->op));
  if (!(*fn = ag_record(nd->op, &nd->attrs, args, nd->nin, next, val, NULL, e)))
    return e && e->code ? e->code : FL_ENOMEM;
  return FL_OK;
}

/* ir_run with a fn beside each value: constants get theirs from fm, ops
** record themselves.  Only what an output reads runs; values and fns go
** after their last use.  ofn[j]: a reference to output j's fn, or NULL. */
static int run_create(const ir_graph *g, const fnmap *fm, ir_apply_fn apply, fl_tensor *outs,
                      ag_fn **ofn, fl_err *e) {
  fl_tensor *vals;
  ag_fn **fns;
  int *uses;
  unsigned char *live;
  int i, k, rc = FL_OK, n = g->n ? g->n : 1;
  vals = calloc((size_t)n, sizeof *vals);
  fns = calloc((size_t)n, sizeof *fns);
  uses = calloc((size_t)n, sizeof *uses);
  live = calloc((size_t)n, 1);
  if (!vals || !fns || !uses || !live) {
    free(vals); free(fns); free(uses); free(live);
    return err_set(e, FL_ENOMEM, "backward: out of memory");
  }
  for (i = 0; i < g->nout; i++) { live[g->outputs[i]] = 1; uses[g->outputs[i]]++; }
  for (i = g->n - 1; i >= 0; i--) {
    const ir_node *nd = &g->nodes[i];
    if (!live[i] || nd->kind != IR_OP) continue;
    for (k = 0; k < nd->nin; k++)
      if (nd->in[k] >= 0) { live[nd->in[k]] = 1; uses[nd->in[k]]++; }
  }
  for (i = 0; i < g->n && rc == FL_OK; i++) {
    const ir_node *nd = &g->nodes[i];
    const fl_tensor *args[64];
    if (!live[i]) continue;
    switch (nd->kind) {
    case IR_INPUT:
      rc = err_set(e, FL_EINVAL, "backward: a backward graph has no inputs");
      break;
    case IR_PARAM: case IR_CONST:
      ten_share(&vals[i], &nd->value);
      if (i < fm->n && (fns[i] = fm->fn[i]) != NULL) ag_ref(fns[i]);
      break;
    case IR_OP:
      for (k = 0; k < nd->nin; k++) args[k] = nd->in[k] < 0 ? NULL : &vals[nd->in[k]];
      rc = apply(nd->op, args, nd->nin, &nd->attrs, &vals[i], e);
      if (rc == FL_OK) rc = record_node(nd, args, fns, &vals[i], &fns[i], e);
      for (k = 0; k < nd->nin && rc == FL_OK; k++)
        if (nd->in[k] >= 0 && --uses[nd->in[k]] == 0) {
          ten_release(&vals[nd->in[k]]);
          ag_unref(fns[nd->in[k]]);
          fns[nd->in[k]] = NULL;
        }
      break;
    }
  }
  if (rc == FL_OK)
    for (i = 0; i < g->nout; i++) {
      ten_share(&outs[i], &vals[g->outputs[i]]);
      if ((ofn[i] = fns[g->outputs[i]]) != NULL) ag_ref(ofn[i]);
    }
  for (i = 0; i < g->n; i++) { ten_release(&vals[i]); ag_unref(fns[i]); }
  free(vals);
  free(fns);
  free(uses);
  free(live);
  return rc;
}

/* A gradient whose fn is a leaf's own (a seed that is a leaf, passed
** through unchanged) becomes a view of it with a fn of its own: a leaf's
** fn belongs to that leaf's tensor alone. */
static int alias_leaf(fl_tensor *t, ag_fn **fn, ir_apply_fn apply, fl_err *e) {
  const fl_tensor *in[1];
  fl_tensor v = {0};
  op_attrs a;
  ag_fn *nf;
  int rc;
  if (!*fn || (*fn)->kind != AG_LEAF) return FL_OK;
  op_attrs_init(OP_RESHAPE, &a);
  a.ndims = t->m.ndim;
  memcpy(a.dims, t->m.shape, (size_t)t->m.ndim * sizeof *t->m.shape);
  in[0] = t;
  if ((rc = apply(OP_RESHAPE, in, 1, &a, &v, e)) != FL_OK) return rc;
  if (!(nf = ag_record(OP_RESHAPE, &a, in, 1, fn, &v, NULL, e))) {
    ten_release(&v);
    return e && e->code ? e->code : FL_ENOMEM;
  }
  ag_unref(*fn);
  *fn = nf;
  ten_release(t);
  *t = v;
  return FL_OK;
}

/* One backward graph from roots, stopping at calls: leaves accumulate,
** a call's gradient waits in its grad, the call in pl (holding a
** reference until it runs). */
static int pass(ag_fn *const *roots, const fl_tensor *const *seeds, ag_fn *const *seed_fns,
                int n, ag_fn *const *want, int nwant, fl_tensor *wout, ag_fn **wfn,
                int retain, int create, ir_apply_fn apply, walk *pl, fl_err *e) {
  walk w = {0};
  built bt;
  fnmap fm = {0};
  fl_tensor *res = NULL;
  ag_fn **rfn = NULL;
  int rc, i, j;
  rc = build(&w, roots, seeds, create ? seed_fns : NULL, n, want, nwant, &bt,
             create ? &fm : NULL, e);
  if (rc == FL_OK && (!(res = calloc((size_t)bt.n + 1, sizeof *res)) ||
                      (create && !(rfn = calloc((size_t)bt.n + 1, sizeof *rfn)))))
    rc = err_set(e, FL_ENOMEM, "backward: out of memory");
  if (rc == FL_OK)
    rc = create ? run_create(bt.g, &fm, apply, res, rfn, e) : ir_run(bt.g, apply, NULL, 0, res, e);
  ir_free(bt.g);                     /* its references to saved values go */
  bt.g = NULL;
  free(fm.fn);
  if (rc == FL_OK && create)
    for (j = 0; j < bt.n && rc == FL_OK; j++) rc = alias_leaf(&res[j], &rfn[j], apply, e);
  if (rc == FL_OK) {
    for (j = 0; j < bt.n && rc == FL_OK; j++) {
      ag_fn *f = bt.who[j];
      if (f->kind == AG_CALL && !wanted(f, want, nwant)) {
        if (!f->pending) {
          if ((rc = push(pl, f, e)) != FL_OK) break;
          ag_ref(f);
          f->pending = 1;
        }
        if (!f->grad.st) {
          f->grad = res[j];
          memset(&res[j], 0, sizeof res[j]);
        } else if ((rc = ag_add_into(&f->grad, &res[j], apply, e)) != FL_OK) {
          break;
        }
      } else if (want) {
        for (i = 0; i < nwant && rc == FL_OK; i++)
          if (want[i] == f && !wout[i].st) {
            ten_share(&wout[i], &res[j]);
            if (create && wfn && (wfn[i] = rfn[j]) != NULL) ag_ref(wfn[i]);
          } else if (want[i] == f) {
            /* a later pass's part (through a compiled function's call):
            ** summed, never with create_graph (calls refuse it) */
            rc = ag_add_into(&wout[i], &res[j], apply, e);
          }
      } else if (!f->grad.st) {
        if ((rc = own(&res[j], apply, e)) == FL_OK) {
          f->grad = res[j];
          memset(&res[j], 0, sizeof res[j]);
          ag_unref(f->grad_fn);
          f->grad_fn = NULL;
          if (create) { f->grad_fn = rfn[j]; rfn[j] = NULL; }
        }
      } else {
        /* out of place (PyTorch's grad = grad + new): with create_graph
        ** the sum is recorded too */
        const fl_tensor *two[2];
        fl_tensor sum = {0};
        ag_fn *next[2], *nf = NULL;
        op_attrs a;
        two[0] = &f->grad;
        two[1] = &res[j];
        op_attrs_init(OP_ADD, &a);
        if ((rc = apply(OP_ADD, two, 2, &a, &sum, e)) != FL_OK) break;
        next[0] = f->grad_fn;
        next[1] = create ? rfn[j] : NULL;
        if (create && (next[0] || next[1]) &&
            !(nf = ag_record(OP_ADD, &a, two, 2, next, &sum, NULL, e))) {
          ten_release(&sum);
          rc = e && e->code ? e->code : FL_ENOMEM;
          break;
        }
        ten_release(&f->grad);
        f->grad = sum;
        ag_unref(f->grad_fn);
        f->grad_fn = nf;
      }
    }
    /* only a fn that saved something is marked: one that saved nothing
    ** (add, sum, views) runs again, and its grad_fn must not say freed */
    if (!retain)
      for (i = 0; i < w.n; i++)
        if (w.fns[i]->kind == AG_OP && w.fns[i]->node >= 0) {
          release_saved(w.fns[i]);
          if (op_info_of(w.fns[i]->op)->saves) w.fns[i]->freed = 1;
        }
  }
  if (res) for (j = 0; j < bt.n; j++) ten_release(&res[j]);
  if (rfn) for (j = 0; j < bt.n; j++) ag_unref(rfn[j]);
  free(res);
  free(rfn);
  free(bt.who);
  ir_free(bt.g);
  unmark(&w);
  return rc;
}

/* The pending call created last: every fn whose gradient can reach it was
** created after it, so it has all of its gradient once those ran. */
static ag_fn *newest(walk *pl) {
  int i, best = 0;
  ag_fn *f;
  for (i = 1; i < pl->n; i++) if (pl->fns[i]->seq > pl->fns[best]->seq) best = i;
  f = pl->fns[best];
  pl->fns[best] = pl->fns[--pl->n];
  f->pending = 0;
  return f;
}

/* A call's gradient g for a leaf of its shape and dtype goes to the
** leaf's .grad here, moved, not through a pass: a pass's graph would hold
** it as a constant, and the leaf would keep a copy of it (own), a fresh
** buffer every step.  1 when done (*rc says how), 0: let a pass take it. */
static int to_leaf(ag_fn *leaf, fl_tensor *g, ir_apply_fn apply, int *rc, fl_err *e) {
  if (leaf->kind != AG_LEAF || leaf->retain || g->m.dtype != leaf->out_meta.dtype ||
      !meta_same_shape(&g->m, &leaf->out_meta))
    return 0;
  if (!leaf->grad.st) {
    if ((*rc = own(g, apply, e)) == FL_OK) {
      leaf->grad = *g;
      memset(g, 0, sizeof *g);
    }
  } else {
    *rc = ag_add_into(&leaf->grad, g, apply, e);
  }
  if (*rc == FL_OK) {
    ag_unref(leaf->grad_fn);
    leaf->grad_fn = NULL;
  }
  return 1;
}

int ag_backward(ag_fn *const *roots, const fl_tensor *const *seeds, ag_fn *const *seed_fns,
                int n, ag_fn *const *want, int nwant, fl_tensor *wout, ag_fn **wfn,
                int retain, int create, ir_apply_fn apply, fl_err *e) {
  walk pl = {0};
  int rc = pass(roots, seeds, seed_fns, n, want, nwant, wout, wfn, retain, create, apply, &pl, e);
  /* the calls reached, newest first: each runs its program on the
  ** gradient that reached it, and the backward goes on from its inputs */
  while (rc == FL_OK && pl.n > 0) {
    ag_fn *f = newest(&pl), **r = NULL;
    fl_tensor *gin = NULL, g = f->grad;
    const fl_tensor **sd = NULL;
    int k, m = 0;
    memset(&f->grad, 0, sizeof f->grad);
    if (f->freed)
      rc = err_set(e, FL_EINVAL, "backward: %s's saved values were freed by an earlier backward "
                   "(pass retain_graph = true to the first backward to run backward through it "
                   "again)", f->call.name);
    else if (!(gin = calloc((size_t)f->nin + 1, sizeof *gin)) ||
             !(r = calloc((size_t)f->nin + 1, sizeof *r)) ||
             !(sd = calloc((size_t)f->nin + 1, sizeof *sd)))
      rc = err_set(e, FL_ENOMEM, "backward: out of memory");
    else
      rc = f->call.call(f->call.ctx, &g, gin, apply, e);
    for (k = 0; rc == FL_OK && k < f->nin; k++)
      if (f->next[k] && gin[k].st) {
        if (!create && !want && to_leaf(f->next[k], &gin[k], apply, &rc, e)) continue;
        r[m] = f->next[k];
        sd[m++] = &gin[k];
      }
    if (rc == FL_OK && !retain) { release_saved(f); f->freed = 1; }
    if (rc == FL_OK && m > 0)   /* fl.grad's wanted leaves collect from here on too */
      rc = pass(r, sd, NULL, m, want, nwant, wout, wfn, retain, 0, apply, &pl, e);
    for (k = 0; gin && k < f->nin; k++) ten_release(&gin[k]);
    ten_release(&g);
    free(gin); free(r); free(sd);
    ag_unref(f);
  }
  while (pl.n > 0) {                   /* after an error: what still waits */
    ag_fn *f = newest(&pl);
    ten_release(&f->grad);
    ag_unref(f);
  }
  free(pl.fns);
  return rc;
}
