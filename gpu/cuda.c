/*
** cuda.c -- device discovery.  The answer is computed once: asking the
** runtime again after it failed to initialize gives the same answer.
*/
#include "config.h"
#include <stdio.h>

#include "cuda.h"

#ifdef HAVE_CUDA
#include <cuda_runtime.h>

int cuda_available(fl_err *e) {
  static int known = 0, usable = 0;
  static char reason[256];
  if (!known) {
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    known = 1;
    if (rc != cudaSuccess)
      snprintf(reason, sizeof reason, "%s", cudaGetErrorString(rc));
    else if (n == 0)
      snprintf(reason, sizeof reason, "the CUDA runtime found no device");
    else
      usable = 1;
  }
  if (!usable) err_set(e, FL_ENODEV, "no CUDA device: %s", reason);
  return usable;
}
#else
int cuda_available(fl_err *e) {
  err_set(e, FL_ENODEV, "no CUDA device: fuselab was built without CUDA "
          "(configure --with-cuda)");
  return 0;
}
#endif
