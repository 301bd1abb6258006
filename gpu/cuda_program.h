/*
** cuda_program.h -- the CUDA backend of the executor (exec/program.h):
** kernels rendered as CUDA C (cuda_codegen.c), compiled by NVRTC
** (nvrtc.c, cached), loaded and launched through the CUDA runtime
** (cuda_rt.c) on one stream; CUDA graphs for "reduce-overhead" and
** max-autotune's block sizes and cuBLAS pick are its own.
**
** Compiling needs NVRTC only; loading and running need a device and fail
** with FL_ENODEV "no CUDA device: <reason>" without one.
*/
#ifndef FL_CUDA_PROGRAM_H
#define FL_CUDA_PROGRAM_H

#include "../exec/program.h"
#include "cuda_codegen.h"
#include "cuda_rt.h"
#include "nvrtc.h"

extern const exec_backend cuda_backend;

enum { CUDA_MODE_DEFAULT = 0, CUDA_MODE_GRAPH = 1 };

/* What a CUDA program keeps besides the executor's (exec_program.priv). */
typedef struct cuda_state {
  cuda_module *mod;      /* the loaded image, or NULL */
  void **epis;           /* per kernel: its epilogue kernel, or NULL */
  int *block;            /* per kernel: threads per block (autotune) */
  char *cublas;          /* per kernel: 1 runs its product on cuBLAS, then the
                            epilogue kernel (max-autotune's pick); NULL: none */
  int mode;              /* CUDA_MODE_*: graphs for "reduce-overhead" */
  int64_t replays;       /* runs that were CUDA graph replays */
  int fused_epilogues;   /* extern launches that ran their epilogue fused */
  char tune[512];        /* what max-autotune chose, "" when not run */
  uint64_t *pblock;      /* the parameter block being built */
  size_t npblock;
  int maxbuf;            /* the most buffers a kernel takes */
  cuda_graph *graph;     /* the captured graph, or NULL */
  fl_tensor *gin, *gout; /* its static inputs and outputs */
  fl_tensor *ghold;      /* every buffer its launches touch (held) */
} cuda_state;

/* pr's CUDA state (made on first use); NULL when out of memory. */
cuda_state *cuda_state_of(exec_program *pr);
/* NVRTC's image once compiled, else NULL; its PTX likewise. */
const nvrtc_image *cuda_program_image(const exec_program *pr);
const char *cuda_program_ptx(const exec_program *pr);

/* The backend's run hook (exec_program_run calls it): on inputs (CPU or
** CUDA tensors, any strides); outs get new
** references to CUDA tensors.  In CUDA_MODE_GRAPH the first run per input
** shape captures a CUDA graph, later runs copy the inputs in and replay
** it.  FL_ENODEV without a device. */
int cuda_program_run(exec_program *pr, const fl_tensor *const *inputs, int ninputs,
                     fl_tensor *outs, fl_err *e);
int cuda_program_set_mode(exec_program *pr, int mode);
/* Time the program with 128, 256 and 512 threads per block on these
** inputs and keep the fastest (cuda_state_of(pr)->tune says what). */
int cuda_program_autotune(exec_program *pr, const fl_tensor *const *inputs, int ninputs,
                          fl_err *e);

#endif
