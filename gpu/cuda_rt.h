/*
** cuda_rt.h -- the CUDA runtime side of the backend: the device, a caching
** allocator, host <-> device copies, loaded modules, launches on one
** stream, CUDA graphs and event timing.
**
** Module loading uses the runtime's library API (cudaLibraryLoadData /
** cudaLibraryGetKernel, CUDA 12+) rather than the driver's cuModuleLoadData:
** the build links libcudart and libnvrtc only (m4/fl_cuda.m4), never
** libcuda, so a machine with the toolkit but no driver still links and runs
** everything that does not need a device.
**
** Every call is checked through CUDA_CHECK (cuda_check.h).  Nothing here
** aborts: a missing device is FL_ENODEV "no CUDA device: <reason>", device
** memory exhaustion FL_ENOMEM naming the size.
*/
#ifndef FL_CUDA_RT_H
#define FL_CUDA_RT_H

#include <stddef.h>
#include <stdint.h>

#include "../graph/tensor.h"

/* Initialize device 0, its stream and the allocator (registered with
** ten_set_allocator for FL_DEV_CUDA).  Idempotent; FL_ENODEV without a
** device. */
int cuda_rt_init(fl_err *e);
/* Compute capability as major * 10 + minor; 0 when there is no device. */
int cuda_device_cc(void);
/* Multiprocessors of the device (for grid sizes); 0 without a device. */
int cuda_sm_count(void);
/* "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" or the no-device reason. */
const char *cuda_device_name(void);

/* --- memory ----------------------------------------------------------------
** A caching allocator: freed blocks are kept per rounded size and handed
** out again (all work is ordered on one stream, so a block freed after a
** launch is safe to reuse by later launches).  When cudaMalloc fails the
** cache is returned to the device and the allocation retried once. */
int cuda_alloc(void **p, size_t nbytes, fl_err *e);
void cuda_free(void *p);
typedef struct cuda_mem_stats {
  int64_t in_use, cached, peak;   /* bytes */
  int64_t allocs, reuses, device_allocs;
} cuda_mem_stats;
void cuda_get_mem_stats(cuda_mem_stats *s);
/* Give every cached block back to the device. */
void cuda_empty_cache(void);

/* --- tensors ------------------------------------------------------------ */
/* *dst = a new contiguous tensor on device `dev` with src's values (src on
** either device, any strides; dtype kept). */
int cuda_copy_to(fl_tensor *dst, const fl_tensor *src, fl_device dev, fl_err *e);
/* Copy between two contiguous tensors of the same size and dtype, any
** devices. */
int cuda_copy_into(fl_tensor *dst, const fl_tensor *src, fl_err *e);
/* *out = a contiguous device copy of a strided device tensor (a shared
** reference when already contiguous). */
int cuda_contiguous(fl_tensor *out, const fl_tensor *src, fl_err *e);

/* --- modules and launches ----------------------------------------------- */
typedef struct cuda_module cuda_module;
/* Load a CUBIN (or NUL-terminated PTX) image; owned by the caller. */
int cuda_module_load(const void *image, cuda_module **out, fl_err *e);
/* The kernel named name (an opaque handle for cuda_launch). */
int cuda_module_kernel(cuda_module *m, const char *name, void **fn, fl_err *e);
void cuda_module_free(cuda_module *m);

/* Launch fn with one by-value parameter block of nbytes at params. */
int cuda_launch(void *fn, const unsigned grid[3], unsigned block, const void *params,
                size_t nbytes, fl_err *e);
/* Wait for the stream. */
int cuda_sync(fl_err *e);
/* The stream all work is ordered on (a cudaStream_t), for libraries such
** as cuBLAS that take one; NULL before cuda_rt_init. */
void *cuda_stream(void);

/* --- CUDA graphs (mode "reduce-overhead") ---------------------------------- */
typedef struct cuda_graph cuda_graph;
/* Start capturing the stream's work; no synchronous call may run until
** cuda_capture_end. */
int cuda_capture_begin(fl_err *e);
/* Stop capturing and instantiate; *out owned by the caller. */
int cuda_capture_end(cuda_graph **out, fl_err *e);
int cuda_graph_replay(cuda_graph *g, fl_err *e);
void cuda_graph_free(cuda_graph *g);
/* 1 while a capture is running (allocations must not reach the device). */
int cuda_capturing(void);

/* --- counters (fl.cuda_info) ------------------------------------------------
** What crossed the bus and what ran, since the process started: a test
** asserts that resident weights are not copied and a replay launches
** nothing one by one. */
typedef struct cuda_counters {
  int64_t h2d_bytes, d2h_bytes;   /* cudaMemcpy host -> device, device -> host */
  int64_t launches;               /* kernels launched one by one */
  int64_t graph_replays;          /* CUDA graph launches */
} cuda_counters;
void cuda_get_counters(cuda_counters *c);

/* --- timing ----------------------------------------------------------------- */
/* Milliseconds of stream time between two points: cuda_timer_start, work,
** cuda_timer_stop (which synchronizes). */
int cuda_timer_start(fl_err *e);
int cuda_timer_stop(double *ms, fl_err *e);

#endif
