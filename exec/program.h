/*
** program.h -- the executor: a fusion plan as a program of one backend,
** from source to running it on tensors, for every backend alike.
**
** What a Program does between kernels is the same on every device: name
** and render each kernel, compile the distinct ones once (through a
** cache), bind sizes and kernel arguments for a set of input shapes (kept
** while the shapes repeat), place inputs and weights on the device, give
** every stored value its memory-plan slot, reserve random draws, launch
** the kernels in order, free what no later kernel reads, hand back the
** outputs, and time each kernel on request.  That lives here, once.
**
** A backend supplies only what differs, in the split tinygrad uses:
**   renderer  preamble + one kernel's source (and its launch info)
**   compiler  head + distinct kernels -> a counted image
**   runtime   load the image, place tensors on the device, launch one
**             kernel (its extern step included), sync
** cpu/backend.c is the C backend (gcc through exec/cache.c), gpu/
** cuda_program.c the CUDA one (NVRTC, the CUDA runtime, CUDA graphs).
**
** Invariant: a kernel is launched only with buffers that exist on the
** backend's device and are contiguous in the shapes its launch metadata
** says, with the arguments fk_bind computed for exactly those shapes.
*/
#ifndef FL_EXEC_PROGRAM_H
#define FL_EXEC_PROGRAM_H

#include <stdio.h>

#include "../fuse/plan.h"
#include "../graph/strbuf.h"

typedef struct exec_program exec_program;
typedef struct exec_run exec_run;

typedef struct exec_backend {
  const char *name;       /* "cpu", "cuda": messages and stats */
  fl_device dev;          /* where its buffers live */
  size_t kinfo_size;      /* bytes of launch info per kernel (render fills) */
  /* renderer: the fixed head for these plans, and kernel k of p named
  ** sym (1 written, 0 nothing to generate, < 0 error in e); known: the
  ** kernel's first fk_static_nargs arguments, which the source may hold as
  ** constants, or NULL (all are arguments) */
  void (*preamble)(strbuf *b, const fuse_plan *const *plans, int n);
  int (*render)(strbuf *b, const fuse_plan *p, int k, const char *sym, void *kinfo,
                const int64_t *known, fl_err *e);
  /* compiler: head + units (each a translation unit after head) into a
  ** counted image; *log gets the compiler's output (malloc'd, or NULL),
  ** *how the CACHE_* place it came from */
  int (*compile)(const char *head, const char *const *units, int nunits, void **image,
                 char **log, int *how, fl_err *e);
  void *(*image_retain)(void *image);
  void (*image_release)(void *image);
  /* runtime: resolve pr->fns from pr->image (kernel k loads pr->alias[k]
  ** when set); a contiguous tensor with src's values on the device (a
  ** shared reference when it already is one); copy between contiguous
  ** tensors of one size; kernel k with its extern step; wait */
  int (*load)(exec_program *pr, fl_err *e);
  int (*to_device)(fl_tensor *dst, const fl_tensor *src, fl_err *e);
  int (*copy_into)(fl_tensor *dst, const fl_tensor *src, fl_err *e);
  int (*launch)(exec_run *r, int k, fl_err *e);
  int (*sync)(fl_err *e);
  /* int64 arguments kernel k takes (fk_nargs, plus an extern's own) */
  int (*nargs)(const exec_program *pr, int k);
  /* the backend's own state (pr->priv), NULL ok */
  void (*free_priv)(exec_program *pr);
  /* node id's value out of the blocked layout r->blk[id] names, into the
  ** plain one (r->blk[id] then 0); NULL where nothing is written blocked */
  int (*unblock)(exec_run *r, int id, fl_err *e);
  /* the blocked layout kernel k's plan writes its result in ("nChw8c"),
  ** for the host program's listing; NULL, or 0 where it is plain */
  int (*layout)(const exec_program *pr, int k, char *buf, size_t n);
  /* a whole run, where the backend has its own way (CUDA graphs replay a
  ** captured run): exec_program_run calls it, and it walks the kernels
  ** with exec_program_run_flags; NULL: exec_program_run walks them */
  int (*run)(exec_program *pr, const fl_tensor *const *inputs, int ninputs, fl_tensor *outs,
             fl_err *e);
  /* how kernel k reads an input otherwise than as a tensor (cpu: a channel
  ** shuffle's planes where they lie), for the listing; NULL, or 0 */
  int (*reads)(const exec_program *pr, int k, char *buf, size_t n);
} exec_backend;

struct exec_program {
  int refs;              /* exec_program_retain; the last free frees it */
  const exec_backend *be;
  fuse_plan *plan;       /* one reference, dropped by exec_program_free */
  char prefix[32];       /* prepended to every kernel symbol */
  char **syms;           /* per kernel: symbol, NULL when nothing is generated */
  char **ktext;          /* per kernel: its source, NULL likewise */
  char **alias;          /* per kernel: the symbol to load instead (the same
                            code compiled once in a batch), or NULL */
  void *kinfo;           /* per kernel: be->kinfo_size bytes of launch info */
  int64_t **known;       /* per kernel: the sizes it was rendered with
                            (fk_static_nargs of them), or NULL: it takes
                            them as arguments */
  char *body;            /* the kernels, without the preamble */
  char *source;          /* preamble + body: what `print(k)` shows */
  char *log;             /* compiler output of the last compile, or NULL */
  void *image;           /* the compiled image (counted), or NULL */
  int loaded;            /* fns resolved from image */
  void **fns;            /* per kernel: entry point, NULL when none */
  int how;               /* CACHE_COMPILED / CACHE_DISK / CACHE_MEMORY */
  double compile_ms;     /* wall time of the last compile (or lookup) */
  int64_t runs;          /* completed runs */
  double run_ms;         /* their wall time, summed */
  fl_tensor *slots;      /* the memory plan's slots, kept between runs */
  fl_tensor *leaves;     /* per node: params and consts on the device */
  /* Sizes bound for the last input shapes seen: a call with the same
  ** shapes (the steady state) skips shape inference and fk_bind. */
  fl_meta *bound_in;     /* the inputs' metadata, or NULL before a run */
  fl_meta *bound_metas;  /* every node's metadata for those inputs */
  int64_t *bound_args;   /* per kernel: its arguments (maxargs each) */
  int maxargs;
  /* Per-kernel wall time while `profile` is set (the device is synced
  ** around each kernel, so off by default). */
  int profile;
  double *kernel_ms;     /* per kernel: summed over the profiled runs */
  double *last_ms;       /* per kernel: the last profiled run */
  int64_t profiled_runs;
  int64_t *kernel_ran;   /* per kernel: profiled runs that launched it */
  /* Values computed from weights alone (a batch norm folded into its
  ** convolution's weights): kernels with keep[k] run when the params'
  ** values or the input shapes changed since they last ran, and their
  ** stored values stay between calls in kept[], memory of their own
  ** rather than a slot.  keep is NULL where nothing is kept (no such
  ** kernel, or a backend whose launches are captured: CUDA graphs). */
  char *keep;            /* per kernel: 1 when it reads weights only */
  fl_tensor *kept;       /* per node: its value kept from the last launch */
  uint64_t *kept_ver;    /* per param node: storage id, version when kept */
  int kept_ok;           /* kept[] holds the values for the bound shapes */
  int kept_last;         /* the last run used kept[] instead of launching */
  int64_t kept_runs;     /* launches of keep kernels, all runs */
  int64_t kept_skips;    /* launches they saved, all runs */
  /* The values freed after each kernel (its plan's last_use, outputs
  ** left out): frees[free_at[k] .. free_at[k + 1]), made at the first run
  ** so that a run does not scan every node after every kernel. */
  int *free_at, *frees;
  void *priv;            /* the backend's own state */
};

/* One run as a backend's launch sees it. */
struct exec_run {
  exec_program *pr;
  const ir_graph *g;
  const fl_meta *metas;  /* every node's metadata for these inputs */
  fl_tensor *vals;       /* per node: its value once computed */
  int64_t *args;         /* kernel k's arguments (maxargs; random draws
                            filled in); a backend may write past fk_nargs */
  int capture;           /* a CUDA graph is being captured: nothing freed */
  uint64_t rng_key;      /* per random node: where its draws start in the */
  const uint64_t *rng_start;   /* stream (NULL: no random node), for an
                                  extern step to draw what eager would */
  unsigned char *blk;    /* per node: 0, or the channel block of the backend's
                            blocked layout its value was written in (cpu:
                            one convolution's result for the next to read);
                            exec_value gives every other reader it plain */
};

/* The launch info of kernel k. */
#define EXEC_KINFO(pr, k) ((void *)((char *)(pr)->kinfo + (size_t)(k) * (pr)->be->kinfo_size))

/* Render plan p for backend be (kernel symbols start with prefix, a C
** identifier prefix; NULL: "fl_").  The program takes a reference on p. */
exec_program *exec_codegen(const exec_backend *be, const fuse_plan *p, const char *prefix,
                           fl_err *e);
const char *exec_program_source(const exec_program *pr);
/* The kernels without the preamble (owned by pr). */
const char *exec_program_body(const exec_program *pr);
/* The host program (host.c): arguments, buffers and their reuse, the
** kernel and library calls in order with their arguments, frees, the
** return; malloc'd, the caller frees it; NULL when out of memory. */
char *exec_program_host(const exec_program *pr);
/* The compiler's output of the last compile ("" when none). */
const char *exec_program_log(const exec_program *pr);

/* Compile (through the cache); loading waits for the first run.
** FL_ECOMPILE keeps the log readable; callers fall back to eager. */
int exec_program_compile(exec_program *pr, fl_err *e);
/* Compile n programs of one backend as one image (one compiler run,
** each distinct kernel once); each program holds a reference to it. */
int exec_compile_batch(exec_program **prs, int n, fl_err *e);

enum {
  EXEC_INTO = 1,         /* results into outs[i] where the caller's fits */
  EXEC_CAPTURE = 2       /* nothing freed, leaves as bound (CUDA graphs) */
};
/* Run on inputs (one per graph input, any strides; shapes may differ from
** the plan's where the graph's dims are symbolic).  Compiles and loads
** first when needed.  outs must hold plan->g->nout tensors; each becomes a
** new reference the caller releases.  With EXEC_INTO a contiguous outs[i]
** of the right dtype and shape is written in place (no allocation).  hold,
** when not NULL (g->n tensors), gets a reference to every value the run
** made.  A program runs one call at a time. */
int exec_program_run_flags(exec_program *pr, const fl_tensor *const *inputs, int ninputs,
                           fl_tensor *outs, int flags, fl_tensor *hold, fl_err *e);
/* A run as its backend does it (its run hook: CUDA graphs), else the
** walk above: what every binding calls. */
int exec_program_run(exec_program *pr, const fl_tensor *const *inputs, int ninputs,
                     fl_tensor *outs, fl_err *e);
int exec_program_run_out(exec_program *pr, const fl_tensor *const *inputs, int ninputs,
                         fl_tensor *outs, fl_err *e);
/* Params and consts onto the device: consts once, params every call (they
** are bound by reference: in-place changes must be seen) into the same
** buffers, so a captured graph sees them too; a weight already on the
** device is used where it is, with no copy. */
int exec_bind_leaves(exec_program *pr, fl_err *e);

/* --- for backends' launch ------------------------------------------------ */
/* The value of node id (views replayed on their source; contiguous when
** contig). */
int exec_value(exec_run *r, int id, int contig, fl_err *e);
/* An uninitialized buffer for stored node id: a view of its memory-plan
** slot (grown as these shapes need), or fresh memory for graph outputs. */
int exec_buffer(exec_run *r, int id, fl_tensor *out, fl_err *e);

/* Per-kernel timing on (counters reset) or off. */
int exec_program_set_profile(exec_program *pr, int on, fl_err *e);
/* One line per kernel of the last profiled run: time, bandwidth from the
** plan's bytes (read + written, cost model), GFLOP/s and its share of the
** machine's roof (exec/roofline.h), each line after indent. */
void exec_program_print_profile(const exec_program *pr, FILE *f, const char *indent);

/* 1 when kernel k of pr reads weights only (params, consts, sizes) and
** its values are kept between calls: see exec_program.keep. */
int exec_kernel_kept(const exec_program *pr, int k);
/* 1 when node id's value is kept between calls (host.c's listing). */
int exec_value_kept(const exec_program *pr, int id);
/* Frees the program and drops its plan and image references; NULL ok. */
void exec_program_free(exec_program *pr);
/* Another reference to pr (a compiled backward held by a tape), dropped
** by exec_program_free. */
exec_program *exec_program_retain(exec_program *pr);

/* Write into out (n bytes) a C identifier made from s: letters, digits
** and '_' kept, everything else '_', never starting with a digit. */
void exec_c_ident(const char *s, char *out, size_t n);

#endif
