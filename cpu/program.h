/*
** program.h -- a fusion plan as a compiled CPU program: its C source, the
** shared object (through the cache), and running it on tensors.
** The four parts of a backend, tinygrad-style: codegen (source), compiler
** ($CC through cpu/cache.c), program (dlsym'd kernels), runtime (run).
*/
#ifndef FL_CPU_PROGRAM_H
#define FL_CPU_PROGRAM_H

#include <stdio.h>

#include "../fuse/plan.h"
#include "cache.h"

typedef struct cpu_program {
  fuse_plan *plan;       /* one reference, dropped by cpu_program_free */
  char prefix[32];       /* prepended to every kernel symbol */
  char **syms;           /* per kernel: C symbol, NULL for pure extern steps */
  char **ktext;          /* per kernel: its C function, NULL likewise */
  int *scratch;          /* per kernel: row-scratch floats per reduced element */
  char *body;            /* the kernels, without the preamble */
  char *source;          /* preamble + body: what `print(k)` shows */
  cache_obj *obj;        /* loaded object once compiled, else NULL */
  void **fns;            /* per kernel: entry point, NULL for pure externs */
  char *log;             /* compiler output of the last compile, or NULL */
  int how;               /* CACHE_COMPILED / CACHE_DISK / CACHE_MEMORY */
  double compile_ms;     /* wall time of the last compile (or lookup) */
  int64_t runs;          /* completed runs */
  fl_tensor *slots;      /* the memory plan's slots, kept between runs
                            (plan->nslots of them, grown as shapes need) */
  /* Sizes bound for the last input shapes seen: a call with the same
  ** shapes (the steady state) skips shape inference and fk_bind. */
  fl_meta *bound_in;     /* the inputs' metadata, or NULL before a run */
  fl_meta *bound_metas;  /* every node's metadata for those inputs */
  int64_t *bound_args;   /* per kernel: its fk_bind arguments (maxargs each) */
  int maxargs;
  /* Per-kernel wall time while `profile` is set (two clock reads per
  ** kernel, so off by default; cpu_program_set_profile). */
  int profile;
  double *kernel_ms;     /* per kernel: summed over the profiled runs */
  double *last_ms;       /* per kernel: the last profiled run */
  int64_t profiled_runs;
} cpu_program;

typedef void (*cpu_kernel_fn)(void **buf, const int64_t *arg);

/* Generate C for plan p.  The program takes a reference on p (p may be
** freed by the caller afterwards).  NULL with e filled on failure; free
** with cpu_program_free. */
cpu_program *cpu_codegen(const fuse_plan *p, fl_err *e);
/* The same with kernel symbols prefixed (a C identifier prefix), so several
** programs can be compiled in one translation unit. */
cpu_program *cpu_codegen_prefixed(const fuse_plan *p, const char *prefix, fl_err *e);

/* The C text; owned by the program. */
const char *cpu_program_source(const cpu_program *pr);
/* The compiler's output of the last compile (empty string when none);
** owned by the program. */
const char *cpu_program_log(const cpu_program *pr);

/* Compile (through the cache) and resolve the kernels.  FL_ECOMPILE when
** the compiler fails: the log stays readable with cpu_program_log and
** callers fall back to eager. */
int cpu_program_compile(cpu_program *pr, fl_err *e);
/* Compile n programs as one translation unit and one shared object (one
** compiler run).  Each program then holds its own reference to it. */
int cpu_compile_batch(cpu_program **prs, int n, fl_err *e);

/* Run on inputs (one per graph input, any strides; shapes may differ from
** the plan's where the graph's dims are symbolic).  Compiles first when
** needed.  outs must hold plan->g->nout tensors; each becomes a new
** reference the caller releases. */
int cpu_program_run(cpu_program *pr, const fl_tensor *const *inputs, int ninputs,
                    fl_tensor *outs, fl_err *e);

/* The same, writing the results into outs[i] when the caller passes a
** contiguous tensor of the right dtype and shape there (no allocation:
** the "out=" form for steady-state loops); other outs[i] must be empty and
** get a new reference as above.  A program runs one call at a time: its
** intermediate buffers are reused from run to run. */
int cpu_program_run_out(cpu_program *pr, const fl_tensor *const *inputs, int ninputs,
                        fl_tensor *outs, fl_err *e);

/* Per-kernel timing on (counters reset) or off. */
int cpu_program_set_profile(cpu_program *pr, int on, fl_err *e);
/* One line per kernel of the last profiled run: time, and bandwidth from
** the plan's bytes (read + written, cost model), each line after indent. */
void cpu_program_print_profile(const cpu_program *pr, FILE *f, const char *indent);

/* Frees the program and drops its plan and object references; NULL ok. */
void cpu_program_free(cpu_program *pr);

#endif
