/*
** cuda_rt.c -- device, allocator, copies, modules, launches, graphs.
** Invariant: all device work is ordered on one stream (`stream`), so a
** block the caching allocator hands out again can only be touched by work
** queued after every use of its previous owner; and every block handed out
** is in `live` (pointer -> size) until cuda_free puts it on a free list, so
** nothing is lost or freed twice.
*/
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_rt.h"
#include "cuda.h"
#include "nvrtc.h"

int cuda_check_(int rc, int lib, const char *call, const char *what,
                const char *file, int line, fl_err *e) {
  const char *msg;
  int code = FL_EINVAL;
  if (rc == 0) return FL_OK;
  if (lib) {
    msg = nvrtcGetErrorString((nvrtcResult)rc);
    if (rc == NVRTC_ERROR_OUT_OF_MEMORY) code = FL_ENOMEM;
    else if (rc == NVRTC_ERROR_COMPILATION) code = FL_ECOMPILE;
  } else {
    msg = cudaGetErrorString((cudaError_t)rc);
    if (rc == cudaErrorMemoryAllocation) code = FL_ENOMEM;
    else if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver ||
             rc == cudaErrorInitializationError) code = FL_ENODEV;
    (void)cudaGetLastError();   /* clear the sticky-free error state */
  }
  if (code == FL_ENODEV) return err_set(e, code, "no CUDA device: %s", msg);
  return err_set(e, code, "%s: %s failed at %s:%d: %s", what, call, file, line, msg);
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int ready, cc, sms;
static cudaStream_t stream;
static char devname[400];
static int capturing;
static cuda_counters counts;      /* under lock */

/* --- allocator -------------------------------------------------------------- */

#define NBUCKET 4096
typedef struct block { void *p; size_t n; struct block *next; } block;
static block *live[NBUCKET];      /* handed out, hashed by address */
static block *cache;              /* freed, any size (first fit by size class) */
static cuda_mem_stats mst;

static unsigned hash_ptr(const void *p) {
  uintptr_t u = (uintptr_t)p >> 8;
  return (unsigned)((u ^ (u >> 13)) % NBUCKET);
}

/* Sizes round up to 512 bytes below 1 MiB, to 2 MiB above: few distinct
** sizes, so freed blocks are found again. */
static size_t round_size(size_t n) {
  if (n < ((size_t)1 << 20)) return (n + 511) & ~(size_t)511;
  return (n + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
}

void cuda_empty_cache(void) {
  block *b, *next;
  pthread_mutex_lock(&lock);
  b = cache;
  cache = NULL;
  mst.cached = 0;
  pthread_mutex_unlock(&lock);
  if (b) (void)cudaStreamSynchronize(stream);
  for (; b; b = next) {
    next = b->next;
    (void)cudaFree(b->p);
    free(b);
  }
}

int cuda_alloc(void **p, size_t nbytes, fl_err *e) {
  size_t n = round_size(nbytes ? nbytes : 1);
  block *b, **pp;
  cudaError_t rc;
  int r;
  *p = NULL;
  if ((r = cuda_rt_init(e)) != FL_OK) return r;
  pthread_mutex_lock(&lock);
  for (pp = &cache; *pp; pp = &(*pp)->next)
    if ((*pp)->n == n) break;
  b = *pp;
  if (b) { *pp = b->next; mst.cached -= (int64_t)n; mst.reuses++; }
  pthread_mutex_unlock(&lock);
  if (!b) {
    void *d = NULL;
    if (!(b = malloc(sizeof *b))) return err_set(e, FL_ENOMEM, "cuda: cannot allocate %zu bytes", nbytes);
    rc = cudaMalloc(&d, n);
    if (rc == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      cuda_empty_cache();
      rc = cudaMalloc(&d, n);
    }
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      free(b);
      if (rc == cudaErrorMemoryAllocation)
        return err_set(e, FL_ENOMEM, "cuda: out of device memory allocating %zu bytes "
                       "(%.1f MiB)", nbytes, (double)nbytes / 1048576.0);
      return CUDA_CHECK(e, "cuda alloc", rc);
    }
    b->p = d;
    b->n = n;
    pthread_mutex_lock(&lock);
    mst.device_allocs++;
    pthread_mutex_unlock(&lock);
  }
  pthread_mutex_lock(&lock);
  b->next = live[hash_ptr(b->p)];
  live[hash_ptr(b->p)] = b;
  mst.in_use += (int64_t)n;
  mst.allocs++;
  if (mst.in_use > mst.peak) mst.peak = mst.in_use;
  pthread_mutex_unlock(&lock);
  *p = b->p;
  return FL_OK;
}

void cuda_free(void *p) {
  block **pp, *b = NULL;
  if (!p) return;
  pthread_mutex_lock(&lock);
  for (pp = &live[hash_ptr(p)]; *pp; pp = &(*pp)->next)
    if ((*pp)->p == p) { b = *pp; *pp = b->next; break; }
  if (b) {
    mst.in_use -= (int64_t)b->n;
    mst.cached += (int64_t)b->n;
    b->next = cache;
    cache = b;
  }
  pthread_mutex_unlock(&lock);
}

void cuda_get_mem_stats(cuda_mem_stats *s) {
  pthread_mutex_lock(&lock);
  *s = mst;
  pthread_mutex_unlock(&lock);
}

/* ten_empty's allocator: zero-filled, NULL on failure (ten_empty then
** reports the size) */
static void *alloc_zeroed(size_t n) {
  void *p;
  fl_err e;
  if (cuda_alloc(&p, n, &e) != FL_OK) return NULL;
  if (cudaMemsetAsync(p, 0, n ? n : 1, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    cuda_free(p);
    return NULL;
  }
  return p;
}

/* ten_uninit's allocator: memory a kernel overwrites whole, so no memset
** (the pool hands back blocks as the last user left them), except the
** tests' poison (ten_poison_uninit). */
static void *alloc_uninit(size_t n) {
  void *p;
  fl_err e;
  if (cuda_alloc(&p, n, &e) != FL_OK) return NULL;
  if (ten_poison_uninit() && cudaMemsetAsync(p, 0xFF, n ? n : 1, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    cuda_free(p);
    return NULL;
  }
  return p;
}

/* --- device ------------------------------------------------------------------- */

int cuda_rt_init(fl_err *e) {
  struct cudaDeviceProp prop;
  int rc;
  if (ready) return FL_OK;
  if (!cuda_available(e)) return FL_ENODEV;
  pthread_mutex_lock(&lock);
  if (ready) { pthread_mutex_unlock(&lock); return FL_OK; }
  rc = CUDA_CHECK(e, "cuda init", cudaSetDevice(0));
  if (rc == FL_OK) rc = CUDA_CHECK(e, "cuda init", cudaGetDeviceProperties(&prop, 0));
  if (rc == FL_OK) rc = CUDA_CHECK(e, "cuda init", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (rc == FL_OK) {
    cc = prop.major * 10 + prop.minor;
    sms = prop.multiProcessorCount;
    snprintf(devname, sizeof devname, "%s (sm_%d, %d SMs, %.1f GiB)", prop.name, cc, sms,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    ten_set_allocator(FL_DEV_CUDA, alloc_zeroed, alloc_uninit, cuda_free, cuda_device_name);
    ready = 1;
  }
  pthread_mutex_unlock(&lock);
  return rc;
}

int cuda_device_cc(void) {
  fl_err e;
  return cuda_rt_init(&e) == FL_OK ? cc : 0;
}

int cuda_sm_count(void) {
  fl_err e;
  return cuda_rt_init(&e) == FL_OK ? sms : 0;
}

const char *cuda_device_name(void) {
  static fl_err e;
  if (cuda_rt_init(&e) != FL_OK) return e.msg;
  return devname;
}

/* --- copies ---------------------------------------------------------------------- */

/* the builtin gather kernels: a strided device tensor made contiguous */
static const char gather_src[] =
  "typedef long long fl_i64;\n"
  "struct fl_gather_args { void *dst; const void *src; fl_i64 n, nd; fl_i64 size[8], stride[8]; };\n"
  "template <typename T> __device__ void gather(const fl_gather_args &a)\n"
  "{\n"
  "  T *d = (T *)a.dst;\n"
  "  const T *s = (const T *)a.src;\n"
  "  for (fl_i64 i = (fl_i64)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;\n"
  "       i += (fl_i64)gridDim.x * blockDim.x) {\n"
  "    fl_i64 r = i, at = 0;\n"
  "    for (int k = (int)a.nd - 1; k >= 0; k--) {\n"
  "      at += (r % a.size[k]) * a.stride[k];\n"
  "      r /= a.size[k];\n"
  "    }\n"
  "    d[i] = s[at];\n"
  "  }\n"
  "}\n"
  "extern \"C\" __global__ void fl_gather1(const fl_gather_args a) { gather<unsigned char>(a); }\n"
  "extern \"C\" __global__ void fl_gather2(const fl_gather_args a) { gather<unsigned short>(a); }\n"
  "extern \"C\" __global__ void fl_gather4(const fl_gather_args a) { gather<unsigned int>(a); }\n"
  "extern \"C\" __global__ void fl_gather8(const fl_gather_args a) { gather<unsigned long long>(a); }\n";

typedef struct gather_args {
  void *dst;
  const void *src;
  int64_t n, nd;
  int64_t size[8], stride[8];
} gather_args;

static cuda_module *gather_mod;
static void *gather_fn[9];

static int gather_kernels(fl_err *e) {
  nvrtc_image img;
  static const char *names[] = {"fl_gather1", "fl_gather2", "fl_gather4", "fl_gather8"};
  static const int sizes[] = {1, 2, 4, 8};
  int rc, i;
  if (gather_mod) return FL_OK;
  if ((rc = nvrtc_compile(gather_src, "fl_gather.cu", nvrtc_default_arch(), &img, NULL, e)) != FL_OK)
    return rc;
  rc = cuda_module_load(img.cubin ? img.cubin : (void *)img.ptx, &gather_mod, e);
  nvrtc_image_free(&img);
  for (i = 0; i < 4 && rc == FL_OK; i++)
    rc = cuda_module_kernel(gather_mod, names[i], &gather_fn[sizes[i]], e);
  return rc;
}

static int dev_empty(fl_tensor *t, const fl_meta *m, fl_err *e) {
  fl_meta dm = *m;
  dm.device = FL_DEV_CUDA;
  return ten_empty(t, &dm, e);
}

int cuda_contiguous(fl_tensor *out, const fl_tensor *src, fl_err *e) {
  gather_args a;
  unsigned grid[3] = {1, 1, 1};
  size_t es = dtype_size(src->m.dtype);
  int64_t n = meta_numel(&src->m);
  int rc, d;
  if (ten_is_contiguous(src)) { ten_share(out, src); return FL_OK; }
  if ((rc = gather_kernels(e)) != FL_OK) return rc;
  if ((rc = dev_empty(out, &src->m, e)) != FL_OK) return rc;
  memset(&a, 0, sizeof a);
  a.dst = ten_data(out);
  a.src = (const char *)src->st->data + src->offset * (int64_t)es;
  a.n = n;
  a.nd = src->m.ndim;
  for (d = 0; d < src->m.ndim; d++) { a.size[d] = src->m.shape[d]; a.stride[d] = src->stride[d]; }
  grid[0] = (unsigned)((n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535);
  if (grid[0] == 0) grid[0] = 1;
  if ((rc = cuda_launch(gather_fn[es], grid, 256, &a, sizeof a, e)) != FL_OK) ten_release(out);
  return rc;
}

int cuda_copy_into(fl_tensor *dst, const fl_tensor *src, fl_err *e) {
  size_t n = (size_t)meta_numel(&src->m) * dtype_size(src->m.dtype);
  enum cudaMemcpyKind kind;
  int rc;
  if (n == 0) return FL_OK;
  if (dst->m.device == FL_DEV_CUDA)
    kind = src->m.device == FL_DEV_CUDA ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
  else
    kind = src->m.device == FL_DEV_CUDA ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
  ten_wrote(dst);
  if ((rc = CUDA_CHECK(e, "copy", cudaMemcpyAsync(ten_data(dst), ten_data(src), n, kind, stream))) != FL_OK)
    return rc;
  pthread_mutex_lock(&lock);
  if (kind == cudaMemcpyHostToDevice) counts.h2d_bytes += (int64_t)n;
  if (kind == cudaMemcpyDeviceToHost) counts.d2h_bytes += (int64_t)n;
  pthread_mutex_unlock(&lock);
  /* host memory is pageable: wait before the caller reuses or reads it */
  if (kind != cudaMemcpyDeviceToDevice && !capturing) return cuda_sync(e);
  return FL_OK;
}

int cuda_copy_to(fl_tensor *dst, const fl_tensor *src, fl_device dev, fl_err *e) {
  fl_tensor c;
  fl_meta m = src->m;
  int rc;
  memset(dst, 0, sizeof *dst);
  if ((rc = cuda_rt_init(e)) != FL_OK) return rc;
  if (src->m.device == FL_DEV_CUDA) rc = cuda_contiguous(&c, src, e);
  else rc = ten_contiguous(&c, src, e);
  if (rc != FL_OK) return rc;
  m.device = dev;
  m.wrapped = 0;
  if ((rc = ten_empty(dst, &m, e)) == FL_OK && (rc = cuda_copy_into(dst, &c, e)) != FL_OK)
    ten_release(dst);
  ten_release(&c);
  return rc;
}

/* --- modules and launches ---------------------------------------------------- */

struct cuda_module { cudaLibrary_t lib; };

int cuda_module_load(const void *image, cuda_module **out, fl_err *e) {
  cuda_module *m;
  int rc;
  *out = NULL;
  if ((rc = cuda_rt_init(e)) != FL_OK) return rc;
  if (!(m = calloc(1, sizeof *m))) return err_set(e, FL_ENOMEM, "cuda: out of memory");
  if ((rc = CUDA_CHECK(e, "load", cudaLibraryLoadData(&m->lib, image, NULL, NULL, 0, NULL, NULL, 0))) != FL_OK) {
    free(m);
    return rc;
  }
  *out = m;
  return FL_OK;
}

int cuda_module_kernel(cuda_module *m, const char *name, void **fn, fl_err *e) {
  cudaKernel_t k;
  int rc = CUDA_CHECK(e, "load", cudaLibraryGetKernel(&k, m->lib, name));
  *fn = rc == FL_OK ? (void *)k : NULL;
  return rc;
}

void cuda_module_free(cuda_module *m) {
  if (!m) return;
  (void)cudaLibraryUnload(m->lib);
  free(m);
}

int cuda_launch(void *fn, const unsigned grid[3], unsigned block, const void *params,
                size_t nbytes, fl_err *e) {
  dim3 g, b;
  void *args[1];
  (void)nbytes;   /* the kernel's signature says how many bytes to read */
  g.x = grid[0] ? grid[0] : 1; g.y = grid[1] ? grid[1] : 1; g.z = grid[2] ? grid[2] : 1;
  b.x = block; b.y = 1; b.z = 1;
  args[0] = (void *)params;
  pthread_mutex_lock(&lock);
  if (!capturing) counts.launches++;
  pthread_mutex_unlock(&lock);
  return CUDA_CHECK(e, "launch", cudaLaunchKernel(fn, g, b, args, 0, stream));
}

void cuda_get_counters(cuda_counters *c) {
  pthread_mutex_lock(&lock);
  *c = counts;
  pthread_mutex_unlock(&lock);
}

void *cuda_stream(void) { return (void *)stream; }

int cuda_sync(fl_err *e) {
  return CUDA_CHECK(e, "synchronize", cudaStreamSynchronize(stream));
}

/* --- graphs ------------------------------------------------------------------------ */

struct cuda_graph { cudaGraph_t g; cudaGraphExec_t x; };

int cuda_capture_begin(fl_err *e) {
  int rc;
  if ((rc = cuda_rt_init(e)) != FL_OK) return rc;
  /* relaxed: the allocator may still call cudaMalloc (not captured) */
  rc = CUDA_CHECK(e, "capture", cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  if (rc == FL_OK) capturing = 1;
  return rc;
}

int cuda_capture_end(cuda_graph **out, fl_err *e) {
  cuda_graph *g = calloc(1, sizeof *g);
  int rc;
  *out = NULL;
  capturing = 0;
  if (!g) {
    cudaGraph_t dead;
    if (cudaStreamEndCapture(stream, &dead) == cudaSuccess) (void)cudaGraphDestroy(dead);
    return err_set(e, FL_ENOMEM, "cuda: out of memory");
  }
  if ((rc = CUDA_CHECK(e, "capture", cudaStreamEndCapture(stream, &g->g))) != FL_OK) { free(g); return rc; }
  if ((rc = CUDA_CHECK(e, "capture", cudaGraphInstantiate(&g->x, g->g, 0))) != FL_OK) {
    (void)cudaGraphDestroy(g->g);
    free(g);
    return rc;
  }
  *out = g;
  return FL_OK;
}

int cuda_graph_replay(cuda_graph *g, fl_err *e) {
  pthread_mutex_lock(&lock);
  counts.graph_replays++;
  pthread_mutex_unlock(&lock);
  return CUDA_CHECK(e, "graph replay", cudaGraphLaunch(g->x, stream));
}

void cuda_graph_free(cuda_graph *g) {
  if (!g) return;
  (void)cudaGraphExecDestroy(g->x);
  (void)cudaGraphDestroy(g->g);
  free(g);
}

int cuda_capturing(void) { return capturing; }

/* --- timing --------------------------------------------------------------------------- */

static cudaEvent_t ev0, ev1;

int cuda_timer_start(fl_err *e) {
  int rc;
  if ((rc = cuda_rt_init(e)) != FL_OK) return rc;
  if (!ev0 && (rc = CUDA_CHECK(e, "timer", cudaEventCreate(&ev0))) != FL_OK) return rc;
  if (!ev1 && (rc = CUDA_CHECK(e, "timer", cudaEventCreate(&ev1))) != FL_OK) return rc;
  return CUDA_CHECK(e, "timer", cudaEventRecord(ev0, stream));
}

int cuda_timer_stop(double *ms, fl_err *e) {
  float f = 0;
  int rc;
  if ((rc = CUDA_CHECK(e, "timer", cudaEventRecord(ev1, stream))) != FL_OK) return rc;
  if ((rc = CUDA_CHECK(e, "timer", cudaEventSynchronize(ev1))) != FL_OK) return rc;
  rc = CUDA_CHECK(e, "timer", cudaEventElapsedTime(&f, ev0, ev1));
  *ms = f;
  return rc;
}
