/*
** blas.h -- which kernels the BLAS library runs, and a better pick where
** it guessed low.  Debian's OpenBLAS 0.3.21 does not know recent Intel
** parts (family 6 model 207 and later) and falls back to its SSE3
** "Prescott" kernels: 32-40 GFLOP/s where its SkylakeX kernels reach
** 190-258 on the same CPU.  The CPU's own feature bits say what it can run.
*/
#ifndef FL_CPU_BLAS_H
#define FL_CPU_BLAS_H

typedef struct cpu_blas_info {
  char config[160];      /* the library's own description, or "" */
  char core[32];         /* the kernels it runs now ("SkylakeX"), or "" */
  char was[32];          /* what it had picked before, when we changed it */
  char why[200];         /* what was decided, in a sentence */
} cpu_blas_info;

/* Once, before the first product: when the library is OpenBLAS with
** runtime kernel selection and runs kernels below what the CPU supports
** (AVX-512 or AVX2+FMA), select the right ones.  Idempotent, thread-safe. */
void cpu_blas_pick(void);
void cpu_blas_get_info(cpu_blas_info *out);

#endif
