/*
** lfl_trace_impl.h -- what capture (lfl_trace.c) and resuming
** (lfl_resume.c) share: the trace and plan structs, the records, and the
** helpers each file gives the other.  Only lfl_trace.c and lfl_resume.c
** include it; everyone else sees lfl.h.
*/
#ifndef LFL_TRACE_IMPL_H
#define LFL_TRACE_IMPL_H

#include "lfl.h"
#include "graph/autograd.h"

#define TRACE_TYPE "fl.Trace"
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
       UV_SYMS,            /* {ud = {expr -> SymInt, "iota DT N" -> tensor}, guards, reasons} */
       UV_COUNT = UV_SYMS };

/* One recorded segment (see RESUMING in lfl_resume.c). */
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
  void *pr;                /* a exec_program the flush runs directly, or NULL */
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
  ag_fn *ag;               /* its history, held: the executor's input gets
                              it, so a compiled segment's backward hands
                              the gradient on to the segment it came from */
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
  int nwrites;             /* in-place writes captured in this segment */
  int ninternal;           /* of them, into values the segment computed */
  int *subst, nsubst, substcap;  /* nodes whose lazies got a real view of
                              an argument or param at this segment's end */
  int *vof, *vcur, vcap;   /* per node id + 1, 0 for none: the root a
                              written value is a version of; a root's
                              latest version (see WRITES in lfl_trace.c) */
};

/* What the next step must be, for lfl_resume_pick(). */
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

/* ---- lfl_trace.c, for lfl_resume.c ---- */
/* Push the active trace's userdata (for its uservalues). */
void lfl_trace_push_active(lua_State *L);
void lfl_trace_clear_externals(lfl_trace *tr);
/* Start a new, empty segment of the trace at tidx. */
int lfl_trace_new_segment(lua_State *L, lfl_trace *tr, int tidx);
/* The trace's list at uservalue uv (UV_BREAKS, UV_GRAPHS), made when
** first needed. */
void lfl_trace_push_list(lua_State *L, int tidx, int uv);
/* Push a new lazy userdata for node id of the current segment. */
void lfl_trace_push_lazy(lua_State *L, lfl_trace *tr, int id);
/* Push a new trace, recording (rec -1) or replaying record rec of the
** plan at planidx; it becomes the active one. */
lfl_trace *lfl_trace_begin(lua_State *L, int mode, int fullgraph, int execidx,
                           int planidx, int rec, int spare);
/* Stop recording; the trace is no longer active. */
void lfl_trace_stop(lua_State *L, lfl_trace *tr);
/* lua_CFunction(trace as light userdata): flush the last segment, for a
** protected call. */
int lfl_trace_flush_k(lua_State *L);

/* After a segment ran: lazies that view another output get real views
** of it (outs: the graph's outputs). */
/* An executor's or runner's output k that has a history gives it to the
** lazy of output k (NULL: no lazy alive; the reference goes), through
** the array lfl_trace_histories pushes (n zeroed slots, collected). */
ag_fn **lfl_trace_histories(lua_State *L, int n);
/* The next external: a shared reference to t's value and its history. */
void lfl_trace_add_ext(lfl_trace *tr, const fl_tensor *t);
/* Push a list of segment graph g's inputs, from tr's externals: their
** values, and their histories (a compiled training segment hands its
** inputs' gradients to them: the chain to the segment they came from). */
void lfl_trace_push_inputs(lua_State *L, const lfl_trace *tr, const ir_graph *g);
void lfl_trace_take_history(ag_fn **ags, int k, const fl_tensor *t);
void lfl_trace_give_history(ag_fn **ags, int k, fl_tensor *lazy);
void lfl_trace_alias_views(lua_State *L, const lfl_trace *tr, const ir_graph *g, int lazyidx,
                           const fl_tensor *outs);

/* ---- lfl_resume.c, for lfl_trace.c ---- */
/* The record whose next step is s (the current one or a sibling with the
** same prefix) becomes tr->rec; 0 when none has it. */
int lfl_resume_pick(lfl_trace *tr, const step *s);
/* The replay does not match s: record from here on (tr->rec = -1). */
void lfl_resume_diverge(lua_State *L, lfl_trace *tr, const step *s);
/* Replaying: leaf t is the next node?  Its id, or -1 after diverging. */
int lfl_resume_leaf(lua_State *L, lfl_trace *tr, const fl_tensor *t, int kind);
/* Record the segment just flushed; returns its record index. */
int lfl_resume_add_record(lua_State *L, lfl_trace *tr, int gidx, const int *src,
                          const char *what, int progidx, int runidx);
/* Flush a segment that matched record tr->rec to its end. */
void lfl_resume_flush(lua_State *L, lfl_trace *tr, const char *what);
/* The fl.Resume metatable and fl._resume_* functions into the table at lib. */
void lfl_resume_open(lua_State *L, int lib);

#endif
