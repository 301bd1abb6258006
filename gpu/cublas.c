/*
** cublas.c -- cuBLAS sgemm through dlopen, on the runtime's stream.
** Row-major C = A @ B is column-major C^T = B^T @ A^T: cuBLAS gets B's
** view as its first operand and A's as its second, each transposed or not
** by which of its strides is 1.
*/
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

#include "cublas.h"
#include "cuda_rt.h"

/* the few entry points used, as the library declares them (v2 API) */
typedef int (*create_fn)(void **handle);
typedef int (*set_stream_fn)(void *handle, void *stream);
typedef int (*sgemm_batched_fn)(void *handle, int ta, int tb, int m, int n, int k,
                                const float *alpha, const float *A, int lda, long long sa,
                                const float *B, int ldb, long long sb, const float *beta,
                                float *C, int ldc, long long sc, int batch);
enum { OP_N = 0, OP_T = 1 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *handle;
static sgemm_batched_fn sgemm_batched;
static char why[256];
static int tried;

static void load(void) {
  static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  void *lib = NULL;
  create_fn create;
  set_stream_fn set_stream;
  fl_err e;
  size_t i;
  tried = 1;
  err_clear(&e);
  if (cuda_rt_init(&e) != FL_OK) { snprintf(why, sizeof why, "%.200s", e.msg); return; }
  for (i = 0; i < sizeof names / sizeof names[0] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { snprintf(why, sizeof why, "cuBLAS: libcublas not found"); return; }
  create = (create_fn)dlsym(lib, "cublasCreate_v2");
  set_stream = (set_stream_fn)dlsym(lib, "cublasSetStream_v2");
  sgemm_batched = (sgemm_batched_fn)dlsym(lib, "cublasSgemmStridedBatched");
  if (!create || !set_stream || !sgemm_batched) {
    snprintf(why, sizeof why, "cuBLAS: the library lacks cublasSgemmStridedBatched");
    sgemm_batched = NULL;
    return;
  }
  if (create(&handle) != 0 || set_stream(handle, cuda_stream()) != 0) {
    snprintf(why, sizeof why, "cuBLAS: cannot create a handle on the stream");
    handle = NULL;
  }
}

int cublas_ready(fl_err *e) {
  int ok;
  pthread_mutex_lock(&lock);
  if (!tried) load();
  ok = handle != NULL;
  pthread_mutex_unlock(&lock);
  if (!ok) err_set(e, FL_EUNSUPPORTED, "%s", why);
  return ok;
}

/* op and leading dimension with which cuBLAS (column-major) reads a
** row-major rows x cols operand of strides (srow, scol); 0 when it cannot. */
static int layout(int64_t srow, int64_t scol, int64_t rows, int64_t cols, int *op, int64_t *ld) {
  if (scol == 1 && srow >= cols) { *op = OP_N; *ld = srow; return 1; }   /* rows contiguous */
  if (srow == 1 && scol >= rows) { *op = OP_T; *ld = scol; return 1; }   /* columns contiguous */
  return 0;
}

int cublas_matmul(int64_t batch, int64_t M, int64_t N, int64_t K, cublas_operand A,
                  cublas_operand B, float *C, fl_err *e) {
  const float one = 1.0f, zero = 0.0f;
  int opa, opb;
  int64_t lda, ldb;
  if (!cublas_ready(e)) return FL_EUNSUPPORTED;
  if (!layout(B.srow, B.scol, K, N, &opb, &ldb) || !layout(A.srow, A.scol, M, K, &opa, &lda) ||
      M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX ||
      lda > INT32_MAX || ldb > INT32_MAX || lda < 1 || ldb < 1)
    return err_set(e, FL_EUNSUPPORTED, "cuBLAS: operand layout not supported");
  /* C^T (N x M, ld N) = B^T (N x K) @ A^T (K x M) */
  if (sgemm_batched(handle, opb, opa, (int)N, (int)M, (int)K, &one, B.p, (int)ldb, B.sbatch,
                    A.p, (int)lda, A.sbatch, &zero, C, (int)N, (long long)(M * N), (int)batch) != 0)
    return err_set(e, FL_EUNSUPPORTED, "cuBLAS: sgemm failed (%lldx%lldx%lld, batch %lld)",
                   (long long)M, (long long)N, (long long)K, (long long)batch);
  return FL_OK;
}
