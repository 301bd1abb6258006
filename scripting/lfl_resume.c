/*
** lfl_resume.c -- resuming: later calls of a compiled function replay
** the segments its first call recorded.
**
** RESUMING (fl.compile of a function with graph breaks; Dynamo's resume
** functions as far as Lua allows).  Lua cannot jump into the middle of a
** function, so the Lua body runs on every call; what must not run again is
** the tracing.  A trace given a PLAN (fl._resume_new) records each
** segment it flushes as a record: the segment's graph (its nodes in the
** order they were made: the tape), where each graph input came from (the
** segment and output index of its value), what ended it (the break's
** name, or the end of the call), and the compiled program the executor
** made for it.  Records form a tree: a record's children are the variants
** of the next segment, its siblings the other variants of itself; the
** roots are the variants of the first segment, one per argument shapes.
**
** A later call (lfl_resume_call, from the compiled callable) picks the
** root whose argument dtypes/shapes/devices equal the arguments (the
** guards of the first segment) and runs the Lua body in REPLAY mode: each
** op dispatched is compared with the record's next node (same op, same
** attributes, same input node ids; a tensor from outside the segment
** must be the same param storage (or a tensor of equal values: one the
** function makes each call), an equal constant, or the value of the
** same output of the same earlier segment with the same dtype and shape;
** after the first break a Lua number is an input of its dtype)
** and gets a lazy tensor carrying the recorded metadata: no IR is built,
** no shape is inferred, nothing is hashed.  These comparisons are the
** segment's guards.  At a break (or the end) the record's program runs on
** the collected inputs and the lazies take their values; the next
** segment replays the first child.  A comparison that fails tries the
** siblings with the same prefix (the other branch of a data-dependent
** if); when none matches, the trace DIVERGES: the matched prefix is
** rebuilt as a graph and recording goes on from there (a new variant,
** counted as a recompile with its reason), as on the first call.
**
** Which lazies a flush computes: recording keeps those reachable after a
** full collection (the graph outputs).  A replayed flush does not
** collect (it would cost more than the segment); it computes the
** recorded outputs, and any other lazy of the segment still in the
** table is taken for garbage but kept computable: it is an ORPHAN,
** remembered with the segment's graph and input values, and computed by
** the eager kernels if Lua ever uses it (lfl_trace_resolve).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lfl.h"
#include "cpu/eager.h"
#include "graph/ir.h"
#include "cpu/backend.h"
#include "lfl_trace_impl.h"

/* ---- replaying a recorded segment ---------------------------------------- */

static int meta_eq(const fl_meta *a, const fl_meta *b) {
  int d;
  if (a->dtype != b->dtype || a->device != b->device || a->ndim != b->ndim ||
      a->wrapped != b->wrapped)
    return 0;
  for (d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

static int attrs_eq(const op_attrs *a, const op_attrs *b) {
  return a->ndims == b->ndims && a->keepdim == b->keepdim && a->dtype == b->dtype &&
         memcmp(a->dims, b->dims, sizeof a->dims) == 0 &&
         memcmp(a->i, b->i, sizeof a->i) == 0 && memcmp(a->f, b->f, sizeof a->f) == 0;
}

/* The n elements of a and b (same dtype) are equal bit for bit. */
static int elems_eq(const fl_tensor *a, const fl_tensor *b, int64_t n) {
  int64_t k;
  for (k = 0; k < n; k++) {
    if (a->m.dtype == FL_I64) {
      if (dtype_load_i64(FL_I64, ten_elem_ptr(a, k)) != dtype_load_i64(FL_I64, ten_elem_ptr(b, k)))
        return 0;
    } else {
      double x = ten_get(a, k), y = ten_get(b, k);
      if (memcmp(&x, &y, sizeof x) != 0) return 0;
    }
  }
  return 1;
}

/* Same values, bit for bit (constants are scalars Lua passed). */
static int values_eq(const fl_tensor *a, const fl_tensor *b) {
  return meta_eq(&a->m, &b->m) && elems_eq(a, b, meta_numel(&a->m));
}

static int same_view(const fl_tensor *a, const fl_tensor *b) {
  int d;
  if (a->st != b->st || a->offset != b->offset || !meta_eq(&a->m, &b->m)) return 0;
  for (d = 0; d < a->m.ndim; d++)
    if (a->stride[d] != b->stride[d]) return 0;
  return 1;
}

/* Same dtype, shape and values (CPU tensors: a tensor the function makes
** on each call, fl.arange(T) or a mask, matches the one recorded when
** its values do; the recorded one, equal, is what the program reads). */
static int same_values(const fl_tensor *a, const fl_tensor *b) {
  int64_t n = meta_numel(&a->m);
  if (!meta_eq(&a->m, &b->m) || a->m.device != FL_DEV_CPU || !a->st || !b->st) return 0;
  if (ten_is_contiguous(a) && ten_is_contiguous(b))
    return memcmp(ten_data(a), ten_data(b), (size_t)n * dtype_size(a->m.dtype)) == 0;
  return elems_eq(a, b, n);
}

/* Node i of record a's graph equals node i of b's. */
static int node_eq(const segrec *a, const segrec *b, int i) {
  const ir_node *x = &a->g->nodes[i], *y = &b->g->nodes[i];
  int k;
  if (x->kind != y->kind || !meta_eq(&x->meta, &y->meta)) return 0;
  switch (x->kind) {
  case IR_INPUT:
    return x->index == y->index && a->src[2 * x->index] == b->src[2 * y->index] &&
           a->src[2 * x->index + 1] == b->src[2 * y->index + 1];
  case IR_PARAM: return same_view(&x->value, &y->value);
  case IR_CONST: return values_eq(&x->value, &y->value);
  case IR_OP:
    if (x->op != y->op || x->nin != y->nin || !attrs_eq(&x->attrs, &y->attrs)) return 0;
    for (k = 0; k < x->nin; k++)
      if (x->in[k] != y->in[k]) return 0;
    return 1;
  }
  return 0;
}

/* b can stand for a over a's first n nodes (and, for roots, the same
** kinds of arguments). */
static int prefix_eq(const segrec *a, const segrec *b, int n) {
  int i;
  if (b->g->n < n) return 0;
  if (a->parent < 0 && (a->nargs != b->nargs || strcmp(a->kinds, b->kinds) != 0)) return 0;
  for (i = 0; i < n; i++)
    if (!node_eq(a, b, i)) return 0;
  return 1;
}

static int step_ok(const lfl_trace *tr, const segrec *r, const step *s) {
  const ir_node *nd;
  int k;
  if (s->kind == STEP_END)
    return r->g->n == tr->cur && strncmp(r->what, s->what, sizeof r->what - 1) == 0;
  if (tr->cur >= r->g->n) return 0;
  nd = &r->g->nodes[tr->cur];
  switch (s->kind) {
  case STEP_CONST: return nd->kind == IR_CONST && values_eq(&nd->value, s->t);
  case STEP_PARAM:
    return nd->kind == IR_PARAM && (same_view(&nd->value, s->t) || same_values(&nd->value, s->t));
  case STEP_INPUT: {
    const lfl_ud *u = (const lfl_ud *)s->t;
    return nd->kind == IR_INPUT && meta_eq(&nd->meta, &s->t->m) &&
           r->src[2 * nd->index] == u->seg && r->src[2 * nd->index + 1] == u->out;
  }
  case STEP_SCALAR:
    return nd->kind == IR_INPUT && meta_eq(&nd->meta, &s->t->m) && r->src[2 * nd->index] == -2;
  case STEP_OP:
    if (nd->kind != IR_OP || nd->op != s->op || nd->nin != s->nin || !attrs_eq(&nd->attrs, s->a))
      return 0;
    for (k = 0; k < s->nin; k++)
      if (nd->in[k] != s->ids[k]) return 0;
    return 1;
  }
  return 0;
}

/* The record (the current one, else a sibling with the same prefix) whose
** next step is s; switches tr->rec to it.  0 when none has it. */
int lfl_resume_pick(lfl_trace *tr, const step *s) {
  const resume_plan *p = tr->plan;
  const segrec *r = &p->r[tr->rec];
  int k;
  if (step_ok(tr, r, s)) return 1;
  for (k = r->parent >= 0 ? p->r[r->parent].child : p->root; k >= 0; k = p->r[k].sibling) {
    if (k == tr->rec || !prefix_eq(r, &p->r[k], tr->cur) || !step_ok(tr, &p->r[k], s)) continue;
    tr->rec = k;
    return 1;
  }
  return 0;
}

/* "add", "an input float32[64]", "the end of the call" */
static void describe_node(const ir_graph *g, int i, char *buf, size_t n) {
  char ty[96];
  if (i >= g->n) { snprintf(buf, n, "no more ops"); return; }
  ir_type_str(g, i, ty, sizeof ty);
  switch (g->nodes[i].kind) {
  case IR_INPUT: snprintf(buf, n, "an input %s", ty); break;
  case IR_PARAM: snprintf(buf, n, "the tensor %s %s", g->nodes[i].name ? g->nodes[i].name : "", ty); break;
  case IR_CONST: snprintf(buf, n, "the constant %.17g", ten_get(&g->nodes[i].value, 0)); break;
  case IR_OP: snprintf(buf, n, "%s -> %s", op_name(g->nodes[i].op), ty); break;
  }
}

static void describe_step(const step *s, char *buf, size_t n) {
  switch (s->kind) {
  case STEP_CONST: snprintf(buf, n, "the constant %.17g", ten_get(s->t, 0)); break;
  case STEP_PARAM: snprintf(buf, n, "another tensor from outside, with other values"); break;
  case STEP_INPUT: snprintf(buf, n, "a value from an earlier segment"); break;
  case STEP_SCALAR: snprintf(buf, n, "a number (%s)", dtype_name(s->t->m.dtype)); break;
  case STEP_OP: snprintf(buf, n, "%s", op_name(s->op)); break;
  case STEP_END:
    if (s->what[0]) snprintf(buf, n, "a break at %s()", s->what);
    else snprintf(buf, n, "the end of the call");
    break;
  }
}


/* The plan's diverge hook hears why a replay had to record. */
static void tell_diverge(lua_State *L, const char *reason) {
  lfl_trace_push_active(L);
  lua_getiuservalue(L, -1, UV_PLAN);
  lua_getiuservalue(L, -1, PUV_HOOKS);
  if (lua_getfield(L, -1, "diverge") == LUA_TFUNCTION) {
    lua_pushstring(L, reason);
    lua_call(L, 1, 0);
  } else {
    lua_pop(L, 1);
  }
  lua_pop(L, 3);
}

/* The replay does not match s: rebuild the matched prefix as the graph
** being recorded, record from here on, and tell the Lua half why (a
** recompile).  Returns with tr->rec = -1. */
void lfl_resume_diverge(lua_State *L, lfl_trace *tr, const step *s) {
  const segrec *r = &tr->plan->r[tr->rec];
  const ir_graph *src = r->g;
  ir_graph *g;
  char want[160], got[160], where[256], reason[768];
  fl_err e;
  int i, id = 0;
  if (tr->cur == src->n && r->what[0]) snprintf(want, sizeof want, "a break at %s()", r->what);
  else if (tr->cur == src->n) snprintf(want, sizeof want, "the end of the call");
  else describe_node(src, tr->cur, want, sizeof want);
  describe_step(s, got, sizeof got);
  lfl_trace_where(L, where, sizeof where);
  snprintf(reason, sizeof reason, "segment %d differs at step %d: the recording has %s, this call %s (%s)",
           tr->seg + 1, tr->cur + 1, want, got, where[0] ? where : "?");
  g = ir_new();
  if (!g) luaL_error(L, "capture: out of memory");
  err_clear(&e);
  for (i = 0; i < tr->cur && id >= 0; i++) {
    const ir_node *nd = &src->nodes[i];
    switch (nd->kind) {
    case IR_INPUT:
      /* static: a replayed call reads plain sizes, so its ops carry
      ** concrete attributes (symbols would not match them) */
      id = ir_add_input(g, &nd->meta, nd->name, &e);
      if (id >= 0) g->nodes[id].meta.wrapped = nd->meta.wrapped;
      break;
    case IR_PARAM: id = ir_add_param(g, &nd->value, nd->name, &e); break;
    case IR_CONST: id = ir_add_const(g, &nd->value, &e); break;
    case IR_OP:
      id = ir_add_op(g, nd->op, nd->in, nd->nin, &nd->attrs, nd->where, nd->scope, &e);
      break;
    }
    /* what a compiled training segment differentiates with respect to */
    if (id >= 0) g->nodes[id].requires_grad = nd->requires_grad;
  }
  if (id < 0) {
    ir_free(g);
    lfl_raise(L, "capture", &e);
  }
  tr->g = g;
  tr->rec = -1;
  tr->diverged = 1;
  tell_diverge(L, reason);
}

/* Replaying: leaf t (kind STEP_CONST/PARAM/INPUT) is the next node?
** Returns its id, or -1 after diverging (the caller records it). */
int lfl_resume_leaf(lua_State *L, lfl_trace *tr, const fl_tensor *t, int kind) {
  step s;
  memset(&s, 0, sizeof s);
  s.kind = kind;
  s.t = t;
  if (lfl_resume_pick(tr, &s)) return tr->cur++;
  lfl_resume_diverge(L, tr, &s);
  return -1;
}

/* ---- records, and the flush of a replayed segment ----------------------- */

/* Keep the value at idx alive in the plan at planidx; its index there. */
static int anchor(lua_State *L, int planidx, int idx) {
  int k;
  idx = lua_absindex(L, idx);
  lua_getiuservalue(L, planidx, PUV_ANCHORS);
  k = (int)luaL_len(L, -1) + 1;
  lua_pushvalue(L, idx);
  lua_rawseti(L, -2, k);
  lua_pop(L, 1);
  return k;
}

/* Record the segment just flushed (graph at gidx, input sources src, the
** executor's program and runner at progidx/runidx) as the next variant
** after tr->parent; returns its index. */
int lfl_resume_add_record(lua_State *L, lfl_trace *tr, int gidx, const int *src,
                      const char *what, int progidx, int runidx) {
  resume_plan *p = tr->plan;
  const ir_graph *g = lfl_checkgraph(L, gidx);
  segrec *r;
  int planidx, i;
  lfl_trace_push_active(L);
  lua_getiuservalue(L, -1, UV_PLAN);
  planidx = lua_gettop(L);
  if (p->n == p->cap) {
    int cap = p->cap ? p->cap * 2 : 8;
    segrec *nr = realloc(p->r, (size_t)cap * sizeof *nr);
    if (!nr) return luaL_error(L, "capture: out of memory");
    p->r = nr;
    p->cap = cap;
  }
  r = &p->r[p->n];
  memset(r, 0, sizeof *r);
  r->src = malloc((size_t)(2 * g->ninputs + 1) * sizeof *r->src);
  r->isout = calloc((size_t)g->n + 1, 1);
  if (!r->src || !r->isout) {
    free(r->src);
    free(r->isout);
    return luaL_error(L, "capture: out of memory");
  }
  memcpy(r->src, src, (size_t)(2 * g->ninputs) * sizeof *src);
  for (i = 0; i < g->nout; i++) r->isout[g->outputs[i]] = 1;
  r->g = (ir_graph *)g;
  r->ganchor = anchor(L, planidx, gidx);
  snprintf(r->what, sizeof r->what, "%s", what ? what : "");
  if (!lua_isnil(L, progidx)) {
    anchor(L, planidx, progidx);
    r->pr = lfl_toanyprogram(L, progidx);
  }
  if (!lua_isnil(L, runidx)) r->runner = anchor(L, planidx, runidx);
  r->parent = tr->parent;
  r->child = -1;
  if (tr->parent < 0) {
    r->nargs = tr->nargs;
    memcpy(r->kinds, tr->kinds, sizeof r->kinds);
    r->sibling = p->root;
    p->root = p->n;
  } else {
    r->sibling = p->r[tr->parent].child;
    p->r[tr->parent].child = p->n;
  }
  lua_pop(L, 2);
  return p->n++;
}

static const char orphan_key = 'o';

/* registry[&orphan_key]: {[lightuserdata lazy] = frame}, frame = {Graph,
** input values...} of the replayed segment the lazy was left out of. */
static void push_orphans(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &orphan_key) == LUA_TTABLE) return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &orphan_key);
}

/* Flush a segment that matched record tr->rec to its end: run the
** record's program on the inputs collected, give the lazies their values
** (the others become orphans), then go on with the record's first next
** variant. */
void lfl_resume_flush(lua_State *L, lfl_trace *tr, const char *what) {
  resume_plan *p = tr->plan;
  const segrec *r = &p->r[tr->rec];
  const ir_graph *g = r->g;
  const fl_tensor *small_in[64], **inputs = small_in;
  fl_tensor small_out[64], *outs = small_out;
  ag_fn **ags = NULL;           /* a runner's outputs' histories */
  int tidx, lazyidx, i, frame = 0, slots = 0, rc = FL_OK, ri = tr->rec;
  size_t fresh = 0;
  fl_err e;
  lfl_trace_push_active(L);
  tidx = lua_gettop(L);
  lua_getiuservalue(L, tidx, UV_LAZY);
  lazyidx = lua_gettop(L);
  if (g->ninputs > 64)
    inputs = lua_newuserdatauv(L, (size_t)g->ninputs * sizeof *inputs, 0);
  for (i = 0; i < tr->next; i++)
    if (tr->ext[i].input) inputs[g->nodes[tr->ext[i].node].index] = &tr->ext[i].val;
  /* lazies of nodes that are no output: garbage at the recording, kept
  ** computable (each stays on the stack while it is registered) */
  for (i = 0; i < tr->nmaybe && !frame; i++) {
    const lfl_ud *u;
    if (r->isout[tr->maybe[i]]) continue;
    lua_rawgeti(L, lazyidx, tr->maybe[i]);
    u = (const lfl_ud *)lfl_totensor(L, -1);
    frame = u && u->node == tr->maybe[i] && u->trace == tr->id && u->seg == tr->seg;
    lua_pop(L, 1);
  }
  if (frame) {
    int k;
    push_orphans(L);
    lua_createtable(L, g->ninputs + 1, 0);
    lua_getiuservalue(L, tidx, UV_PLAN);
    lua_getiuservalue(L, -1, PUV_ANCHORS);
    lua_rawgeti(L, -1, r->ganchor);
    lua_rawseti(L, -4, 1);
    lua_pop(L, 2);
    for (k = 0; k < g->ninputs; k++) {
      ten_share(lfl_newtensor(L), inputs[k]);
      lua_rawseti(L, -2, k + 2);
    }
    frame = lua_gettop(L);
    for (i = 0; i < tr->nmaybe; i++) {
      int id = tr->maybe[i];
      const lfl_ud *u;
      if (r->isout[id]) continue;
      lua_rawgeti(L, lazyidx, id);
      u = (const lfl_ud *)lfl_totensor(L, -1);
      if (u && u->node == id && u->trace == tr->id && u->seg == tr->seg) {
        lua_pushvalue(L, frame);
        lua_rawsetp(L, frame - 1, u);
      }
      lua_pop(L, 1);
    }
  }
  if (g->nout > 64 || (r->runner && !r->pr)) {
    outs = lfl_newslots(L, g->nout);
    slots = 1;
  } else {
    memset(outs, 0, (size_t)g->nout * sizeof *outs);
  }
  err_clear(&e);
  if (r->pr) {
    rc = exec_program_run((exec_program *)r->pr, inputs, g->ninputs, outs, &e);
  } else if (r->runner) {
    lua_getiuservalue(L, tidx, UV_PLAN);
    lua_getiuservalue(L, -1, PUV_ANCHORS);
    lua_rawgeti(L, -1, r->runner);
    ags = lfl_trace_histories(L, g->nout);
    lua_insert(L, -4);                       /* below the runner's frame: kept to the end */
    lfl_trace_push_inputs(L, tr, g);
    lua_call(L, 1, 1);
    for (i = 0; i < g->nout; i++) {
      fl_tensor *t;
      lua_rawgeti(L, -1, i + 1);
      t = lfl_totensor(L, -1);
      if (!t || lfl_islazy(t))
        luaL_error(L, "capture: the segment returned no tensor #%d", i + 1);
      ten_share(&outs[i], t);
      lfl_trace_take_history(ags, i, t);
      lua_pop(L, 1);
    }
    lua_pop(L, 3);
    r = &p->r[ri];
  } else {
    rc = lfl_graph_run_eager(g, inputs, g->ninputs, outs, &e);
  }
  if (rc != FL_OK) {
    if (!slots)
      for (i = 0; i < g->nout; i++) ten_release(&outs[i]);
    lfl_raise(L, "compiled", &e);
  }
  for (i = 0; i < g->nout; i++) {
    fl_tensor *t, *o = &outs[i];
    lua_rawgeti(L, lazyidx, g->outputs[i]);
    t = lfl_totensor(L, -1);
    if (t && lfl_islazy(t) && lfl_ud_of(t)->trace == tr->id && lfl_ud_of(t)->seg == tr->seg) {
      int wrapped = t->m.wrapped;
      ten_share(t, o);
      t->m.wrapped = wrapped;
      lfl_ud_of(t)->node = -1;
      lfl_ud_of(t)->out = i;
      if (o->st && o->st->refs == 2) fresh += o->st->nbytes;
      lfl_trace_give_history(ags, i, t);
    }
    lfl_trace_give_history(ags, i, NULL);      /* no lazy took it */
    lua_pop(L, 1);
  }
  lfl_trace_alias_views(L, tr, g, lazyidx, outs);
  for (i = 0; i < g->nout; i++) ten_release(&outs[i]);
  p->segs++;
  tr->parent = ri;
  tr->rec = what ? r->child : -1;
  if (what) {
    lfl_trace_new_segment(L, tr, tidx);
  } else {                                   /* the call is over */
    lfl_trace_clear_externals(tr);
    tr->seg++;
  }
  lua_settop(L, tidx - 1);
  lfl_account(L, fresh);
  if (what && tr->rec < 0) {
    /* this path was never recorded past this break (an error cut the
    ** call that first came here): record the rest, as a recompile */
    char reason[128];
    snprintf(reason, sizeof reason, "segment %d: not recorded after the break at %s() before",
             tr->seg + 1, what);
    tr->diverged = 1;
    tell_diverge(L, reason);
  }
}

/* ---- orphans -------------------------------------------------------------- */

int lfl_trace_resolve(lua_State *L, fl_tensor *t) {
  lfl_ud *u = lfl_ud_of(t);
  const ir_graph *g;
  ir_graph *c;
  const fl_tensor **in;
  fl_tensor out;
  int top = lua_gettop(L), frame, k, wrapped;
  fl_err e;
  if (!lfl_islazy(t)) return 1;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &orphan_key) != LUA_TTABLE ||
      lua_rawgetp(L, -1, t) != LUA_TTABLE) {
    lua_settop(L, top);
    return 0;
  }
  frame = lua_gettop(L);
  lua_rawgeti(L, frame, 1);
  g = lfl_checkgraph(L, -1);
  c = ir_clone(g);
  if (!c) return luaL_error(L, "capture: out of memory");
  lfl_pushgraph(L, c);                       /* owns c */
  c->nout = 0;
  err_clear(&e);
  if (ir_add_output(c, u->node, &e) != FL_OK) lfl_raise(L, "capture", &e);
  in = lua_newuserdatauv(L, (size_t)(g->ninputs + 1) * sizeof *in, 0);
  for (k = 0; k < g->ninputs; k++) {         /* the frame keeps them alive */
    lua_rawgeti(L, frame, k + 2);
    in[k] = lfl_totensor(L, -1);
    lua_pop(L, 1);
  }
  memset(&out, 0, sizeof out);
  if (lfl_graph_run_eager(c, in, g->ninputs, &out, &e) != FL_OK) lfl_raise(L, "graph", &e);
  wrapped = t->m.wrapped;
  ten_share(t, &out);
  ten_release(&out);
  t->m.wrapped = wrapped;
  u->node = -1;
  u->trace = 0;                              /* from now on a plain tensor */
  lua_pushnil(L);
  lua_rawsetp(L, frame - 1, t);
  lua_settop(L, top);
  if (t->st && t->st->refs == 1) lfl_account(L, t->st->nbytes);
  return 1;
}

void lfl_trace_forget(lua_State *L, fl_tensor *t) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &orphan_key) == LUA_TTABLE) {
    lua_pushnil(L);
    lua_rawsetp(L, -2, t);
  }
  lua_pop(L, 1);
}

/* ---- the plan of a compiled function ---------------------------------------- */

/* fl._resume_new{exec=, diverge=, breaks=, fullgraph=} -> plan.  exec is
** the segment executor, diverge(reason) hears of each replay that had to
** record, breaks(list) of the breaks such a recording met. */
static int rp_new(lua_State *L) {
  resume_plan *p;
  luaL_checktype(L, 1, LUA_TTABLE);
  p = (resume_plan *)lua_newuserdatauv(L, sizeof *p, PUV_COUNT);
  memset(p, 0, sizeof *p);
  p->root = -1;
  luaL_setmetatable(L, RESUME_TYPE);
  lua_getfield(L, 1, "fullgraph");
  p->fullgraph = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (getenv("FUSELAB_DEBUG")) p->debug = atoi(getenv("FUSELAB_DEBUG"));
  lua_newtable(L);
  lua_setiuservalue(L, -2, PUV_ANCHORS);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, PUV_HOOKS);
  return 1;
}

static int rp_gc(lua_State *L) {
  resume_plan *p = (resume_plan *)luaL_checkudata(L, 1, RESUME_TYPE);
  int i;
  for (i = 0; i < p->n; i++) {
    free(p->r[i].src);
    free(p->r[i].isout);
  }
  free(p->r);
  free(p->ext_cache);
  free(p->maybe_cache);
  p->ext_cache = NULL;
  p->maybe_cache = NULL;
  p->r = NULL;
  p->n = p->cap = 0;
  p->root = -1;
  p->enabled = 0;
  return 0;
}

/* fl._resume_enable(plan, on) */
static int rp_enable(lua_State *L) {
  resume_plan *p = (resume_plan *)luaL_checkudata(L, 1, RESUME_TYPE);
  p->enabled = lua_toboolean(L, 2);
  return 0;
}

/* fl._resume_counts(plan) -> segments run from records, calls replayed,
** records */
static int rp_counts(lua_State *L) {
  resume_plan *p = (resume_plan *)luaL_checkudata(L, 1, RESUME_TYPE);
  lua_pushinteger(L, p->segs);
  lua_pushinteger(L, p->calls);
  lua_pushinteger(L, p->n);
  return 3;
}

int lfl_resume_enabled(lua_State *L, int idx) {
  resume_plan *p = (resume_plan *)luaL_testudata(L, idx, RESUME_TYPE);
  return p && p->enabled && p->root >= 0;
}

/* Root r takes the arguments at base (kinds given)?  Else why (when why
** is not NULL) says the first difference, like the entries' guards. */
static int root_ok(const segrec *r, lua_State *L, int base, int nargs, const char *kinds,
                   char *why, size_t wn, int *argi, int *dim) {
  int i, k = 0, d;
  if (r->nargs != nargs) {
    if (why) snprintf(why, wn, "called with %d argument(s), captured with %d", nargs, r->nargs);
    return 0;
  }
  for (i = 0; i < nargs; i++) {
    const ir_node *nd;
    const fl_tensor *t;
    const char *name;
    if (kinds[i] != r->kinds[i]) {
      if (why) snprintf(why, wn, "argument %d: expected %s, got %s", i + 1,
                        r->kinds[i] == 't' ? "a tensor" : "a value other than a tensor",
                        lfl_typename(L, base + i));
      return 0;
    }
    if (kinds[i] != 't') continue;
    nd = &r->g->nodes[k++];
    t = lfl_totensor(L, base + i);
    if (meta_eq(&nd->meta, &t->m)) continue;
    if (!why) return 0;
    name = nd->name ? nd->name : "arg";
    if (t->m.dtype != nd->meta.dtype)
      snprintf(why, wn, "%s.dtype: expected %s, got %s", name, dtype_name(nd->meta.dtype),
               dtype_name(t->m.dtype));
    else if (t->m.device != nd->meta.device)
      snprintf(why, wn, "%s.device: expected %s, got %s", name,
               nd->meta.device == FL_DEV_CPU ? "cpu" : "cuda", t->m.device == FL_DEV_CPU ? "cpu" : "cuda");
    else if (t->m.ndim != nd->meta.ndim)
      snprintf(why, wn, "%s.dim(): expected %d, got %d", name, nd->meta.ndim, t->m.ndim);
    else
      for (d = 0; d < t->m.ndim; d++)
        if (t->m.shape[d] != nd->meta.shape[d]) {
          snprintf(why, wn, "%s.shape[%d]: expected %lld, got %lld", name, d + 1,
                   (long long)nd->meta.shape[d], (long long)t->m.shape[d]);
          *argi = i + 1;
          *dim = d + 1;
          break;
        }
    return 0;
  }
  return 1;
}

/* Tracebacks like compile.lua's xpcall(fn, debug.traceback). */
static int msgh(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) return 1;
  luaL_traceback(L, L, msg, 1);
  return 1;
}

int lfl_resume_call(lua_State *L, int pidx, int fnidx, int base, int nargs,
                    char *why, size_t wn, int *argi, int *dim) {
  resume_plan *p = (resume_plan *)luaL_checkudata(L, pidx, RESUME_TYPE);
  char kinds[MAXARGS + 1];
  lfl_trace *tr;
  int i, k, root, hidx, tidx, fidx, nres, first = 1;
  long segs0 = p->segs;
  *argi = *dim = 0;
  why[0] = '\0';
  pidx = lua_absindex(L, pidx);
  fnidx = lua_absindex(L, fnidx);
  if (nargs > MAXARGS || lfl_trace_active(L)) {
    snprintf(why, wn, nargs > MAXARGS ? "too many arguments" : "called inside a trace");
    return -1;
  }
  for (i = 0; i < nargs; i++) {
    fl_tensor *t = lfl_totensor(L, base + i);
    if (t && lfl_islazy(t) && !lfl_trace_resolve(L, t)) t = NULL;
    kinds[i] = t ? 't' : 'v';
  }
  kinds[nargs] = '\0';
  for (root = p->root; root >= 0; root = p->r[root].sibling) {
    if (root_ok(&p->r[root], L, base, nargs, kinds, first ? why : NULL, wn, argi, dim)) break;
    first = 0;
  }
  if (root < 0) return -1;
  p->calls++;
  lua_pushcfunction(L, msgh);
  hidx = lua_gettop(L);
  lua_getiuservalue(L, pidx, PUV_HOOKS);
  lua_getfield(L, -1, "exec");
  lua_getiuservalue(L, pidx, PUV_SPARE);
  {
    lfl_trace *sp = (lfl_trace *)luaL_testudata(L, -1, TRACE_TYPE);
    int spare = sp && !sp->active ? lua_gettop(L) : 0;
    tr = lfl_trace_begin(L, MODE_RUN, p->fullgraph, lua_gettop(L) - 1, pidx, root, spare);
  }
  tidx = lua_gettop(L);
  if (!lua_rawequal(L, tidx, tidx - 1)) {   /* the next call reuses it */
    lua_pushvalue(L, tidx);
    lua_setiuservalue(L, pidx, PUV_SPARE);
  }
  tr->nargs = nargs;
  memcpy(tr->kinds, kinds, sizeof kinds);
  luaL_checkstack(L, nargs + 8, "compiled: too many arguments");
  lua_pushvalue(L, fnidx);
  fidx = lua_gettop(L);
  for (i = 0, k = 0; i < nargs; i++) {
    fl_tensor *x;
    if (kinds[i] != 't') {
      lua_pushvalue(L, base + i);
      continue;
    }
    x = lfl_totensor(L, base + i);
    if (tr->next == tr->extcap) {
      int cap = tr->extcap ? tr->extcap * 2 : 32;
      ext *ne = realloc(tr->ext, (size_t)cap * sizeof *ne);
      if (!ne) {
        lfl_trace_stop(L, tr);
        return luaL_error(L, "capture: out of memory");
      }
      tr->ext = ne;
      tr->extcap = cap;
    }
    tr->ext[tr->next].key = NULL;
    tr->ext[tr->next].node = k;
    tr->ext[tr->next].input = 1;
    tr->ext[tr->next].sseg = -1;
    tr->ext[tr->next].sout = k;
    lfl_trace_add_ext(tr, x);
    lfl_trace_push_lazy(L, tr, k++);
  }
  tr->narg = k;
  tr->cur = k;
  if (lua_pcall(L, nargs, LUA_MULTRET, hidx) != LUA_OK) {
    lfl_trace_stop(L, tr);
    return lua_error(L);
  }
  nres = lua_gettop(L) - fidx + 1;
  lua_pushcfunction(L, lfl_trace_flush_k);
  lua_pushlightuserdata(L, tr);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    lfl_trace_stop(L, tr);
    return lua_error(L);
  }
  lfl_trace_stop(L, tr);
  if (tr->diverged) {
    lfl_trace_push_list(L, tidx, UV_BREAKS);
    if (luaL_len(L, -1) > 0) {
      lua_getiuservalue(L, pidx, PUV_HOOKS);
      if (lua_getfield(L, -1, "breaks") == LUA_TFUNCTION) {
        lua_pushvalue(L, -3);
        lua_call(L, 1, 0);
      } else {
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  for (i = fidx; i < fidx + nres; i++) {      /* results left out of a segment */
    fl_tensor *t = lfl_totensor(L, i);
    if (t && lfl_islazy(t) && !lfl_trace_resolve(L, t))
      return luaL_error(L, "compiled: result %d was never computed", i - fidx + 1);
  }
  if (p->debug >= 1)
    fprintf(stderr, "fuselab: resume: %ld segment(s) from records%s\n", p->segs - segs0,
            tr->diverged ? ", then recorded" : "");
  return nres;
}

static const luaL_Reg resume_funcs[] = {
  {"_resume_new", rp_new}, {"_resume_enable", rp_enable}, {"_resume_counts", rp_counts},
  {NULL, NULL}
};

void lfl_resume_open(lua_State *L, int lib) {
  lib = lua_absindex(L, lib);
  if (luaL_newmetatable(L, RESUME_TYPE)) {
    lua_pushcfunction(L, rp_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, resume_funcs, 0);
  lua_pop(L, 1);
}
