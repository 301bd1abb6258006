/*
** lfl_trace.c -- capture: tracing Lua code into graphs (the Dynamo part).
**
** While a trace records, lfl_dispatch hands every op here instead of
** running it: the op becomes a node of the current SEGMENT graph and the
** Lua code gets a LAZY tensor back (metadata, no storage).  Lua keeps
** running normally.  When Lua needs a value (x:item(), tostring, an
** in-place write, fl.graph_break()) the segment is cut there: every lazy
** tensor of the segment still reachable becomes an output, the graph runs,
** the lazies receive their values, the break is recorded with its reason
** and source line, and a new segment starts.  Ending the trace flushes the
** last segment the same way.
**
** Invariants: a lazy tensor belongs to exactly one segment of one trace
** (lfl_ud.trace/.seg/.node) and is computed when that segment is flushed
** or never (the trace was aborted; using it then raises).  Tensors used by
** a segment but made outside it are EXTERNALS: those made earlier in this
** trace are segment inputs (IR_INPUT); all others (module weights,
** upvalues, tensors created by fl.zeros...) are parameters bound by
** reference (IR_PARAM shares their storage, so in-place updates are seen).
**
** Resuming (fl.compile replaying recorded segments on later calls, and
** the orphans a replayed flush leaves) is in lfl_resume.c.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lfl.h"
#include "cpu/eager.h"
#include "graph/ir.h"
#include "graph/view.h"
#include "lfl_trace_impl.h"

#define MAXEXT 4096        /* externals per segment */

static const char active_key = 't';
static const char weak_key = 'w';
static unsigned next_id = 1;

lfl_trace *lfl_trace_active(lua_State *L) {
  lfl_trace *tr;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &active_key) != LUA_TUSERDATA) {
    lua_pop(L, 1);
    return NULL;
  }
  tr = (lfl_trace *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  return tr->active ? tr : NULL;
}

void lfl_trace_mark_fresh(lua_State *L, fl_tensor *t) {
  lfl_trace *tr = lfl_trace_active(L);
  /* host memory only: replays compare a constant's values on the host */
  if (tr && t && t->m.device == FL_DEV_CPU) lfl_ud_of(t)->fresh = tr->id;
}

static lfl_trace *checktrace(lua_State *L, int idx) {
  return (lfl_trace *)luaL_checkudata(L, idx, TRACE_TYPE);
}

/* Push the active trace's userdata (for its uservalues). */
void lfl_trace_push_active(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &active_key);
}

void lfl_trace_clear_externals(lfl_trace *tr) {
  int i;
  for (i = 0; i < tr->next; i++) {
    ten_release(&tr->ext[i].val);
    ag_unref(tr->ext[i].ag);
  }
  tr->next = 0;
}

void lfl_trace_add_ext(lfl_trace *tr, const fl_tensor *t) {
  ext *x = &tr->ext[tr->next++];
  x->val.st = NULL;
  ten_share(&x->val, t);
  x->ag = lfl_ud_of(t)->ag;
  ag_ref(x->ag);
}

void lfl_trace_push_inputs(lua_State *L, const lfl_trace *tr, const ir_graph *g) {
  int i;
  lua_createtable(L, g->ninputs, 0);
  for (i = 0; i < tr->next; i++) {
    const ext *x = &tr->ext[i];
    fl_tensor *t;
    if (!x->input) continue;
    t = lfl_newtensor(L);
    ten_share(t, &x->val);
    if (x->ag) {
      lfl_ud_of(t)->ag = x->ag;
      ag_ref(x->ag);
    }
    lua_rawseti(L, -2, g->nodes[x->node].index + 1);
  }
}

/* The graph the current segment's node ids refer to: the record being
** replayed, or the one being built. */
static const ir_graph *seg_graph(const lfl_trace *tr) {
  return tr->rec >= 0 ? tr->plan->r[tr->rec].g : tr->g;
}

/* Start a new, empty segment; the previous graph was handed over.  A
** replayed segment (tr->rec set) builds no graph. */
int lfl_trace_new_segment(lua_State *L, lfl_trace *tr, int tidx) {
  lfl_trace_clear_externals(tr);
  tr->nmaybe = 0;
  tr->cur = 0;
  if (tr->nwrites && tr->vcap) {
    memset(tr->vof, 0, (size_t)tr->vcap * sizeof *tr->vof);
    memset(tr->vcur, 0, (size_t)tr->vcap * sizeof *tr->vcur);
  }
  tr->nwrites = tr->ninternal = 0;
  if (tr->rec < 0) {
    tr->g = ir_new();
    if (!tr->g) return luaL_error(L, "capture: out of memory");
  }
  tr->seg++;
  lua_newtable(L);                           /* weak-valued lazy table */
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &weak_key) != LUA_TTABLE) {
    lua_pop(L, 1);                           /* one metatable for all of them */
    lua_newtable(L);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &weak_key);
  }
  lua_setmetatable(L, -2);
  lua_setiuservalue(L, tidx, UV_LAZY);
  return 0;
}

/* The trace's list at uservalue uv (UV_BREAKS, UV_GRAPHS), made when first
** needed (a replayed call mostly needs neither). */
void lfl_trace_push_list(lua_State *L, int tidx, int uv) {
  if (lua_getiuservalue(L, tidx, uv) == LUA_TTABLE) return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_pushvalue(L, -1);
  lua_setiuservalue(L, tidx, uv);
}

/* "file.lua:12" of the innermost user code that called into fuselab:
** frames of fuselab's own embedded Lua (chunk names "=nn.lua",
** "=compile.lua") are skipped, so nodes point at the model's source. */
static void user_where(lua_State *L, char *buf, size_t n) {
  lua_Debug ar;
  int level;
  buf[0] = '\0';
  for (level = 1; lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) continue;
    /* fuselab's own embedded Lua (nn.lua, optim.lua, compile.lua, ...:
    ** chunk names "=x.lua"; a user's file is "@path", the REPL "=stdin") */
    if (ar.source[0] == '=' && strlen(ar.source) > 5 &&
        strcmp(ar.source + strlen(ar.source) - 4, ".lua") == 0)
      continue;
    snprintf(buf, n, "%s:%d", ar.short_src, ar.currentline);
    return;
  }
}

/* The node of tensor t in the current segment, adding it as an external
** (input or param) the first time it is seen.  Raises for a lazy tensor of
** another (aborted or finished) trace. */
static int node_of(lua_State *L, lfl_trace *tr, const fl_tensor *t, const char *opname) {
  const lfl_ud *u = (const lfl_ud *)t;
  fl_err e;
  int i, id, input, scalar_in;
  if (lfl_islazy(t)) {
    if (u->trace == tr->id && u->seg == tr->seg) return u->node;
    if (!lfl_trace_resolve(L, (fl_tensor *)t))
      return luaL_error(L, "%s: this tensor belongs to a capture that ended "
                        "with an error and was never computed", opname);
  }
  /* a Lua number: a constant of the graph, except after a break in
  ** fl.compile, where numbers are often values the Lua computed from the
  ** previous segment (x:item()): there they are inputs (Dynamo does not
  ** specialize floats either), so a new value needs no new graph */
  scalar_in = t->m.wrapped && tr->plan && tr->seg > 0;
  if (t->m.wrapped && !scalar_in) {
    if (tr->rec >= 0 && (id = lfl_resume_leaf(L, tr, t, STEP_CONST)) >= 0) return id;
    id = ir_add_const(tr->g, t, &e);
    if (id < 0) lfl_raise(L, opname, &e);
    return id;
  }
  for (i = 0; i < tr->next; i++)
    if (tr->ext[i].key == t && tr->ext[i].val.st == t->st &&
        tr->ext[i].val.offset == t->offset &&
        memcmp(&tr->ext[i].val.m, &t->m, sizeof t->m) == 0)
      return tr->ext[i].node;
  if (tr->next == tr->extcap) {
    int cap = tr->extcap ? tr->extcap * 2 : 32;
    ext *ne;
    if (cap > MAXEXT)
      return luaL_error(L, "%s: more than %d tensors from outside one "
                        "captured graph", opname, MAXEXT);
    ne = realloc(tr->ext, (size_t)cap * sizeof *ne);
    if (!ne) return luaL_error(L, "capture: out of memory");
    tr->ext = ne;
    tr->extcap = cap;
  }
  input = u->trace == tr->id || scalar_in;
  id = -1;
  if (tr->rec >= 0)
    id = lfl_resume_leaf(L, tr, t, scalar_in ? STEP_SCALAR : input ? STEP_INPUT :
                         u->fresh == tr->id ? STEP_CONST : STEP_PARAM);
  if (id >= 0) {
    /* matched the record */
  } else if (input) {
    /* computed earlier in this trace: the value flows in from Lua; a
    ** number stays wrapped (weakest in type promotion, as in eager) */
    id = ir_add_input(tr->g, &t->m, NULL, &e);
    if (id >= 0) {
      tr->g->nodes[id].meta.wrapped = t->m.wrapped;
      /* a result of an earlier segment with a history (its loss, or a
      ** value whose gradient a compiled pair refuses) */
      tr->g->nodes[id].requires_grad = lfl_requires_grad(t);
    }
  } else if (u->fresh == tr->id) {
    /* fl.arange inside the function: its values are fixed (an iota the
    ** code generators turn into loop indices) */
    id = ir_add_const(tr->g, t, &e);
  } else {
    id = ir_add_param(tr->g, t, NULL, &e);
    /* what g:joint() differentiates with respect to */
    if (id >= 0) tr->g->nodes[id].requires_grad = lfl_requires_grad(t);
  }
  if (id < 0) lfl_raise(L, opname, &e);
  tr->ext[tr->next].key = t;
  tr->ext[tr->next].node = id;
  tr->ext[tr->next].input = input;
  tr->ext[tr->next].sseg = scalar_in ? -2 : u->seg;
  tr->ext[tr->next].sout = scalar_in ? 0 : u->out;
  lfl_trace_add_ext(tr, t);
  return id;
}

/* Push a new lazy userdata for node id of the current segment and
** remember it (weakly) so a flush can give it its value. */
void lfl_trace_push_lazy(lua_State *L, lfl_trace *tr, int id) {
  fl_tensor *t = lfl_newtensor(L);
  lfl_ud *u = lfl_ud_of(t);
  int d;
  t->m = seg_graph(tr)->nodes[id].meta;
  if (tr->rec >= 0) {                        /* an orphan if alive at the flush */
    if (tr->nmaybe == tr->maybecap) {
      int cap = tr->maybecap ? tr->maybecap * 2 : 64;
      int *nm = realloc(tr->maybe, (size_t)cap * sizeof *nm);
      if (!nm) luaL_error(L, "capture: out of memory");
      tr->maybe = nm;
      tr->maybecap = cap;
    }
    tr->maybe[tr->nmaybe++] = id;
  }
  for (d = 0; d < t->m.ndim; d++) t->stride[d] = 0;
  u->trace = tr->id;
  u->seg = tr->seg;
  u->node = id;
  lfl_trace_push_active(L);
  lua_getiuservalue(L, -1, UV_LAZY);
  lua_pushvalue(L, -3);
  lua_rawseti(L, -2, id);
  lua_pop(L, 2);
}

/* Record op over node ids (or match it, replaying); returns its id.
** No lazy is made: lfl_trace_record's caller gets one, the ops a write
** adds stay inside the graph. */
static int record_ids(lua_State *L, lfl_trace *tr, fl_op op, const int *ids, int nin,
                      const op_attrs *a, const int *asym) {
  char where[256];
  fl_err e;
  int id, k, d;
  if (tr->rec >= 0) {
    step s;
    memset(&s, 0, sizeof s);
    s.kind = STEP_OP;
    s.op = op;
    s.ids = ids;
    s.nin = nin;
    s.a = a;
    if (lfl_resume_pick(tr, &s)) return tr->cur++;
    lfl_resume_diverge(L, tr, &s);
  }
  user_where(L, where, sizeof where);
  err_clear(&e);
  id = ir_add_op_sym(tr->g, op, ids, nin, a, asym, where[0] ? where : NULL,
                     tr->nscope ? tr->scope[tr->nscope - 1] : NULL, &e);
  if (id < 0) return lfl_raise(L, op_name(op), &e);
  if (tr->g->nodes[id].symlost) {
    /* sizes this op computes are not followed symbolically: their inputs'
    ** symbols become static rather than be guessed */
    char why[320];
    snprintf(why, sizeof why, "%s computes sizes from them%s%s", op_name(op),
             where[0] ? " at " : "", where);
    for (k = 0; k < nin; k++) {
      const ir_node *p = ids[k] >= 0 ? &tr->g->nodes[ids[k]] : NULL;
      for (d = 0; p && d < p->meta.ndim; d++)
        if (p->sym[d]) lfl_trace_specialize(L, tr, p->sym[d] - 1, why);
    }
  }
  return id;
}

static int current_node(lua_State *L, lfl_trace *tr, const fl_tensor *t, const char *opname);

static void flush_if_aliased(lua_State *L, lfl_trace *tr, const fl_tensor *t);

int lfl_trace_record(lua_State *L, lfl_trace *tr, fl_op op, const fl_tensor *const *in,
                     int nin, const op_attrs *a, const int *asym) {
  int ids[64], k;
  for (k = 0; k < nin; k++)
    if (in[k]) flush_if_aliased(L, tr, in[k]);
  for (k = 0; k < nin; k++)
    ids[k] = in[k] ? current_node(L, tr, in[k], op_name(op)) : -1;
  lfl_trace_push_lazy(L, tr, record_ids(L, tr, op, ids, nin, a, asym));
  return 1;
}

/* ---- WRITES: in-place updates under capture ---------------------------
** An in-place write while a trace records (x:copy_(y), a view's fill_,
** kv:narrow(2, pos, 1):copy_(new)) does not run: it becomes pure ops of
** the graph, as AOTAutograd's functionalization does.  A node's BASE is
** the first node below it that is not a view (reshape, narrow, transpose
** ... applied to it); a base's ROOT is itself, or for a value a write made,
** the node it is the new version of; a root's LATEST is its newest
** version.  A write into a view of base b builds b's new value from the
** view's: each view undone in turn (a narrow becomes a cat of the parts
** around the new slice, a transpose its transpose, a reshape a reshape
** back), and that becomes the latest of b's root.  A node whose base is
** no longer its root's latest is STALE: its views are applied again to the
** latest when it is next used, so a read after a write sees the write.
** At the segment's end a root that is a graph input or a param gets a
** write-back (ir_add_writeback: each run copies the latest value into the
** caller's storage), and a lazy that is a view of an input or a param is
** given a real view of it, as eager code holds.  A write the graph cannot
** express (through a strided slice or an expand, into a tensor made inside
** the function, with symbolic sizes) is a graph break instead, and the
** break's eager write lands where eager puts it: the views it goes
** through are real views of the inputs. */

static int is_view_node(const ir_graph *g, int id) {
  const ir_node *nd = &g->nodes[id];
  return nd->kind == IR_OP && (op_info_of(nd->op)->flags & OPF_VIEW) && nd->nin >= 1 &&
         nd->in[0] >= 0;
}

/* The base of node id; chain[0..*n-1] = the views from id down (chain[0]
** is id itself when it is a view).  -1 past 64 views. */
static int base_of(const ir_graph *g, int id, int *chain, int *n) {
  *n = 0;
  while (is_view_node(g, id)) {
    if (*n == 64) return -1;
    chain[(*n)++] = id;
    id = g->nodes[id].in[0];
  }
  return id;
}

static int root_of(const lfl_trace *tr, int b) {
  return b < tr->vcap && tr->vof[b] ? tr->vof[b] - 1 : b;
}

static int latest_of(const lfl_trace *tr, int r) {
  return r < tr->vcap && tr->vcur[r] ? tr->vcur[r] - 1 : r;
}

static void set_version(lua_State *L, lfl_trace *tr, int root, int v) {
  int need = (root > v ? root : v) + 1;
  if (need > tr->vcap) {
    int cap = tr->vcap ? tr->vcap : 64, *a, *b;
    while (cap < need) cap *= 2;
    a = realloc(tr->vof, (size_t)cap * sizeof *a);
    if (a) tr->vof = a;
    b = a ? realloc(tr->vcur, (size_t)cap * sizeof *b) : NULL;
    if (!a || !b) luaL_error(L, "capture: out of memory");
    tr->vcur = b;
    memset(tr->vof + tr->vcap, 0, (size_t)(cap - tr->vcap) * sizeof *a);
    memset(tr->vcur + tr->vcap, 0, (size_t)(cap - tr->vcap) * sizeof *b);
    tr->vcap = cap;
  }
  tr->vof[v] = root + 1;
  tr->vcur[root] = v + 1;
}

/* Node id with its views applied again to its root's latest version when
** its base was written since (else id). */
static int refresh(lua_State *L, lfl_trace *tr, int id) {
  int chain[64], n, b, cur, k;
  if (!tr->nwrites) return id;
  if ((b = base_of(seg_graph(tr), id, chain, &n)) < 0) return id;
  cur = latest_of(tr, root_of(tr, b));
  if (cur == b) return id;
  for (k = n - 1; k >= 0; k--) {
    const ir_node *v = &seg_graph(tr)->nodes[chain[k]];
    op_attrs a = v->attrs;
    int asym[IR_NASYM];
    fl_op op = v->op;
    memcpy(asym, v->asym, sizeof asym);
    cur = record_ids(L, tr, op, &cur, 1, &a, asym);
  }
  return cur;
}

/* Lazy t (node id) now stands for node nid. */
static void relabel(lua_State *L, fl_tensor *t, int id, int nid) {
  lfl_ud_of(t)->node = nid;
  lfl_trace_push_active(L);
  lua_getiuservalue(L, -1, UV_LAZY);
  if (lua_rawgeti(L, -1, id) == LUA_TUSERDATA && lua_touserdata(L, -1) == (void *)t) {
    lua_rawseti(L, -2, nid);
    lua_pushnil(L);
    lua_rawseti(L, -2, id);
  } else {
    lua_pop(L, 1);
  }
  lua_pop(L, 2);
}

/* node_of, and the current value of what it names (a stale lazy is
** relabelled to its refreshed node). */
static int current_node(lua_State *L, lfl_trace *tr, const fl_tensor *t, const char *opname) {
  int id = node_of(L, tr, t, opname), nid;
  const lfl_ud *u = (const lfl_ud *)t;
  if (!tr->nwrites) return id;
  nid = refresh(L, tr, id);
  if (nid != id && lfl_islazy(t) && u->trace == tr->id && u->seg == tr->seg)
    relabel(L, (fl_tensor *)t, id, nid);
  return nid;
}

/* The external (argument or param) whose graph leaf is node id, or NULL. */
static const ext *ext_of_node(const lfl_trace *tr, int id) {
  int i;
  for (i = 0; i < tr->next; i++)
    if (tr->ext[i].node == id) return &tr->ext[i];
  return NULL;
}

/* *out = the views chain[n-1..0] applied to base in eager order, sharing
** its storage; FL_EUNSUPPORTED where eager code would copy (a reshape of
** a non-contiguous tensor). */
static int apply_views(const ir_graph *g, const int *chain, int n, const fl_tensor *base,
                       fl_tensor *out) {
  fl_tensor cur, nxt;
  fl_err e;
  int k, rc = FL_OK;
  ten_share(&cur, base);
  for (k = n - 1; k >= 0 && rc == FL_OK; k--) {
    const ir_node *v = &g->nodes[chain[k]];
    err_clear(&e);
    memset(&nxt, 0, sizeof nxt);
    rc = view_apply(v->op, &cur, &v->attrs, &v->meta, &nxt, &e);
    ten_release(&cur);
    cur = nxt;
  }
  if (rc == FL_OK) *out = cur;
  else ten_release(&cur);
  return rc;
}

/* A contiguous stand-in for a base computed by the graph: only its
** metadata and strides (view_apply never reads data). */
static void fake_base(const ir_node *nd, fl_tensor *t) {
  memset(t, 0, sizeof *t);
  t->m = nd->meta;
  ten_set_contiguous_strides(t);
}

/* Node id is a view (or the leaf itself) of an argument or param, or of
** a version a write made of one: after the run that storage holds the
** latest value, which any view of it sees, as in eager code: *out = that
** view of the external's tensor. */
static int view_of_external(const lfl_trace *tr, int id, fl_tensor *out) {
  const ir_graph *g = seg_graph(tr);
  int chain[64], n, b, r;
  const ext *x;
  if ((b = base_of(g, id, chain, &n)) < 0) return 0;
  r = root_of(tr, b);
  if (g->nodes[r].kind != IR_INPUT && g->nodes[r].kind != IR_PARAM) return 0;
  if (!(x = ext_of_node(tr, r)) || !x->val.st) return 0;
  if (g->nodes[r].meta.wrapped) return 0;
  return apply_views(g, chain, n, &x->val, out) == FL_OK;
}

/* The view op child = op(parent) undone: parent's new value given the
** child's new value nv (parent's old value is node parent).  -1 when
** the graph cannot express it. */
static int unview(lua_State *L, lfl_trace *tr, int child, int parent, int nv, int dry) {
  const ir_graph *g = seg_graph(tr);
  const ir_node *c = &g->nodes[child], *p = &g->nodes[parent];
  fl_meta pm = p->meta;
  op_attrs a;
  fl_op op = c->op;
  int d, ids[3], n = 0;
  int64_t dim, start, len, size;
  switch (op) {
  case OP_RESHAPE: case OP_VIEW: case OP_SQUEEZE: case OP_UNSQUEEZE:
    if (dry) return 0;
    op_attrs_init(OP_RESHAPE, &a);
    a.ndims = pm.ndim;
    for (d = 0; d < pm.ndim; d++) a.dims[d] = pm.shape[d];
    return record_ids(L, tr, OP_RESHAPE, &nv, 1, &a, NULL);
  case OP_TRANSPOSE:
    if (dry) return 0;
    a = c->attrs;
    return record_ids(L, tr, OP_TRANSPOSE, &nv, 1, &a, NULL);
  case OP_PERMUTE:
    if (dry) return 0;
    op_attrs_init(OP_PERMUTE, &a);
    a.ndims = c->attrs.ndims;
    for (d = 0; d < c->attrs.ndims; d++) a.dims[c->attrs.dims[d]] = d;
    return record_ids(L, tr, OP_PERMUTE, &nv, 1, &a, NULL);
  case OP_EXPAND:
    /* only an expand that repeats nothing can be written through */
    if (!meta_same_shape(&c->meta, &pm)) return -1;
    return dry ? 0 : nv;
  case OP_NARROW: case OP_SLICE:
    dim = c->attrs.i[0];
    start = c->attrs.i[1];
    len = c->attrs.i[2];
    if (op == OP_SLICE && c->attrs.i[3] != 1) return -1;
    if (dim < 0 || dim >= pm.ndim) return -1;
    size = pm.shape[dim];
    if (dry) return 0;
    /* the parts of the old value around the slice, and the new slice */
    if (start > 0) {
      op_attrs_init(OP_NARROW, &a);
      a.i[0] = dim; a.i[1] = 0; a.i[2] = start;
      ids[n++] = record_ids(L, tr, OP_NARROW, &parent, 1, &a, NULL);
    }
    ids[n++] = nv;
    if (start + len < size) {
      op_attrs_init(OP_NARROW, &a);
      a.i[0] = dim; a.i[1] = start + len; a.i[2] = size - start - len;
      ids[n++] = record_ids(L, tr, OP_NARROW, &parent, 1, &a, NULL);
    }
    if (n == 1) return nv;
    op_attrs_init(OP_CAT, &a);
    a.i[0] = dim;
    return record_ids(L, tr, OP_CAT, ids, n, &a, NULL);
  default:
    return -1;
  }
}

static void record_break(lua_State *L, lfl_trace *tr, const char *what);
static void flush(lua_State *L, lfl_trace *tr, const char *what);

/* Before t enters the segment: when another tensor on its storage was
** written in this segment, the segment ends first (a break), so t is
** read after the write-back, as eager code reads it. */
static void flush_if_aliased(lua_State *L, lfl_trace *tr, const fl_tensor *t) {
  const lfl_ud *u = (const lfl_ud *)t;
  int k;
  if (!tr->nwrites || lfl_islazy(t) || !t->st) return;
  (void)u;
  for (k = 0; k < tr->next; k++) {
    const ext *x = &tr->ext[k];
    if (x->key == t && x->val.offset == t->offset && memcmp(&x->val.m, &t->m, sizeof t->m) == 0)
      return;                    /* t itself: its node has the write */
  }
  for (k = 0; k < tr->next; k++) {
    const ext *x = &tr->ext[k];
    if (x->val.st == t->st && latest_of(tr, x->node) != x->node) {
      record_break(L, tr, "aliased read");
      flush(L, tr, "aliased read");
      return;
    }
  }
}

static int has_sym(const ir_node *nd) {
  int d;
  for (d = 0; d < nd->meta.ndim; d++)
    if (nd->sym[d]) return 1;
  return 0;
}

int lfl_trace_write(lua_State *L, fl_tensor *dst, const fl_tensor *val, const char *what) {
  lfl_trace *tr = lfl_trace_active(L);
  const lfl_ud *u = (const lfl_ud *)dst;
  const ir_graph *g;
  int id, v, b, r, chain[64], n, k, first, d;
  op_attrs a;
  fl_tensor probe, base;
  if (!tr) return 0;
  if (lfl_islazy(dst) ? (u->trace != tr->id || u->seg != tr->seg)
                      : (u->fresh == tr->id || dst->m.wrapped))
    return 0;
  if (lfl_islazy(val) && (lfl_ud_of(val)->trace != tr->id || lfl_ud_of(val)->seg != tr->seg))
    return 0;
  if (!lfl_islazy(dst)) {
    flush_if_aliased(L, tr, dst);
    /* another tensor of this segment on the same storage would not see
    ** the write until the write-back: an eager write after a break */
    for (k = 0; k < tr->next; k++)
      if (tr->ext[k].key != dst && tr->ext[k].val.st == dst->st) return 0;
  }
  id = current_node(L, tr, dst, what);
  g = seg_graph(tr);
  if ((b = base_of(g, id, chain, &n)) < 0) return 0;
  r = root_of(tr, b);
  if (g->nodes[r].kind == IR_CONST || g->nodes[r].meta.wrapped) return 0;
  /* symbolic sizes: transposes, permutes and a narrow along a dim of
  ** fixed size undo without computing a size; the other views would need
  ** one (a break instead) */
  for (k = 0; k < n; k++) {
    const ir_node *c = &g->nodes[chain[k]], *p = &g->nodes[c->in[0]];
    int sized = c->op == OP_NARROW || c->op == OP_SLICE
                ? c->attrs.i[0] >= 0 && c->attrs.i[0] < p->meta.ndim && p->sym[c->attrs.i[0]] != 0
                : c->op != OP_TRANSPOSE && c->op != OP_PERMUTE && (has_sym(c) || has_sym(p));
    if (sized || unview(L, tr, chain[k], c->in[0], -1, 1) < 0) return 0;
  }
  /* the views must be real ones in eager code too (a reshape of a
  ** non-contiguous tensor copies, and a write into the copy is lost) */
  if (g->nodes[r].kind == IR_INPUT || g->nodes[r].kind == IR_PARAM) {
    const ext *x = ext_of_node(tr, r);
    if (!x) return 0;
    ten_share(&base, &x->val);
  } else {
    fake_base(&g->nodes[b], &base);
  }
  k = apply_views(g, chain, n, &base, &probe);
  ten_release(&base);
  if (k != FL_OK) return 0;
  /* a write through an expanded view is refused as eager code refuses it */
  for (d = 0; d < probe.m.ndim && k == FL_OK; d++)
    if (probe.stride[d] == 0 && probe.m.shape[d] > 1) k = FL_EINVAL;
  ten_release(&probe);
  if (k != FL_OK) return 0;
  first = g->n;
  if (tr->rec >= 0) first = tr->cur;
  /* the new value of the written tensor: val in its dtype, broadcast */
  v = current_node(L, tr, val, what);
  g = seg_graph(tr);
  if (g->nodes[v].meta.dtype != g->nodes[id].meta.dtype) {
    op_attrs_init(OP_TO, &a);
    a.dtype = g->nodes[id].meta.dtype;
    v = record_ids(L, tr, OP_TO, &v, 1, &a, NULL);
    g = seg_graph(tr);
  }
  {
    const ir_node *vn = &g->nodes[v], *dn = &g->nodes[id];
    const fl_meta *vm = &vn->meta, *dm = &dn->meta;
    int off = dm->ndim - vm->ndim, bad = off < 0, same = off == 0;
    for (d = 0; !bad && d < vm->ndim; d++) {
      bad = vm->shape[d] != 1 && vm->shape[d] != dm->shape[d + off];
      /* two symbolic sizes seen equal are equal whenever the graph runs:
      ** the op that made the value checked they broadcast (sizes >= 2) */
      same = same && vm->shape[d] == dm->shape[d] && !vn->sym[d] == !dn->sym[d];
    }
    if (bad) {                       /* eager's words (ten_copy) */
      char s1[128], s2[128];
      return luaL_error(L, "%s: broadcast_to: cannot broadcast %s to %s", what,
                        meta_shape_str(vm, s1, sizeof s1), meta_shape_str(dm, s2, sizeof s2));
    }
    if (!same) {
      /* broadcast to the target's shape; a symbolic size is the target's
      ** size expression (an attribute slot of the expand) */
      int asym[IR_NASYM];
      memset(asym, 0, sizeof asym);
      op_attrs_init(OP_EXPAND, &a);
      a.ndims = dm->ndim;
      for (d = 0; d < a.ndims; d++) {
        a.dims[d] = dm->shape[d];
        if (d >= off && !vn->sym[d - off] != !dn->sym[d] && vm->shape[d - off] != 1) return 0;
        asym[d] = dn->sym[d];
      }
      v = record_ids(L, tr, OP_EXPAND, &v, 1, &a, asym);
    }
  }
  for (k = 0; k < n; k++) {
    v = unview(L, tr, chain[k], seg_graph(tr)->nodes[chain[k]].in[0], v, 0);
    if (v < 0) return luaL_error(L, "%s: internal error: a checked view could not be undone", what);
  }
  /* the root's new version is a node of its own: not a view, not a leaf,
  ** not a value Lua holds under another name */
  g = seg_graph(tr);
  if (v < first || is_view_node(g, v) || g->nodes[v].kind != IR_OP) {
    op_attrs_init(OP_CONTIGUOUS, &a);
    v = record_ids(L, tr, OP_CONTIGUOUS, &v, 1, &a, NULL);
  }
  set_version(L, tr, r, v);
  tr->nwrites++;
  tr->ninternal += g->nodes[r].kind == IR_OP;
  return 1;
}

/* ---- flushing a segment ----------------------------------------------- */

/* Run graph g on its inputs: through the Lua executor when fl.compile
** installed one (compiled kernels, caches), else the eager interpreter.
** outs must hold g->nout empty tensors.  Leaves two values on the stack:
** what the executor returned besides the outputs -- a CPU program a
** replay may run directly, and a runner(inputs) -> outputs for the others
** (either may be nil) -- or two nils. */
static void run_segment(lua_State *L, int tidx, const ir_graph *g, int gidx, int inidx,
                        int pidx, const fl_tensor *const *inputs, fl_tensor *outs, ag_fn **ags) {
  fl_err e;
  int i;
  if (lua_getiuservalue(L, tidx, UV_EXEC) == LUA_TFUNCTION) {
    lua_pushvalue(L, gidx);
    lua_pushvalue(L, inidx);
    lua_pushvalue(L, pidx);
    lua_call(L, 3, 3);
    if (!lua_istable(L, -3)) luaL_error(L, "capture: the executor returned no outputs");
    for (i = 0; i < g->nout; i++) {
      fl_tensor *t;
      lua_rawgeti(L, -3, i + 1);
      t = lfl_totensor(L, -1);
      if (!t || lfl_islazy(t))
        luaL_error(L, "capture: the executor returned no tensor #%d", i + 1);
      ten_share(&outs[i], t);
      lfl_trace_take_history(ags, i, t);
      lua_pop(L, 1);
    }
    lua_remove(L, -3);
    return;
  }
  lua_pop(L, 1);
  err_clear(&e);
  if (lfl_graph_run_eager(g, inputs, g->ninputs, outs, &e) != FL_OK)
    lfl_raise(L, "graph", &e);
  lua_pushnil(L);
  lua_pushnil(L);
}

/* An executor's output k that has a history (a compiled training
** segment's loss: its CompiledFunctionBackward) hands it to its lazy:
** ags[k] takes a reference, lfl_trace_give_history passes it on. */
void lfl_trace_take_history(ag_fn **ags, int k, const fl_tensor *t) {
  if (ags && lfl_ud_of(t)->ag) {
    ags[k] = lfl_ud_of(t)->ag;
    ag_ref(ags[k]);
  }
}

ag_fn **lfl_trace_histories(lua_State *L, int n) {
  ag_fn **ags = lua_newuserdatauv(L, (size_t)(n + 1) * sizeof *ags, 0);
  memset(ags, 0, (size_t)(n + 1) * sizeof *ags);
  return ags;
}

void lfl_trace_give_history(ag_fn **ags, int k, fl_tensor *lazy) {
  if (!ags || !ags[k]) return;
  if (lazy) {
    ag_unref(lfl_ud_of(lazy)->ag);
    lfl_ud_of(lazy)->ag = ags[k];
  } else {
    ag_unref(ags[k]);
  }
  ags[k] = NULL;
}

/* After segment g (of trace tr) ran: a lazy result that is a view of
** another result (z:narrow(...) of z = y:exp(), both alive at a break;
** a view of a value nobody holds cannot be told from a copy) is given a
** real view of that value's output, as eager code
** holds one, so a write through it after the break lands in the value it
** views.  outs: the graph's outputs; the lazies took their values. */
void lfl_trace_alias_views(lua_State *L, const lfl_trace *tr, const ir_graph *g, int lazyidx,
                           const fl_tensor *outs) {
  int *pos, i, chain[64], nc, b, nres = ir_nresults(g), any = 0;
  for (i = 0; i < nres && !any; i++) any = is_view_node(g, g->outputs[i]);
  if (!any) return;
  pos = lua_newuserdatauv(L, (size_t)(g->n + 1) * sizeof *pos, 0);
  for (i = 0; i < g->n; i++) pos[i] = -1;
  for (i = nres - 1; i >= 0; i--) pos[g->outputs[i]] = i;
  for (i = 0; i < nres; i++) {
    fl_tensor *t, view;
    lfl_ud *u;
    int id = g->outputs[i];
    if (!is_view_node(g, id) || (b = base_of(g, id, chain, &nc)) < 0 || pos[b] < 0) continue;
    if (lua_rawgeti(L, lazyidx, id) == LUA_TUSERDATA && (t = lfl_totensor(L, -1)) != NULL) {
      u = lfl_ud_of(t);
      if (u->trace == tr->id && u->node == -1 && u->out == i && outs[pos[b]].st &&
          apply_views(g, chain, nc, &outs[pos[b]], &view) == FL_OK) {
        int wrapped = t->m.wrapped;
        ten_release(t);
        lfl_ud_of(t)->t = view;
        t->m.wrapped = wrapped;
      }
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* Cut the current segment: outputs = the lazies still reachable, run,
** give them their values; hand the graph to the trace's list.  Values
** nobody can reach are not computed (settle_lazies collected).  The
** next segment starts before the graph runs, so an error while running
** leaves the trace consistent (the old lazies just stay uncomputed). */
static void record_flush(lua_State *L, lfl_trace *tr, const char *what) {
  int tidx, gidx, lazyidx, pidx, inidx, n = 0, n2, i;
  int *nodes, *src = NULL;
  fl_tensor *buf;               /* ninputs input shares, then n outputs */
  ag_fn **ags;                  /* outputs' histories (run_segment) */
  const fl_tensor **inputs;
  ir_graph *g;
  size_t fresh = 0;
  fl_err e;
  lfl_trace_push_active(L);
  tidx = lua_gettop(L);
  lua_getiuservalue(L, tidx, UV_LAZY);     /* settle_lazies collected */
  lazyidx = lua_gettop(L);
  g = tr->g;
  lfl_pushgraph(L, g);                       /* owns g from here on */
  gidx = lua_gettop(L);
  nodes = lua_newuserdatauv(L, (size_t)(g->n + 1) * sizeof *nodes, 0);
  /* ids in increasing order: the graph's outputs read like the program */
  for (i = 0; i < g->n; i++) {
    if (lua_rawgeti(L, lazyidx, i) == LUA_TUSERDATA) nodes[n++] = i;
    lua_pop(L, 1);
  }
  for (i = 0; i < n; i++)
    if (ir_add_output(g, nodes[i], &e) != FL_OK) lfl_raise(L, "capture", &e);
  /* at the call's end, views of arguments the caller gets are computed
  ** too: a compiled entry rebuilds each as a view from that output's
  ** shape without running the Lua */
  for (i = 0; i < tr->nsubst && !what; i++)
    if (ir_add_output(g, tr->subst[i], &e) != FL_OK) lfl_raise(L, "capture", &e);
  /* the arguments and params written in place: their latest values */
  for (i = 0; i < tr->next && tr->nwrites; i++) {
    int r = tr->ext[i].node, v = latest_of(tr, r);
    if (v != r && ir_add_writeback(g, v, r, &e) != FL_OK) lfl_raise(L, "capture", &e);
  }
  buf = lfl_newslots(L, g->ninputs + g->nout);       /* released even if the run raises */
  ags = lfl_trace_histories(L, g->nout);
  inputs = lua_newuserdatauv(L, (size_t)(g->ninputs + 1) * sizeof *inputs, 0);
  if (tr->plan) src = lua_newuserdatauv(L, (size_t)(2 * g->ninputs + 1) * sizeof *src, 0);
  for (i = 0; i < tr->next; i++)
    if (tr->ext[i].input) {
      int k = g->nodes[tr->ext[i].node].index;
      ten_share(&buf[k], &tr->ext[i].val);
      inputs[k] = &buf[k];
      if (src) {
        src[2 * k] = tr->ext[i].sseg;
        src[2 * k + 1] = tr->ext[i].sout;
      }
    }
  /* the params and where they came from (the executor names them before
  ** it compiles, so plans and code say "fc1.weight") */
  lua_newtable(L);
  for (i = 0, n2 = 0; i < tr->next; i++) {
    if (tr->ext[i].input) continue;
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, tr->ext[i].node);
    lua_setfield(L, -2, "node");
    lua_pushlightuserdata(L, (void *)tr->ext[i].key);
    lua_setfield(L, -2, "key");
    lua_rawseti(L, -2, ++n2);
  }
  pidx = lua_gettop(L);
  lfl_trace_push_inputs(L, tr, g);           /* (the new segment clears the externals) */
  inidx = lua_gettop(L);
  tr->g = NULL;
  lfl_trace_new_segment(L, tr, tidx);
  run_segment(L, tidx, g, gidx, inidx, pidx, inputs, buf + g->ninputs, ags);
  if (tr->plan)
    tr->parent = lfl_resume_add_record(L, tr, gidx, src, what, lua_gettop(L) - 1,
                                       lua_gettop(L));
  for (i = 0; i < n; i++) {
    fl_tensor *t, *o = &buf[g->ninputs + i];
    lua_rawgeti(L, lazyidx, nodes[i]);
    t = lfl_totensor(L, -1);
    if (t) {
      int wrapped = t->m.wrapped;
      ten_share(t, o);
      t->m.wrapped = wrapped;
      lfl_ud_of(t)->node = -1;               /* computed now */
      lfl_ud_of(t)->out = i;
      if (o->st && o->st->refs == 2) fresh += o->st->nbytes;
    }
    lfl_trace_give_history(ags, i, t);
    lua_pop(L, 1);
  }
  for (; i < g->nout; i++) lfl_trace_give_history(ags, i, NULL);   /* views, write-backs */
  lfl_trace_alias_views(L, tr, g, lazyidx, buf + g->ninputs);
  for (i = 0; i < g->ninputs + g->nout; i++) ten_release(&buf[i]);
  lfl_trace_push_list(L, tidx, UV_GRAPHS);
  lua_pushvalue(L, gidx);
  lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
  lua_settop(L, tidx - 1);
  lfl_account(L, fresh);
}

static void push_break(lua_State *L, lfl_trace *tr, const char *what);

/* Before a segment ends: a lazy that is a view of an argument or a param
** gets a real view of it (written back to by then), as eager code would
** hold: a write through it after the break, or a write into the input
** after the call, is seen where eager code sees it.  Its output index
** stays unique (-2 - node), so a replay still tells it apart from the
** segment's outputs.  A stale lazy of a value the segment computed (see
** WRITES) is refreshed: only those alive, so the segment is collected
** first -- a replay too, where such writes happened (it must refresh
** what its recording refreshed), and never else (a replay's flush does
** not collect). */
static void settle_lazies(lua_State *L, lfl_trace *tr) {
  int tidx, lazy, n, i;
  lfl_trace_push_active(L);
  tidx = lua_gettop(L);
  tr->nsubst = 0;
  /* only what is alive: a recording's outputs are the lazies a full
  ** collection leaves */
  if (tr->ninternal || tr->rec < 0) lua_gc(L, LUA_GCCOLLECT);
  lua_getiuservalue(L, tidx, UV_LAZY);
  lazy = lua_gettop(L);
  n = tr->rec >= 0 ? tr->cur : tr->g->n;
  for (i = 0; i < n; i++) {
    fl_tensor *t, view;
    lfl_ud *u;
    int nid;
    if (lua_rawgeti(L, lazy, i) != LUA_TUSERDATA) { lua_pop(L, 1); continue; }
    t = lfl_totensor(L, -1);
    u = t ? lfl_ud_of(t) : NULL;
    if (u && lfl_islazy(t) && u->node == i && u->trace == tr->id && u->seg == tr->seg) {
      if (!view_of_external(tr, i, &view)) {
        if ((nid = refresh(L, tr, i)) != i) relabel(L, t, i, nid);
      } else {
        int wrapped = t->m.wrapped;
        nid = i;
        if (tr->nsubst == tr->substcap) {
          int cap = tr->substcap ? 2 * tr->substcap : 16, *ns = realloc(tr->subst, (size_t)cap * sizeof *ns);
          if (!ns) { ten_release(&view); luaL_error(L, "capture: out of memory"); }
          tr->subst = ns;
          tr->substcap = cap;
        }
        tr->subst[tr->nsubst++] = nid;
        lfl_ud_of(t)->t = view;
        t->m.wrapped = wrapped;
        u->node = -1;
        u->out = -2 - nid;
        lua_pushnil(L);
        lua_rawseti(L, lazy, nid);
      }
    }
    lua_pop(L, 1);
  }
  lua_settop(L, tidx - 1);
}

/* End the current segment (what: the break, NULL at the end of the call). */
static void flush(lua_State *L, lfl_trace *tr, const char *what) {
  settle_lazies(L, tr);
  if (tr->rec >= 0) {
    step s;
    memset(&s, 0, sizeof s);
    s.kind = STEP_END;
    s.what = what ? what : "";
    if (lfl_resume_pick(tr, &s)) {
      lfl_resume_flush(L, tr, what);
      return;
    }
    lfl_resume_diverge(L, tr, &s);
    if (what) push_break(L, tr, what);
  }
  record_flush(L, tr, what);
}

static const char *hint_for(const char *what) {
  if (strcmp(what, "item") == 0 || strcmp(what, "tolist") == 0)
    return "the value is needed in Lua (a data-dependent branch?); keep it in "
           "tensor ops, e.g. fl.where(c, a, b) instead of an if on x:item()";
  if (strcmp(what, "tostring") == 0)
    return "printing a traced tensor needs its values; print outside the "
           "compiled function";
  if (strcmp(what, "fl.graph_break()") == 0)
    return "fl.graph_break() asks for a break here";
  if (strcmp(what, "backward") == 0)
    return "the backward runs between the graphs, as in PyTorch: the segment that "
           "computes the loss trains as a compiled forward and backward pair";
  if (strcmp(what, "optimizer step") == 0)
    return "each call's gradients are new tensors, so the step cannot live in the graph: "
           "it runs its own compiled update every call (opt:compiled()), one fused "
           "kernel per parameter";
  if (strcmp(what, "aliased read") == 0)
    return "a tensor sharing storage with one written in place earlier in the "
           "graph is read here; the graph ends so the write lands first";
  if (strchr(what, '_') && what[strlen(what) - 1] == '_')
    return "in-place writes are captured through narrow, slice (step 1), transpose, "
           "permute, reshape and x[i]; this one goes through a strided slice or an "
           "expand, into a tensor made inside the function, or has symbolic sizes, so "
           "it runs eagerly: write through such a view, or compute the value out of place";
  return "this operation has no lowering into a graph; it runs in Lua";
}

static void break_reason(const char *what, char *reason, size_t n) {
  if (strcmp(what, "fl.graph_break()") == 0)
    snprintf(reason, n, "fl.graph_break() called");
  else if (strcmp(what, "backward") == 0)
    snprintf(reason, n, "loss:backward() inside the function");
  else if (strcmp(what, "optimizer step") == 0)
    snprintf(reason, n, "an optimizer's step (each call's gradients are new tensors; it runs its own compiled update)");
  else if (strcmp(what, "aliased read") == 0)
    snprintf(reason, n, "aliased read: another view of storage written in place");
  else if (strchr(what, '_') && what[strlen(what) - 1] == '_')
    snprintf(reason, n, "%s: an in-place write the graph cannot express", what);
  else
    snprintf(reason, n, "%s() needs a concrete value", what);
}

/* Append the break named what, at the user's line, to the trace's list. */
static void push_break(lua_State *L, lfl_trace *tr, const char *what) {
  char where[256], reason[320];
  (void)tr;
  user_where(L, where, sizeof where);
  break_reason(what, reason, sizeof reason);
  lfl_trace_push_active(L);
  lfl_trace_push_list(L, lua_gettop(L), UV_BREAKS);
  lua_createtable(L, 0, 3);
  lua_pushstring(L, reason);
  lua_setfield(L, -2, "reason");
  lua_pushstring(L, hint_for(what));
  lua_setfield(L, -2, "hint");
  lua_pushstring(L, where);
  lua_setfield(L, -2, "where");
  lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
  lua_pop(L, 2);
}

/* Record a break named what at the user's line, or raise under fullgraph
** or fl.capture.  A replayed break was recorded when it was first seen
** (flush records it again if the replay diverges there). */
static void record_break(lua_State *L, lfl_trace *tr, const char *what) {
  tr->reads++;
  if (tr->fullgraph || tr->mode == MODE_CAPTURE) {
    char where[256], reason[320];
    user_where(L, where, sizeof where);
    break_reason(what, reason, sizeof reason);
    luaL_error(L, "graph break %s: %s (%s); hint: %s",
               tr->mode == MODE_CAPTURE ? "in fl.capture" : "with fullgraph=true",
               reason, where[0] ? where : "?", hint_for(what));
  }
  if (tr->rec < 0) push_break(L, tr, what);
}

void lfl_trace_before_write(lua_State *L, fl_tensor *dst, const char *what) {
  lfl_trace *tr = lfl_trace_active(L);
  int k;
  if (!tr || lfl_islazy(dst) || !dst->st) return;
  for (k = 0; k < tr->next; k++)
    if (tr->ext[k].val.st == dst->st) {
      record_break(L, tr, what);
      flush(L, tr, what);
      return;
    }
}

void lfl_trace_materialize(lua_State *L, fl_tensor *t, const char *what) {
  lfl_trace *tr = lfl_trace_active(L);
  lfl_ud *u = lfl_ud_of(t);
  if (!tr || u->trace != tr->id || u->seg != tr->seg) {
    if (lfl_trace_resolve(L, t)) return;
    luaL_error(L, "%s: this tensor belongs to a capture that ended with an "
               "error and was never computed", what);
  }
  record_break(L, tr, what);
  flush(L, tr, what);
}

/* ---- symbolic sizes: what lfl_sym.c builds on --------------------------- */

ir_graph *lfl_trace_symgraph(const lfl_trace *tr) {
  /* symbols live in the first segment only: after a break the graphs
  ** start from values Lua has already seen */
  return tr->seg == 0 ? tr->g : NULL;
}

ir_graph *lfl_trace_g0(const lfl_trace *tr) { return tr->g0; }

unsigned lfl_trace_id(const lfl_trace *tr) { return tr->id; }

void lfl_trace_where(lua_State *L, char *buf, size_t n) { user_where(L, buf, n); }

/* Push the trace's UV_SYMS field `name` (created on first use). */
static void push_symfield(lua_State *L, const char *name) {
  lfl_trace_push_active(L);
  if (lua_getiuservalue(L, -1, UV_SYMS) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, -3, UV_SYMS);
  }
  if (lua_getfield(L, -1, name) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, name);
  }
  lua_replace(L, -3);
  lua_pop(L, 1);
}

void lfl_trace_push_symcache(lua_State *L) { push_symfield(L, "ud"); }

const char *lfl_trace_symname(const lfl_trace *tr, int var) {
  return var >= 0 && var < tr->nsym ? tr->sym_name[var] : "?";
}

void lfl_trace_specialize(lua_State *L, lfl_trace *tr, int x, const char *why) {
  unsigned char used[IR_MAX_SYMX];
  int v;
  if (!tr->g0 || x < 0) return;
  memset(used, 0, sizeof used);
  ir_sym_uses(tr->g0, x, used);
  for (v = 0; v < tr->nsym; v++) {
    if (!used[v] || tr->sym_static[v]) continue;
    tr->sym_static[v] = 1;
    push_symfield(L, "reasons");
    lua_pushfstring(L, "s%d = %s specialized to %I: %s", v, tr->sym_name[v],
                    (lua_Integer)ir_sym_hint(tr->g0, v), why);
    lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
    lua_pop(L, 1);
  }
}

void lfl_trace_guard(lua_State *L, lfl_trace *tr, int a, int cmp, int b, int expect,
                     const char *text) {
  lua_Integer k, n;
  (void)tr;
  push_symfield(L, "guards");
  n = (lua_Integer)luaL_len(L, -1);
  for (k = 1; k <= n; k++) {                /* each guard once */
    int same;
    lua_rawgeti(L, -1, k);
    lua_getfield(L, -1, "a");
    lua_getfield(L, -2, "b");
    lua_getfield(L, -3, "cmp");
    lua_getfield(L, -4, "expect");
    same = lua_tointeger(L, -4) == a && lua_tointeger(L, -3) == b &&
           lua_tointeger(L, -2) == cmp && lua_toboolean(L, -1) == expect;
    lua_pop(L, 5);
    if (same) { lua_pop(L, 1); return; }
  }
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, a);
  lua_setfield(L, -2, "a");
  lua_pushinteger(L, b);
  lua_setfield(L, -2, "b");
  lua_pushinteger(L, cmp);
  lua_setfield(L, -2, "cmp");
  lua_pushboolean(L, expect);
  lua_setfield(L, -2, "expect");
  lua_pushstring(L, text);
  lua_setfield(L, -2, "text");
  lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
  lua_pop(L, 1);
}

/* ---- the Lua-facing trace object (used by compile.lua) ----------------- */

/* Push a new trace, recording (rec -1) or replaying record rec of the
** plan at planidx (0: none); exec at execidx (0: none).  It becomes the
** active one. */
lfl_trace *lfl_trace_begin(lua_State *L, int mode, int fullgraph, int execidx,
                        int planidx, int rec, int spare) {
  lfl_trace *tr;
  int tidx, i;
  if (spare) {
    /* a finished trace of this plan, made new again: a replayed call
    ** allocates no trace (the struct is several KiB) */
    lua_pushvalue(L, spare);
    tr = (lfl_trace *)lua_touserdata(L, -1);
    lfl_trace_clear_externals(tr);
    free(tr->ext);
    free(tr->maybe);
    free(tr->vof);
    free(tr->vcur);
    free(tr->subst);
    ir_free(tr->g);
    for (i = 0; i < tr->nscope; i++) free(tr->scope[i]);
    memset(tr, 0, sizeof *tr);
    for (i = UV_BREAKS; i <= UV_COUNT; i++) {
      lua_pushnil(L);
      lua_setiuservalue(L, -2, i);
    }
  } else {
    tr = (lfl_trace *)lua_newuserdatauv(L, sizeof *tr, UV_COUNT);
    memset(tr, 0, sizeof *tr);
    luaL_setmetatable(L, TRACE_TYPE);
  }
  tidx = lua_gettop(L);
  tr->id = next_id++;
  if (next_id == 0) next_id = 1;
  tr->seg = -1;
  tr->mode = mode;
  tr->fullgraph = fullgraph;
  tr->rec = rec;
  tr->parent = -1;
  if (execidx) lua_pushvalue(L, execidx); else lua_pushnil(L);
  lua_setiuservalue(L, tidx, UV_EXEC);
  if (planidx) {
    resume_plan *p = (resume_plan *)luaL_checkudata(L, planidx, RESUME_TYPE);
    tr->plan = p;
    tr->ext = p->ext_cache;
    tr->extcap = p->ext_cap;
    tr->maybe = p->maybe_cache;
    tr->maybecap = p->maybe_cap;
    p->ext_cache = NULL;
    p->maybe_cache = NULL;
    p->ext_cap = p->maybe_cap = 0;
    lua_pushvalue(L, planidx);
    lua_setiuservalue(L, tidx, UV_PLAN);
  }
  lfl_trace_new_segment(L, tr, tidx);
  tr->g0 = tr->g;
  tr->active = 1;
  lua_pushvalue(L, tidx);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &active_key);
  return tr;
}

/* fl._trace_begin{capture=bool, fullgraph=bool, exec=function, plan=,
** kinds="tv..."} -> trace.  With a plan, each segment flushed is recorded
** there (kinds: the call's arguments, 't' for a tensor). */
static int tr_begin(lua_State *L) {
  lfl_trace *tr;
  int mode, fullgraph, execidx = 0, planidx = 0;
  luaL_checktype(L, 1, LUA_TTABLE);
  if (lfl_trace_active(L))
    return luaL_error(L, "capture: a trace is already recording (nested "
                      "fl.compile/fl.capture inside a traced function)");
  lua_getfield(L, 1, "capture");
  mode = lua_toboolean(L, -1) ? MODE_CAPTURE : MODE_RUN;
  lua_getfield(L, 1, "fullgraph");
  fullgraph = lua_toboolean(L, -1);
  if (lua_getfield(L, 1, "exec") != LUA_TNIL) execidx = lua_gettop(L);
  if (lua_getfield(L, 1, "plan") != LUA_TNIL) planidx = lua_gettop(L);
  tr = lfl_trace_begin(L, mode, fullgraph, execidx, planidx, -1, 0);
  if (lua_getfield(L, 1, "kinds") == LUA_TSTRING) {
    size_t n;
    const char *k = lua_tolstring(L, -1, &n);
    if (n > MAXARGS) n = MAXARGS;
    memcpy(tr->kinds, k, n);
    tr->kinds[n] = '\0';
    tr->nargs = (int)n;
  }
  lua_pop(L, 1);
  return 1;
}

/* tr:input(x, name, dynamic_dims) -> lazy proxy for argument x.  Dims
** listed in dynamic_dims (1-based; sizes 0 and 1 stay static) get a symbol. */
static int tr_input(lua_State *L) {
  lfl_trace *tr = checktrace(L, 1);
  fl_tensor *x = lfl_checkdata(L, 2, "capture");
  const char *name = luaL_optstring(L, 3, NULL);
  fl_err e;
  int id, d;
  if (!tr->active) return luaL_error(L, "capture: trace is not recording");
  if (tr->seg != 0 || tr->g->n != tr->narg)
    return luaL_error(L, "capture: inputs must be declared first");
  id = ir_add_input(tr->g, &x->m, name, &e);
  if (id < 0) return lfl_raise(L, "capture", &e);
  tr->g->nodes[id].meta.wrapped = x->m.wrapped;   /* a number stays weakest in promotion */
  tr->g->nodes[id].requires_grad = lfl_requires_grad(x);
  if (lua_istable(L, 4)) {
    lua_Integer n = luaL_len(L, 4), k;
    for (k = 1; k <= n; k++) {
      lua_rawgeti(L, 4, k);
      d = (int)lua_tointeger(L, -1) - 1;
      lua_pop(L, 1);
      if (d < 0 || d >= x->m.ndim || x->m.shape[d] < 2 || tr->nsym >= MAXSYM) continue;
      if (ir_sym_var(tr->g, x->m.shape[d], &e) < 0) return lfl_raise(L, "capture", &e);
      tr->sym_arg[tr->nsym] = tr->narg;
      tr->sym_dim[tr->nsym] = d;
      snprintf(tr->sym_name[tr->nsym], sizeof tr->sym_name[0], "%.32s.shape[%d]",
               name ? name : "input", d + 1);
      tr->g->nodes[id].sym[d] = ++tr->nsym;
    }
  }
  if (tr->next == tr->extcap) {
    ext *ne = realloc(tr->ext, (size_t)(tr->extcap ? tr->extcap * 2 : 32) * sizeof *ne);
    if (!ne) return luaL_error(L, "capture: out of memory");
    tr->ext = ne;
    tr->extcap = tr->extcap ? tr->extcap * 2 : 32;
  }
  tr->ext[tr->next].key = NULL;             /* reached only through the proxy */
  tr->ext[tr->next].node = id;
  tr->ext[tr->next].input = 1;
  tr->ext[tr->next].sseg = -1;
  tr->ext[tr->next].sout = tr->narg;
  lfl_trace_add_ext(tr, x);
  tr->narg++;
  lfl_trace_push_lazy(L, tr, id);
  return 1;
}

/* tr:input_number(v, name) -> lazy proxy for a number argument that is a
** graph input (a 0-d tensor of its kind, weakest in type promotion as a
** Lua number is): Dynamo's automatic dynamic for a float or an int that
** changed between calls. */
static int tr_input_number(lua_State *L) {
  luaL_checknumber(L, 2);
  lfl_pushscalar(L, 2);
  lua_replace(L, 2);
  lua_settop(L, 3);
  return tr_input(L);
}

/* Stop recording; the trace is no longer active.  Restores nothing else:
** lazies of an unflushed segment stay uncomputed (their use raises). */
void lfl_trace_stop(lua_State *L, lfl_trace *tr) {
  resume_plan *p = tr->plan;
  tr->active = 0;
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &active_key);
  if (p) {                                   /* the buffers go to the next call */
    lfl_trace_clear_externals(tr);
    if (!p->ext_cache && tr->ext) {
      p->ext_cache = tr->ext;
      p->ext_cap = tr->extcap;
      tr->ext = NULL;
      tr->extcap = 0;
    }
    if (!p->maybe_cache && tr->maybe) {
      p->maybe_cache = tr->maybe;
      p->maybe_cap = tr->maybecap;
      tr->maybe = NULL;
      tr->maybecap = tr->nmaybe = 0;
    }
  }
}

/* tr:finish() -> info: flushes the last segment (outputs = the lazies the
** caller still holds: its results, and any it stored elsewhere) and
** returns {graphs=, breaks=, outputs=<node ids of the last graph>,
** static_syms={{arg, dim}...}}.  Then the trace is over. */
int lfl_trace_flush_k(lua_State *L) {
  flush(L, (lfl_trace *)lua_touserdata(L, 1), NULL);
  return 0;
}

static int tr_finish(lua_State *L) {
  lfl_trace *tr = checktrace(L, 1);
  int i, last;
  if (!tr->active) return luaL_error(L, "capture: trace is not recording");
  /* running the last segment can fail (a bad index, no memory, Ctrl-C):
  ** the trace ends all the same, or every later capture would refuse */
  lua_pushcfunction(L, lfl_trace_flush_k);
  lua_pushlightuserdata(L, tr);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    lfl_trace_stop(L, tr);
    return lua_error(L);
  }
  lfl_trace_stop(L, tr);
  lua_createtable(L, 0, 4);
  lfl_trace_push_list(L, 1, UV_GRAPHS);
  last = (int)luaL_len(L, -1);
  lua_setfield(L, -2, "graphs");
  lfl_trace_push_list(L, 1, UV_BREAKS);
  lua_setfield(L, -2, "breaks");
  lua_createtable(L, 0, 0);
  for (i = 0; i < tr->nsym; i++) {
    if (!tr->sym_static[i]) continue;
    lua_createtable(L, 2, 0);
    lua_pushinteger(L, tr->sym_arg[i] + 1);
    lua_rawseti(L, -2, 1);
    lua_pushinteger(L, tr->sym_dim[i] + 1);
    lua_rawseti(L, -2, 2);
    lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
  }
  lua_setfield(L, -2, "static_dims");
  if (lua_getiuservalue(L, 1, UV_SYMS) == LUA_TTABLE) {
    lua_getfield(L, -1, "guards");
    lua_setfield(L, -3, "sym_guards");
    lua_getfield(L, -1, "reasons");
    lua_setfield(L, -3, "specialized");
  }
  lua_pop(L, 1);
  lua_pushinteger(L, last);
  lua_setfield(L, -2, "ngraphs");
  return 1;
}

/* tr:abort(): after an error in the traced code; nothing is computed. */
static int tr_abort(lua_State *L) {
  lfl_trace *tr = checktrace(L, 1);
  if (tr->active) lfl_trace_stop(L, tr);
  return 0;
}

/* tr:node_of(x) -> the node id (0-based) of lazy tensor x in the current
** segment, or nil.  Used to map a function's results onto graph outputs
** (call before finish). */
static int tr_node_of(lua_State *L) {
  lfl_trace *tr = checktrace(L, 1);
  fl_tensor *t = lfl_totensor(L, 2);
  const lfl_ud *u = t ? (const lfl_ud *)t : NULL;
  if (!u || !lfl_islazy(t) || u->trace != tr->id || u->seg != tr->seg) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushinteger(L, u->node);
  return 1;
}

/* tr:result_of(x) -> node, is_view: after tr:finish(), the node of the
** last graph a result x got its value from (an output, or for a view of
** an argument or param, the view's node: x shares that tensor's
** storage); nil for a tensor the trace did not compute. */
static int tr_result_of(lua_State *L) {
  lfl_trace *tr = checktrace(L, 1);
  fl_tensor *t = lfl_totensor(L, 2);
  const lfl_ud *u = t ? (const lfl_ud *)t : NULL;
  const ir_graph *g;
  if (!u || lfl_islazy(t) || u->trace != tr->id || u->seg != tr->seg - 1 ||
      u->out == -1) {
    lua_pushnil(L);
    return 1;
  }
  lfl_trace_push_list(L, 1, UV_GRAPHS);
  lua_rawgeti(L, -1, (lua_Integer)luaL_len(L, -1));
  g = lfl_checkgraph(L, -1);
  if (u->out <= -2) {
    lua_pushinteger(L, -2 - u->out);
    lua_pushboolean(L, 1);
    return 2;
  }
  if (u->out >= ir_nresults(g)) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushinteger(L, g->outputs[u->out]);
  lua_pushboolean(L, 0);
  return 2;
}

/* tr:params() -> array of {node=, tensor=} for the params of the current
** segment, so the caller can search where they came from. */
static int tr_params(lua_State *L) {
  lfl_trace *tr = checktrace(L, 1);
  int i, k = 0;
  lua_newtable(L);
  for (i = 0; i < tr->next; i++) {
    if (tr->ext[i].input) continue;
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, tr->ext[i].node);
    lua_setfield(L, -2, "node");
    ten_share(lfl_newtensor(L), &tr->ext[i].val);
    lua_setfield(L, -2, "tensor");
    lua_pushlightuserdata(L, (void *)tr->ext[i].key);
    lua_setfield(L, -2, "key");
    lua_rawseti(L, -2, ++k);
  }
  return 1;
}

static int tr_gc(lua_State *L) {
  lfl_trace *tr = (lfl_trace *)luaL_checkudata(L, 1, TRACE_TYPE);
  int i;
  tr->active = 0;
  lfl_trace_clear_externals(tr);
  free(tr->ext);
  tr->ext = NULL;
  tr->extcap = 0;
  ir_free(tr->g);
  tr->g = NULL;
  free(tr->maybe);
  tr->maybe = NULL;
  tr->maybecap = tr->nmaybe = 0;
  free(tr->vof);
  free(tr->vcur);
  tr->vof = tr->vcur = NULL;
  tr->vcap = 0;
  free(tr->subst);
  tr->subst = NULL;
  tr->nsubst = tr->substcap = 0;
  for (i = 0; i < tr->nscope; i++) free(tr->scope[i]);
  tr->nscope = 0;
  return 0;
}

/* fl.graph_break(): cut the graph here (a no-op outside a trace). */
static int break_named(lua_State *L, const char *what) {
  lfl_trace *tr = lfl_trace_active(L);
  if (!tr) return 0;
  record_break(L, tr, what);
  flush(L, tr, what);
  return 0;
}

static int l_graph_break(lua_State *L) { return break_named(L, "fl.graph_break()"); }

/* fl._break_optimizer(): an optimizer's step under a trace (optim.lua):
** each call's .grad is a new tensor the graph cannot hold, so the step
** runs every call, outside the graph, as its own compiled update. */
static int l_break_optimizer(lua_State *L) { return break_named(L, "optimizer step"); }

/* fl._untraced(fn, ...) -> fn(...) with the active trace suspended: what
** fn makes are real tensors and what it runs runs now (an optimizer's
** state, created on its first step, and its own compiled update, which
** reads each call's gradients).  The trace is back on return and on
** error. */
static int l_untraced(lua_State *L) {
  int n = lua_gettop(L), rc;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &active_key);
  lua_insert(L, 1);                          /* the trace (or nil), then fn, args */
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &active_key);
  rc = lua_pcall(L, n - 1, LUA_MULTRET, 0);
  lua_pushvalue(L, 1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &active_key);
  if (rc != LUA_OK) return lua_error(L);
  return lua_gettop(L) - 1;
}

/* fl._scope_push(path) / fl._scope_pop(): module paths for the nodes
** recorded inside a module's forward (cheap no-ops when not tracing). */
static int l_scope_push(lua_State *L) {
  lfl_trace *tr = lfl_trace_active(L);
  const char *p = luaL_checkstring(L, 1);
  if (tr && tr->nscope < MAXSCOPE) {
    size_t n = strlen(p) + 1;
    char *c = malloc(n);
    if (c) { memcpy(c, p, n); tr->scope[tr->nscope++] = c; }
  }
  return 0;
}

static int l_scope_pop(lua_State *L) {
  lfl_trace *tr = lfl_trace_active(L);
  if (tr && tr->nscope > 0) free(tr->scope[--tr->nscope]);
  return 0;
}

/* fl._tracing() -> true while a trace records */
static int l_tracing(lua_State *L) {
  lua_pushboolean(L, lfl_trace_active(L) != NULL);
  return 1;
}

/* fl._trace_reset() -> true when a trace was still recording and is now
** ended (the REPL calls it after an error reached the top level). */
static int l_trace_reset(lua_State *L) {
  lfl_trace *tr = lfl_trace_active(L);
  if (tr) lfl_trace_stop(L, tr);
  lua_pushboolean(L, tr != NULL);
  return 1;
}

static const luaL_Reg trace_methods[] = {
  {"input", tr_input}, {"finish", tr_finish}, {"abort", tr_abort},
  {"node_of", tr_node_of}, {"result_of", tr_result_of}, {"params", tr_params},
  {"input_number", tr_input_number},
  {NULL, NULL}
};

static const luaL_Reg trace_funcs[] = {
  {"_trace_begin", tr_begin}, {"graph_break", l_graph_break}, {"_break_optimizer", l_break_optimizer},
  {"_untraced", l_untraced},
  {"_scope_push", l_scope_push}, {"_scope_pop", l_scope_pop},
  {"_tracing", l_tracing}, {"_trace_reset", l_trace_reset},
  {NULL, NULL}
};

void lfl_open_trace(lua_State *L, int lib) {
  lib = lua_absindex(L, lib);
  if (luaL_newmetatable(L, TRACE_TYPE)) {
    lua_pushcfunction(L, tr_gc);
    lua_setfield(L, -2, "__gc");
    luaL_newlib(L, trace_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, trace_funcs, 0);
  lua_pop(L, 1);
  lfl_resume_open(L, lib);
}
