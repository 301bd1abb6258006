/*
** conv_overhead.c -- the floor under one convolution: oneDNN's own loop,
** as benchdnn times it (one primitive, oneDNN's blocked layouts for the
** input, weights and result made once, the primitive executed again and
** again), for small per-layer shapes (the CNNs' last stages, MobileNet's
** depthwise), with a bias and a relu post-op.  bench/conv_overhead.lua
** runs it beside fuselab's compiled chain of eight such layers; the
** difference per layer is what a layer costs fuselab beyond the
** arithmetic (its launch, the primitive cache, any reorder).  Prints "name ms" per shape, the best of
** 7 timed batches.
**   cd build && make bench/conv_overhead && OMP_NUM_THREADS=2 bench/conv_overhead
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CK(x) do { dnnl_status_t s_ = (x); if (s_ != dnnl_success) { \
  fprintf(stderr, "%s: %d\n", #x, (int)s_); exit(1); } } while (0)

/* the shapes bench/conv_overhead.lua names alike */
typedef struct shape { const char *name; int c, co, hw, k, groups; } shape;
static const shape shapes[] = {
  {"1x1 256->256 7x7", 256, 256, 7, 1, 1},
  {"1x1 512->512 7x7", 512, 512, 7, 1, 1},
  {"3x3 512->512 7x7", 512, 512, 7, 3, 1},
  {"3x3 dw 576 7x7", 576, 576, 7, 3, 576},
  {"1x1 64->64 14x14", 64, 64, 14, 1, 1},
};

static dnnl_memory_t mem(dnnl_engine_t eng, const dnnl_memory_desc_t *md) {
  dnnl_memory_t m;
  CK(dnnl_memory_create(&m, md, eng, DNNL_MEMORY_ALLOCATE));
  return m;
}

int main(void) {
  dnnl_engine_t eng;
  dnnl_stream_t st;
  size_t i;
  CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
  CK(dnnl_stream_create(&st, eng, dnnl_stream_default_flags));
  for (i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    const shape *s = &shapes[i];
    int G = s->groups, pad = s->k / 2, r, b, reps;
    dnnl_dims_t xd = {1, s->c, s->hw, s->hw}, yd = {1, s->co, s->hw, s->hw}, bd = {s->co};
    dnnl_dims_t wd = {s->co, s->c, s->k, s->k}, gwd = {G, s->co / G, s->c / G, s->k, s->k};
    dnnl_dims_t strides = {1, 1}, dil = {0, 0}, pl = {pad, pad}, pr = {pad, pad};
    dnnl_memory_desc_t x, w, y, bias;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t ops;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_exec_arg_t args[4];
    double best = 1e30, t0;
    CK(dnnl_memory_desc_init_by_tag(&x, 4, xd, dnnl_f32, dnnl_format_tag_any));
    CK(dnnl_memory_desc_init_by_tag(&y, 4, yd, dnnl_f32, dnnl_format_tag_any));
    CK(dnnl_memory_desc_init_by_tag(&w, G > 1 ? 5 : 4, G > 1 ? gwd : wd, dnnl_f32, dnnl_format_tag_any));
    CK(dnnl_memory_desc_init_by_tag(&bias, 1, bd, dnnl_f32, dnnl_x));
    CK(dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct,
                                                  &x, &w, &bias, &y, strides, dil, pl, pr));
    CK(dnnl_primitive_attr_create(&attr));
    CK(dnnl_post_ops_create(&ops));
    CK(dnnl_post_ops_append_eltwise(ops, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f));
    CK(dnnl_primitive_attr_set_post_ops(attr, ops));
    CK(dnnl_primitive_desc_create(&pd, &cd, attr, eng, NULL));
    CK(dnnl_primitive_create(&prim, pd));
    args[0].arg = DNNL_ARG_SRC; args[0].memory = mem(eng, dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0));
    args[1].arg = DNNL_ARG_WEIGHTS; args[1].memory = mem(eng, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0));
    args[2].arg = DNNL_ARG_BIAS; args[2].memory = mem(eng, &bias);
    args[3].arg = DNNL_ARG_DST; args[3].memory = mem(eng, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0));
    for (b = 0; b < 4; b++) {          /* small values, no denormals */
      const dnnl_memory_desc_t *md;
      float *p;
      size_t n, j;
      CK(dnnl_memory_get_memory_desc(args[b].memory, &md));
      CK(dnnl_memory_get_data_handle(args[b].memory, (void **)&p));
      n = dnnl_memory_desc_get_size(md) / sizeof *p;
      for (j = 0; j < n; j++) p[j] = (float)((j * 7919) % 101) / 101.0f - 0.5f;
    }
    CK(dnnl_primitive_execute(prim, st, 4, args));
    CK(dnnl_stream_wait(st));
    t0 = now();
    CK(dnnl_primitive_execute(prim, st, 4, args));
    CK(dnnl_stream_wait(st));
    reps = (int)(0.05 / (now() - t0 + 1e-7)) + 1;
    for (r = 0; r < 7; r++) {
      t0 = now();
      for (b = 0; b < reps; b++) CK(dnnl_primitive_execute(prim, st, 4, args));
      CK(dnnl_stream_wait(st));
      if ((now() - t0) / reps < best) best = (now() - t0) / reps;
    }
    printf("%s\t%.4f\n", s->name, best * 1e3);
    for (b = 0; b < 4; b++) dnnl_memory_destroy(args[b].memory);
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(ops);
    dnnl_primitive_attr_destroy(attr);
  }
  dnnl_stream_destroy(st);
  dnnl_engine_destroy(eng);
  return 0;
}
