/*
** test_ir.c -- the graph IR and its passes: building, listing, running
** with the reference interpreter, and decompose/optimize keeping results
** equal to the reference within stated tolerances.
*/
#include <stdlib.h>
#include <string.h>

#include "graph/ir.h"
#include "graph/pass.h"
#include "graph/ref.h"
#include "graph/rng.h"
#include "tap.h"

static fl_meta mk(fl_dtype t, int nd, const int64_t *shape) {
  fl_meta m;
  memset(&m, 0, sizeof m);
  m.dtype = t;
  m.ndim = nd;
  memcpy(m.shape, shape, (size_t)nd * sizeof(int64_t));
  return m;
}

static fl_tensor randt(int nd, const int64_t *shape) {
  fl_tensor t = {0};
  fl_meta m = mk(FL_F32, nd, shape);
  fl_err e;
  if (ten_empty(&t, &m, &e)) { printf("# alloc: %s\n", e.msg); exit(1); }
  rng_normal(&t);
  return t;
}

static int op1(ir_graph *g, fl_op op, int x, op_attrs *a) {
  fl_err e;
  op_attrs d;
  int id;
  if (!a) { op_attrs_init(op, &d); a = &d; }
  id = ir_add_op(g, op, &x, 1, a, "test.lua:1", NULL, &e);
  if (id < 0) printf("# %s: %s\n", op_name(op), e.msg);
  return id;
}

static int op2(ir_graph *g, fl_op op, int x, int y) {
  fl_err e;
  op_attrs a;
  int in[2] = {x, y}, id;
  op_attrs_init(op, &a);
  id = ir_add_op(g, op, in, 2, &a, NULL, NULL, &e);
  if (id < 0) printf("# %s: %s\n", op_name(op), e.msg);
  return id;
}

/* max |a - b| over all elements, or 1e30 on a shape mismatch */
static double maxdiff(const fl_tensor *a, const fl_tensor *b) {
  int64_t i, n = meta_numel(&a->m);
  double m = 0;
  if (!meta_same_shape(&a->m, &b->m)) return 1e30;
  for (i = 0; i < n; i++) {
    double d = fabs(ten_get(a, i) - ten_get(b, i));
    if (d > m || d != d) m = d;
  }
  return m;
}

/* run g and h on the same inputs; max difference of output 0 */
static double compare(const ir_graph *g, const ir_graph *h, const fl_tensor *in, int nin) {
  const fl_tensor *args[4] = {&in[0], &in[1], &in[2], &in[3]};
  fl_tensor a = {0}, b = {0};
  fl_err e;
  double d;
  if (ir_run(g, ref_apply, args, nin, &a, &e)) { printf("# run g: %s\n", e.msg); return 1e30; }
  if (ir_run(h, ref_apply, args, nin, &b, &e)) { printf("# run h: %s\n", e.msg); ten_release(&a); return 1e30; }
  d = maxdiff(&a, &b);
  ten_release(&a);
  ten_release(&b);
  return d;
}

static int count_op(const ir_graph *g, fl_op op) {
  int i, n = 0;
  for (i = 0; i < g->n; i++) n += g->nodes[i].kind == IR_OP && g->nodes[i].op == op;
  return n;
}

static void test_listing(void) {
  int64_t s[2] = {8, 128};
  fl_meta m = mk(FL_F32, 2, s);
  ir_graph *g = ir_new();
  fl_err e;
  int x = ir_add_input(g, &m, "x", &e), y = ir_add_input(g, &m, "y", &e);
  int z = op2(g, OP_ADD, x, y);
  char *l;
  ir_add_output(g, z, &e);
  l = ir_listing(g);
  ok(l && strstr(l, "%2 = add(%0, %1) : float32[8,128]"), "listing shows %%2 = add(%%0, %%1) : float32[8,128]");
  ok(l && strstr(l, "graph(%0: float32[8,128] x, %1: float32[8,128] y)"), "listing names inputs");
  free(l);
  is_int(ir_op_count(g), 1, "one op");
  ir_free(g);
}

static void test_decompose(void) {
  int64_t s[2] = {5, 7}, ws[1] = {7}, lw[2] = {3, 7};
  fl_meta m = mk(FL_F32, 2, s);
  fl_tensor in[4] = {randt(2, s)}, w = randt(1, ws), b = randt(1, ws), lin = randt(2, lw);
  fl_err e;
  const fl_op composites[] = {OP_SOFTMAX, OP_LOG_SOFTMAX, OP_LAYER_NORM, OP_RMS_NORM,
                              OP_GELU, OP_GELU_TANH, OP_SILU, OP_LINEAR};
  size_t c;
  for (c = 0; c < sizeof composites / sizeof composites[0]; c++) {
    fl_op op = composites[c];
    ir_graph *g = ir_new(), *h;
    op_attrs a;
    int x = ir_add_input(g, &m, "x", &e), y, ins[3];
    char *log = NULL;
    op_attrs_init(op, &a);
    a.i[0] = (op == OP_SOFTMAX || op == OP_LOG_SOFTMAX) ? 1 : 1;
    ins[0] = x;
    if (op == OP_LAYER_NORM) { ins[1] = ir_add_param(g, &w, "w", &e); ins[2] = ir_add_param(g, &b, "b", &e); }
    if (op == OP_RMS_NORM) ins[1] = ir_add_param(g, &w, "w", &e);
    if (op == OP_LINEAR) { ins[1] = ir_add_param(g, &lin, "fc.weight", &e); ins[2] = -1; }
    y = ir_add_op(g, op, ins, op == OP_LAYER_NORM ? 3 : op == OP_RMS_NORM ? 2 : op == OP_LINEAR ? 3 : 1,
                  &a, NULL, NULL, &e);
    if (y < 0) printf("# %s\n", e.msg);
    ir_add_output(g, y, &e);
    h = pass_decompose(g, &log, &e);
    ok(h != NULL, "decompose %s", op_name(op));
    if (!h) { printf("# %s\n", e.msg); ir_free(g); continue; }
    is_int(count_op(h, op), 0, "%s gone after decompose", op_name(op));
    ok(log && strstr(log, op_name(op)), "decompose log names %s", op_name(op));
    /* float32 formulas rearranged: agree with the fused reference to 1e-5 */
    ok(compare(g, h, in, 1) <= 1e-5, "decomposed %s equals the reference (1e-5)", op_name(op));
    free(log);
    ir_free(h);
    ir_free(g);
  }
  ten_release(&in[0]); ten_release(&w); ten_release(&b); ten_release(&lin);
}

static void test_optimize(void) {
  int64_t s[2] = {4, 6};
  fl_meta m = mk(FL_F32, 2, s);
  fl_tensor in[4] = {randt(2, s)}, one = {0}, zero = {0}, two = {0};
  fl_meta sm;
  fl_err e;
  ir_graph *g = ir_new(), *h;
  int x, c1, c0, c2, c3, a, t1, t2, p, q, dead, out;
  char *log = NULL;
  memset(&sm, 0, sizeof sm);
  sm.dtype = FL_F32;
  sm.wrapped = 1;
  ten_empty(&one, &sm, &e); ten_set(&one, 0, 1.0);
  ten_empty(&zero, &sm, &e);
  ten_empty(&two, &sm, &e); ten_set(&two, 0, 2.0);
  x = ir_add_input(g, &m, "x", &e);
  c1 = ir_add_const(g, &one, &e);
  c0 = ir_add_const(g, &zero, &e);
  c2 = ir_add_const(g, &two, &e);
  c3 = op2(g, OP_MUL, c2, c2);                 /* folds to 4 */
  a = op2(g, OP_ADD, op2(g, OP_MUL, x, c1), c0); /* x*1+0 = x */
  t1 = op1(g, OP_EXP, a, NULL);
  t2 = op1(g, OP_EXP, a, NULL);                /* cse with t1 */
  {
    op_attrs ta;
    op_attrs_init(OP_TRANSPOSE, &ta);
    ta.i[0] = 0; ta.i[1] = 1;
    p = op1(g, OP_TRANSPOSE, op1(g, OP_TRANSPOSE, t2, &ta), &ta); /* = t2 */
  }
  q = op2(g, OP_ADD, op2(g, OP_MUL, t1, p), c3);
  dead = op1(g, OP_SIN, x, NULL);
  (void)dead;
  out = q;
  ir_add_output(g, out, &e);
  h = pass_optimize(g, &log, &e);
  ok(h != NULL, "optimize runs");
  if (h) {
    printf("# %s", log);
    ok(strstr(log, "x * 1 = x") != NULL, "log: x * 1");
    ok(strstr(log, "x + 0 = x") != NULL, "log: x + 0");
    ok(strstr(log, "cse") != NULL, "log: cse");
    ok(strstr(log, "transpose(transpose(x)) = x") != NULL, "log: double transpose");
    ok(strstr(log, "folded") != NULL, "log: constant folding");
    ok(strstr(log, "dce") != NULL, "log: dead code");
    is_int(count_op(h, OP_EXP), 1, "one exp left");
    is_int(count_op(h, OP_TRANSPOSE), 0, "no transpose left");
    is_int(count_op(h, OP_SIN), 0, "dead sin removed");
    ok(compare(g, h, in, 1) <= 1e-6, "optimized graph equals the original (1e-6)");
    ir_free(h);
  } else printf("# %s\n", e.msg);
  free(log);
  ir_free(g);
  ten_release(&in[0]); ten_release(&one); ten_release(&zero); ten_release(&two);
}

/* conv2d (+ bias) -> batch_norm -> relu over x [xs], weights [ws]: the
** batch norm must leave the graph, folded into the weights, or (small) into
** a per-channel scale of the conv's result where that has fewer elements
** than the weights (there it takes 128 values against 4608 weights). */
static void test_conv_bn(const int64_t *xs, const int64_t *ws, int bias, int small) {
  int64_t cs[1] = {ws[0]};
  fl_meta m = mk(FL_F32, 4, xs);
  fl_tensor in[1] = {randt(4, xs)}, w = randt(4, ws), b = randt(1, cs), mean = randt(1, cs),
            var = randt(1, cs), gam = randt(1, cs), bet = randt(1, cs);
  ir_graph *g = ir_new(), *h;
  fl_err e;
  op_attrs ca, ba;
  int64_t i;
  int x, cv, bn, ins[5];
  char *log = NULL;
  const char *what = small ? "small result" : "conv+bn";
  for (i = 0; i < cs[0]; i++) ten_set(&var, i, fabs(ten_get(&var, i)) + 0.5);
  x = ir_add_input(g, &m, "x", &e);
  op_attrs_init(OP_CONV2D, &ca);
  ca.i[0] = ca.i[1] = 1; ca.i[2] = ca.i[3] = ca.i[4] = ca.i[5] = 1;
  ins[0] = x; ins[1] = ir_add_param(g, &w, "conv.weight", &e);
  if (bias) ins[2] = ir_add_param(g, &b, "conv.bias", &e);
  cv = ir_add_op(g, OP_CONV2D, ins, bias ? 3 : 2, &ca, NULL, NULL, &e);
  op_attrs_init(OP_BATCH_NORM, &ba);
  ins[0] = cv; ins[1] = ir_add_param(g, &mean, "bn.mean", &e); ins[2] = ir_add_param(g, &var, "bn.var", &e);
  ins[3] = ir_add_param(g, &gam, "bn.weight", &e); ins[4] = ir_add_param(g, &bet, "bn.bias", &e);
  bn = ir_add_op(g, OP_BATCH_NORM, ins, 5, &ba, NULL, NULL, &e);
  ok(cv >= 0 && bn >= 0, "%s graph built", what);
  ir_add_output(g, op1(g, OP_RELU, bn, NULL), &e);
  h = pass_optimize(g, &log, &e);
  ok(h && count_op(h, OP_BATCH_NORM) == 0 && count_op(h, OP_CONV2D) == 1 &&
     (!small || count_op(h, OP_MUL) >= 1), "%s: batch_norm folded into the conv's %s", what,
     small ? "result, per channel" : "weights");
  ok(h && strstr(log, "folded into conv2d") && strstr(log, small ? "'s result (per channel" : "'s weights"),
     "%s: the log says which", what);
  ok(h && compare(g, h, in, 1) <= 1e-5, "%s: folded equals conv+bn (1e-5)", what);
  free(log);
  ir_free(h);
  ir_free(g);
  ten_release(&in[0]); ten_release(&w); ten_release(&b); ten_release(&mean);
  ten_release(&var); ten_release(&gam); ten_release(&bet);
}

int main(void) {
  rng_seed(42);
  test_listing();
  test_decompose();
  test_optimize();
  {
    const int64_t xs[4] = {2, 3, 6, 5}, ws[4] = {4, 3, 3, 3};
    const int64_t xs2[4] = {1, 16, 2, 2}, ws2[4] = {32, 16, 3, 3};
    test_conv_bn(xs, ws, 1, 0);
    test_conv_bn(xs2, ws2, 0, 1);
  }
  return tap_done();
}
