/*
** cuda_check.h -- the one check every CUDA runtime and NVRTC call goes
** through.  On failure the error record gets what was being done, the call
** as written, the file and line, and the library's own message:
**   "launch: cudaLaunchKernel(...) failed at gpu/cuda_rt.c:212: out of memory"
** Only gpu/ includes this (it needs the toolkit's headers).
*/
#ifndef FL_CUDA_CHECK_H
#define FL_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <nvrtc.h>

#include "../graph/err.h"

/* Status of the call: FL_OK, or code (FL_ENOMEM for out-of-memory) with e
** filled.  `lib` is 0 for the CUDA runtime, 1 for NVRTC. */
int cuda_check_(int rc, int lib, const char *call, const char *what,
                const char *file, int line, fl_err *e);

/* CUDA_CHECK(e, "what", call): evaluates call once; which library's
** message applies is decided from the call's type. */
#define CUDA_CHECK(e, what, call) \
  cuda_check_((int)(call), _Generic((call), nvrtcResult: 1, default: 0), \
              #call, (what), __FILE__, __LINE__, (e))

#endif
