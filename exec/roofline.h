/*
** roofline.h -- how close each compiled kernel comes to what this machine
** can do (the roofline model: Williams, Waterman and Patterson, 2009).
**
** A kernel that does F floating-point operations and moves B bytes (the
** cost model's read + written, fuse/plan.h) has arithmetic intensity
** I = F / B flop/byte; the machine can give it at most
** min(P, I x W) GFLOP/s, where W is its memory bandwidth and P its peak
** for products.  Below the ridge point I = P / W a kernel is bound by
** memory, above it by compute; its share of that roof says how much is
** left to gain.
**
** The two peaks are measured once per machine: W as a float triad
** (a = b + s c over arrays well above the last-level cache, on as many
** OpenMP threads as the generated kernels use), P as a large float32
** product through the path compiled products take (oneDNN, else BLAS
** sgemm); medians over repeated runs (exec/measure.h).  The result is
** kept in the kernel cache's directory, under the cache's trust rules
** (exec/cache.h: a blob <key>.roof), keyed by the CPU's model and
** instruction set, the thread count, the product path and the fuselab
** version, so another machine, or this one set up otherwise, measures
** afresh.  A file that is damaged, foreign or malformed is ignored and
** measured again.  A measurement made while the machine was busy
** (noisy) is kept but measured again by the next processes, up to
** ROOF_NOISY_TRIES measurements in all, each peak the best of them (other
** work only ever slows a run down); a quiet measurement is final.
*/
#ifndef FL_EXEC_ROOFLINE_H
#define FL_EXEC_ROOFLINE_H

#include <stdint.h>

#include "../graph/err.h"
#include "program.h"

#define ROOF_NOISY_TRIES 3

typedef struct roof_peaks {
  double copy_gbs;          /* triad bandwidth, GB/s of bytes read + written
                               (as the cost model counts them) */
  double product_gflops;    /* float32 product, GFLOP/s (2 M N K per product) */
  double copy_spread;       /* (q3 - q1) / median of the timed runs */
  double product_spread;
  int copy_runs, product_runs;
  int noisy;                /* either measurement was noisy (measure.h) */
  int tries;                /* measurements this result is the best of */
  char noise[160];          /* why, in a few words, or "" */
  char cpu[128];            /* the CPU's model name */
  char product_path[96];    /* "oneDNN", "OpenBLAS sgemm (Haswell kernels)" */
  int threads;              /* OpenMP threads, as the kernels run */
  double copy_mib;          /* size of the triad's three arrays together */
  int product_n;            /* the product was n x n x n */
  int from_cache;           /* this call measured nothing */
  double measure_s;         /* seconds the measurement took (0 from cache) */
  const char *warning;      /* the cache directory could not be used, or NULL */
} roof_peaks;

/* This machine's peaks: from memory, else from the disk cache, else
** measured (about half a second to a second) and stored; remeasure
** forces a measurement.  Thread-safe. */
int roof_machine_peaks(roof_peaks *out, int remeasure, fl_err *e);
/* The intensity (flop/byte) where the roofs meet. */
double roof_ridge(const roof_peaks *pk);
/* The roof over intensity i: min(peak, i x bandwidth), GFLOP/s. */
double roof_attainable(const roof_peaks *pk, double intensity);

enum { ROOF_MEMORY = 0, ROOF_COMPUTE = 1 };
/* "memory", "compute" */
const char *roof_bound_name(int bound);

/* One kernel on the roofline. */
typedef struct roof_kernel {
  const char *name;         /* the plan's kernel name (borrowed) */
  int64_t flops, bytes;     /* cost model, at the plan's sizes */
  double ms;                /* time per launch: the mean over profiled runs
                               that launched it; 0 when none did */
  int timed;                /* launched and took a measurable time */
  double gflops, gbps;      /* achieved (0 when not timed) */
  double intensity;         /* flop/byte, 0 when it moves nothing */
  double attainable;        /* the roof at its intensity, GFLOP/s */
  double roof_pct;          /* achieved / attainable x 100; a kernel with
                               no flops: its bandwidth / copy_gbs x 100 */
  int bound;                /* ROOF_MEMORY or ROOF_COMPUTE */
} roof_kernel;

/* Kernel k of pr at ms per launch (ms <= 0: not timed) against pk. */
void roof_kernel_at(const exec_program *pr, int k, double ms, const roof_peaks *pk,
                    roof_kernel *out);
/* The same from the counts alone (a report's kernel row). */
void roof_kernel_of(const char *name, int64_t flops, int64_t bytes, double ms,
                    const roof_peaks *pk, roof_kernel *out);
/* Every kernel of pr (out: pr->plan->nkernels entries), each at its mean
** time per launch over the profiled runs; FL_EINVAL naming the cause when
** pr was never profiled (k:profile(true), then runs). */
int roof_program(const exec_program *pr, const roof_peaks *pk, roof_kernel *out, fl_err *e);

#endif
