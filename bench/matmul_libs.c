/*
** matmul_libs.c -- float32 products of the shapes the models run, through
** OpenBLAS's cblas_sgemm (whatever kernels it runs: set OPENBLAS_CORETYPE
** to compare) and oneDNN's matmul primitive (one primitive per shape,
** created once, as a primitive cache would).  GFLOP/s, best of 7 timed
** batches per shape.  Run on the threads OMP_NUM_THREADS gives.
**   cd build && make bench/matmul_libs && OMP_NUM_THREADS=2 bench/matmul_libs
** and again with OPENBLAS_CORETYPE=Prescott (a CPU OpenBLAS does not know).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CK(x) do { dnnl_status_t s_ = (x); if (s_ != dnnl_success) { \
  fprintf(stderr, "%s: %d\n", #x, (int)s_); exit(1); } } while (0)

typedef struct shape { const char *name; int B, M, K, N, tb; } shape;

static float *fill(size_t n) {
  float *p = malloc(n * sizeof *p);
  size_t i;
  for (i = 0; i < n; i++) p[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
  return p;
}

static double timeit(void (*f)(void *), void *ctx, double flops) {
  int reps = (int)(4e8 / flops) + 1, r, t;
  double best = 1e30;
  f(ctx);
  for (t = 0; t < 7; t++) {
    double t0 = now();
    for (r = 0; r < reps; r++) f(ctx);
    double dt = (now() - t0) / reps;
    if (dt < best) best = dt;
  }
  return flops / best / 1e9;
}

typedef struct ctx {
  const shape *s;
  float *a, *b, *c;
  dnnl_primitive_t prim;
  dnnl_stream_t stream;
  dnnl_memory_t ma, mb, mc;
} ctx;

/* one sgemm per matrix (what eager_matmul does for a batched right operand) */
static void blas_loop(void *p) {
  ctx *x = p;
  const shape *s = x->s;
  int i;
  for (i = 0; i < s->B; i++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, s->M, s->N, s->K,
                1.0f, x->a + (size_t)i * s->M * s->K, s->K, x->b + (size_t)i * s->K * s->N,
                s->tb ? s->K : s->N, 0.0f, x->c + (size_t)i * s->M * s->N, s->N);
}

static void dnnl_run(void *p) {
  ctx *x = p;
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, x->ma}, {DNNL_ARG_WEIGHTS, x->mb}, {DNNL_ARG_DST, x->mc}};
  CK(dnnl_primitive_execute(x->prim, x->stream, 3, args));
  CK(dnnl_stream_wait(x->stream));
}

int main(void) {
  static const shape shapes[] = {
    {"mlp fc1 256x512->2048 (x@w^T)", 1, 256, 512, 2048, 1},
    {"mlp fc2 256x2048->512 (x@w^T)", 1, 256, 2048, 512, 1},
    {"attn q@k^T [32]128x64x128", 32, 128, 64, 128, 1},
    {"attn p@v [32]128x128x64", 32, 128, 128, 64, 0},
    {"gpt qkv 1024x256->768", 1, 1024, 256, 768, 1},
    {"gpt proj 1024x256->256", 1, 1024, 256, 256, 1},
    {"gpt fc1 1024x256->1024", 1, 1024, 256, 1024, 1},
    {"gpt fc2 1024x1024->256", 1, 1024, 1024, 256, 1},
    {"square 1024^3", 1, 1024, 1024, 1024, 0},
  };
  dnnl_engine_t eng;
  dnnl_stream_t stream;
  size_t i;
  char *(*core)(void) = openblas_get_corename;
  CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
  CK(dnnl_stream_create(&stream, eng, dnnl_stream_default_flags));
  printf("OpenBLAS kernels: %s; oneDNN %d.%d.%d\n", core(), dnnl_version()->major,
         dnnl_version()->minor, dnnl_version()->patch);
  for (i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    const shape *s = &shapes[i];
    ctx x;
    dnnl_dims_t ad = {s->B, s->M, s->K}, bd = {s->B, s->K, s->N}, cd = {s->B, s->M, s->N};
    dnnl_dims_t as = {(dnnl_dim_t)s->M * s->K, s->K, 1}, cs = {(dnnl_dim_t)s->M * s->N, s->N, 1};
    dnnl_dims_t bs;
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    double flops = 2.0 * s->B * s->M * s->K * s->N, gb, gd;
    memset(&x, 0, sizeof x);
    x.s = s;
    x.a = fill((size_t)s->B * s->M * s->K);
    x.b = fill((size_t)s->B * s->K * s->N);
    x.c = fill((size_t)s->B * s->M * s->N);
    if (s->tb) { bs[0] = (dnnl_dim_t)s->K * s->N; bs[1] = 1; bs[2] = s->K; }
    else { bs[0] = (dnnl_dim_t)s->K * s->N; bs[1] = s->N; bs[2] = 1; }
    CK(dnnl_memory_desc_init_by_strides(&amd, 3, ad, dnnl_f32, as));
    CK(dnnl_memory_desc_init_by_strides(&bmd, 3, bd, dnnl_f32, bs));
    CK(dnnl_memory_desc_init_by_strides(&cmd, 3, cd, dnnl_f32, cs));
    CK(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd));
    CK(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
    CK(dnnl_primitive_create(&x.prim, pd));
    {
      const char *impl;
      CK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
      gb = timeit(blas_loop, &x, flops);
      CK(dnnl_memory_create(&x.ma, &amd, eng, x.a));
      CK(dnnl_memory_create(&x.mb, &bmd, eng, x.b));
      CK(dnnl_memory_create(&x.mc, &cmd, eng, x.c));
      x.stream = stream;
      gd = timeit(dnnl_run, &x, flops);
      printf("  %-32s openblas %7.1f  onednn %7.1f  (%s)  onednn/openblas %.2f\n", s->name, gb, gd,
             impl, gd / gb);
    }
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_destroy(x.prim);
    dnnl_memory_destroy(x.ma); dnnl_memory_destroy(x.mb); dnnl_memory_destroy(x.mc);
    free(x.a); free(x.b); free(x.c);
  }
  return 0;
}
