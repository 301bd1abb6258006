/*
** cuda.h -- whether a CUDA device can be used, and why not.  The CUDA
** backend proper (NVRTC codegen, launch) grows here; without a toolkit at
** build time every entry reports "built without CUDA".
*/
#ifndef FL_CUDA_H
#define FL_CUDA_H

#include "../graph/err.h"

/* 1 when a device is usable; else 0 with the runtime's reason in e as
** "no CUDA device: <reason>". */
int cuda_available(fl_err *e);

#endif
