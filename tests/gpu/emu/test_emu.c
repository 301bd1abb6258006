/*
** test_emu.c -- the CUDA emulator catches what it claims to: small CUDA
** sources, each a correct kernel and mutations of it (a missing
** __syncthreads, a wrong index, a misaligned float4 load, a barrier in a
** divergent branch, a racing write, a shuffle over a partial warp), are
** compiled through the NVRTC shim and launched through the cudart shim;
** every mutation fails its launch with the message that names it, and
** the correct kernels pass with the right results.  Also: 16-bit
** rounding, WMMA, graph capture and replay, cuBLAS, device-memory misuse.
** Runs through tests/gpu/emu/run (mutations.sh); on a real GPU it would
** fail, by design (the magic of the images).
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <unistd.h>
#include <sys/wait.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>

#include "../../unit/tap.h"

static const char src[] =
  "#include <cuda_fp16.h>\n"
  "#include <cuda_bf16.h>\n"
  "#include <mma.h>\n"
  "/* a block sum in shared memory, then mutations of it */\n"
  "extern \"C\" __global__ void __launch_bounds__(256) reduce_ok(float *out, const float *in)\n"
  "{\n"
  "  __shared__ float sh[256];\n"
  "  sh[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];\n"
  "  __syncthreads();\n"
  "  for (int s = 128; s > 0; s >>= 1) {\n"
  "    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];\n"
  "    __syncthreads();\n"
  "  }\n"
  "  if (threadIdx.x == 0) out[blockIdx.x] = sh[0];\n"
  "}\n"
  "extern \"C\" __global__ void __launch_bounds__(256) reduce_nobarrier(float *out, const float *in)\n"
  "{\n"
  "  __shared__ float sh[256];\n"
  "  sh[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];\n"
  "  __syncthreads();\n"
  "  for (int s = 128; s > 0; s >>= 1) {\n"
  "    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];\n"
  "  }\n"
  "  if (threadIdx.x == 0) out[blockIdx.x] = sh[0];\n"
  "}\n"
  "extern \"C\" __global__ void reduce_divergent(float *out, const float *in)\n"
  "{\n"
  "  __shared__ float sh[256];\n"
  "  sh[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];\n"
  "  for (int s = 128; s > 0; s >>= 1) {\n"
  "    if (threadIdx.x < s) {\n"
  "      __syncthreads();\n"
  "      sh[threadIdx.x] += sh[threadIdx.x + s];\n"
  "    }\n"
  "  }\n"
  "  if (threadIdx.x == 0) out[blockIdx.x] = sh[0];\n"
  "}\n"
  "/* grid-stride copies */\n"
  "extern \"C\" __global__ void copy_ok(float *out, const float *in, int n)\n"
  "{\n"
  "  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)\n"
  "    out[i] = in[i];\n"
  "}\n"
  "extern \"C\" __global__ void copy_past_end(float *out, const float *in, int n)\n"
  "{\n"
  "  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)\n"
  "    out[i + 1] = in[i];\n"
  "}\n"
  "extern \"C\" __global__ void copy4(float *out, const float *in, int n, int off)\n"
  "{\n"
  "  for (int q = blockIdx.x * blockDim.x + threadIdx.x; q < n / 4; q += gridDim.x * blockDim.x) {\n"
  "    const float4 v = *(const float4 *)(in + off + 4 * q);\n"
  "    *(float4 *)(out + 4 * q) = v;\n"
  "  }\n"
  "}\n"
  "extern \"C\" __global__ void race(float *out)\n"
  "{\n"
  "  out[0] = (float)threadIdx.x;\n"
  "}\n"
  "/* a warp sum by shuffles */\n"
  "extern \"C\" __global__ void warp_sum(float *out, const float *in)\n"
  "{\n"
  "  float v = in[threadIdx.x];\n"
  "  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);\n"
  "  if ((threadIdx.x & 31) == 0) out[threadIdx.x / 32] = v;\n"
  "}\n"
  "/* float -> float16 / bfloat16 -> float */\n"
  "extern \"C\" __global__ void round16(float *out, const float *in, int n)\n"
  "{\n"
  "  for (int i = threadIdx.x; i < n; i += blockDim.x) {\n"
  "    out[2 * i] = __half2float(__float2half_rn(in[i]));\n"
  "    out[2 * i + 1] = __bfloat162float(__float2bfloat16_rn(in[i]));\n"
  "  }\n"
  "}\n"
  "/* one 16x16x16 product on tensor cores, one warp */\n"
  "extern \"C\" __global__ void wmma16(float *c, const __half *a, const __half *b)\n"
  "{\n"
  "  using namespace nvcuda;\n"
  "  __shared__ __align__(32) __half as[16 * 16];\n"
  "  __shared__ __align__(32) __half bs[16 * 16];\n"
  "  for (int i = threadIdx.x; i < 256; i += 32) { as[i] = a[i]; bs[i] = b[i]; }\n"
  "  __syncthreads();\n"
  "  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;\n"
  "  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;\n"
  "  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;\n"
  "  wmma::fill_fragment(fc, 0.0f);\n"
  "  wmma::load_matrix_sync(fa, as, 16);\n"
  "  wmma::load_matrix_sync(fb, bs, 16);\n"
  "  wmma::mma_sync(fc, fa, fb, fc);\n"
  "  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);\n"
  "}\n";

static cudaLibrary_t lib;
static char last_msg[4096];

static void *kernel(const char *name) {
  cudaKernel_t k = NULL;
  if (cudaLibraryGetKernel(&k, lib, name) != cudaSuccess) {
    printf("# no kernel %s\n", name);
    exit(1);
  }
  return (void *)k;
}

/* launch, synchronize; the status, its message in last_msg */
static cudaError_t launch(void *fn, unsigned grid, unsigned block, void **args) {
  dim3 g = {grid, 1, 1}, b = {block, 1, 1};
  cudaError_t rc = cudaLaunchKernel(fn, g, b, args, 0, NULL);
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(NULL);
  snprintf(last_msg, sizeof last_msg, "%s", cudaGetErrorString(rc));
  (void)cudaGetLastError();
  return rc;
}

static int says(const char *what) { return strstr(last_msg, what) != NULL; }

static float *dev(size_t n, const float *host) {
  void *p = NULL;
  if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) { printf("# cudaMalloc\n"); exit(1); }
  if (host) cudaMemcpy(p, host, n * sizeof(float), cudaMemcpyHostToDevice);
  return p;
}

int main(void) {
  nvrtcProgram prog;
  const char *opts[] = {"--gpu-architecture=sm_90", "-default-device", "--std=c++17"};
  size_t n;
  char *cubin, *log;
  float in[1024], out[1024], *din, *dout;
  int i, nn = 1024, off = 0, major = 0, minor = 0;
  void *args[4];
  cudaError_t rc;

  nvrtcVersion(&major, &minor);
  if (major != 13 || minor < 98) {
    printf("1..0 # SKIP not the emulator's NVRTC (run through tests/gpu/emu/run)\n");
    return 77;
  }
  /* a compile error comes back with the compiler's log */
  nvrtcCreateProgram(&prog, "extern \"C\" __global__ void bad(float *p) { p[0] = undeclared; }\n",
                     "bad.cu", 0, NULL, NULL);
  ok(nvrtcCompileProgram(prog, 3, opts) == NVRTC_ERROR_COMPILATION, "a compile error is NVRTC_ERROR_COMPILATION");
  nvrtcGetProgramLogSize(prog, &n);
  log = malloc(n);
  nvrtcGetProgramLog(prog, log);
  ok(strstr(log, "undeclared") != NULL && strstr(log, "bad.cu:1") != NULL, "its log names the error and line");
  free(log);
  nvrtcDestroyProgram(&prog);
  {
    const char *bad_opt[] = {"--no-such-option"};
    nvrtcCreateProgram(&prog, "", "empty.cu", 0, NULL, NULL);
    ok(nvrtcCompileProgram(prog, 1, bad_opt) == NVRTC_ERROR_INVALID_OPTION, "an unknown option is refused");
    nvrtcDestroyProgram(&prog);
  }

  nvrtcCreateProgram(&prog, src, "mutations.cu", 0, NULL, NULL);
  if (nvrtcCompileProgram(prog, 3, opts) != NVRTC_SUCCESS) {
    nvrtcGetProgramLogSize(prog, &n);
    log = malloc(n);
    nvrtcGetProgramLog(prog, log);
    printf("# %s\n", log);
    ok(0, "the test kernels compile");
    return tap_done();
  }
  nvrtcGetCUBINSize(prog, &n);
  cubin = malloc(n);
  nvrtcGetCUBIN(prog, cubin);
  nvrtcDestroyProgram(&prog);
  ok(cudaLibraryLoadData(&lib, cubin, NULL, NULL, 0, NULL, NULL, 0) == cudaSuccess, "the image loads");
  free(cubin);

  for (i = 0; i < 1024; i++) in[i] = (float)(i % 97) * 0.25f + 1.0f;
  din = dev(1024, in);
  dout = dev(1024, NULL);

  /* block reductions */
  args[0] = &dout; args[1] = &din;
  rc = launch(kernel("reduce_ok"), 4, 256, args);
  cudaMemcpy(out, dout, 4 * sizeof(float), cudaMemcpyDeviceToHost);
  {
    double want = 0;
    for (i = 0; i < 256; i++) want += in[i];
    ok(rc == cudaSuccess && fabs(out[0] - want) < 1e-3 * want, "reduce_ok: %g (want %g) %s", out[0], want, last_msg);
  }
  rc = launch(kernel("reduce_nobarrier"), 4, 256, args);
  ok(rc == cudaErrorLaunchFailure && says("reduce_nobarrier") && says("depend on thread order"),
     "a missing __syncthreads is a race: %s", last_msg);
  rc = launch(kernel("reduce_divergent"), 4, 256, args);
  ok(rc == cudaErrorLaunchFailure && says("reduce_divergent") && says("__syncthreads divergence"),
     "a barrier in a divergent branch: %s", last_msg);
  rc = launch(kernel("reduce_ok"), 1, 512, args);
  ok(rc == cudaErrorLaunchOutOfResources && says("__launch_bounds__(256)"),
     "more threads than the launch bound: %s", last_msg);

  /* copies */
  args[0] = &dout; args[1] = &din; args[2] = &nn;
  rc = launch(kernel("copy_ok"), 3, 128, args);
  cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
  ok(rc == cudaSuccess && memcmp(out, in, sizeof in) == 0, "copy_ok copies %s", last_msg);
#if defined(__SANITIZE_ADDRESS__)
  /* sanitized, the redzones are poisoned: ASan stops the process at the
  ** write, so a child makes it */
  {
    char tmpl[] = "/tmp/fl-emu-asan-XXXXXX", buf[8192];
    int fd = mkstemp(tmpl), st = 0;
    ssize_t got;
    pid_t pid;
    fflush(stdout);
    if ((pid = fork()) == 0) {
      dup2(fd, 2);
      launch(kernel("copy_past_end"), 3, 128, args);
      _exit(0);
    }
    waitpid(pid, &st, 0);
    got = pread(fd, buf, sizeof buf - 1, 0);
    buf[got > 0 ? got : 0] = '\0';
    close(fd);
    unlink(tmpl);
    ok(!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && strstr(buf, "AddressSanitizer") &&
       strstr(buf, "WRITE of size 4"), "a wrong index writing past the end: ASan stops it at the write");
  }
#else
  rc = launch(kernel("copy_past_end"), 3, 128, args);
  ok(rc == cudaErrorLaunchFailure && says("copy_past_end") && says("out of bounds of a 4096-byte allocation"),
     "a wrong index writing past the end: %s", last_msg);
#endif
  args[3] = &off;
  rc = launch(kernel("copy4"), 2, 64, args);
  cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
  ok(rc == cudaSuccess && memcmp(out, in, sizeof in) == 0, "aligned float4 loads and stores %s", last_msg);
  off = 1;
  nn = 1020;
  rc = launch(kernel("copy4"), 2, 64, args);
  ok(rc == cudaErrorLaunchFailure && says("copy4") && says("misaligned") && says("float4"),
     "a misaligned float4 load: %s", last_msg);
  args[0] = &dout;
  rc = launch(kernel("race"), 1, 64, args);
  ok(rc == cudaErrorLaunchFailure && says("race") && says("depend on thread order"),
     "threads racing on one element: %s", last_msg);

  /* shuffles */
  args[0] = &dout; args[1] = &din;
  rc = launch(kernel("warp_sum"), 1, 64, args);
  cudaMemcpy(out, dout, 2 * sizeof(float), cudaMemcpyDeviceToHost);
  {
    double want = 0;
    for (i = 32; i < 64; i++) want += in[i];
    ok(rc == cudaSuccess && fabs(out[1] - want) < 1e-4 * want, "warp_sum by shuffles: %g (want %g) %s",
       out[1], want, last_msg);
  }
  rc = launch(kernel("warp_sum"), 1, 48, args);
  ok(rc == cudaErrorLaunchFailure && says("warp_sum") && says("names lane 16"),
     "a full-mask shuffle over a partial warp: %s", last_msg);

  /* 16-bit rounding: nearest even, subnormals, overflow, NaN */
  {
    static const float x[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65519.0f, 65520.0f, 0x1p-25f,
                              0x1.8p-24f, -0x1p-26f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3.0e38f};
    static const float hw[] = {1.0f, 1.0f + 0x1p-9f, 65504.0f, INFINITY, 0.0f, 0x1p-23f, -0.0f,
                               1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, INFINITY};
    static const float bw[] = {1.0f, 1.0f, 65536.0f, 65536.0f, 0x1p-25f, 0x1.8p-24f, -0x1p-26f,
                               1.0f, 1.0f + 0x1p-6f, 0x1.c4p+127f};
    float r[20];
    int nx = 10, bad = 0;
    float *dx = dev(10, x), *dr = dev(20, NULL);
    args[0] = &dr; args[1] = &dx; args[2] = &nx;
    rc = launch(kernel("round16"), 1, 32, args);
    cudaMemcpy(r, dr, sizeof r, cudaMemcpyDeviceToHost);
    for (i = 0; i < nx; i++)
      if (memcmp(&r[2 * i], &hw[i], 4) || memcmp(&r[2 * i + 1], &bw[i], 4)) {
        printf("# %a: half %a (want %a), bfloat16 %a (want %a)\n", x[i], r[2 * i], hw[i], r[2 * i + 1], bw[i]);
        bad++;
      }
    ok(rc == cudaSuccess && !bad, "float16 and bfloat16 round to nearest even, as the GPU %s", last_msg);
    cudaFree(dx);
    cudaFree(dr);
  }

  /* WMMA against a plain product */
  {
    unsigned short ha[256], hb[256];
    float c[256], a[256], b[256];
    void *da, *db;
    float *dc = dev(256, NULL);
    int bad = 0, j, k;
    for (i = 0; i < 256; i++) {
      a[i] = (float)((i * 7) % 11) - 5.0f;
      b[i] = (float)((i * 5) % 13) * 0.5f - 3.0f;
      /* small integers and halves: exact in float16 */
      { float f = a[i]; unsigned u; memcpy(&u, &f, 4); ha[i] = (unsigned short)(((u >> 16) & 0x8000) | (f == 0 ? 0 : ((((u >> 23) & 0xff) - 112) << 10) | ((u >> 13) & 0x3ff))); }
      { float f = b[i]; unsigned u; memcpy(&u, &f, 4); hb[i] = (unsigned short)(((u >> 16) & 0x8000) | (f == 0 ? 0 : ((((u >> 23) & 0xff) - 112) << 10) | ((u >> 13) & 0x3ff))); }
    }
    cudaMalloc(&da, sizeof ha);
    cudaMalloc(&db, sizeof hb);
    cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice);
    args[0] = &dc; args[1] = &da; args[2] = &db;
    rc = launch(kernel("wmma16"), 1, 32, args);
    cudaMemcpy(c, dc, sizeof c, cudaMemcpyDeviceToHost);
    for (i = 0; i < 16; i++)
      for (j = 0; j < 16; j++) {
        float s = 0;
        for (k = 0; k < 16; k++) s += a[i * 16 + k] * b[k * 16 + j];
        if (s != c[i * 16 + j]) bad++;
      }
    ok(rc == cudaSuccess && !bad, "wmma 16x16x16 equals the product (%d wrong) %s", bad, last_msg);
    rc = launch(kernel("wmma16"), 1, 64, args);
    ok(rc == cudaSuccess, "two warps storing the same tile agree %s", last_msg);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
  }

  /* a graph: a memset and a launch, captured, replayed */
  {
    cudaStream_t s;
    cudaGraph_t g, g0;
    cudaGraphExec_t x;
    dim3 g1 = {2, 1, 1}, b1 = {128, 1, 1};
    int m = 256;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    args[0] = &dout; args[1] = &din; args[2] = &m;
    cudaMemset(dout, 0, 1024 * sizeof(float));
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    cudaMemsetAsync(dout, 0xff, 1024 * sizeof(float), s);
    cudaLaunchKernel(kernel("copy_ok"), g1, b1, args, 0, s);
    m = 3;   /* the launch captured its arguments' values */
    ok(cudaStreamEndCapture(s, &g) == cudaSuccess && cudaGraphInstantiate(&x, g, 0) == cudaSuccess,
       "capture and instantiate");
    g0 = g;
    cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
    ok(out[0] == 0.0f, "nothing ran during capture");
    ok(cudaGraphLaunch(x, s) == cudaSuccess && cudaGraphLaunch(x, s) == cudaSuccess, "two replays");
    cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
    ok(memcmp(out, in, 256 * sizeof(float)) == 0 && isnan(out[256]), "the replay copied 256 and memset the rest");
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    ok(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported, "synchronizing a capturing stream fails");
    ok(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated, "and invalidates the capture");
    (void)cudaGetLastError();
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g0);
    cudaStreamDestroy(s);
  }

  /* cuBLAS: C = A @ B, row-major as fuselab calls it */
  {
    void *h = dlopen("libcublas.so.13", RTLD_NOW), *hd = NULL;
    int (*create)(void **) = h ? (int (*)(void **))dlsym(h, "cublasCreate_v2") : NULL;
    int (*gemm)(void *, int, int, int, int, int, const float *, const float *, int, long long,
                const float *, int, long long, const float *, float *, int, long long, int) =
      h ? (int (*)(void *, int, int, int, int, int, const float *, const float *, int, long long,
                   const float *, int, long long, const float *, float *, int, long long, int))
          dlsym(h, "cublasSgemmStridedBatched") : NULL;
    const float one = 1, zero = 0;
    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, 0, 1, 1, 1}, C[4];
    float *dA = dev(6, A), *dB = dev(6, B), *dC = dev(4, NULL);
    /* row-major C (2x2) = A (2x3) @ B (3x2): column-major C^T = B^T A^T */
    ok(create && gemm && create(&hd) == 0 &&
       gemm(hd, 0, 0, 2, 2, 3, &one, dB, 2, 0, dA, 3, 0, &zero, dC, 2, 0, 1) == 0, "cublasSgemmStridedBatched runs");
    cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost);
    ok(C[0] == 4 && C[1] == 5 && C[2] == 10 && C[3] == 11, "and computes (%g %g; %g %g)", C[0], C[1], C[2], C[3]);
    ok(gemm && gemm(hd, 0, 0, 2, 2, 3, &one, dB, 2, 0, dA, 3, 0, &zero, dC, 2, 4, 2) != 0,
       "a batch past the end of its operands fails");
    (void)cudaGetLastError();
    if (h) {
      int (*destroy)(void *) = (int (*)(void *))dlsym(h, "cublasDestroy_v2");
      if (destroy) destroy(hd);
    }
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
  }

  /* device memory misuse */
  {
    void *p = NULL, *q = NULL;
    ok(cudaMalloc(&p, (size_t)1 << 42) == cudaErrorMemoryAllocation && !p, "a 4 TiB cudaMalloc fails");
    (void)cudaGetLastError();
    cudaMalloc(&q, 64);
    ok(cudaMemcpy(q, in, 128, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
       "a copy past the end of an allocation fails: %s", cudaGetErrorString(cudaErrorInvalidValue));
    ok(cudaFree(q) == cudaSuccess && cudaFree(q) == cudaErrorInvalidValue, "a double cudaFree fails");
    (void)cudaGetLastError();
  }
  cudaLibraryUnload(lib);
  args[0] = &dout; args[1] = &din; args[2] = &nn;
  cudaFree(din);
  cudaFree(dout);
  return tap_done();
}
