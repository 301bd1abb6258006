/*
** codegen.h -- C source from kernel descriptions.
** Each kernel becomes one function
**     void NAME(void **restrict buf, const int64_t *restrict arg)
** where buf[i] is the data of the kernel's i-th buffer (fk_kernel.bufs) and
** arg holds what fk_bind computes (sizes, then per access strides and
** offset).  Where those cannot change (a graph without symbolic sizes:
** fk_static_args) the source holds them as constants instead.
*/
#ifndef FL_CPU_CODEGEN_H
#define FL_CPU_CODEGEN_H

#include "../fuse/plan.h"
#include "../graph/strbuf.h"

/* The includes and helpers every program starts with (guarded, so several
** programs may share one translation unit). */
void cpu_emit_preamble(strbuf *b);
/* The fewest elements a generated loop starts threads for in this process
** (its OpenMP wait policy): what the loader writes into a library's
** fl_par_min. */
int64_t cpu_par_min(void);
/* Append kernel k of plan p as a C function named sym (a C identifier the
** caller made).  Extern kernels without an epilogue emit nothing and
** return 0; else 1.  known: the first fk_static_nargs arguments, written
** as constants, or NULL.  *scratch (may be NULL) gets the number of float32
** values per reduced element and per thread the kernel keeps in a row
** scratch: when non-zero the caller passes, after the kernel's buffers,
** one more of max_threads * scratch * CPU_SCRATCH_STRIDE(reduced elements)
** floats, 64-byte aligned. */
int cpu_emit_kernel(strbuf *b, const fuse_plan *p, int k, const char *sym, const int64_t *known,
                    int *scratch);

/* A row scratch's elements per value kept: the reduced elements rounded up
** to a 64-byte line, the expression the generated kernels compute. */
#define CPU_SCRATCH_STRIDE(nr) (((nr) + 15) & ~(int64_t)15)

#endif
