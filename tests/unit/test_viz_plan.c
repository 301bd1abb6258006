/*
** test_viz_plan.c -- pictures and reports of real fusion plans: one
** cluster per planned kernel (p:stats().kernels), one dashed edge per read
** of an intermediate the plan does not store, the plan's own numbers on
** the compare titles and in the report.  Files land in tests/tmp/viz/.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <graphviz/cgraph.h>

#include "viz/plan.h"
#include "tap.h"

#define DIR "tests/tmp/viz"

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

static int op(ir_graph *g, fl_op o, int a, int b, const op_attrs *at0) {
  op_attrs at;
  int in[2];
  in[0] = a;
  in[1] = b;
  if (at0) at = *at0;
  else op_attrs_init(o, &at);
  return ir_add_op(g, o, in, b < 0 ? 1 : 2, &at, "net.lua:3", "net", &E);
}

/* x @ w + b, relu, transpose, a row sum, divide by it, exp, softmax. */
static ir_graph *net(void) {
  ir_graph *g = ir_new();
  fl_meta xm;
  op_attrs at;
  int x, h, t, s;
  memset(&xm, 0, sizeof xm);
  xm.dtype = FL_F32;
  xm.ndim = 2;
  xm.shape[0] = 8;
  xm.shape[1] = 128;
  x = ir_add_input(g, &xm, "x", &E);
  h = op(g, OP_MATMUL, x, param(g, 128, 256, "fc.weight"), NULL);
  h = op(g, OP_ADD, h, param(g, 256, 0, "fc.bias"), NULL);
  h = op(g, OP_RELU, h, -1, NULL);
  op_attrs_init(OP_TRANSPOSE, &at);
  at.i[0] = 0;
  at.i[1] = 1;
  t = op(g, OP_TRANSPOSE, h, -1, &at);
  op_attrs_init(OP_SUM, &at);
  at.ndims = 1;
  at.dims[0] = 1;
  at.keepdim = 1;
  s = op(g, OP_SUM, t, -1, &at);
  h = op(g, OP_DIV, t, s, NULL);
  h = op(g, OP_EXP, h, -1, NULL);
  op_attrs_init(OP_SOFTMAX, &at);
  at.i[0] = 1;
  h = op(g, OP_SOFTMAX, h, -1, &at);
  if (h < 0 || ir_add_output(g, h, &E)) {
    ir_free(g);
    return NULL;
  }
  return g;
}

typedef struct counts { int nodes, dashed, kclusters; } counts;

static void count_clusters(Agraph_t *g, counts *c) {
  Agraph_t *s;
  for (s = agfstsubg(g); s; s = agnxtsubg(s)) {
    if (strncmp(agnameof(s), "cluster_k", 9) == 0) c->kclusters++;
    count_clusters(s, c);
  }
}

static counts dot_counts(const viz_stage *st) {
  counts c = {-1, 0, 0};
  viz_scene sc;
  char *text = NULL;
  size_t len;
  Agraph_t *g;
  Agnode_t *n;
  Agedge_t *ed;
  memset(&sc, 0, sizeof sc);
  sc.stages = st;
  sc.nstages = 1;
  if (viz_render_mem(&sc, "dot", NULL, &text, &len, &E) != FL_OK) return c;
  g = agmemread(text);
  free(text);
  if (!g) return c;
  c.nodes = agnnodes(g);
  for (n = agfstnode(g); n; n = agnxtnode(g, n))
    for (ed = agfstout(g, n); ed; ed = agnxtout(g, ed)) {
      char *s = agget(ed, "style");
      if (s && strstr(s, "dashed")) c.dashed++;
    }
  count_clusters(g, &c);
  agclose(g);
  return c;
}

/* What a read really reads: through views no kernel computes, to the
** value they view. */
static int base_of(const fuse_plan *p, int j) {
  const ir_graph *g = p->g;
  while (j >= 0 && g->nodes[j].kind == IR_OP && p->kernel_of[j] < 0 &&
         (op_info_of(g->nodes[j].op)->flags & OPF_VIEW))
    j = g->nodes[j].in[0];
  return j;
}

/* Reads (edges) of values the plan computes in a kernel but does not
** store, directly or through a view. */
static int removed_reads(const fuse_plan *p) {
  const ir_graph *g = p->g;
  int i, k, n = 0;
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_OP) continue;
    for (k = 0; k < nd->nin; k++) {
      int j = base_of(p, nd->in[k]);
      if (j >= 0 && g->nodes[j].kind == IR_OP && p->kernel_of[j] >= 0 && !p->stored[j]) n++;
    }
  }
  return n;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long n;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
  if (buf) buf[n] = '\0';
  fclose(f);
  return buf;
}

int main(void) {
  ir_graph *g = net();
  fuse_plan *p, *u;
  fuse_opts fo;
  viz_plan_stage ps;
  viz_plan_report pr;
  viz_report r;
  counts c;
  char *html;
  int kernels, buffers;
  int64_t bytes;
  mkdir("tests", 0777);
  mkdir("tests/tmp", 0777);
  mkdir(DIR, 0777);
  if (!ok(g != NULL, "graph built (%s)", E.msg)) return tap_done();
  p = fuse_plan_build(g, NULL, &E);
  if (!ok(p != NULL, "planned (%s)", E.msg)) return tap_done();
  printf("# %d kernels, %d removed reads\n", p->stats.kernels, removed_reads(p));

  ok(viz_plan_stage_init(&ps, p, NULL, &E) == FL_OK, "plan as a stage");
  c = dot_counts(&ps.st);
  is_int(c.kclusters, p->stats.kernels, "kernel clusters = p:stats().kernels");
  is_int(c.dashed, removed_reads(p), "dashed edges = reads of removed intermediates");
  ok(removed_reads(p) > 0, "the plan removed intermediates");
  viz_stage_numbers(&ps.st, &kernels, &buffers, &bytes);
  ok(kernels == p->stats.kernels && buffers == p->stats.buffers_after &&
     bytes == p->stats.bytes_after, "title numbers are the plan's stats");
  viz_plan_stage_free(&ps);

  ok(viz_draw_plan(p, DIR "/net-plan.png", NULL, &E) == FL_OK, "plan: png (%s)", E.msg);
  ok(viz_draw_plan(p, DIR "/net-plan.svg", NULL, &E) == FL_OK, "plan: svg");
  ok(viz_draw_plan(p, DIR "/net-plan.pdf", NULL, &E) == FL_OK, "plan: pdf");
  ok(viz_draw_plan_compare(p, DIR "/net-compare.png", NULL, &E) == FL_OK, "plan: compare png");
  ok(viz_draw_plan(p, DIR "/net.gif", NULL, &E) == FL_EINVAL, "plan: unknown extension refused");

  /* the unfused baseline: a cluster per kernel, nothing dashed */
  fuse_opts_default(&fo);
  fo.fuse = 0;
  u = fuse_plan_build(g, &fo, &E);
  ok(u != NULL, "unfused plan");
  if (u) {
    ok(viz_plan_stage_init(&ps, u, NULL, &E) == FL_OK, "unfused plan as a stage");
    c = dot_counts(&ps.st);
    is_int(c.kclusters, u->stats.kernels, "unfused: kernel clusters = kernels");
    is_int(c.dashed, 0, "unfused: nothing dashed");
    viz_plan_stage_free(&ps);
    ok(viz_draw_plan(u, DIR "/net-unfused.png", NULL, &E) == FL_OK, "unfused plan: png");
    fuse_plan_free(u);
  }

  viz_report_init(&r);
  r.title = "net: fusion review";
  ok(viz_plan_report_fill(&r, &pr, p, NULL, NULL, NULL, &E) == FL_OK, "report filled from the plan");
  is_int(r.nkernels, p->nkernels, "report: one row per kernel");
  is_int(r.ndecisions, p->ndec, "report: one row per decision");
  ok(viz_report_write(&r, DIR "/net-review.html", &E) == FL_OK, "report written");
  html = slurp(DIR "/net-review.html");
  ok(html && p->nkernels > 0 && strstr(html, p->kernels[0].name), "report names the kernels");
  ok(html && strstr(html, "id=\"graph-after\"") && strstr(html, "cluster_k0"),
     "report holds the fused graph");
  free(html);
  ok(viz_report_write(&r, "/nonexistent-dir/r.html", &E) == FL_EIO &&
     strstr(E.msg, "/nonexistent-dir/r.html"), "report: unwritable path named: %s", E.msg);
  viz_plan_report_free(&pr);  /* r points into pr: last use above */

  fuse_plan_free(p);
  ir_free(g);
  return tap_done();
}
