/*
** test_fuse.c -- the fusion planner: kernel counts for the patterns that
** must become one kernel, counts for whole models (justified below), the
** wording of decisions, hand-checked stats, and fuse=false.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "fuse_graphs.h"
#include "fuse/plan.h"

static int kernels_of(ir_graph *g, int fuse, fuse_plan **keep) {
  fuse_opts o;
  fl_err e;
  fuse_plan *p;
  int n;
  fuse_opts_default(&o);
  o.fuse = fuse;
  p = fuse_plan_build(g, &o, &e);
  if (!p) { printf("# plan failed: %s\n", e.msg); return -1; }
  n = p->nkernels;
  if (keep) *keep = p;
  else fuse_plan_free(p);
  return n;
}

static void show(fuse_plan *p) {
  char *s = fuse_plan_listing(p, 1), *line;
  for (line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) printf("# %s\n", line);
  free(s);
}

static void one_kernel(const char *what, ir_graph *g) {
  fuse_plan *p = NULL;
  int n = kernels_of(g, 1, &p);
  is_int(n, 1, "%s is one kernel", what);
  if (n != 1 && p) show(p);
  if (p && n == 1) ok(p->kernels[0].kind == FK_REDUCE, "%s: a reduce kernel (%s)", what, p->kernels[0].name);
  fuse_plan_free(p);
  ir_free(g);
}

static int has_decision(const fuse_plan *p, const char *needle, int fused) {
  int i;
  for (i = 0; i < p->ndec; i++)
    if (strstr(p->dec[i].reason, needle) && p->dec[i].fused == fused) return 1;
  return 0;
}

int main(void) {
  fuse_plan *p;
  ir_graph *g;
  int n;

  /* the four normalizations, both forms: each one reduce kernel */
  one_kernel("softmax (composite)", fg_softmax(64, 128, 0, 0));
  one_kernel("softmax (decomposed)", fg_softmax(64, 128, 1, 0));
  one_kernel("log_softmax (composite)", fg_softmax(64, 128, 0, 1));
  one_kernel("log_softmax (decomposed)", fg_softmax(64, 128, 1, 1));
  one_kernel("layer_norm (composite)", fg_norm(64, 128, 0, 0));
  one_kernel("layer_norm (decomposed)", fg_norm(64, 128, 1, 0));
  one_kernel("rms_norm (composite)", fg_norm(64, 128, 0, 1));
  one_kernel("rms_norm (decomposed)", fg_norm(64, 128, 1, 1));

  /* MLP: linear+gelu is one kernel (sgemm, then gelu as its epilogue),
  ** the second linear another: 2 */
  g = fg_mlp(32, 64, 128);
  n = kernels_of(g, 1, &p);
  is_int(n, 2, "MLP linear-gelu-linear: 2 kernels");
  if (p && n == 2) ok(p->kernels[0].kind == FK_EXTERN && p->kernels[0].nnodes == 1,
                      "gelu is the first linear's epilogue (%s)", p->kernels[0].name);
  fuse_plan_free(p);
  ir_free(g);

  /* conv-bn-relu: conv as the extern step, batch_norm and relu its
  ** epilogue: 1 */
  g = fg_conv_bn_relu(2, 3, 8, 16);
  n = kernels_of(g, 1, &p);
  is_int(n, 1, "conv-bn-relu: 1 kernel");
  if (n != 1 && p) show(p);
  fuse_plan_free(p);
  ir_free(g);

  /* transformer block: ln1 (1), q k v linears (3), q@k^T (1), scale fused
  ** into softmax as its prologue (1), p@v (1), o-linear (1), residual add
  ** fused into ln2 as its prologue (1: saving its write and read scores
  ** higher than joining the o-linear's epilogue, which saves no traffic),
  ** fc1 + gelu (1), fc2 + residual add as its epilogue (1): 11.  A
  ** reduction never joins an extern's epilogue, and an extern never takes
  ** a prologue, which is what keeps the rest apart. */
  g = fg_block(2, 16, 32);
  n = kernels_of(g, 1, &p);
  is_int(n, 11, "transformer block: 11 kernels");
  if (n != 11 && p) show(p);
  fuse_plan_free(p);
  is_int(kernels_of(g, 0, NULL), ir_op_count(g) - 1, "transformer block unfused: one kernel per op but the folded transpose");
  ir_free(g);

  /* refusal wording */
  {
    op_attrs at;
    int x, w, s, mm;
    g = ir_new();
    x = fg_input(g, fg_meta(FL_F32, 3, (int64_t)2, (int64_t)8, (int64_t)16));
    w = fg_param(g, fg_meta(FL_F32, 2, (int64_t)1, (int64_t)5), "w", 1, 0);
    op_attrs_init(OP_SUM, &at);
    at.ndims = 1; at.dims[0] = 2; at.keepdim = 1;
    s = fg_attr(g, OP_SUM, &x, 1, &at);
    mm = fg_bin(g, OP_MATMUL, s, w);
    ir_add_output(g, mm, NULL);
    n = kernels_of(g, 1, &p);
    is_int(n, 2, "sum then matmul: 2 kernels");
    ok(p && has_decision(p, "cannot fuse %2 (sum over dim 2) with %3 (matmul): matmul is not an epilogue", 0),
       "refusal says: matmul is not an epilogue");
    if (p) show(p);
    fuse_plan_free(p);
    ir_free(g);
  }

  /* decided and explained fusions */
  g = fg_softmax(8, 16, 1, 0);
  kernels_of(g, 1, &p);
  ok(p && has_decision(p, "elementwise producer of a reduction", 1) &&
     has_decision(p, "elementwise consumer of a reduction", 1),
     "softmax decisions name their rules");
  fuse_plan_free(p);
  ir_free(g);

  /* hand-checked stats: x[1024] f32; a = exp(x); b = a * 2; c = b + x.
  ** unfused: exp 4K+4K, mul 4K+4K (the scalar is a literal), add 8K+4K =
  ** 28 KiB; fused: read x, write c = 8 KiB.  Buffers a, b, c -> c.  Peak
  ** unfused: a and b alive together (8 KiB), then b and c (8 KiB); fused:
  ** c alone. */
  {
    int x, a, b, c;
    g = ir_new();
    x = fg_input(g, fg_meta(FL_F32, 1, (int64_t)1024));
    a = fg_un(g, OP_EXP, x);
    b = fg_bin(g, OP_MUL, a, fg_scalar(g, 2.0));
    c = fg_bin(g, OP_ADD, b, x);
    ir_add_output(g, c, NULL);
    n = kernels_of(g, 1, &p);
    is_int(n, 1, "exp-mul-add: 1 kernel");
    is_int(p->stats.nodes, 3, "stats.nodes");
    is_int(p->stats.kernels, 1, "stats.kernels");
    is_int(p->stats.bytes_before, 28672, "stats.bytes_before");
    is_int(p->stats.bytes_after, 8192, "stats.bytes_after");
    is_int(p->stats.buffers_before, 3, "stats.buffers_before");
    is_int(p->stats.buffers_after, 1, "stats.buffers_after");
    is_int(p->stats.peak_bytes_before, 8192, "stats.peak_bytes_before");
    is_int(p->stats.peak_bytes_after, 4096, "stats.peak_bytes_after");
    ok(has_decision(p, "fused %1 (exp) with %3 (mul): elementwise chain", 1), "chain decision text");
    fuse_plan_free(p);
    /* fuse off: one kernel per op, and every pair refused as such */
    n = kernels_of(g, 0, &p);
    is_int(n, 3, "fuse off: 3 kernels for 3 ops");
    ok(p && has_decision(p, "fusion is off", 0), "fuse off decisions say so");
    fuse_plan_free(p);
    ir_free(g);
  }

  /* fuse off on a decomposed layer_norm: one kernel per op */
  g = fg_norm(16, 32, 1, 0);
  is_int(kernels_of(g, 0, NULL), ir_op_count(g), "fuse off: one kernel per op (layer_norm decomposed)");
  ir_free(g);

  /* max_nodes caps a chain */
  {
    fuse_opts o;
    fl_err e;
    int x, i;
    g = ir_new();
    x = fg_input(g, fg_meta(FL_F32, 1, (int64_t)100));
    for (i = 0; i < 10; i++) x = fg_un(g, OP_NEG, x);
    ir_add_output(g, x, NULL);
    fuse_opts_default(&o);
    o.max_nodes = 4;
    p = fuse_plan_build(g, &o, &e);
    is_int(p ? p->nkernels : -1, 3, "max_nodes 4: 10 ops in 3 kernels");
    ok(p && has_decision(p, "max_nodes is 4", 0), "refusal names max_nodes");
    fuse_plan_free(p);
    ir_free(g);
  }

  /* views fold into indexing: exp(x.T) + y is one kernel, no copy */
  {
    int x, y;
    g = ir_new();
    x = fg_input(g, fg_meta(FL_F32, 2, (int64_t)8, (int64_t)4));
    y = fg_input(g, fg_meta(FL_F32, 2, (int64_t)4, (int64_t)8));
    ir_add_output(g, fg_bin(g, OP_ADD, fg_un(g, OP_EXP, fg_transpose(g, x, 0, 1)), y), NULL);
    n = kernels_of(g, 1, &p);
    is_int(n, 1, "exp(x.T) + y: 1 kernel");
    if (p && n == 1) is_int(p->kernels[0].nin, 2, "reads x and y directly (the transpose is indexing)");
    fuse_plan_free(p);
    ir_free(g);
  }

  /* horizontal: sum and amax of the same input in one kernel */
  {
    int x, s, m;
    g = ir_new();
    x = fg_input(g, fg_meta(FL_F32, 2, (int64_t)16, (int64_t)32));
    s = fg_red(g, OP_SUM, x, 1, 0);
    m = fg_red(g, OP_AMAX, x, 1, 0);
    ir_add_output(g, s, NULL);
    ir_add_output(g, m, NULL);
    n = kernels_of(g, 1, &p);
    is_int(n, 1, "sum and amax over one input: 1 kernel");
    ok(p && has_decision(p, "horizontal", 1), "decision says horizontal");
    fuse_plan_free(p);
    ir_free(g);
  }
  return tap_done();
}
