/*
** lfl.h -- the Lua bindings of fuselab: the `fl` table and the fl.Tensor
** userdata.  This is the only layer (with repl/) that includes lua.h; it
** turns the core's status codes and error records into Lua errors, after
** every C temporary has been released (temporaries here are userdata, so
** the collector releases them).
**
** Conventions at the Lua surface:
**   - dimension and position arguments are 1-based; negative ones count
**     from the end (-1 is the last); 0 is never a valid dimension;
**   - values stored in tensors (argmax results, embedding indices) are
**     0-based, as in PyTorch, so data moves to and from NumPy unchanged.
*/
#ifndef LFL_H
#define LFL_H

#include <lua.h>
#include <lauxlib.h>

#include "graph/ir.h"

#define LFL_TENSOR "fl.Tensor"   /* metatable name (also __name) */
/* Registry key of the value fl._shown noted (repl.h has the same name). */
#define LFL_SHOWN_KEY "fuselab.shown"

int luaopen_fuselab(lua_State *L);

/* --- the tensor userdata (lfl_tensor.c) ------------------------------- */
/* The block behind every fl.Tensor userdata.  The tensor comes first, so
** the fl_tensor* every binding handles is also the lfl_ud*.  A tensor made
** while a trace records (lfl_trace.c) is LAZY until its graph runs: it has
** metadata but no storage, and trace/node say where its value will come
** from. */
typedef struct lfl_ud {
  fl_tensor t;
  unsigned trace;   /* id of the trace that made it, 0 for none */
  int seg;          /* that trace's segment it belongs to */
  int node;         /* its node in the segment's graph; -1 once computed */
  int out;          /* once computed: its output index in that segment's
                       graph (a replayed call finds it by seg and out) */
  unsigned fresh;   /* made by fl.arange while trace `fresh` recorded: a
                       constant of its graph (eager code makes it anew on
                       every call), not a param bound by reference */
  struct ag_fn *ag; /* autograd (lfl_autograd.c): the leaf's accumulator
                       or the op that made it; NULL: no grad required */
} lfl_ud;
#define lfl_ud_of(t) ((lfl_ud *)(t))
#define lfl_islazy(t) (lfl_ud_of(t)->node >= 0)
/* The tensor at idx with its values: a lazy tensor is computed first (a
** graph break named `what` when a trace is recording). */
fl_tensor *lfl_checkdata(lua_State *L, int idx, const char *what);
/* The fl_tensor at stack index idx, or a Lua argument error. */
fl_tensor *lfl_checktensor(lua_State *L, int idx);
/* The fl_tensor at idx, or NULL when the value is not an fl.Tensor. */
fl_tensor *lfl_totensor(lua_State *L, int idx);
#define lfl_istensor(L, idx) (lfl_totensor((L), (idx)) != NULL)
/* Push a new, empty (no storage) tensor userdata and return its slot; the
** caller fills it (ten_empty, eager_apply, npy_load...).  The userdata
** exists before the resource, so a failure in between leaks nothing. */
fl_tensor *lfl_newtensor(lua_State *L);
/* Push a new contiguous tensor with metadata m (zero-filled); raises
** (naming what and the size) when the size is invalid or too large. */
fl_tensor *lfl_pushempty(lua_State *L, const fl_meta *m, const char *what);
/* Push a new userdata that takes over src's storage reference (src is
** left without one).  Storage no one else holds is new memory: it is
** counted for the collector like lfl_pushempty's (compiled programs' and
** graphs' outputs come this way). */
fl_tensor *lfl_pushmoved(lua_State *L, fl_tensor *src);
/* Push a userdata of n empty tensor slots (and one spare) and return them;
** slots still holding storage when it is collected are released, so a
** raise between filling and handing them on leaks nothing.  A finalized
** userdata costs about 1 us per call: the per-call run paths use plain
** slots and release them on their own error paths. */
fl_tensor *lfl_newslots(lua_State *L, int n);
/* Count n bytes of new storage held outside the Lua heap; collects when
** enough has been allocated, so loops dropping large tensors stay bounded. */
void lfl_account(lua_State *L, size_t n);
/* A full collection after an allocation failure, before one retry. */
void lfl_collect(lua_State *L);
/* Push a Lua number as a wrapped 0-dim tensor: an integer becomes int64, a
** float float32, with meta.wrapped set (weakest in type promotion). */
fl_tensor *lfl_pushscalar(lua_State *L, int idx);
/* The tensor at idx, or a wrapped scalar pushed for a number at idx. */
fl_tensor *lfl_checkoperand(lua_State *L, int idx);
/* Float Lua numbers among in[0..n) (stack slots first..) held in double
** when a tensor among them is float64, as PyTorch holds a Python float;
** still wrapped, so promotion is unchanged. */
void lfl_widen_numbers(lua_State *L, const fl_tensor **in, int first, int n);
/* Fill the metatable at meta (__gc, __index...) and the method table at
** methods with the tensor's own methods (queries, to, in-place ops). */
void lfl_open_tensor(lua_State *L, int meta, int methods);
/* The object (graph or plan) made from the Graph at src came from src's
** captured graph: what "op by op" means in p:memory() (lfl_memory.c). */
void lfl_note_origin(lua_State *L, int src, const void *made);
/* The memory chart of plan p as SVG (malloc'd), or NULL with e set. */
struct fuse_plan;
char *lfl_memory_svg(lua_State *L, const struct fuse_plan *p, fl_err *e);
/* Push t's shape as a Lua array (x.shape). */
void lfl_pushshape(lua_State *L, const fl_tensor *t);

/* --- autograd (lfl_autograd.c) ---------------------------------------- */
int lfl_requires_grad(const fl_tensor *t);
/* After op ran eagerly into out: record it on the tape when grad mode is
** on and an input requires grad.  key/block: the random stream's state
** before the op (dropout draws its mask again from there). */
void lfl_ag_record(lua_State *L, fl_op op, const fl_tensor *const *in, int nin,
                   const op_attrs *a, fl_tensor *out, uint64_t key, uint64_t block);
/* Raises when writing src (NULL: a number) into t in place would lose a
** gradient: t requires grad, or src does and t not (grad mode on). */
void lfl_ag_check_write(lua_State *L, const fl_tensor *t, const fl_tensor *src,
                        const char *what);
/* "requires grad" (a leaf) or "grad_fn MulBackward" into buf, for the
** printed form; NULL when t requires no grad. */
const char *lfl_ag_label(const fl_tensor *t, char *buf, size_t n);
/* __gc: the tensor's hold on the tape. */
void lfl_ag_release(fl_tensor *t);
/* What the tensor's finalizer does, now: its storage (and history) let go,
** the userdata left empty.  For tensors only fuselab's own Lua holds. */
void lfl_drop(lua_State *L, fl_tensor *t);
/* x.grad, x.requires_grad, x.grad_fn, x.is_leaf: 1 when k is one of them
** (its value pushed); setting x.grad, x.requires_grad: 1 when handled. */
int lfl_ag_index(lua_State *L, fl_tensor *t, const char *k);
int lfl_ag_newindex(lua_State *L, fl_tensor *t, const char *k, int v);
void lfl_open_autograd(lua_State *L, int methods, int lib);
/* fl._adam_step, fl._sgd_step: fused optimizer updates (lfl_optim.c). */
void lfl_open_optim(lua_State *L, int lib);
/* Push fl.backward_graph of the tensor at idx and return 1 when it has a
** grad_fn, else 0 (nothing pushed). */
int lfl_ag_push_graph(lua_State *L, int idx);

/* --- capture (lfl_trace.c) ------------------------------------------- */
typedef struct lfl_trace lfl_trace;
/* The trace recording now, or NULL (the common case: a plain load). */
lfl_trace *lfl_trace_active(lua_State *L);
/* Mark tensor t, just made by a factory (fl.arange), as the active trace's
** own: it enters the graph as a constant.  No trace, or t not in host
** memory: nothing (t is a param, as before). */
void lfl_trace_mark_fresh(lua_State *L, fl_tensor *t);
/* Record op into the active trace instead of running it; pushes the lazy
** result.  Raises shape errors exactly as eager execution would. */
int lfl_trace_record(lua_State *L, lfl_trace *tr, fl_op op, const fl_tensor *const *in,
                     int nin, const op_attrs *a, const int *asym);
/* Compute a lazy tensor: runs its segment's graph (a graph break, or an
** error under fullgraph/capture, named `what`). */
void lfl_trace_materialize(lua_State *L, fl_tensor *t, const char *what);
/* An in-place write of val into dst while a trace records, captured as
** graph ops (functionalization): 1 when done, 0 when it cannot be (no
** trace, or a write the graph cannot express): the caller then writes
** eagerly, after lfl_trace_before_write. */
int lfl_trace_write(lua_State *L, fl_tensor *dst, const fl_tensor *val, const char *what);
/* Before an eager write into dst while a trace records: a graph break
** when the current segment reads dst's storage, so what it computed
** before the write sees the old values. */
void lfl_trace_before_write(lua_State *L, fl_tensor *dst, const char *what);
/* Symbolic sizes: the graph their expressions live in (the first
** segment's, NULL after a break), the trace's id, the user's file:line,
** the cache of SymInt userdata by expression (and of iotas), a variable's source
** ("x.shape[2]").  specialize: every variable in expression x becomes
** static, with the reason; guard: the capture holds only while
** (a cmp b) == expect (cmp: LFL_SYM_LT, LE, EQ), text says why. */
ir_graph *lfl_trace_symgraph(const lfl_trace *tr);
ir_graph *lfl_trace_g0(const lfl_trace *tr);
unsigned lfl_trace_id(const lfl_trace *tr);
void lfl_trace_where(lua_State *L, char *buf, size_t n);
void lfl_trace_push_symcache(lua_State *L);
const char *lfl_trace_symname(const lfl_trace *tr, int var);
void lfl_trace_specialize(lua_State *L, lfl_trace *tr, int x, const char *why);
void lfl_trace_guard(lua_State *L, lfl_trace *tr, int a, int cmp, int b, int expect,
                     const char *text);
enum { LFL_SYM_LT, LFL_SYM_LE, LFL_SYM_EQ };

/* --- resuming (lfl_resume.c) ------------------------------------------ */
/* A lazy tensor left uncomputed by a replayed segment (it looked like
** garbage, see lfl_resume.c) is computed now; returns 1 when t has its
** value, 0 when t is lazy for good (its capture failed). */
int lfl_trace_resolve(lua_State *L, fl_tensor *t);
/* Forget the bookkeeping of a lazy tensor being collected. */
void lfl_trace_forget(lua_State *L, fl_tensor *t);
/* fl.compile of a function whose Lua runs on every call (graph breaks):
** runs fn (at fnidx) on the nargs values at base against the segments
** recorded in the plan at pidx.  Returns the number of results (pushed on
** top), or -1 with why/argi/dim filled when no recorded first segment
** takes these arguments (the Lua slow path traces then). */
int lfl_resume_call(lua_State *L, int pidx, int fnidx, int base, int nargs,
                    char *why, size_t wn, int *argi, int *dim);
/* The plan at idx is in use (the function runs its Lua each call). */
int lfl_resume_enabled(lua_State *L, int idx);

/* --- symbolic sizes in Lua (lfl_sym.c) -------------------------------- */
/* Push size d of t: an integer, or a SymInt when t is a lazy tensor whose
** dim d is symbolic. */
void lfl_pushsize(lua_State *L, const fl_tensor *t, int d);
void lfl_pushnumel(lua_State *L, const fl_tensor *t);
/* 1 when the value at idx is a SymInt. */
int lfl_issym(lua_State *L, int idx);
/* The size at idx as its value seen now; *x gets its expression index
** when x is not NULL, else the SymInt is specialized (its variables become
** static) because `what` needs a plain number. */
int64_t lfl_symsize(lua_State *L, int idx, int *x, const char *what);
/* The SymInt at idx as a 0-d int64 tensor of the graph (x * T), pushed. */
fl_tensor *lfl_sym_totensor(lua_State *L, int idx);
/* fl.arange(n) for a symbolic n under capture. */
int lfl_sym_arange(lua_State *L, fl_dtype dt, fl_device dev);
void lfl_open_sym(lua_State *L, int lib);
void lfl_open_trace(lua_State *L, int lib);
/* Graph userdata (lfl_graph.c): push a new one owning g. */
void lfl_pushgraph(lua_State *L, ir_graph *g);
ir_graph *lfl_checkgraph(lua_State *L, int idx);
void lfl_open_graph(lua_State *L, int lib);
/* Compiled callables (lfl_compile.c) and the Lua half (compile.lua). */
void lfl_open_compile(lua_State *L, int lib);
/* fl.checklist (checklist.lua) and its helpers (lfl_checklist.c). */
void lfl_open_checklist(lua_State *L, int lib);
/* lfl_measure.c: fl.measure, fl.compare_times; a timing summary (in ms) as
** a Lua table and back */
struct meas_summary;
#define LFL_LIB_KEY "fuselab.lib"     /* the registry's reference to the fl table */
void lfl_open_measure(lua_State *L, int lib);
void lfl_push_summary(lua_State *L, const struct meas_summary *s);
int lfl_to_summary(lua_State *L, int idx, struct meas_summary *s, const char *where);
/* fl.Plan and fl.Program (lfl_plan.c): g:fuse, p:codegen, k:run. */
struct fuse_plan *lfl_toplan(lua_State *L, int idx);
struct exec_program *lfl_toprogram(lua_State *L, int idx);
/* The same for a CUDA program (lfl_cuda.c); NULL for anything else. */
struct exec_program *lfl_tocudaprogram(lua_State *L, int idx);
/* A program of either backend (exec_program_run runs it as its backend
** does), or NULL. */
struct exec_program *lfl_toanyprogram(lua_State *L, int idx);
/* Push pr (the reference moves) as an fl.CudaProgram (lfl_cuda.c). */
void lfl_pushcudaprogram(lua_State *L, struct exec_program *pr);
/* The CUDA backend, or NULL in a build without it. */
const struct exec_backend *lfl_cuda_backend(void);
/* A compiled program (exec/program.h) as Lua sees it: a userdata whose
** only field is the program (NULL once collected).  What every backend's
** Program shares -- __gc, __tostring (its source), compile, try_compile,
** run, source, log -- comes from lfl_program_type, on the executor; a
** backend names its type, how it runs (CUDA's graph mode), and adds its
** own methods in `extra`. */
typedef struct lfl_progtype {
  const char *type;        /* the metatable's name: "fl.Program" */
  int (*run)(struct exec_program *pr, const fl_tensor *const *in, int n, fl_tensor *outs,
             fl_err *e);
} lfl_progtype;
void lfl_program_type(lua_State *L, const lfl_progtype *be, const luaL_Reg *extra);
/* The program in the userdata at idx, which must be of be's type. */
struct exec_program *lfl_checkprogram(lua_State *L, int idx, const lfl_progtype *be);
/* Push a new, empty Program userdata of be's type; returns its slot, which
** the caller fills (an error before that leaks nothing). */
struct exec_program **lfl_newprogram(lua_State *L, const lfl_progtype *be);
/* Raise e from compiling pr, with the compiler's log when it has one. */
int lfl_program_raise(lua_State *L, struct exec_program *pr, const fl_err *e);
/* Push a new fl.Plan userdata holding a reference to p. */
void lfl_pushplan(lua_State *L, struct fuse_plan *p);
void lfl_open_plan(lua_State *L, int lib);
/* fl.draw, fl.draw_compare, fl.report (lfl_viz.c). */
void lfl_open_viz(lua_State *L, int lib);
/* fl.cuda_available, x:cuda()/x:cpu()/x:to("cuda"), p:codegen("cuda") (lfl_cuda.c). */
/* Replace the tensor on top of the stack by its copy on dev (nothing when
** it is there): how factories made on the host honour {device=}. */
int lfl_place(lua_State *L, fl_device dev);
/* The tensor at idx with values the host can read: itself, or a host copy
** that replaces it in its stack slot (item, tolist, allclose on CUDA). */
fl_tensor *lfl_readable(lua_State *L, int idx, const char *what);
void lfl_open_cuda(lua_State *L, int lib);

/* --- ops (lfl_ops.c) -------------------------------------------------- */
/* THE dispatch point: every op invoked from Lua runs here.  Pushes the
** result as a new userdata (1 returned) or raises the core's message.
** The inputs must be anchored on the Lua stack for the call. */
/* The same with attribute slots given by size expressions (ir_node's
** asym), or NULL. */
int lfl_dispatch_sym(lua_State *L, fl_op op, const fl_tensor *const *in,
                     int nin, const op_attrs *a, const int *asym);
int lfl_dispatch(lua_State *L, fl_op op, const fl_tensor *const *in,
                 int nin, const op_attrs *a);
/* Run graph g op by op where its tensors are: the eager kernels on the
** CPU; with any input or weight on CUDA, one generated kernel per op there
** (the unfused plan).  What fl.capture's values, g:run and the fallback of
** a graph no fused plan lowers use. */
int lfl_graph_run_eager(const ir_graph *g, const fl_tensor *const *in, int n, fl_tensor *outs,
                        fl_err *e);
/* An eager op on the device (lfl_cuda.c: a generated per-op kernel,
** compiled once and launched; fl.rand's, which has no inputs to say
** where); pushes the result, unrecorded. */
int lfl_cuda_eager(lua_State *L, fl_op op, const fl_tensor *const *in,
                   int nin, const op_attrs *a);
/* One op where its inputs are: the ir_apply_fn of eager ops and of
** autograd's backward (eager_apply, or gpu/cuda_eager.c's with any input
** on the device). */
int lfl_apply(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a, fl_tensor *out,
              fl_err *e);
/* t (contiguous) filled with v on its device. */
int lfl_fill(fl_tensor *t, double v, fl_err *e);
/* dst <- src (broadcast to dst's shape, converted to its dtype) on either
** device; a device destination must be contiguous. */
int lfl_copy_into(fl_tensor *dst, const fl_tensor *src, fl_err *e);
/* *dst = src on dev: a new reference when it is there, else a copy. */
int lfl_move(fl_tensor *dst, const fl_tensor *src, fl_device dev, fl_err *e);
/* The same, but never recorded: for in-place ops, which are graph breaks
** (their inputs were computed first) and so run eagerly even in a trace. */
int lfl_dispatch_eager(lua_State *L, fl_op op, const fl_tensor *const *in,
                       int nin, const op_attrs *a);
/* Register every op binding: methods into the table at index `methods`,
** function forms into the table at index `lib`, operators (__add...) into
** the metatable at index `meta`. */
void lfl_open_ops(lua_State *L, int meta, int methods, int lib);

/* --- shared argument helpers (lfl_lib.c) ------------------------------ */
/* The type name for messages: "fl.Tensor" for tensors, else Lua's. */
const char *lfl_typename(lua_State *L, int idx);
/* Raise e's message, prefixed with "what: " unless it already names it. */
int lfl_raise(lua_State *L, const char *what, const fl_err *e);
/* Convert a 1-based (or negative) Lua dimension for an ndim-d tensor to
** 0-based; raises "<what>: dim 3 out of range for a 2-d tensor ...". */
int lfl_dim(lua_State *L, lua_Integer d, int ndim, const char *what);
/* The dim argument at idx (must be an integer-valued number). */
int lfl_checkdim(lua_State *L, int idx, int ndim, const char *what);
/* Sizes given as varargs from idx (numbers) or one table at idx; stops at
** the first non-number.  Returns the count and sets *next to the first
** argument not consumed.  Non-integers and too many dims raise. */
/* lfl_sizes_sym: a SymInt size k is kept as asym[k] = expression + 1 (the
** rest 0); with asym NULL (lfl_sizes) it is specialized. */
int lfl_sizes_sym(lua_State *L, int idx, int64_t *sizes, int *asym, int *next,
                  const char *what);
int lfl_sizes(lua_State *L, int idx, int64_t *sizes, int *next,
              const char *what);
/* A factory's options {dtype=, device=, requires_grad=} from a table at
** idx (absent: defaults kept; requires_grad is the factories' wrapper's,
** lfl_autograd.c); lfl_move_options, x:to's, takes {dtype=, device=}. */
void lfl_options(lua_State *L, int idx, fl_dtype *dtype, fl_device *dev,
                 const char *what);
void lfl_move_options(lua_State *L, int idx, fl_dtype *dtype, fl_device *dev,
                      const char *what);
/* Field k of the table at t: a number (def when absent or not a number),
** a truth value (Lua's). */
double lfl_num_field(lua_State *L, int t, const char *k, double def);
int lfl_bool_field(lua_State *L, int t, const char *k);
/* Raise unless device can hold tensors in this build ("no CUDA device"). */
void lfl_checkdevice(lua_State *L, fl_device dev, const char *what);
/* Raise "<what>: unknown option 'x' (expected a, b)" when the table at idx
** has a key not in the NULL-terminated list allowed (catches typos). */
void lfl_checkkeys(lua_State *L, int idx, const char *const *allowed,
                   const char *what);

/* Fill the fl table at fl_index: fl.nn and fl.models (lfl_nn.c),
** fl.save_weights and fl.load_weights (lfl_weights.c). */
int lfl_open_nn(lua_State *L, int fl_index);
int lfl_open_weights(lua_State *L, int fl_index);
/* fl.load_onnx (onnx.lua) over the reader (lfl_onnx.c); after lfl_open_nn. */
void lfl_open_onnx(lua_State *L, int lib);
/* fl.tokenizer (lfl_tokenizer.c) */
void lfl_open_tokenizer(lua_State *L, int lib);

#endif
