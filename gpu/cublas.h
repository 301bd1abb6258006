/*
** cublas.h -- cuBLAS's sgemm as the matmul candidate mode="max-autotune"
** times against the generated kernel (issue: the fastest is kept, the
** choice shown in stats).  cuBLAS is loaded at run time (dlopen), so
** nothing links against it and a toolkit without it costs nothing: the
** candidate is simply not offered.
*/
#ifndef FL_CUBLAS_H
#define FL_CUBLAS_H

#include <stdint.h>

#include "../graph/err.h"

/* 1 when libcublas loads and a handle on the program stream exists (needs
** a device); else 0 with e saying why. */
int cublas_ready(fl_err *e);

/* One operand as the generated matmul sees it: element strides of its
** rows and columns, and of its (at most one) batch dim. */
typedef struct cublas_operand {
  const float *p;
  int64_t srow, scol, sbatch;
} cublas_operand;

/* C[z] = A[z] @ B[z] for z < batch, float32, C contiguous ([batch, M, N]
** row-major).  FL_EUNSUPPORTED when an operand has a unit stride on
** neither side or a size does not fit cuBLAS's int: the caller keeps the
** generated kernel. */
int cublas_matmul(int64_t batch, int64_t M, int64_t N, int64_t K, cublas_operand A,
                  cublas_operand B, float *C, fl_err *e);

#endif
