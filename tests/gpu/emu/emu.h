/*
** emu.h -- the emulated runtime's parts, shared by the libcudart shim's
** files: the scheduler (emu_sched.c), device memory (emu_mem.c) and the
** API (emu_cudart.c).  The libcublas shim uses only emu_stream_work and
** emu_check_range, exported from libcudart.
*/
#ifndef FL_EMU_H
#define FL_EMU_H

#include <stddef.h>
#include <stdint.h>

#include "include/emu_abi.h"

/* a kernel of a loaded library: what the NVRTC shim's entry wrapper
** exports for it */
typedef struct emu_kernel {
  uint32_t magic;                       /* EMU_KERNEL_MAGIC while valid */
  int dead;                             /* its library was unloaded */
  char name[160];
  void (*entry)(void **args);           /* __emu_entry_NAME */
  const unsigned long *info;            /* __emu_args_NAME: nargs, launch bound, sizes */
  void (*shared)(char **b, char **e);   /* the library's emu_shared section */
  struct emu_kernel *next;              /* all kernels ever made (never freed) */
} emu_kernel;
#define EMU_KERNEL_MAGIC 0x454d554bu

/* --- emu_sched.c: one grid, one thread order -------------------------------- */
/* Runs every block of the grid; each CUDA thread a fiber.  order 0 runs
** blocks and threads forward, 1 backward, more a shuffle seeded by it.
** Returns 0, or a cudaError_t with msg filled. */
int emu_run_grid(const emu_kernel *k, const unsigned grid[3], const unsigned block[3],
                 void **args, int order, char *msg, size_t n);

/* --- emu_mem.c: device allocations ------------------------------------------ */
int emu_mem_alloc(void **p, size_t n);          /* cudaError_t */
int emu_mem_free(void *p, char *msg, size_t n);
/* the allocation holding [p, p + n), or -1 (n = 0: p itself, or one past
** the end); its start and size */
int emu_mem_find(const void *p, size_t n, char **start, size_t *size);
/* 0, or -1 with msg saying which allocation's redzone a kernel wrote */
int emu_mem_check_redzones(const char *who, char *msg, size_t n);
/* the allocations an argument block points into; out lists their
** starts and sizes (at most max) */
int emu_mem_touched(void **args, const unsigned long *info, char **start, size_t *size, int max);
int64_t emu_mem_in_use(void);

/* --- exported for libcublas ------------------------------------------------------ */
/* Run fn(ctx) in stream order: now, or at each replay of the graph being
** captured on s (ctx is copied: n bytes).  Returns a cudaError_t. */
int emu_stream_work(void *s, int (*fn)(void *ctx, char *msg, size_t n), const void *ctx, size_t n);
/* 0 when [p, p + n) lies in one device allocation, else -1 and a message */
int emu_check_range(const void *p, size_t n, const char *what, char *msg, size_t mn);

#endif
