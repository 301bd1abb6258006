/*
** test_viz.c -- pictures: every format is a valid file, the DOT text
** re-reads with cgraph and says what the stage holds (kernel clusters,
** dashed removed intermediates, shapes on labels), bad requests fail with
** useful messages, and big graphs collapse within max_nodes in time.
** Pictures are kept in tests/tmp/viz/ for a person to look at.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <graphviz/cgraph.h>

#include "graph/ir.h"
#include "viz/draw.h"
#include "viz/style.h"
#include "tap.h"

#define DIR "tests/tmp/viz"

static fl_err E;

static fl_meta meta(fl_dtype t, int nd, const int64_t *shape) {
  fl_meta m;
  memset(&m, 0, sizeof m);
  m.dtype = t;
  m.ndim = nd;
  memcpy(m.shape, shape, (size_t)nd * sizeof *shape);
  return m;
}

static int param(ir_graph *g, int nd, const int64_t *shape, const char *name) {
  fl_tensor t;
  fl_meta m = meta(FL_F32, nd, shape);
  int id;
  memset(&t, 0, sizeof t);
  if (ten_empty(&t, &m, &E)) return -1;
  id = ir_add_param(g, &t, name, &E);
  ten_release(&t);
  return id;
}

static int op(ir_graph *g, fl_op o, int a, int b, const char *scope) {
  op_attrs at;
  int in[2];
  in[0] = a;
  in[1] = b;
  op_attrs_init(o, &at);
  if (o == OP_SUM) { at.ndims = 1; at.dims[0] = 1; at.keepdim = 1; }
  if (o == OP_SOFTMAX) at.i[0] = 1;
  return ir_add_op(g, o, in, b < 0 ? 1 : 2, &at, "model.lua:7", scope, &E);
}

/* A small MLP block: x[8,128] @ w1[128,256] + b1, relu, @ w2, softmax.
** Node ids: 0 x, 1 w1, 2 mm, 3 b1, 4 add, 5 relu, 6 w2, 7 mm2, 8 softmax. */
static ir_graph *mlp(void) {
  static const int64_t xs[] = {8, 128}, w1s[] = {128, 256}, b1s[] = {256},
                       w2s[] = {256, 64};
  ir_graph *g = ir_new();
  fl_meta xm = meta(FL_F32, 2, xs);
  int x, w1, w2, b1, h;
  x = ir_add_input(g, &xm, "x", &E);
  w1 = param(g, 2, w1s, "fc1.weight");
  h = op(g, OP_MATMUL, x, w1, "fc1");
  b1 = param(g, 1, b1s, "fc1.bias");
  h = op(g, OP_ADD, h, b1, "fc1");
  h = op(g, OP_RELU, h, -1, "act");
  w2 = param(g, 2, w2s, "fc2.weight");
  h = op(g, OP_MATMUL, h, w2, "fc2");
  h = op(g, OP_SOFTMAX, h, -1, NULL);
  ir_add_output(g, h, &E);
  return g;
}

/* nblocks transformer-like blocks with scopes blocks.<i>.attn/.mlp and the
** residual adds in blocks.<i> itself, as a module's forward captures them;
** each block is 14 ops and 3 params.  Returns the graph. */
static ir_graph *blocks(int nblocks, int with_scopes) {
  static const int64_t xs[] = {4, 64, 128}, ws[] = {128, 128}, vs[] = {128};
  ir_graph *g = ir_new();
  fl_meta xm = meta(FL_F32, 3, xs);
  char sc[64], sc2[64], sc0[64], name[64];
  int x, i;
  x = ir_add_input(g, &xm, "tokens", &E);
  for (i = 0; i < nblocks; i++) {
    int w, v, h, a, r;
    snprintf(sc, sizeof sc, "blocks.%d.attn", i);
    snprintf(sc2, sizeof sc2, "blocks.%d.mlp", i);
    snprintf(sc0, sizeof sc0, "blocks.%d", i);
    snprintf(name, sizeof name, "blocks.%d.attn.w", i);
    w = param(g, 2, ws, name);
    h = op(g, OP_MATMUL, x, w, with_scopes ? sc : NULL);
    a = op(g, OP_SOFTMAX, h, -1, with_scopes ? sc : NULL);
    a = op(g, OP_MUL, a, h, with_scopes ? sc : NULL);
    a = op(g, OP_ADD, a, x, with_scopes ? sc0 : NULL);
    snprintf(name, sizeof name, "blocks.%d.mlp.w", i);
    w = param(g, 2, ws, name);
    r = op(g, OP_MATMUL, a, w, with_scopes ? sc2 : NULL);
    snprintf(name, sizeof name, "blocks.%d.mlp.b", i);
    v = param(g, 1, vs, name);
    r = op(g, OP_ADD, r, v, with_scopes ? sc2 : NULL);
    r = op(g, OP_GELU, r, -1, with_scopes ? sc2 : NULL);
    r = op(g, OP_SIGMOID, r, -1, with_scopes ? sc2 : NULL);
    r = op(g, OP_MUL, r, r, with_scopes ? sc2 : NULL);
    r = op(g, OP_TANH, r, -1, with_scopes ? sc2 : NULL);
    r = op(g, OP_EXP, r, -1, with_scopes ? sc2 : NULL);
    r = op(g, OP_NEG, r, -1, with_scopes ? sc2 : NULL);
    r = op(g, OP_ABS, r, -1, with_scopes ? sc2 : NULL);
    x = op(g, OP_ADD, r, a, with_scopes ? sc0 : NULL);
  }
  x = op(g, OP_SUM, x, -1, "head");
  ir_add_output(g, x, &E);
  return g;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long n;
  *len = 0;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
  if (buf) { buf[n] = '\0'; *len = (size_t)n; }
  fclose(f);
  return buf;
}

/* Well-formed enough: every <tag> closed in order (no XML library here;
** the shell test runs xmllint when present). */
static int xml_balanced(const char *s) {
  const char *stack[256];
  size_t lens[256];
  int depth = 0, seen_svg = 0;
  while ((s = strchr(s, '<')) != NULL) {
    const char *end;
    if (strncmp(s, "<!--", 4) == 0) { s = strstr(s, "-->"); if (!s) return 0; continue; }
    end = strchr(s, '>');
    if (!end) return 0;
    if (s[1] == '?' || s[1] == '!') { s = end + 1; continue; }
    if (s[1] == '/') {
      size_t n = strcspn(s + 2, " >");
      if (depth == 0 || lens[depth - 1] != n || strncmp(stack[depth - 1], s + 2, n)) return 0;
      depth--;
    } else if (end[-1] != '/') {
      if (depth == 256) return 0;
      stack[depth] = s + 1;
      lens[depth] = strcspn(s + 1, " >/\n");
      if (strncmp(s + 1, "svg", 3) == 0) seen_svg = 1;
      depth++;
    }
    s = end + 1;
  }
  return depth == 0 && seen_svg;
}

typedef struct dotcount { int nodes, edges, dashed, kclusters, labels_with_shape; } dotcount;

static void count_clusters(Agraph_t *g, dotcount *c) {
  Agraph_t *s;
  for (s = agfstsubg(g); s; s = agnxtsubg(s)) {
    const char *name = agnameof(s);
    if (strncmp(name, "cluster_k", 9) == 0) c->kclusters++;
    count_clusters(s, c);
  }
}

/* Re-reads DOT text with cgraph; -1 nodes when it does not parse. */
static dotcount dot_count(const char *text, const char *shape) {
  dotcount c = {-1, 0, 0, 0, 0};
  Agraph_t *g = agmemread(text);
  Agnode_t *n;
  Agedge_t *ed;
  if (!g) return c;
  c.nodes = agnnodes(g);
  c.edges = agnedges(g);
  for (n = agfstnode(g); n; n = agnxtnode(g, n)) {
    char *lab = agget(n, "label");
    if (lab && strstr(lab, shape)) c.labels_with_shape++;
    for (ed = agfstout(g, n); ed; ed = agnxtout(g, ed)) {
      char *st = agget(ed, "style");
      if (st && strstr(st, "dashed")) c.dashed++;
    }
  }
  count_clusters(g, &c);
  agclose(g);
  return c;
}

static char *render_dot(const viz_scene *s, const viz_opts *o) {
  char *out = NULL;
  size_t len;
  if (viz_render_mem(s, "dot", o, &out, &len, &E) != FL_OK) {
    printf("# %s\n", E.msg);
    return NULL;
  }
  return out;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_formatters(void) {
  char b[64];
  static const int64_t s6[] = {2, 3, 4, 5, 6, 7};
  ir_graph *g = ir_new();
  fl_meta m = meta(FL_F16, 6, s6);
  is_str(viz_bytes_str(512, b, sizeof b), "512 B", "bytes: 512 B");
  is_str(viz_bytes_str(4096, b, sizeof b), "4 KiB", "bytes: 4 KiB");
  is_str(viz_bytes_str(3 << 19, b, sizeof b), "1.5 MiB", "bytes: 1.5 MiB");
  ir_add_input(g, &m, "x", &E);
  is_str(viz_shape_str(g, 0, b, sizeof b), "[2,3,\xe2\x80\xa6,7]", "six dims shortened");
  is_str(viz_type_str(g, 0, b, sizeof b), "float16[2,3,\xe2\x80\xa6,7]", "type string");
  g->nodes[0].sym[0] = 1;
  is_str(viz_shape_str(g, 0, b, sizeof b), "[s0,3,\xe2\x80\xa6,7]", "symbolic dim");
  is_int(viz_node_bytes(g, 0), 2 * 5040, "bytes of a float16 value");
  ir_free(g);
}

static void test_formats(const ir_graph *g) {
  static const char *ext[] = {"dot", "svg", "png", "pdf"};
  char path[128], *data;
  size_t len;
  int i, rc;
  viz_opts o;
  viz_opts_init(&o);
  o.title = "mlp: captured";
  for (i = 0; i < 4; i++) {
    snprintf(path, sizeof path, DIR "/mlp.%s", ext[i]);
    rc = viz_draw_graph(g, path, &o, &E);
    if (!ok(rc == FL_OK, "draw %s", path)) printf("# %s\n", E.msg);
    data = slurp(path, &len);
    if (i == 0) {
      dotcount c = data ? dot_count(data, "[8,") : (dotcount){-1, 0, 0, 0, 0};
      /* 9 graph nodes + 1 output + legend */
      is_int(c.nodes, 11, "DOT re-reads with cgraph: every node drawn");
      ok(c.labels_with_shape >= 6, "labels carry shapes (%d with [8,...])", c.labels_with_shape);
      ok(data && strstr(data, "[8,256] 8 KiB"), "edge labelled with shape and bytes");
      ok(data && strstr(data, "fc1.weight"), "parameters carry their names");
      ok(data && strstr(data, "invhouse") && strstr(data, "cylinder") && strstr(data, "house"),
         "inputs, params and outputs have their own shapes");
    } else if (i == 1) {
      ok(data && xml_balanced(data), "SVG is balanced XML with an <svg> root");
      ok(data && strstr(data, "mlp: captured"), "SVG carries the title");
    } else if (i == 2) {
      ok(data && len > 2000 && memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0,
         "PNG signature, %zu bytes", len);
    } else {
      ok(data && len > 1000 && memcmp(data, "%PDF-", 5) == 0, "PDF header, %zu bytes", len);
    }
    free(data);
  }
  snprintf(path, sizeof path, DIR "/mlp-lr.PNG");
  o.rankdir = "LR";
  o.legend = 0;
  ok(viz_draw_graph(g, path, &o, &E) == FL_OK, "upper-case extension, LR layout");
  o.rankdir = "BT";
  rc = viz_draw_graph(g, DIR "/x.svg", &o, &E);
  ok(rc == FL_EINVAL && strstr(E.msg, "rankdir"), "bad rankdir refused");
}

static void test_errors(const ir_graph *g) {
  int rc;
  viz_stage st;
  viz_scene s;
  char *out;
  size_t len;
  rc = viz_draw_graph(g, DIR "/mlp.jpg", NULL, &E);
  ok(rc == FL_EINVAL && strstr(E.msg, ".dot .svg .png .pdf") && strstr(E.msg, ".jpg"),
     "unknown extension lists the formats: %s", E.msg);
  rc = viz_draw_graph(g, DIR "/noext", NULL, &E);
  ok(rc == FL_EINVAL && strstr(E.msg, "no extension"), "no extension: %s", E.msg);
  rc = viz_draw_graph(g, "/nonexistent-dir/g.svg", NULL, &E);
  ok(rc == FL_EIO && strstr(E.msg, "/nonexistent-dir/g.svg") && strstr(E.msg, "No such file"),
     "unwritable path names path and reason: %s", E.msg);
  memset(&st, 0, sizeof st);
  memset(&s, 0, sizeof s);
  s.stages = &st;
  s.nstages = 1;
  rc = viz_render_mem(&s, "svg", NULL, &out, &len, &E);
  ok(rc == FL_EINVAL, "a stage without a graph is refused: %s", E.msg);
  st.g = g;
  rc = viz_render_mem(&s, "gif", NULL, &out, &len, &E);
  ok(rc == FL_EINVAL && strstr(E.msg, ".pdf"), "unknown format to memory refused");
}

static void test_empty(void) {
  ir_graph *g = ir_new();
  char *data;
  size_t len;
  ok(viz_draw_graph(g, DIR "/empty.svg", NULL, &E) == FL_OK, "empty graph: svg");
  data = slurp(DIR "/empty.svg", &len);
  ok(data && xml_balanced(data) && strstr(data, "empty graph"), "empty graph: valid, says so");
  free(data);
  ok(viz_draw_graph(g, DIR "/empty.png", NULL, &E) == FL_OK, "empty graph: png");
  data = slurp(DIR "/empty.png", &len);
  ok(data && memcmp(data, "\x89PNG", 4) == 0, "empty graph: png signature");
  free(data);
  ir_free(g);
}

/* The MLP fused into 2 kernels: {mm, add, relu} and {mm2, softmax}.  The
** mm and add results never leave kernel 0, nor mm2's kernel 1: 3 removed
** intermediates, read by one edge each; relu's result goes to kernel 1 and
** stays in memory. */
static void test_plan(const ir_graph *g) {
  static const int k0[] = {2, 4, 5}, k1[] = {7, 8};
  viz_kernel ks[2] = {
    {.name = "k0_matmul_add_relu", .nodes = k0, .nnodes = 3,
     .bytes_read = 8 * 128 * 4 + 128 * 256 * 4 + 256 * 4, .bytes_written = 8 * 256 * 4,
     .time_ms = 0.042},
    {.name = "k1_matmul_softmax", .nodes = k1, .nnodes = 2,
     .bytes_read = 8 * 256 * 4 + 256 * 64 * 4, .bytes_written = 8 * 64 * 4, .time_ms = -1},
  };
  viz_stage st, before;
  viz_scene s;
  viz_break br = {"x:item() needs a concrete value", "model.lua:12"};
  viz_stage pieces[2];
  int kernels, buffers;
  int64_t bytes;
  char *dot;
  dotcount c;
  memset(&st, 0, sizeof st);
  st.g = g;
  st.kernels = ks;
  st.nkernels = 2;
  st.label = "fused";
  memset(&s, 0, sizeof s);
  s.stages = &st;
  s.nstages = 1;
  dot = render_dot(&s, NULL);
  c = dot ? dot_count(dot, "[") : (dotcount){-1, 0, 0, 0, 0};
  is_int(c.kclusters, 2, "one cluster_k* per kernel");
  /* mm2 -> softmax also stays inside kernel 1 */
  is_int(c.dashed, 3, "dashed edges = edges of removed intermediates");
  ok(dot && strstr(dot, "k0_matmul_add_relu") && strstr(dot, "0.042 ms"),
     "kernel label: name and measured time");
  ok(dot && strstr(dot, "3 nodes") && strstr(dot, "wrote 8 KiB"), "kernel label: nodes and bytes");
  free(dot);
  ok(viz_draw_stage(&st, DIR "/plan.png", NULL, &E) == FL_OK, "plan: png");
  ok(viz_draw_stage(&st, DIR "/plan.svg", NULL, &E) == FL_OK, "plan: svg");

  viz_stage_numbers(&st, &kernels, &buffers, &bytes);
  is_int(kernels, 2, "plan numbers: kernels");
  /* relu and softmax */
  is_int(buffers, 2, "plan numbers: buffers (results that leave their kernel)");
  memset(&before, 0, sizeof before);
  before.g = g;
  before.label = "captured";
  viz_stage_numbers(&before, &kernels, &buffers, &bytes);
  is_int(kernels, 5, "graph numbers: one kernel per op");
  is_int(buffers, 5, "graph numbers: one buffer per op");
  ok(viz_draw_compare(&before, &st, DIR "/compare.png", NULL, &E) == FL_OK, "compare: png");
  ok(viz_draw_compare(&before, &st, DIR "/compare.dot", NULL, &E) == FL_OK, "compare: dot");
  {
    size_t len;
    char *d = slurp(DIR "/compare.dot", &len);
    ok(d && strstr(d, "cluster_s0") && strstr(d, "cluster_s1") && strstr(d, "5 kernels") &&
       strstr(d, "2 kernels"), "compare: two titled sides with kernel counts");
    c = d ? dot_count(d, "[") : (dotcount){-1, 0, 0, 0, 0};
    /* 10 per stage, a legend, a header per kernel */
    is_int(c.nodes, 2 * 10 + 1 + 2, "compare: both stages drawn");
    free(d);
  }

  pieces[0] = before;
  pieces[1] = st;
  ok(viz_draw_pieces(pieces, 2, &br, DIR "/break.png", NULL, &E) == FL_OK, "graph break: png");
  memset(&s, 0, sizeof s);
  s.stages = pieces;
  s.nstages = 2;
  s.breaks = &br;
  dot = render_dot(&s, NULL);
  ok(dot && strstr(dot, "graph break") && strstr(dot, "item() needs a concrete value") &&
     strstr(dot, "model.lua:12"), "graph break marker: reason and file:line");
  ok(dot && strstr(dot, "graph 1 of 2") && strstr(dot, "graph 2 of 2"), "pieces framed");
  free(dot);

  /* a kernel naming a node the graph lacks */
  {
    static const int bad[] = {99};
    viz_kernel kb = {.name = "k_bad", .nodes = bad, .nnodes = 1, .time_ms = -1};
    st.kernels = &kb;
    st.nkernels = 1;
    ok(viz_draw_stage(&st, DIR "/bad.svg", NULL, &E) == FL_EINVAL && strstr(E.msg, "99"),
       "kernel with an unknown node refused: %s", E.msg);
  }
}

static void test_escape(void) {
  static const int64_t s[] = {4};
  ir_graph *g = ir_new();
  char *dot;
  viz_stage st;
  viz_scene sc;
  viz_opts o;
  int p = param(g, 1, s, "<w&b>\"");
  ir_add_output(g, op(g, OP_RELU, p, -1, NULL), &E);
  memset(&st, 0, sizeof st);
  st.g = g;
  memset(&sc, 0, sizeof sc);
  sc.stages = &st;
  sc.nstages = 1;
  viz_opts_init(&o);
  o.title = "a < b & c";
  dot = render_dot(&sc, &o);
  ok(dot && strstr(dot, "&lt;w&amp;b&gt;&quot;") && strstr(dot, "a &lt; b &amp; c"),
     "user strings are escaped in HTML labels");
  free(dot);
  ok(viz_draw_stage(&st, DIR "/escape.svg", &o, &E) == FL_OK, "escaped names render");
  ir_free(g);
}

static void test_large(void) {
  ir_graph *g = blocks(12, 1), *h;
  viz_opts o;
  viz_stage st;
  viz_scene sc;
  char *dot, *svg;
  size_t len;
  dotcount c;
  double t0, dt;
  viz_opts_init(&o);
  o.title = "12 blocks";
  memset(&st, 0, sizeof st);
  st.g = g;
  memset(&sc, 0, sizeof sc);
  sc.stages = &st;
  sc.nstages = 1;
  o.max_nodes = 100;
  dot = render_dot(&sc, &o);
  ok(dot && strstr(dot, "blocks.1 \xe2\x80\xa6 blocks.11: 11 blocks repeating blocks.0"),
     "repeated blocks collapsed and named");
  c = dot ? dot_count(dot, "[") : (dotcount){-1, 0, 0, 0, 0};
  ok(c.nodes > 0 && c.nodes <= 100 + 1, "within max_nodes (%d nodes)", c.nodes);
  ok(dot && strstr(dot, "nodes collapsed"), "the picture says nodes were collapsed");
  free(dot);
  ok(viz_draw_stage(&st, DIR "/blocks.png", &o, &E) == FL_OK, "12 blocks collapsed: png");
  /* the large model in full (206 nodes, under the default max_nodes),
  ** nested module clusters, as a PNG: the slowest common request */
  o.max_nodes = 0;
  o.group_modules = 1;
  t0 = now();
  ok(viz_draw_stage(&st, DIR "/blocks-modules.png", &o, &E) == FL_OK, "12 blocks with modules: png");
  dt = now() - t0;
  /* how long it took is reported, not tested: a busy machine is slower */
  printf("# large model drawn in %.2f s\n", dt);
  o.max_nodes = -1;
  ir_free(g);
  g = blocks(2, 1);
  st.g = g;
  dot = render_dot(&sc, &o);
  ok(dot && strstr(dot, "cluster_m_blocks.1.attn") && strstr(dot, "cluster_m_blocks.0") &&
     !strstr(dot, "cluster_m_blocks\""), "group_modules: nested clusters per scope");
  free(dot);
  ok(viz_draw_stage(&st, DIR "/modules.png", &o, &E) == FL_OK, "group_modules: png");

  /* 5000 nodes without scopes: the middle collapses */
  h = blocks(300, 0);
  st.g = h;
  viz_opts_init(&o);
  ok(h->n > 5000, "a %d-node graph", h->n);
  t0 = now();
  svg = NULL;
  ok(viz_render_mem(&sc, "svg", &o, &svg, &len, &E) == FL_OK, "5000 nodes: svg");
  dt = now() - t0;
  printf("# 5000 nodes drawn in %.2f s\n", dt);
  ok(svg && xml_balanced(svg) && strstr(svg, "nodes collapsed"), "5000 nodes: valid, says collapsed");
  free(svg);
  dot = render_dot(&sc, &o);
  c = dot ? dot_count(dot, "[") : (dotcount){-1, 0, 0, 0, 0};
  ok(c.nodes > 0 && c.nodes <= VIZ_DEFAULT_MAX_NODES + 1, "5000 nodes: %d picture nodes", c.nodes);
  free(dot);
  ok(viz_draw_stage(&st, DIR "/big.png", &o, &E) == FL_OK, "5000 nodes: png");
  ir_free(g);
  ir_free(h);
}

int main(void) {
  ir_graph *g;
  mkdir("tests", 0777);
  mkdir("tests/tmp", 0777);
  mkdir(DIR, 0777);
  test_formatters();
  g = mlp();
  ok(g && g->n == 9, "test graph built (%s)", E.msg);
  if (g && g->n == 9) {
    test_formats(g);
    test_errors(g);
    test_plan(g);
  }
  test_empty();
  test_escape();
  test_large();
  ir_free(g);
  return tap_done();
}
