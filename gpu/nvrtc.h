/*
** nvrtc.h -- CUDA C to device code with NVRTC, through the disk cache.
** The architecture is the device's (sm_XX from its compute capability),
** sm_90 when compiling without a device; an architecture newer than this
** NVRTC knows gets PTX for the newest one it does (the driver finishes it).
** Options: -default-device --std=c++17 -I<toolkit include>.  A failure
** keeps NVRTC's log and the source; images are cached on disk (PTX and
** CUBIN in one blob, cpu/cache.c) and in memory.
*/
#ifndef FL_NVRTC_H
#define FL_NVRTC_H

#include <stddef.h>
#include <stdint.h>

#include "../graph/err.h"

/* A compiled program: owned by the caller (nvrtc_image_free). */
typedef struct nvrtc_image {
  char *ptx;            /* NUL-terminated PTX */
  size_t ptx_n;
  void *cubin;          /* NULL when only PTX was made */
  size_t cubin_n;
  char *log;            /* NVRTC's log (warnings), "" when none */
  char arch[16];        /* "sm_90" or "compute_90" */
  int how;              /* CACHE_COMPILED / CACHE_DISK / CACHE_MEMORY */
  double ms;            /* wall time of the compile or lookup */
} nvrtc_image;

/* 1 when NVRTC can be used; else 0 with the reason in e. */
int nvrtc_available(fl_err *e);
/* "13.0" */
const char *nvrtc_version_str(void);
/* The compute capability (major * 10 + minor) to compile for: the
** device's, or 90 when there is none. */
int nvrtc_default_arch(void);

/* Compile source for arch (see nvrtc_default_arch).  On success *img is
** filled.  On FL_ECOMPILE, *log (when log is not NULL) gets NVRTC's log,
** malloc'd and owned by the caller, and the source is written beside the
** cache as <key>.failed.cu for reading. */
int nvrtc_compile(const char *source, const char *name, int arch, nvrtc_image *img,
                  char **log, fl_err *e);
void nvrtc_image_free(nvrtc_image *img);
/* Forget the images kept in memory (the next request goes to disk). */
void nvrtc_forget_memory(void);
/* Remove the CUDA blobs from disk; the number removed. */
int nvrtc_cache_clear(void);
void nvrtc_cache_count(int64_t *entries, int64_t *bytes);

#endif
