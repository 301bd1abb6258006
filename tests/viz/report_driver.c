/*
** report_driver.c -- writes a review report with every section filled
** (a small MLP before and after fusion, hostile strings included) so that
** report.sh can open it in a real browser.  Usage: report_driver OUT.html
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/ir.h"
#include "viz/draw.h"
#include "viz/report.h"

static fl_err E;

static int param(ir_graph *g, int64_t r, int64_t c, const char *name) {
  fl_tensor t;
  fl_meta m;
  int id;
  memset(&m, 0, sizeof m);
  memset(&t, 0, sizeof t);
  m.dtype = FL_F32;
  m.ndim = c ? 2 : 1;
  m.shape[0] = r;
  m.shape[1] = c;
  if (ten_empty(&t, &m, &E)) return -1;
  id = ir_add_param(g, &t, name, &E);
  ten_release(&t);
  return id;
}

static int op(ir_graph *g, fl_op o, int a, int b) {
  op_attrs at;
  int in[2];
  in[0] = a;
  in[1] = b;
  op_attrs_init(o, &at);
  if (o == OP_SOFTMAX) at.i[0] = 1;
  return ir_add_op(g, o, in, b < 0 ? 1 : 2, &at, "mlp.lua:9", "mlp", &E);
}

int main(int argc, char **argv) {
  static const int k0[] = {2, 4, 5}, k1[] = {7, 8};
  viz_kernel ks[2] = {
    {.name = "fused_matmul_add_relu_8x256", .nodes = k0, .nnodes = 3,
     .bytes_read = 136192, .bytes_written = 8192, .time_ms = 0.041},
    {.name = "fused_matmul_softmax_8x64", .nodes = k1, .nnodes = 2,
     .bytes_read = 73728, .bytes_written = 2048, .time_ms = 0.017},
  };
  viz_kernel_row rows[2] = {
    {"fused_matmul_add_relu_8x256", "extern", 3, 136192, 8192, 0.041},
    {"fused_matmul_softmax_8x64", "extern", 2, 73728, 2048, 0.017},
  };
  viz_decision_row dec[3] = {
    {"matmul %2", "add %4", 1, "elementwise epilogue of a matmul", 16384},
    {"add %4", "relu %5", 1, "same shape, elementwise", 16384},
    {"relu %5", "matmul %7", 0, "a matmul's input must be in memory (<A & B>)", 0},
  };
  viz_kv sum[5] = {{"kernels", "5 \xe2\x86\x92 2"}, {"buffers", "5 \xe2\x86\x92 2"},
                   {"bytes moved", "251 KiB \xe2\x86\x92 215 KiB"}, {"graph breaks", "1"},
                   {"recompiles", "1"}};
  const char *guards[] = {"x.shape == [8,128]", "x.dtype == float32 && x.device == cpu"};
  const char *recomp[] = {"x.shape[1]: expected 128, got 256"};
  viz_break_row br[1] = {{"x:item() needs a concrete value", "keep it a tensor: use fl.where",
                          "mlp.lua:12"}};
  viz_check_row chk[3] = {{"operator coverage", "5/5", 1}, {"break-even", "3 calls", 0},
                          {"accuracy vs eager", "max abs err 2.4e-07", 1}};
  /* two steps of the pass stepper: a listing with a hostile name, then a
  ** pass that replaced its line 3 (removed, shown after line 2) and
  ** changed line 4 (was line 4) */
  static const char mark2[] = {0, 0, '+', '~', 0, 0};
  static const int gone2[] = {3, 2}, was2[] = {4, 4};
  viz_step steps[3] = {
    {.name = "capture", .summary = "capture: 2 ops",
     .listing = "graph(%0: float32[8,128] x) {\n  %1 = param </pre><script>alert(1)</script> : float32[]\n"
                "  %2 = mul(%0, %1) : float32[8,128]\n  %3 = relu(%2) : float32[8,128]\n  return %3\n}",
     .prev = -1, .added = -1, .removed = -1, .changed = -1},
    {.name = "optimize", .summary = "optimize: 2 nodes removed, 2 added (1 of them changed: the same "
                                    "op with new inputs); 2 \xe2\x86\x92 2 ops",
     .listing = "graph(%0: float32[8,128] x) {\n  %1 = param </pre><script>alert(1)</script> : float32[]\n"
                "  %2 = add(%0, %1) : float32[8,128]\n  %3 = relu(%2) : float32[8,128]\n  return %3\n}",
     .mark = mark2, .nmark = 6, .prev = 0, .gone = gone2, .ngone = 1, .was = was2, .nwas = 1,
     .added = 2, .removed = 2, .changed = 1},
    {.name = "code", .summary = "code: 7 lines of generated C", .ref = "code", .prev = -1,
     .added = -1, .removed = -1, .changed = -1},
  };
  viz_report r;
  viz_stage before, after;
  viz_opts o;
  ir_graph *g = ir_new();
  fl_meta xm;
  char *bsvg = NULL, *asvg = NULL;
  int x, h;
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: report_driver OUT.html [BEFORE.svg]\n");
    return 2;
  }
  memset(&xm, 0, sizeof xm);
  xm.dtype = FL_F32;
  xm.ndim = 2;
  xm.shape[0] = 8;
  xm.shape[1] = 128;
  x = ir_add_input(g, &xm, "x", &E);
  h = op(g, OP_MATMUL, x, param(g, 128, 256, "fc1.weight"));
  h = op(g, OP_ADD, h, param(g, 256, 0, "fc1.bias"));
  h = op(g, OP_RELU, h, -1);
  h = op(g, OP_MATMUL, h, param(g, 256, 64, "fc2.weight"));
  h = op(g, OP_SOFTMAX, h, -1);
  if (h < 0 || ir_add_output(g, h, &E)) {
    fprintf(stderr, "report_driver: %s\n", E.msg);
    return 1;
  }
  memset(&before, 0, sizeof before);
  before.g = g;
  after = before;
  after.kernels = ks;
  after.nkernels = 2;
  viz_opts_init(&o);
  if (viz_stage_svg(&before, &o, &bsvg, &E) || viz_stage_svg(&after, &o, &asvg, &E)) {
    fprintf(stderr, "report_driver: %s\n", E.msg);
    return 1;
  }
  viz_report_init(&r);
  r.title = "Review: mlp <fc1 & fc2>";
  r.subtitle = "fl.compile(mlp, {backend=\"cpu\"}) \xc2\xb7 input x float32[8,128]";
  r.summary = sum;
  r.nsummary = 5;
  r.before_svg = bsvg;
  r.before_label = "captured: 5 kernels \xc2\xb7 5 buffers \xc2\xb7 251 KiB moved";
  r.after_svg = asvg;
  r.after_label = "fused: 2 kernels \xc2\xb7 2 buffers \xc2\xb7 215 KiB moved";
  r.kernels = rows;
  r.nkernels = 2;
  r.decisions = dec;
  r.ndecisions = 3;
  r.code = "/* fused_matmul_add_relu_8x256: nodes %2 %4 %5 */\n"
           "void k0(const float *restrict x, float *restrict out, long n) {\n"
           "  for (long i = 0; i < n; i++) {\n"
           "    float v = x[i] < 0.0f ? 0.0f : x[i];  /* </code></pre><script>alert(1)</script> */\n"
           "    out[i] = v;\n"
           "  }\n"
           "}\n";
  r.code_lang = "C";
  r.guards = guards;
  r.nguards = 2;
  r.recompiles = recomp;
  r.nrecompiles = 1;
  r.breaks = br;
  r.nbreaks = 1;
  r.cold_ms = 182.5;
  r.warm_ms = 0.31;
  r.steady_ms = 0.058;
  r.eager_ms = 0.21;
  r.checklist = chk;
  r.nchecklist = 3;
  r.recommendation = "stable shapes and a 3.6x steady-state speedup: compile";
  r.steps = steps;
  r.nsteps = 3;
  if (viz_report_write(&r, argv[1], &E)) {
    fprintf(stderr, "report_driver: %s\n", E.msg);
    return 1;
  }
  if (argc == 3) {
    FILE *f = fopen(argv[2], "wb");
    if (!f || fputs(bsvg, f) < 0 || fclose(f) != 0) {
      fprintf(stderr, "report_driver: cannot write %s\n", argv[2]);
      return 1;
    }
  }
  free(bsvg);
  free(asvg);
  ir_free(g);
  return 0;
}
