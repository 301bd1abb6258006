/*
** cuda_program.h -- a fusion plan as a CUDA program: its CUDA C (codegen),
** the device image (NVRTC through the cache), the loaded kernels, and
** running them on tensors.  The four parts of a backend, tinygrad-style:
** cuda_codegen.c (source), nvrtc.c (compiler), cuda_rt.c (allocator and
** device), this file (program: bind, launch, graphs, autotune).
**
** Compiling needs NVRTC only; loading and running need a device and fail
** with FL_ENODEV "no CUDA device: <reason>" without one.
*/
#ifndef FL_CUDA_PROGRAM_H
#define FL_CUDA_PROGRAM_H

#include "../fuse/plan.h"
#include "cuda_codegen.h"
#include "cuda_rt.h"
#include "nvrtc.h"

enum { CUDA_MODE_DEFAULT = 0, CUDA_MODE_GRAPH = 1 };

typedef struct cuda_program {
  fuse_plan *plan;       /* one reference, dropped by cuda_program_free */
  char prefix[32];       /* prepended to every kernel symbol */
  char **syms;           /* per kernel: symbol, NULL when nothing runs */
  char **ktext;          /* per kernel: its CUDA C (kernel and _epi), or NULL */
  char **alias;          /* per kernel: the symbol to load instead (a batch
                            compiled identical code once), or NULL */
  cuda_kinfo *info;      /* per kernel: parameter sizes, paths */
  char *body;            /* the kernels, without the preamble */
  char *source;          /* preamble + body: what `print(k)` shows */
  char *log;             /* NVRTC's log of the last compile, or NULL */
  nvrtc_image img;       /* the device image once compiled */
  int compiled;
  double compile_ms;     /* wall time of the last compile (or lookup) */
  cuda_module *mod;      /* loaded image, or NULL */
  void **fns, **epis;    /* per kernel: kernel handles (epilogue kernels) */
  int *block;            /* per kernel: threads per block (autotune) */
  char *cublas;          /* per kernel: 1 runs its product on cuBLAS, then the
                            epilogue kernel (max-autotune's pick); NULL: none */
  int mode;              /* CUDA_MODE_*: graphs for "reduce-overhead" */
  int64_t runs, replays; /* completed runs; of them, CUDA graph replays */
  int fused_epilogues;   /* extern launches that ran their epilogue fused */
  char tune[512];        /* what max-autotune chose, "" when not run */
  /* device state kept between runs (runs are one at a time) */
  fl_tensor *slots;      /* the memory plan's slots */
  fl_tensor *consts;     /* per node: device copy of IR_CONST / IR_PARAM */
  cuda_graph *graph;     /* the captured graph, or NULL */
  fl_tensor *gin, *gout; /* its static inputs and outputs */
  fl_tensor *ghold;      /* every buffer its launches touch (held) */
} cuda_program;

/* Generate CUDA C for plan p; the program takes a reference on p.  NULL
** with e filled (FL_EUNSUPPORTED naming an op without a CUDA lowering). */
cuda_program *cuda_codegen(const fuse_plan *p, fl_err *e);
/* The same with kernel symbols prefixed (several programs in one NVRTC
** program: cuda_compile_batch). */
cuda_program *cuda_codegen_prefixed(const fuse_plan *p, const char *prefix, fl_err *e);

const char *cuda_program_source(const cuda_program *pr);
/* NVRTC's output of the last compile ("" when none). */
const char *cuda_program_log(const cuda_program *pr);
/* The PTX once compiled, else NULL. */
const char *cuda_program_ptx(const cuda_program *pr);

/* NVRTC compile (through the cache) for the device's architecture, sm_90
** without a device.  Works without a GPU.  FL_ECOMPILE keeps the log. */
int cuda_program_compile(cuda_program *pr, fl_err *e);
/* Compile n programs as one NVRTC program (one compiler run). */
int cuda_compile_batch(cuda_program **prs, int n, fl_err *e);

/* Run on inputs (CPU or CUDA tensors, any strides).  Compiles and loads
** first when needed.  outs (plan->g->nout) get new references to CUDA
** tensors.  FL_ENODEV without a device. */
int cuda_program_run(cuda_program *pr, const fl_tensor *const *inputs, int ninputs,
                     fl_tensor *outs, fl_err *e);
/* CUDA_MODE_GRAPH: the first run per input shape captures a CUDA graph,
** later runs copy the inputs in and replay it. */
void cuda_program_set_mode(cuda_program *pr, int mode);
/* Time the program with 128, 256 and 512 threads per block on these
** inputs and keep the fastest (pr->tune says what was chosen). */
int cuda_program_autotune(cuda_program *pr, const fl_tensor *const *inputs, int ninputs,
                          fl_err *e);

/* Frees the program, its device buffers, graph and module; NULL ok. */
void cuda_program_free(cuda_program *pr);

#endif
