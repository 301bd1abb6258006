/*
** test_gpu.c -- the GPU differential test: programs compiled with NVRTC
** and run on the device against the reference interpreter (graph/ref.c,
** double precision), on
**   - random graphs from the differential generator (fused and unfused),
**   - softmax, layer_norm, rms_norm, an MLP, a conv-bn-relu block and a
**     transformer block (fuse_graphs.h), in float32,
**   - float16 and bfloat16 versions of softmax, layer_norm, matmul + gelu
**     (tensor cores) and linear,
**   - CUDA graphs (reduce-overhead): two replays equal a plain run,
**   - max-autotune picks a block size (and ours or cuBLAS for the
**     products) and still matches; the products forced onto cuBLAS match.
** Tolerances (|got - want| <= tol * (1 + |want|)): float32 2e-3 (the
** device's expf/erff are within a few ulp, sums are reassociated),
** float16 1e-2, bfloat16 3e-2 (one rounding of the result plus the
** inputs' rounding through a matmul); int64 and bool exact; NaN matches NaN.
** Exits 77 without a device.  FUSELAB_GPU_GRAPHS (default 300).
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../unit/tap.h"
#include "../unit/random_graph.h"
#include "fuse/plan.h"
#include "gpu/cuda.h"
#include "gpu/cuda_program.h"
#include "gpu/cublas.h"
#include "graph/ref.h"

static int mismatch(const fl_tensor *got, const fl_tensor *want, char *why, size_t n) {
  int64_t i, cnt = meta_numel(&want->m);
  fl_dtype dt = want->m.dtype;
  double rt = dt == FL_F16 ? 1e-2 : dt == FL_BF16 ? 3e-2 : 2e-3;
  if (got->m.dtype != dt || !meta_same_shape(&got->m, &want->m)) {
    snprintf(why, n, "result type differs");
    return 1;
  }
  for (i = 0; i < cnt; i++) {
    double a = ten_get(got, i), b = ten_get(want, i);
    int bad;
    if (isnan(a) && isnan(b)) continue;
    if (dt == FL_I64 || dt == FL_BOOL) bad = a != b;
    else if (isinf(b) || isinf(a)) bad = a != b;
    else bad = !(fabs(a - b) <= rt * (1 + fabs(b)));
    if (bad) {
      snprintf(why, n, "element %lld: got %.9g, want %.9g", (long long)i, a, b);
      return 1;
    }
  }
  return 0;
}

static void fill(ir_graph *g, fl_tensor *in, uint64_t seed) {
  rg_fill_inputs(g, in, seed);
}

/* Run g fused or not on the device and compare with the reference;
** mode: 0 plain, 1 CUDA graph (three calls), 2 autotuned, 3 every product
** cuBLAS can take on cuBLAS (max-autotune's alternative).  1 on success. */
static int check(const char *what, ir_graph *g, int fuse, int mode, uint64_t seed, int quiet) {
  fuse_opts o;
  fuse_plan *p;
  exec_program *pr;
  fl_tensor in[RG_MAXN], want[8], got[8], host;
  const fl_tensor *inp[RG_MAXN];
  fl_err e;
  char why[1400];
  int i, o2, good = 1, call, calls = mode == 1 ? 3 : 1;
  memset(in, 0, sizeof in);
  memset(want, 0, sizeof want);
  fuse_opts_default(&o);
  o.fuse = fuse;
  if (!(p = fuse_plan_build(g, &o, &e))) { ok(0, "%s: plan: %s", what, e.msg); return 0; }
  pr = exec_codegen(&cuda_backend, p, NULL, &e);
  fuse_plan_free(p);
  if (!pr) { ok(0, "%s: codegen: %s", what, e.msg); return 0; }
  fill(g, in, seed);
  for (i = 0; i < g->ninputs; i++) inp[i] = &in[i];
  if (ir_run(g, ref_apply, inp, g->ninputs, want, &e) != FL_OK) {
    good = -1;     /* the oracle refuses these inputs: not a compiler test */
    goto done;
  }
  if (mode == 1) cuda_program_set_mode(pr, CUDA_MODE_GRAPH);
  if (mode == 2 && cuda_program_autotune(pr, inp, g->ninputs, &e) != FL_OK) {
    ok(0, "%s: autotune: %s", what, e.msg);
    good = 0;
    goto done;
  }
  if (mode == 3) {
    if (!cublas_ready(&e)) {
      printf("ok - %s: products on cuBLAS # SKIP %s\n", what, e.msg);
      good = -1;
      goto done;
    }
    cuda_state *cs = cuda_state_of(pr);
    if (cs && (cs->cublas = malloc((size_t)pr->plan->nkernels))) memset(cs->cublas, 1, (size_t)pr->plan->nkernels);
  }
  for (call = 0; call < calls && good == 1; call++) {
    memset(got, 0, sizeof got);
    if (cuda_program_run(pr, inp, g->ninputs, got, &e) != FL_OK) {
      snprintf(why, sizeof why, "run: %s\n%s", e.msg, exec_program_log(pr));
      good = 0;
    }
    for (o2 = 0; o2 < g->nout && good == 1; o2++) {
      if (cuda_copy_to(&host, &got[o2], FL_DEV_CPU, &e) != FL_OK) {
        snprintf(why, sizeof why, "copy back: %s", e.msg);
        good = 0;
        break;
      }
      {
        char detail[400];
        if (mismatch(&host, &want[o2], detail, sizeof detail)) {
          snprintf(why, sizeof why, "call %d output %d: %s", call + 1, o2, detail);
          good = 0;
        }
      }
      ten_release(&host);
    }
    for (o2 = 0; o2 < 8; o2++) ten_release(&got[o2]);
  }
  if (!quiet || !good) {
    ok(good, "%s (%s%s) matches the reference", what, fuse ? "fused" : "unfused",
       mode == 1 ? ", CUDA graph" : mode == 2 ? ", autotuned" : mode == 3 ? ", products on cuBLAS" : "");
    if (!good) {
      char *s = ir_listing(g);
      printf("# %s\n# %s\n", why, s ? s : "");
      free(s);
    } else if (mode == 2) {
      printf("# %s\n", cuda_state_of(pr)->tune);
    }
  }
done:
  for (i = 0; i < RG_MAXN; i++) ten_release(&in[i]);
  for (i = 0; i < 8; i++) ten_release(&want[i]);
  exec_program_free(pr);
  return good;
}

/* x (dtype dt) through op, then gelu: the 16-bit graphs */
static ir_graph *half_graph(fl_dtype dt, int which) {
  ir_graph *g = ir_new();
  op_attrs a;
  fl_err e;
  int x, y, in[3];
  switch (which) {
  case 0:     /* softmax */
    x = fg_input(g, fg_meta(dt, 2, (int64_t)64, (int64_t)1000));
    op_attrs_init(OP_SOFTMAX, &a);
    a.i[0] = 1;
    y = ir_add_op(g, OP_SOFTMAX, &x, 1, &a, NULL, NULL, &e);
    break;
  case 1:     /* layer_norm */
    x = fg_input(g, fg_meta(dt, 2, (int64_t)64, (int64_t)768));
    in[0] = x;
    in[1] = fg_param(g, fg_meta(dt, 1, (int64_t)768), "w", 0.5, 1.0);
    in[2] = fg_param(g, fg_meta(dt, 1, (int64_t)768), "b", 0.1, 0.0);
    op_attrs_init(OP_LAYER_NORM, &a);
    a.i[0] = 1;
    y = ir_add_op(g, OP_LAYER_NORM, in, 3, &a, NULL, NULL, &e);
    break;
  case 2:     /* matmul + gelu: tensor cores */
    x = fg_input(g, fg_meta(dt, 2, (int64_t)130, (int64_t)96));
    in[0] = x;
    in[1] = fg_param(g, fg_meta(dt, 2, (int64_t)96, (int64_t)70), "w", 0.1, 0.0);
    op_attrs_init(OP_MATMUL, &a);
    y = ir_add_op(g, OP_MATMUL, in, 2, &a, NULL, NULL, &e);
    op_attrs_init(OP_GELU, &a);
    y = ir_add_op(g, OP_GELU, &y, 1, &a, NULL, NULL, &e);
    break;
  default:    /* linear with bias */
    x = fg_input(g, fg_meta(dt, 3, (int64_t)2, (int64_t)33, (int64_t)64));
    in[0] = x;
    in[1] = fg_param(g, fg_meta(dt, 2, (int64_t)48, (int64_t)64), "w", 0.1, 0.0);
    in[2] = fg_param(g, fg_meta(dt, 1, (int64_t)48), "b", 0.1, 0.0);
    op_attrs_init(OP_LINEAR, &a);
    y = ir_add_op(g, OP_LINEAR, in, 3, &a, NULL, NULL, &e);
    break;
  }
  ir_add_output(g, y, NULL);
  return g;
}

int main(void) {
  const char *eg = getenv("FUSELAB_GPU_GRAPHS");
  long total = eg ? atol(eg) : 300, i, failed = 0, skipped = 0, ran = 0;
  fl_err e;
  time_t t0 = time(NULL);
  int w, d;
  if (!cuda_available(&e) || cuda_rt_init(&e) != FL_OK) {
    printf("1..0 # SKIP %s\n", e.msg);
    return 77;
  }
  printf("# device: %s; NVRTC %s\n", cuda_device_name(), nvrtc_version_str());
  {
    struct { const char *what; ir_graph *g; } named[] = {
      {"softmax 512x1000", fg_softmax(512, 1000, 0, 0)},
      {"log_softmax 64x4097", fg_softmax(64, 4097, 0, 1)},
      {"softmax decomposed 33x77", fg_softmax(33, 77, 1, 0)},
      {"layer_norm 256x768", fg_norm(256, 768, 0, 0)},
      {"rms_norm 256x768", fg_norm(256, 768, 0, 1)},
      {"layer_norm decomposed 16x100", fg_norm(16, 100, 1, 0)},
      {"mlp 64x128x512", fg_mlp(64, 128, 512)},
      {"conv-bn-relu 2x8x16x14", fg_conv_bn_relu(2, 8, 16, 14)},
      {"transformer block 2x16x64", fg_block(2, 16, 64)},
      {"transformer block 2x16x64, 4 heads", fg_block_heads(2, 16, 64, 4)},
    };
    for (w = 0; w < (int)(sizeof named / sizeof named[0]); w++) {
      check(named[w].what, named[w].g, 1, 0, 11, 0);
      check(named[w].what, named[w].g, 0, 0, 11, 0);
      if (w == 0 || w == 6) check(named[w].what, named[w].g, 1, 1, 12, 0);
      if (w == 3 || w == 8) check(named[w].what, named[w].g, 1, 2, 13, 0);
      if (w >= 6) check(named[w].what, named[w].g, 1, 3, 14, 0);
      ir_free(named[w].g);
    }
  }
  for (d = 0; d < 2; d++)
    for (w = 0; w < 4; w++) {
      static const char *const names[] = {"softmax", "layer_norm", "matmul + gelu", "linear"};
      char what[64];
      fl_dtype dt = d ? FL_BF16 : FL_F16;
      ir_graph *g = half_graph(dt, w);
      snprintf(what, sizeof what, "%s %s", names[w], dtype_name(dt));
      check(what, g, 1, 0, 21, 0);
      ir_free(g);
    }
  for (i = 0; i < total; i++) {
    ir_graph *g = rg_random_graph((uint64_t)i + 1);
    int r;
    char what[64];
    if (!g) { skipped++; continue; }
    snprintf(what, sizeof what, "random graph seed %ld", i + 1);
    r = check(what, g, 1, 0, (uint64_t)i + 1, 1);
    if (r == 1) r = check(what, g, 0, 0, (uint64_t)i + 1, 1);
    if (r == 0) failed++;
    if (r >= 0) ran++;
    ir_free(g);
  }
  ok(failed == 0, "%ld random graphs on the GPU (fused and unfused) match the reference "
     "(%ld refused by the oracle or empty) in %.0f s", ran, total - ran, difftime(time(NULL), t0));
  {
    /* device out of memory: an error naming the size, nothing held */
    cuda_mem_stats before, after;
    void *big = NULL;
    int rc;
    cuda_get_mem_stats(&before);
    rc = cuda_alloc(&big, (size_t)1 << 42, &e);
    cuda_get_mem_stats(&after);
    ok(rc == FL_ENOMEM && strstr(e.msg, "4398046511104") != NULL && !big,
       "a 4 TiB allocation fails naming its size: %s", e.msg);
    ok(after.in_use == before.in_use, "and holds no memory afterwards");
  }
  {
    cuda_mem_stats ms;
    cuda_get_mem_stats(&ms);
    printf("# device memory: peak %.1f MiB, %lld allocations, %lld reused\n",
           (double)ms.peak / 1048576.0, (long long)ms.allocs, (long long)ms.reuses);
  }
  (void)skipped;
  return tap_done();
}
