/*
** emu_cudart.c -- libcudart.so.13 for the emulator: the runtime calls
** fuselab makes, on host memory, executed at once in stream order.
** Every launch is checked: the kernel runs under FUSELAB_EMU_ORDERS
** thread orders (default 2: forward, backward) from the same memory, and
** the allocations it can reach must end bit for bit equal; redzones must
** be intact; collectives must not diverge (emu_sched.c).  A failed launch
** returns cudaErrorLaunchFailure (or IllegalAddress), and
** cudaGetErrorString then says what went wrong, naming the kernel.
** Invariant: while a stream captures, its work is appended to the graph
** being captured instead of run; cudaGraphLaunch runs a copy of that list.
*/
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include "emu.h"

#define MAX_TOUCHED 64

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cudaError_t last;
static char detail[2048];          /* what the last failure was */
static cudaError_t detail_rc;      /* and its code */
static emu_kernel *kernels;        /* every kernel handle made */

static cudaError_t set_err(cudaError_t rc) {
  if (rc != cudaSuccess) last = rc;
  return rc;
}

/* a failure with its story, also on stderr: a test log shows it */
static cudaError_t failf(cudaError_t rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  detail_rc = rc;
  fprintf(stderr, "fuselab emu: %s\n", detail);
  return set_err(rc);
}

static int orders(void) {
  static int n;
  if (!n) {
    const char *e = getenv("FUSELAB_EMU_ORDERS");
    n = e && atoi(e) > 0 ? atoi(e) : 2;
    if (n > 16) n = 16;
  }
  return n;
}

/* FUSELAB_EMU_TRACE=1: every launch on stderr */
static int trace(void) {
  static int t = -1;
  if (t < 0) t = getenv("FUSELAB_EMU_TRACE") && atoi(getenv("FUSELAB_EMU_TRACE")) > 0;
  return t;
}

/* --- errors --------------------------------------------------------------------------- */

cudaError_t cudaGetLastError(void) {
  cudaError_t r = last;
  last = cudaSuccess;
  return r;
}

cudaError_t cudaPeekAtLastError(void) { return last; }

const char *cudaGetErrorName(cudaError_t rc) {
  switch (rc) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
  case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
  case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
  case cudaErrorInvalidKernelImage: return "cudaErrorInvalidKernelImage";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
  case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
  case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
  case cudaErrorIllegalState: return "cudaErrorIllegalState";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  default: return "cudaErrorUnknown";
  }
}

const char *cudaGetErrorString(cudaError_t rc) {
  static __thread char b[2200];
  const char *base;
  switch (rc) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: base = "invalid argument"; break;
  case cudaErrorMemoryAllocation: base = "out of memory"; break;
  case cudaErrorInvalidConfiguration: base = "invalid configuration argument"; break;
  case cudaErrorLaunchFailure: base = "unspecified launch failure"; break;
  case cudaErrorIllegalAddress: base = "an illegal memory access was encountered"; break;
  case cudaErrorLaunchOutOfResources: base = "too many resources requested for launch"; break;
  case cudaErrorInvalidKernelImage: base = "device kernel image is invalid"; break;
  case cudaErrorInvalidResourceHandle: base = "invalid resource handle"; break;
  case cudaErrorSymbolNotFound: base = "named symbol not found"; break;
  case cudaErrorStreamCaptureUnsupported: base = "operation not permitted when stream is capturing"; break;
  case cudaErrorStreamCaptureInvalidated: base = "operation failed due to a previous error during capture"; break;
  case cudaErrorNotReady: base = "device not ready"; break;
  default: base = "unknown error"; break;
  }
  if (!detail[0] || rc != detail_rc) return base;
  snprintf(b, sizeof b, "%s (emulator: %s)", base, detail);
  return b;
}

/* --- device ------------------------------------------------------------------------------ */

cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : set_err(cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int *v) { *v = 13000; return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = 13000; return cudaSuccess; }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
  if (d != 0) return set_err(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "Emulated GPU (fuselab emu)");
  p->major = 9;
  p->minor = 0;
  p->totalGlobalMem = (size_t)8 << 30;
  /* few SMs: grids sized by SM count stay small, and grid-stride loops loop */
  p->multiProcessorCount = 4;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff; p->maxGridSize[1] = 65535; p->maxGridSize[2] = 65535;
  p->sharedMemPerBlock = 48 * 1024;
  p->sharedMemPerBlockOptin = 227 * 1024;
  p->sharedMemPerMultiprocessor = 228 * 1024;
  p->regsPerBlock = 65536;
  p->regsPerMultiprocessor = 65536;
  p->maxThreadsPerMultiProcessor = 2048;
  p->maxBlocksPerMultiProcessor = 32;
  p->totalConstMem = 65536;
  p->l2CacheSize = 4 << 20;
  p->memoryBusWidth = 256;
  p->textureAlignment = 512;
  p->concurrentKernels = 1;
  p->unifiedAddressing = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
  (void)d;
  switch (a) {
  case cudaDevAttrMultiProcessorCount: *v = 4; break;
  case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
  case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
  case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
  case cudaDevAttrWarpSize: *v = 32; break;
  case cudaDevAttrMaxSharedMemoryPerBlock: *v = 48 * 1024; break;
  default: *v = 0; break;
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *fr, size_t *total) {
  *total = (size_t)8 << 30;
  *fr = *total - (size_t)emu_mem_in_use();
  return cudaSuccess;
}

/* --- streams and capture ------------------------------------------------------------------ */

enum { W_KERNEL, W_COPY, W_SET, W_FN };
typedef struct work {
  int kind;
  const emu_kernel *k;
  unsigned grid[3], block[3];
  char *blob;                  /* kernel: the arguments' bytes; fn: its context */
  size_t bn;
  void *dst;
  const void *src;
  size_t n;
  int value;
  enum cudaMemcpyKind ck;
  int (*fn)(void *, char *, size_t);
} work;

struct CUgraph_st { work *w; size_t n, cap; };
struct CUgraphExec_st { work *w; size_t n; };
struct CUstream_st { int capturing, invalid; struct CUgraph_st *g; };
struct CUevent_st { double ms; int recorded; };

static struct CUstream_st stream0;

static struct CUstream_st *st_of(cudaStream_t s) { return s ? (struct CUstream_st *)s : &stream0; }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  (void)flags;
  if (!(*s = calloc(1, sizeof(struct CUstream_st)))) return set_err(cudaErrorMemoryAllocation);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) { if (s) free(s); return cudaSuccess; }

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  struct CUstream_st *t = st_of(s);
  /* as CUDA: waiting on a capturing stream is illegal and spoils the capture */
  if (t->capturing) {
    t->invalid = 1;
    return failf(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize on a stream that is capturing");
  }
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
  *st = st_of(s)->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  struct CUstream_st *t = st_of(s);
  (void)mode;
  if (t->capturing) return failf(cudaErrorIllegalState, "cudaStreamBeginCapture: already capturing");
  if (!(t->g = calloc(1, sizeof *t->g))) return set_err(cudaErrorMemoryAllocation);
  t->capturing = 1;
  t->invalid = 0;
  return cudaSuccess;
}

static void work_free(work *w, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) free(w[i].blob);
  free(w);
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  if (!g) return cudaSuccess;
  work_free(g->w, g->n);
  free(g);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *out) {
  struct CUstream_st *t = st_of(s);
  *out = NULL;
  if (!t->capturing) return failf(cudaErrorIllegalState, "cudaStreamEndCapture: the stream is not capturing");
  t->capturing = 0;
  if (t->invalid) {
    cudaGraphDestroy(t->g);
    t->g = NULL;
    return set_err(cudaErrorStreamCaptureInvalidated);
  }
  *out = t->g;
  t->g = NULL;
  return cudaSuccess;
}

static cudaError_t record(struct CUstream_st *t, const work *w) {
  if (t->g->n == t->g->cap) {
    size_t c = t->g->cap ? 2 * t->g->cap : 16;
    work *nw = realloc(t->g->w, c * sizeof *nw);
    if (!nw) { free(w->blob); return set_err(cudaErrorMemoryAllocation); }
    t->g->w = nw;
    t->g->cap = c;
  }
  t->g->w[t->g->n++] = *w;
  return cudaSuccess;
}

/* --- events: host clock, as all work is done by the time it is queued ------------------------- */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
  if (!(*e = calloc(1, sizeof(struct CUevent_st)))) return set_err(cudaErrorMemoryAllocation);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) { (void)f; return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  (void)s;
  e->ms = now_ms();
  e->recorded = 1;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  return e->recorded ? cudaSuccess : failf(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: event never recorded");
}
cudaError_t cudaEventQuery(cudaEvent_t e) { (void)e; return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a->recorded || !b->recorded)
    return failf(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never recorded");
  *ms = (float)(b->ms - a->ms);
  return cudaSuccess;
}

/* --- memory ------------------------------------------------------------------------------------ */

cudaError_t cudaMalloc(void **p, size_t n) {
  int rc;
  pthread_mutex_lock(&lock);
  rc = emu_mem_alloc(p, n);
  pthread_mutex_unlock(&lock);
  return set_err((cudaError_t)rc);
}

cudaError_t cudaFree(void *p) {
  char m[300];
  int rc;
  if (!p) return cudaSuccess;
  pthread_mutex_lock(&lock);
  rc = emu_mem_free(p, m, sizeof m);
  pthread_mutex_unlock(&lock);
  return rc ? failf((cudaError_t)rc, "%s", m) : cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n) { *p = malloc(n ? n : 1); return *p ? cudaSuccess : set_err(cudaErrorMemoryAllocation); }
cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }

/* a device operand: in one allocation, all of it */
static cudaError_t dev_range(const void *p, size_t n, const char *what) {
  char m[300];
  int bad;
  pthread_mutex_lock(&lock);
  bad = emu_check_range(p, n, what, m, sizeof m);
  pthread_mutex_unlock(&lock);
  return bad ? failf(cudaErrorInvalidValue, "%s", m) : cudaSuccess;
}

static cudaError_t do_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
  cudaError_t rc = cudaSuccess;
  if (n == 0) return cudaSuccess;
  if (k == cudaMemcpyDeviceToDevice || k == cudaMemcpyHostToDevice) rc = dev_range(dst, n, "cudaMemcpy destination");
  if (rc == cudaSuccess && (k == cudaMemcpyDeviceToDevice || k == cudaMemcpyDeviceToHost))
    rc = dev_range(src, n, "cudaMemcpy source");
  if (rc == cudaSuccess) memmove(dst, src, n);
  return rc;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s) {
  struct CUstream_st *t = st_of(s);
  if (t->capturing) {
    work w = {0};
    w.kind = W_COPY; w.dst = dst; w.src = src; w.n = n; w.ck = k;
    return record(t, &w);
  }
  return do_copy(dst, src, n, k);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
  if (stream0.capturing) return failf(cudaErrorStreamCaptureUnsupported, "cudaMemcpy during capture");
  return do_copy(dst, src, n, k);
}

static cudaError_t do_set(void *p, int v, size_t n) {
  cudaError_t rc = n ? dev_range(p, n, "cudaMemset") : cudaSuccess;
  if (rc == cudaSuccess) memset(p, v, n);
  return rc;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  struct CUstream_st *t = st_of(s);
  if (t->capturing) {
    work w = {0};
    w.kind = W_SET; w.dst = p; w.value = v; w.n = n;
    return record(t, &w);
  }
  return do_set(p, v, n);
}

cudaError_t cudaMemset(void *p, int v, size_t n) { return do_set(p, v, n); }

int emu_stream_work(void *s, int (*fn)(void *, char *, size_t), const void *ctx, size_t n) {
  struct CUstream_st *t = st_of((cudaStream_t)s);
  char m[600];
  if (t->capturing) {
    work w = {0};
    w.kind = W_FN; w.fn = fn; w.bn = n;
    if (!(w.blob = malloc(n ? n : 1))) return set_err(cudaErrorMemoryAllocation);
    memcpy(w.blob, ctx, n);
    return record(t, &w);
  }
  {
    void *c = malloc(n ? n : 1);
    int rc;
    if (!c) return set_err(cudaErrorMemoryAllocation);
    memcpy(c, ctx, n);
    m[0] = '\0';
    rc = fn(c, m, sizeof m);
    free(c);
    return rc ? failf(cudaErrorLaunchFailure, "%s", m) : cudaSuccess;
  }
}

/* --- libraries: the NVRTC shim's images hold a shared object ---------------------------------- */

#define IMAGE_MAGIC "FLEMUSO1"
struct CUlib_st { void *h; emu_kernel **ks; int nks; };

cudaError_t cudaLibraryLoadData(cudaLibrary_t *lib, const void *code, enum cudaJitOption *jo,
                                void **jv, unsigned nj, enum cudaLibraryOption *lo, void **lv,
                                unsigned nl) {
  struct CUlib_st *L;
  uint64_t n;
  char path[4200];
  const char *tmp = getenv("TMPDIR");
  static int seq;
  int fd;
  (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
  *lib = NULL;
  if (!code || memcmp(code, IMAGE_MAGIC, 8) != 0)
    return failf(cudaErrorInvalidKernelImage, "cudaLibraryLoadData: not an image of the emulator's NVRTC "
                 "(a CUBIN or PTX of a real NVRTC, from a cache shared with a GPU run?)");
  memcpy(&n, (const char *)code + 8, 8);
  /* a file of its own name: dlopen knows objects by name, and a
  ** /proc/self/fd/N path would be taken for whatever object was loaded
  ** under that number before (fuselab's CPU cache loads its own so) */
  snprintf(path, sizeof path, "%s/fuselab-emu-%ld-%d.so", tmp ? tmp : "/tmp", (long)getpid(), ++seq);
  if ((fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0700)) < 0)
    return failf(cudaErrorInvalidKernelImage, "cudaLibraryLoadData: cannot write %s", path);
  if (write(fd, (const char *)code + 16, n) != (ssize_t)n || close(fd) != 0) {
    unlink(path);
    return failf(cudaErrorInvalidKernelImage, "cudaLibraryLoadData: cannot write %s", path);
  }
  if (!(L = calloc(1, sizeof *L))) { unlink(path); return set_err(cudaErrorMemoryAllocation); }
  L->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  unlink(path);
  if (!L->h) {
    cudaError_t rc = failf(cudaErrorInvalidKernelImage, "cudaLibraryLoadData: %s", dlerror());
    free(L);
    return rc;
  }
  *lib = L;
  return cudaSuccess;
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t *out, cudaLibrary_t lib, const char *name) {
  struct CUlib_st *L = lib;
  emu_kernel *k;
  char sym[200];
  *out = NULL;
  if (!L) return failf(cudaErrorInvalidResourceHandle, "cudaLibraryGetKernel: no library");
  if (!(k = calloc(1, sizeof *k))) return set_err(cudaErrorMemoryAllocation);
  snprintf(k->name, sizeof k->name, "%s", name);
  snprintf(sym, sizeof sym, "__emu_entry_%s", name);
  k->entry = (void (*)(void **))dlsym(L->h, sym);
  snprintf(sym, sizeof sym, "__emu_args_%s", name);
  k->info = dlsym(L->h, sym);
  k->shared = (void (*)(char **, char **))dlsym(L->h, "__emu_shared_range");
  if (!k->entry || !k->info) {
    free(k);
    return failf(cudaErrorSymbolNotFound, "cudaLibraryGetKernel: no __global__ function %s in the library", name);
  }
  k->magic = EMU_KERNEL_MAGIC;
  pthread_mutex_lock(&lock);
  k->next = kernels;
  kernels = k;
  pthread_mutex_unlock(&lock);
  /* the library marks its kernels dead when unloaded */
  {
    emu_kernel **ks = realloc(L->ks, (L->nks + 1) * sizeof *ks);
    if (ks) { L->ks = ks; L->ks[L->nks++] = k; }
  }
  *out = (cudaKernel_t)k;
  return cudaSuccess;
}

cudaError_t cudaLibraryUnload(cudaLibrary_t lib) {
  struct CUlib_st *L = lib;
  int i;
  if (!L) return cudaSuccess;
  for (i = 0; i < L->nks; i++) L->ks[i]->dead = 1;
  free(L->ks);
  dlclose(L->h);
  free(L);
  return cudaSuccess;
}

/* --- launches ------------------------------------------------------------------------------------ */

static const char *order_name(int o) { return o == 0 ? "forward" : o == 1 ? "backward" : "shuffled"; }

/* One checked launch: every order from the same memory, compared. */
static cudaError_t run_checked(const emu_kernel *k, const unsigned grid[3], const unsigned block[3],
                               void **args) {
  char *start[MAX_TOUCHED], *before[MAX_TOUCHED], *after[MAX_TOUCHED];
  size_t size[MAX_TOUCHED];
  const int no = orders();
  int nt, i, o, rc = cudaSuccess;
  char m[1500];
  m[0] = '\0';
  nt = emu_mem_touched(args, k->info, start, size, MAX_TOUCHED);
  memset(before, 0, sizeof before);
  memset(after, 0, sizeof after);
  if (no > 1)
    for (i = 0; i < nt; i++) {
      if (!(before[i] = malloc(size[i] ? size[i] : 1))) { rc = cudaErrorMemoryAllocation; goto out; }
      memcpy(before[i], start[i], size[i]);
    }
  for (o = 0; o < no; o++) {
    if (o > 0)
      for (i = 0; i < nt; i++) memcpy(start[i], before[i], size[i]);
    if ((rc = emu_run_grid(k, grid, block, args, o, m, sizeof m)) != 0) {
      rc = failf(rc, "%s (thread order %d, %s)", m, o, order_name(o));
      goto out;
    }
    if (emu_mem_check_redzones(k->name, m, sizeof m) != 0) {
      rc = failf(cudaErrorLaunchFailure, "kernel %s", m);
      goto out;
    }
    for (i = 0; i < nt && no > 1; i++) {
      if (o == 0) {
        if (!(after[i] = malloc(size[i] ? size[i] : 1))) { rc = cudaErrorMemoryAllocation; goto out; }
        memcpy(after[i], start[i], size[i]);
      } else if (memcmp(after[i], start[i], size[i]) != 0) {
        size_t b = 0;
        while (after[i][b] == start[i][b]) b++;
        rc = failf(cudaErrorLaunchFailure, "kernel %s: results depend on thread order (race): byte %zu of "
                   "a %zu-byte allocation differs between order 0 (forward) and order %d (%s)",
                   k->name, b, size[i], o, order_name(o));
        goto out;
      }
    }
  }
out:
  for (i = 0; i < nt; i++) { free(before[i]); free(after[i]); }
  return set_err((cudaError_t)rc);
}

static cudaError_t launch(const emu_kernel *k, const unsigned grid[3], const unsigned block[3], void **args) {
  const unsigned long nthreads = (unsigned long)block[0] * block[1] * block[2];
  cudaError_t rc;
  if (!k || k->magic != EMU_KERNEL_MAGIC)
    return failf(cudaErrorInvalidResourceHandle, "cudaLaunchKernel: not a kernel handle of the emulator");
  if (k->dead) return failf(cudaErrorInvalidResourceHandle, "kernel %s: its library was unloaded", k->name);
  if (!grid[0] || !grid[1] || !grid[2] || !block[0] || !block[1] || !block[2] || nthreads > 1024 ||
      block[2] > 64 || grid[1] > 65535 || grid[2] > 65535 || grid[0] > 0x7fffffffu)
    return failf(cudaErrorInvalidConfiguration, "kernel %s: grid (%u,%u,%u) block (%u,%u,%u) is not a "
                 "valid launch", k->name, grid[0], grid[1], grid[2], block[0], block[1], block[2]);
  if (k->info[1] && nthreads > k->info[1])
    return failf(cudaErrorLaunchOutOfResources, "kernel %s: %lu threads per block, but it is compiled with "
                 "__launch_bounds__(%lu)", k->name, nthreads, k->info[1]);
  if (trace()) {
    /* and the first words of the first argument (fuselab's parameter block) */
    unsigned long w;
    fprintf(stderr, "fuselab emu: launch %s grid (%u,%u,%u) block (%u,%u,%u) args", k->name, grid[0],
            grid[1], grid[2], block[0], block[1], block[2]);
    for (w = 0; k->info[0] && w < 10 && (w + 1) * 8 <= k->info[2]; w++) {
      long long v;
      memcpy(&v, (const char *)args[0] + 8 * w, 8);
      fprintf(stderr, " %llx", v);
    }
    fprintf(stderr, "\n");
  }
  pthread_mutex_lock(&lock);
  detail[0] = '\0';
  rc = run_checked(k, grid, block, args);
  pthread_mutex_unlock(&lock);
  return rc;
}

cudaError_t cudaLaunchKernel(const void *fn, dim3 g, dim3 b, void **args, size_t shmem, cudaStream_t s) {
  const emu_kernel *k = fn;
  struct CUstream_st *t = st_of(s);
  unsigned grid[3] = {g.x, g.y, g.z}, block[3] = {b.x, b.y, b.z};
  (void)shmem;
  if (t->capturing) {
    work w = {0};
    unsigned long a, na;
    size_t at = 0;
    if (!k || k->magic != EMU_KERNEL_MAGIC)
      return failf(cudaErrorInvalidResourceHandle, "cudaLaunchKernel: not a kernel handle of the emulator");
    na = k->info[0];
    for (a = 0; a < na; a++) w.bn += (k->info[2 + a] + 15) & ~(size_t)15;
    w.kind = W_KERNEL; w.k = k;
    memcpy(w.grid, grid, sizeof grid);
    memcpy(w.block, block, sizeof block);
    if (!(w.blob = malloc(w.bn ? w.bn : 1))) return set_err(cudaErrorMemoryAllocation);
    for (a = 0; a < na; a++) {
      memcpy(w.blob + at, args[a], k->info[2 + a]);
      at += (k->info[2 + a] + 15) & ~(size_t)15;
    }
    return record(t, &w);
  }
  return launch(k, grid, block, args);
}

/* --- graphs --------------------------------------------------------------------------------------- */

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *out, cudaGraph_t g, unsigned long long flags) {
  struct CUgraphExec_st *x;
  size_t i;
  (void)flags;
  *out = NULL;
  if (!g) return failf(cudaErrorInvalidValue, "cudaGraphInstantiate: no graph");
  if (!(x = calloc(1, sizeof *x)) || !(x->w = calloc(g->n ? g->n : 1, sizeof *x->w))) {
    free(x);
    return set_err(cudaErrorMemoryAllocation);
  }
  for (i = 0; i < g->n; i++) {
    x->w[i] = g->w[i];
    x->w[i].blob = NULL;
    if (g->w[i].blob) {
      if (!(x->w[i].blob = malloc(g->w[i].bn ? g->w[i].bn : 1))) {
        work_free(x->w, i);
        free(x);
        return set_err(cudaErrorMemoryAllocation);
      }
      memcpy(x->w[i].blob, g->w[i].blob, g->w[i].bn);
    }
  }
  x->n = g->n;
  *out = x;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
  if (!x) return cudaSuccess;
  work_free(x->w, x->n);
  free(x);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s) {
  size_t i;
  (void)s;
  if (!x) return failf(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: no graph");
  for (i = 0; i < x->n; i++) {
    work *w = &x->w[i];
    cudaError_t rc = cudaSuccess;
    switch (w->kind) {
    case W_KERNEL: {
      void *args[64];
      unsigned long a, na = w->k->info[0];
      size_t at = 0;
      if (na > 64) return failf(cudaErrorInvalidValue, "kernel %s: more than 64 arguments", w->k->name);
      for (a = 0; a < na; a++) {
        args[a] = w->blob + at;
        at += (w->k->info[2 + a] + 15) & ~(size_t)15;
      }
      rc = launch(w->k, w->grid, w->block, args);
      break;
    }
    case W_COPY: rc = do_copy(w->dst, w->src, w->n, w->ck); break;
    case W_SET: rc = do_set(w->dst, w->value, w->n); break;
    default: {
      char m[600] = "";
      if (w->fn(w->blob, m, sizeof m)) rc = failf(cudaErrorLaunchFailure, "%s", m);
      break;
    }
    }
    if (rc != cudaSuccess) return rc;
  }
  return cudaSuccess;
}
