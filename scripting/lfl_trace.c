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
#include "cpu/program.h"

#define TRACE_TYPE "fl.Trace"
#define MAXEXT 4096        /* externals per segment */
#define MAXSYM 64
#define MAXSCOPE 32
#define MAXARGS 64
#define RESUME_TYPE "fl.Resume"

enum { MODE_RUN, MODE_CAPTURE };

/* uservalues of the trace userdata */
enum { UV_LAZY = 1,        /* node id -> lazy userdata of this segment (weak) */
       UV_BREAKS,          /* array of {reason=, hint=, where=} */
       UV_GRAPHS,          /* array of flushed segment Graphs */
       UV_EXEC,            /* optional Lua function(graph, inputs) -> outputs */
       UV_PLAN,            /* the fl.Resume plan recorded into / replayed, or nil */
       UV_SYMS,            /* {ud = {expr -> SymInt}, guards = {...}, reasons = {...}} */
       UV_COUNT = UV_SYMS };

/* One recorded segment (see RESUMING above). */
typedef struct segrec {
  ir_graph *g;             /* borrowed from the Graph in the plan's anchors;
                              its outputs are the values the flush gave */
  int parent, child, sibling;  /* record indices, -1 for none */
  int *src;                /* 2 per graph input: the segment and output
                              index its value came from (segment -1: the
                              argument proxies of the first segment) */
  char *isout;             /* per node: a graph output */
  char what[48];           /* the break that ended it, "" for the call's end */
  int ganchor;             /* anchors index of the Graph */
  void *pr;                /* a cpu_program the flush runs directly, or NULL */
  int runner;              /* anchors index of a Lua runner(inputs) ->
                              outputs, 0: none (pr, or the eager kernels) */
  int nargs;               /* roots: the call's arguments, kinds[i] 't' */
  char kinds[MAXARGS + 1]; /* (a tensor) or 'v' (any other value) */
} segrec;

typedef struct resume_plan {
  segrec *r;
  int n, cap;
  int root;                /* newest root record, -1 */
  int enabled;             /* calls replay (the Lua body runs each call) */
  int fullgraph, debug;
  long segs, calls;        /* segments run from records; calls replayed */
  struct ext *ext_cache;   /* a finished trace's buffers, for the next one */
  int ext_cap, *maybe_cache, maybe_cap;   /* (one malloc less per call) */
} resume_plan;

enum { PUV_ANCHORS = 1,    /* array: graphs, programs, runners of records */
       PUV_HOOKS,          /* {exec=, diverge=} (compile.lua) */
       PUV_SPARE,          /* the trace of the last replayed call, reused */
       PUV_COUNT = PUV_SPARE };

typedef struct ext {
  const fl_tensor *key;    /* the userdata's tensor (identity) */
  fl_tensor val;           /* a shared reference to its value */
  int node;
  int input;               /* 1: IR_INPUT of the segment, 0: IR_PARAM */
  int sseg, sout;          /* input: the segment and output it came from */
} ext;

struct lfl_trace {
  unsigned id;             /* nonzero; lazies carry it */
  int mode;                /* MODE_RUN (fl.compile) or MODE_CAPTURE */
  int fullgraph;           /* a break is an error */
  int active;              /* recording (between begin and finish/abort) */
  int seg;                 /* current segment number */
  ir_graph *g;             /* the current segment's graph */
  ir_graph *g0;            /* the first segment's: where size expressions live */
  ext *ext;                /* externals of the segment, next[] used */
  int next, extcap;
  int nsym;                /* symbols created for dynamic input dims */
  int sym_arg[MAXSYM], sym_dim[MAXSYM];
  char sym_static[MAXSYM]; /* Lua needed the size as a number: specialize it */
  char sym_name[MAXSYM][64];  /* "x.shape[2]", for reasons */
  int narg;                /* trace inputs declared (function arguments) */
  char *scope[MAXSCOPE];   /* module path stack (nn modules push theirs) */
  int nscope;
  int reads;               /* graph breaks so far */
  int prev_active_ref;     /* the trace active before this one (nesting) */
  resume_plan *plan;       /* records go there (UV_PLAN), or NULL */
  int rec;                 /* replaying: the record matched so far, else -1
                              (recording into g) */
  int cur;                 /* replaying: nodes of rec matched */
  int parent;              /* record of this call's previous segment, -1 */
  int nargs;               /* the call's arguments and their kinds (roots) */
  char kinds[MAXARGS + 1];
  int *maybe, nmaybe, maybecap;  /* replaying: nodes given a lazy (the
                              non-outputs alive at the flush are orphans) */
  int diverged;            /* a replay that recorded something */
};

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

static lfl_trace *checktrace(lua_State *L, int idx) {
  return (lfl_trace *)luaL_checkudata(L, idx, TRACE_TYPE);
}

/* Push the active trace's userdata (for its uservalues). */
static void push_active(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &active_key);
}

static void clear_externals(lfl_trace *tr) {
  int i;
  for (i = 0; i < tr->next; i++) ten_release(&tr->ext[i].val);
  tr->next = 0;
}

/* The graph the current segment's node ids refer to: the record being
** replayed, or the one being built. */
static const ir_graph *seg_graph(const lfl_trace *tr) {
  return tr->rec >= 0 ? tr->plan->r[tr->rec].g : tr->g;
}

/* Start a new, empty segment; the previous graph was handed over.  A
** replayed segment (tr->rec set) builds no graph. */
static int new_segment(lua_State *L, lfl_trace *tr, int tidx) {
  clear_externals(tr);
  tr->nmaybe = 0;
  tr->cur = 0;
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
static void push_list(lua_State *L, int tidx, int uv) {
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
    if (ar.source[0] == '=' && (strcmp(ar.source, "=nn.lua") == 0 ||
                                strcmp(ar.source, "=compile.lua") == 0))
      continue;
    snprintf(buf, n, "%s:%d", ar.short_src, ar.currentline);
    return;
  }
}

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

/* Same values, bit for bit (constants are scalars Lua passed). */
static int values_eq(const fl_tensor *a, const fl_tensor *b) {
  int64_t k, n = meta_numel(&a->m);
  if (!meta_eq(&a->m, &b->m)) return 0;
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
  int64_t k, n = meta_numel(&a->m);
  if (!meta_eq(&a->m, &b->m) || a->m.device != FL_DEV_CPU || !a->st || !b->st) return 0;
  if (ten_is_contiguous(a) && ten_is_contiguous(b))
    return memcmp(ten_data(a), ten_data(b), (size_t)n * dtype_size(a->m.dtype)) == 0;
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

/* What the next step must be, for pick(). */
typedef struct step {
  int kind;                    /* STEP_* */
  const fl_tensor *t;          /* leaves */
  fl_op op;                    /* STEP_OP */
  const int *ids;
  int nin;
  const op_attrs *a;
  const char *what;            /* STEP_END: the break, "" for the call's end */
} step;
enum { STEP_CONST, STEP_PARAM, STEP_INPUT, STEP_SCALAR, STEP_OP, STEP_END };

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
static int pick(lfl_trace *tr, const step *s) {
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

static void user_where(lua_State *L, char *buf, size_t n);

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
  push_active(L);
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
static void diverge(lua_State *L, lfl_trace *tr, const step *s) {
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
  user_where(L, where, sizeof where);
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
static int replay_leaf(lua_State *L, lfl_trace *tr, const fl_tensor *t, int kind) {
  step s;
  memset(&s, 0, sizeof s);
  s.kind = kind;
  s.t = t;
  if (pick(tr, &s)) return tr->cur++;
  diverge(L, tr, &s);
  return -1;
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
    if (tr->rec >= 0 && (id = replay_leaf(L, tr, t, STEP_CONST)) >= 0) return id;
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
    id = replay_leaf(L, tr, t, scalar_in ? STEP_SCALAR : input ? STEP_INPUT : STEP_PARAM);
  if (id >= 0) {
    /* matched the record */
  } else if (input) {
    /* computed earlier in this trace: the value flows in from Lua; a
    ** number stays wrapped (weakest in type promotion, as in eager) */
    id = ir_add_input(tr->g, &t->m, NULL, &e);
    if (id >= 0) tr->g->nodes[id].meta.wrapped = t->m.wrapped;
  } else {
    id = ir_add_param(tr->g, t, NULL, &e);
  }
  if (id < 0) lfl_raise(L, opname, &e);
  tr->ext[tr->next].key = t;
  tr->ext[tr->next].val.st = NULL;
  ten_share(&tr->ext[tr->next].val, t);
  tr->ext[tr->next].node = id;
  tr->ext[tr->next].input = input;
  tr->ext[tr->next].sseg = scalar_in ? -2 : u->seg;
  tr->ext[tr->next].sout = scalar_in ? 0 : u->out;
  tr->next++;
  return id;
}

/* Push a new lazy userdata for node id of the current segment and
** remember it (weakly) so a flush can give it its value. */
static void push_lazy(lua_State *L, lfl_trace *tr, int id) {
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
  push_active(L);
  lua_getiuservalue(L, -1, UV_LAZY);
  lua_pushvalue(L, -3);
  lua_rawseti(L, -2, id);
  lua_pop(L, 2);
}

int lfl_trace_record(lua_State *L, lfl_trace *tr, fl_op op, const fl_tensor *const *in,
                     int nin, const op_attrs *a, const int *asym) {
  int ids[64], k, d, id;
  char where[256];
  fl_err e;
  for (k = 0; k < nin; k++)
    ids[k] = in[k] ? node_of(L, tr, in[k], op_name(op)) : -1;
  if (tr->rec >= 0) {
    step s;
    memset(&s, 0, sizeof s);
    s.kind = STEP_OP;
    s.op = op;
    s.ids = ids;
    s.nin = nin;
    s.a = a;
    if (pick(tr, &s)) {
      push_lazy(L, tr, tr->cur++);
      return 1;
    }
    diverge(L, tr, &s);
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
  push_lazy(L, tr, id);
  return 1;
}

/* ---- flushing a segment ----------------------------------------------- */

/* Run graph g on its inputs: through the Lua executor when fl.compile
** installed one (compiled kernels, caches), else the eager interpreter.
** outs must hold g->nout empty tensors.  Leaves two values on the stack:
** what the executor returned besides the outputs -- a CPU program a
** replay may run directly, and a runner(inputs) -> outputs for the others
** (either may be nil) -- or two nils. */
static void run_segment(lua_State *L, int tidx, const ir_graph *g, int gidx,
                        int pidx, const fl_tensor *const *inputs, fl_tensor *outs) {
  fl_err e;
  int i;
  if (lua_getiuservalue(L, tidx, UV_EXEC) == LUA_TFUNCTION) {
    lua_pushvalue(L, gidx);
    lua_createtable(L, g->ninputs, 0);
    for (i = 0; i < g->ninputs; i++) {
      ten_share(lfl_newtensor(L), inputs[i]);
      lua_rawseti(L, -2, i + 1);
    }
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
      lua_pop(L, 1);
    }
    lua_remove(L, -3);
    return;
  }
  lua_pop(L, 1);
  err_clear(&e);
  if (ir_run(g, eager_apply, inputs, g->ninputs, outs, &e) != FL_OK)
    lfl_raise(L, "graph", &e);
  lua_pushnil(L);
  lua_pushnil(L);
}

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
static int add_record(lua_State *L, lfl_trace *tr, int gidx, const int *src,
                      const char *what, int progidx, int runidx) {
  resume_plan *p = tr->plan;
  const ir_graph *g = lfl_checkgraph(L, gidx);
  segrec *r;
  int planidx, i;
  push_active(L);
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
    r->pr = lfl_toprogram(L, progidx);
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

/* Cut the current segment: outputs = the lazies still reachable, run,
** give them their values; hand the graph to the trace's list.  A full
** collection first, so values nobody can reach are not computed.  The
** next segment starts before the graph runs, so an error while running
** leaves the trace consistent (the old lazies just stay uncomputed). */
static void record_flush(lua_State *L, lfl_trace *tr, const char *what) {
  int tidx, gidx, lazyidx, pidx, n = 0, n2, i;
  int *nodes, *src = NULL;
  fl_tensor *buf;               /* ninputs input shares, then n outputs */
  const fl_tensor **inputs;
  ir_graph *g;
  size_t fresh = 0;
  fl_err e;
  push_active(L);
  tidx = lua_gettop(L);
  lua_gc(L, LUA_GCCOLLECT);
  lua_getiuservalue(L, tidx, UV_LAZY);
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
  buf = lfl_newslots(L, g->ninputs + n);       /* released even if the run raises */
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
  tr->g = NULL;
  new_segment(L, tr, tidx);
  run_segment(L, tidx, g, gidx, pidx, inputs, buf + g->ninputs);
  if (tr->plan) tr->parent = add_record(L, tr, gidx, src, what, lua_gettop(L) - 1, lua_gettop(L));
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
    lua_pop(L, 1);
  }
  for (i = 0; i < g->ninputs + n; i++) ten_release(&buf[i]);
  push_list(L, tidx, UV_GRAPHS);
  lua_pushvalue(L, gidx);
  lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
  lua_settop(L, tidx - 1);
  lfl_account(L, fresh);
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
static void replay_flush(lua_State *L, lfl_trace *tr, const char *what) {
  resume_plan *p = tr->plan;
  const segrec *r = &p->r[tr->rec];
  const ir_graph *g = r->g;
  const fl_tensor *small_in[64], **inputs = small_in;
  fl_tensor small_out[64], *outs = small_out;
  int tidx, lazyidx, i, frame = 0, slots = 0, rc = FL_OK, ri = tr->rec;
  size_t fresh = 0;
  fl_err e;
  push_active(L);
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
    rc = cpu_program_run((cpu_program *)r->pr, inputs, g->ninputs, outs, &e);
  } else if (r->runner) {
    lua_getiuservalue(L, tidx, UV_PLAN);
    lua_getiuservalue(L, -1, PUV_ANCHORS);
    lua_rawgeti(L, -1, r->runner);
    lua_createtable(L, g->ninputs, 0);
    for (i = 0; i < g->ninputs; i++) {
      ten_share(lfl_newtensor(L), inputs[i]);
      lua_rawseti(L, -2, i + 1);
    }
    lua_call(L, 1, 1);
    for (i = 0; i < g->nout; i++) {
      fl_tensor *t;
      lua_rawgeti(L, -1, i + 1);
      t = lfl_totensor(L, -1);
      if (!t || lfl_islazy(t))
        luaL_error(L, "capture: the segment returned no tensor #%d", i + 1);
      ten_share(&outs[i], t);
      lua_pop(L, 1);
    }
    lua_pop(L, 3);
    r = &p->r[ri];
  } else {
    rc = ir_run(g, eager_apply, inputs, g->ninputs, outs, &e);
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
    }
    lua_pop(L, 1);
    ten_release(o);
  }
  p->segs++;
  tr->parent = ri;
  tr->rec = what ? r->child : -1;
  if (what) {
    new_segment(L, tr, tidx);
  } else {                                   /* the call is over */
    clear_externals(tr);
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

static void push_break(lua_State *L, lfl_trace *tr, const char *what);

/* End the current segment (what: the break, NULL at the end of the call). */
static void flush(lua_State *L, lfl_trace *tr, const char *what) {
  if (tr->rec >= 0) {
    step s;
    memset(&s, 0, sizeof s);
    s.kind = STEP_END;
    s.what = what ? what : "";
    if (pick(tr, &s)) {
      replay_flush(L, tr, what);
      return;
    }
    diverge(L, tr, &s);
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
  if (strchr(what, '_') && what[strlen(what) - 1] == '_')
    return "in-place ops have no lowering; write y = x + z instead of x:add_(z)";
  return "this operation has no lowering into a graph; it runs in Lua";
}

static void break_reason(const char *what, char *reason, size_t n) {
  if (strcmp(what, "fl.graph_break()") == 0)
    snprintf(reason, n, "fl.graph_break() called");
  else if (strchr(what, '_') && what[strlen(what) - 1] == '_')
    snprintf(reason, n, "%s: in-place op on a traced tensor", what);
  else
    snprintf(reason, n, "%s() needs a concrete value", what);
}

/* Append the break named what, at the user's line, to the trace's list. */
static void push_break(lua_State *L, lfl_trace *tr, const char *what) {
  char where[256], reason[320];
  (void)tr;
  user_where(L, where, sizeof where);
  break_reason(what, reason, sizeof reason);
  push_active(L);
  push_list(L, lua_gettop(L), UV_BREAKS);
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
  push_active(L);
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
  if (ir_run(c, eager_apply, in, g->ninputs, &out, &e) != FL_OK) lfl_raise(L, "graph", &e);
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

/* ---- the Lua-facing trace object (used by compile.lua) ----------------- */

/* Push a new trace, recording (rec -1) or replaying record rec of the
** plan at planidx (0: none); exec at execidx (0: none).  It becomes the
** active one. */
static lfl_trace *begin(lua_State *L, int mode, int fullgraph, int execidx,
                        int planidx, int rec, int spare) {
  lfl_trace *tr;
  int tidx, i;
  if (spare) {
    /* a finished trace of this plan, made new again: a replayed call
    ** allocates no trace (the struct is several KiB) */
    lua_pushvalue(L, spare);
    tr = (lfl_trace *)lua_touserdata(L, -1);
    clear_externals(tr);
    free(tr->ext);
    free(tr->maybe);
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
  new_segment(L, tr, tidx);
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
  tr = begin(L, mode, fullgraph, execidx, planidx, -1, 0);
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
  tr->ext[tr->next].val.st = NULL;
  ten_share(&tr->ext[tr->next].val, x);
  tr->ext[tr->next].node = id;
  tr->ext[tr->next].input = 1;
  tr->ext[tr->next].sseg = -1;
  tr->ext[tr->next].sout = tr->narg;
  tr->next++;
  tr->narg++;
  push_lazy(L, tr, id);
  return 1;
}

/* Stop recording; the trace is no longer active.  Restores nothing else:
** lazies of an unflushed segment stay uncomputed (their use raises). */
static void stop(lua_State *L, lfl_trace *tr) {
  resume_plan *p = tr->plan;
  tr->active = 0;
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &active_key);
  if (p) {                                   /* the buffers go to the next call */
    clear_externals(tr);
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
static int flush_k(lua_State *L) {
  flush(L, (lfl_trace *)lua_touserdata(L, 1), NULL);
  return 0;
}

static int tr_finish(lua_State *L) {
  lfl_trace *tr = checktrace(L, 1);
  int i, last;
  if (!tr->active) return luaL_error(L, "capture: trace is not recording");
  /* running the last segment can fail (a bad index, no memory, Ctrl-C):
  ** the trace ends all the same, or every later capture would refuse */
  lua_pushcfunction(L, flush_k);
  lua_pushlightuserdata(L, tr);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    stop(L, tr);
    return lua_error(L);
  }
  stop(L, tr);
  lua_createtable(L, 0, 4);
  push_list(L, 1, UV_GRAPHS);
  last = (int)luaL_len(L, -1);
  lua_setfield(L, -2, "graphs");
  push_list(L, 1, UV_BREAKS);
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
  if (tr->active) stop(L, tr);
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
  clear_externals(tr);
  free(tr->ext);
  tr->ext = NULL;
  tr->extcap = 0;
  ir_free(tr->g);
  tr->g = NULL;
  free(tr->maybe);
  tr->maybe = NULL;
  tr->maybecap = tr->nmaybe = 0;
  for (i = 0; i < tr->nscope; i++) free(tr->scope[i]);
  tr->nscope = 0;
  return 0;
}

/* fl.graph_break(): cut the graph here (a no-op outside a trace). */
static int l_graph_break(lua_State *L) {
  lfl_trace *tr = lfl_trace_active(L);
  if (!tr) return 0;
  record_break(L, tr, "fl.graph_break()");
  flush(L, tr, "fl.graph_break()");
  return 0;
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
  if (tr) stop(L, tr);
  lua_pushboolean(L, tr != NULL);
  return 1;
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
    tr = begin(L, MODE_RUN, p->fullgraph, lua_gettop(L) - 1, pidx, root, spare);
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
        stop(L, tr);
        return luaL_error(L, "capture: out of memory");
      }
      tr->ext = ne;
      tr->extcap = cap;
    }
    tr->ext[tr->next].key = NULL;
    tr->ext[tr->next].val.st = NULL;
    ten_share(&tr->ext[tr->next].val, x);
    tr->ext[tr->next].node = k;
    tr->ext[tr->next].input = 1;
    tr->ext[tr->next].sseg = -1;
    tr->ext[tr->next].sout = k;
    tr->next++;
    push_lazy(L, tr, k++);
  }
  tr->narg = k;
  tr->cur = k;
  if (lua_pcall(L, nargs, LUA_MULTRET, hidx) != LUA_OK) {
    stop(L, tr);
    return lua_error(L);
  }
  nres = lua_gettop(L) - fidx + 1;
  lua_pushcfunction(L, flush_k);
  lua_pushlightuserdata(L, tr);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    stop(L, tr);
    return lua_error(L);
  }
  stop(L, tr);
  if (tr->diverged) {
    push_list(L, tidx, UV_BREAKS);
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

static const luaL_Reg trace_methods[] = {
  {"input", tr_input}, {"finish", tr_finish}, {"abort", tr_abort},
  {"node_of", tr_node_of}, {"params", tr_params},
  {NULL, NULL}
};

static const luaL_Reg trace_funcs[] = {
  {"_trace_begin", tr_begin}, {"graph_break", l_graph_break},
  {"_scope_push", l_scope_push}, {"_scope_pop", l_scope_pop},
  {"_tracing", l_tracing}, {"_trace_reset", l_trace_reset},
  {"_resume_new", rp_new}, {"_resume_enable", rp_enable}, {"_resume_counts", rp_counts},
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
  if (luaL_newmetatable(L, RESUME_TYPE)) {
    lua_pushcfunction(L, rp_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_pushvalue(L, lib);
  luaL_setfuncs(L, trace_funcs, 0);
  lua_pop(L, 1);
}
