/*
** test_diff.c -- differential testing: random graphs, compiled fused and
** unfused, against the reference interpreter.
**
** The generator builds random DAGs over the ops the code generator lowers
** (elementwise, broadcasting, comparisons, where, reductions with random
** dims and keepdim, softmax/log_softmax/layer_norm/rms_norm, views:
** transpose, permute, unsqueeze, expand, narrow, reshape; casts) plus
** matmul as an extern step, on random shapes with broadcasting, size-1 and
** odd sizes (7, 33, 1023), in float32 with some int64, bool, float16 and
** bfloat16 values.  Graph i uses seed FUSELAB_DIFF_SEED + i, so any graph
** can be rebuilt alone.
**
** Compiling each graph with cc would take ~0.3 s apiece on this machine;
** instead BATCH graphs (fused and unfused programs both) are generated
** with distinct symbol prefixes and compiled as translation units of
** BATCH/2 graphs each, one shared object per unit (cpu_compile_batch), the
** two halves by two compiler runs side by side (two cores).  Kernels whose
** code is identical across graphs are compiled once (aliases).
**
** Tolerances against the double-precision oracle: float32 |got - want| <=
** 2e-3 (1 + |want|); float16 1e-2, bfloat16 3e-2 relative; int64 and bool
** exact; NaN matches NaN.
**
** Environment: FUSELAB_DIFF_GRAPHS (default 2000), FUSELAB_DIFF_SEED
** (default 1), FUSELAB_DIFF_SECONDS (time bound, default 1200).  A long run:
**   FUSELAB_DIFF_GRAPHS=100000 FUSELAB_DIFF_SECONDS=100000 tests/unit/test_diff
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#include "tap.h"
#include "fuse_graphs.h"
#include "fuse/plan.h"
#include "cpu/program.h"
#include "graph/ref.h"

#define BATCH 100
#define MAXN 64

static uint64_t rs;
static unsigned rnd(unsigned n) {
  rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
  return n ? (unsigned)(rs % n) : 0;
}

static int64_t pick_dim(void) {
  static const int64_t dims[] = {1, 1, 2, 3, 4, 5, 7, 8, 16, 33};
  return dims[rnd(sizeof dims / sizeof dims[0])];
}

static fl_meta rand_meta(void) {
  fl_meta m;
  int d;
  memset(&m, 0, sizeof m);
  m.dtype = FL_F32;
  m.ndim = 1 + (int)rnd(3);
  if (rnd(12) == 0) { m.ndim = 1; m.shape[0] = 1023; return m; }
  if (rnd(16) == 0) { m.ndim = 2; m.shape[0] = 3; m.shape[1] = 1023; return m; }
  for (d = 0; d < m.ndim; d++) m.shape[d] = pick_dim();
  return m;
}

typedef struct gen { ir_graph *g; int n; } gen;

static int new_input(ir_graph *g, fl_meta m) {
  fl_err e;
  return ir_add_input(g, &m, NULL, &e);
}

/* a shape that broadcasts against m: some dims 1, maybe fewer dims */
static fl_meta bcast_of(const fl_meta *m) {
  fl_meta r = *m;
  int d, drop = m->ndim > 1 && rnd(3) == 0 ? 1 : 0;
  r.ndim = m->ndim - drop;
  for (d = 0; d < r.ndim; d++) {
    r.shape[d] = m->shape[d + drop];
    if (rnd(3) == 0) r.shape[d] = 1;
  }
  return r;
}

static int any_node(ir_graph *g) {
  return (int)rnd((unsigned)g->n);
}

static int try_op(ir_graph *g, fl_op op, const int *in, int nin, const op_attrs *a) {
  fl_err e;
  int id = ir_add_op(g, op, in, nin, a, NULL, NULL, &e);
  if (id >= 0 && meta_numel(&g->nodes[id].meta) > 20000) return -1;  /* keep the oracle fast */
  return id;
}

static int is_float(ir_graph *g, int id) { return dtype_is_float(g->nodes[id].meta.dtype); }

static int add_random_op(ir_graph *g) {
  static const fl_op un[] = {OP_ABS, OP_NEG, OP_EXP, OP_LOG, OP_SQRT, OP_RSQRT, OP_SIN, OP_COS,
                             OP_TANH, OP_SIGMOID, OP_RELU, OP_GELU, OP_GELU_TANH, OP_SILU, OP_ERF, OP_CLAMP};
  static const fl_op bin[] = {OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAXIMUM, OP_MINIMUM, OP_POW,
                              OP_ADD, OP_MUL, OP_SUB};
  static const fl_op cmp[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
  static const fl_op red[] = {OP_SUM, OP_MEAN, OP_AMAX, OP_AMIN, OP_VAR, OP_SUM};
  op_attrs a;
  int x = any_node(g), in[3], k = (int)rnd(100);
  const fl_meta *m = &g->nodes[x].meta;
  if (k < 22) {
    fl_op op = un[rnd(sizeof un / sizeof un[0])];
    op_attrs_init(op, &a);
    if (op == OP_CLAMP) { a.f[0] = -0.5; a.f[1] = rnd(2) ? 0.75 : INFINITY; }
    return try_op(g, op, &x, 1, &a);
  }
  if (k < 50) {
    fl_op op = k < 44 ? bin[rnd(sizeof bin / sizeof bin[0])] : cmp[rnd(sizeof cmp / sizeof cmp[0])];
    int y, c = (int)rnd(4);
    if (c == 0) y = fg_scalar(g, (double)(int)rnd(5) - 1.5);
    else if (c == 1) {
      int t, tries;
      for (y = -1, tries = 0; tries < 8 && y < 0; tries++) {
        t = any_node(g);
        if (meta_same_shape(&g->nodes[t].meta, m)) y = t;
      }
      if (y < 0) y = new_input(g, bcast_of(m));
    } else {
      fl_meta bm = bcast_of(m);
      if (rnd(6) == 0 && is_float(g, x)) bm.dtype = FL_I64;
      y = new_input(g, bm);
    }
    if (op == OP_POW && !is_float(g, x)) op = OP_MUL;
    in[0] = rnd(2) ? x : y;
    in[1] = in[0] == x ? y : x;
    /* pow's exponent fresh from [-2, 2]: a computed exponent of 1e10 makes
    ** the sign of the result hang on its last bit (exp's 1-ulp freedom) */
    if (op == OP_POW) {
      in[0] = x;
      in[1] = c == 0 ? y : new_input(g, bcast_of(m));
    }
    op_attrs_init(op, &a);
    return try_op(g, op, in, 2, &a);
  }
  if (k < 56) {
    int c = -1, i;
    for (i = g->n - 1; i >= 0; i--)
      if (g->nodes[i].meta.dtype == FL_BOOL && rnd(2)) { c = i; break; }
    if (c < 0) {
      int y = new_input(g, bcast_of(m));
      in[0] = x; in[1] = y;
      op_attrs_init(OP_GT, &a);
      if ((c = try_op(g, OP_GT, in, 2, &a)) < 0) return -1;
    }
    in[0] = c; in[1] = x; in[2] = rnd(2) ? fg_scalar(g, 0.25) : new_input(g, bcast_of(m));
    op_attrs_init(OP_WHERE, &a);
    return try_op(g, OP_WHERE, in, 3, &a);
  }
  if (k < 70 && m->ndim > 0) {
    fl_op op = red[rnd(sizeof red / sizeof red[0])];
    int d0 = (int)rnd((unsigned)m->ndim), d1 = (int)rnd((unsigned)m->ndim);
    op_attrs_init(op, &a);
    a.ndims = rnd(5) == 0 ? 0 : (d0 != d1 && rnd(3) == 0) ? 2 : 1;
    a.dims[0] = d0 < d1 || a.ndims == 1 ? d0 : d1;
    a.dims[1] = d0 < d1 ? d1 : d0;
    a.keepdim = (int)rnd(2);
    if (op == OP_VAR) a.f[0] = rnd(2);
    if (op == OP_AMAX && rnd(4) == 0 && g->nodes[x].kind == IR_INPUT) {
      op = OP_ARGMAX;       /* on raw inputs only: ties there are impossible */
      a.ndims = 1;
      a.dims[0] = d0;
    }
    return try_op(g, op, &x, 1, &a);
  }
  if (k < 78 && m->ndim > 0 && is_float(g, x)) {
    int c = (int)rnd(4), nd = m->ndim >= 2 && rnd(3) == 0 ? 2 : 1;
    fl_op op = c == 0 ? OP_SOFTMAX : c == 1 ? OP_LOG_SOFTMAX : c == 2 ? OP_LAYER_NORM : OP_RMS_NORM;
    op_attrs_init(op, &a);
    in[0] = x;
    if (op == OP_SOFTMAX || op == OP_LOG_SOFTMAX) {
      a.i[0] = rnd((unsigned)m->ndim);
      return try_op(g, op, in, 1, &a);
    } else {
      fl_meta wm;
      int n = 1, d;
      memset(&wm, 0, sizeof wm);
      wm.dtype = FL_F32;
      wm.ndim = nd;
      for (d = 0; d < nd; d++) wm.shape[d] = m->shape[m->ndim - nd + d];
      a.i[0] = nd;
      if (rnd(3)) in[n++] = fg_param(g, wm, "w", 0.5, 1.0);
      if (op == OP_LAYER_NORM && n == 2 && rnd(2)) in[n++] = fg_param(g, wm, "b", 0.5, 0.0);
      return try_op(g, op, in, n, &a);
    }
  }
  if (k < 92 && m->ndim > 0) {
    int c = (int)rnd(6), d = (int)rnd((unsigned)m->ndim), j;
    fl_op op;
    op_attrs_init(OP_TRANSPOSE, &a);
    switch (c) {
    case 0:
      if (m->ndim < 2) return -1;
      op = OP_TRANSPOSE; a.i[0] = d; a.i[1] = (d + 1) % m->ndim;
      break;
    case 1:
      op = OP_PERMUTE; a.ndims = m->ndim;
      for (j = 0; j < m->ndim; j++) a.dims[j] = (j + 1) % m->ndim;
      break;
    case 2:
      op = OP_UNSQUEEZE; a.i[0] = (int)rnd((unsigned)m->ndim + 1);
      break;
    case 3:
      op = OP_EXPAND; a.ndims = m->ndim;
      for (j = 0; j < m->ndim; j++) a.dims[j] = m->shape[j] == 1 && rnd(2) ? 3 : m->shape[j];
      break;
    case 4:
      if (m->shape[d] < 2) return -1;
      op = OP_NARROW; a.i[0] = d; a.i[1] = 1; a.i[2] = m->shape[d] - 1 - (int64_t)rnd(2) * (m->shape[d] > 2);
      break;
    default:
      op = OP_RESHAPE; a.ndims = 1; a.dims[0] = meta_numel(m);
      if (rnd(2) && m->ndim == 1 && m->shape[0] % 2 == 0) { a.ndims = 2; a.dims[0] = 2; a.dims[1] = m->shape[0] / 2; }
      break;
    }
    return try_op(g, op, &x, 1, &a);
  }
  if (k < 96) {
    static const fl_dtype to[] = {FL_F16, FL_BF16, FL_F32, FL_F32, FL_I64, FL_BOOL};
    op_attrs_init(OP_TO, &a);
    a.dtype = to[rnd(sizeof to / sizeof to[0])];
    /* float -> int64 only from values made integral-safe by a clamp */
    if (a.dtype == FL_I64 && is_float(g, x)) return -1;
    return try_op(g, OP_TO, &x, 1, &a);
  }
  if (m->ndim == 2 && is_float(g, x) && g->nodes[x].meta.dtype == FL_F32) {
    fl_meta wm = fg_meta(FL_F32, 2, m->shape[1], pick_dim() + 1);
    in[0] = x;
    in[1] = fg_param(g, wm, "w", 0.3, 0.0);
    op_attrs_init(OP_MATMUL, &a);
    return try_op(g, OP_MATMUL, in, 2, &a);
  }
  return -1;
}

static ir_graph *random_graph(uint64_t seed) {
  ir_graph *g = ir_new();
  int i, nops, made = 0, last = -1, tries;
  fl_meta m;
  rs = seed * 0x9E3779B97F4A7C15ull + 12345;
  rnd(1);
  m = rand_meta();
  if (rnd(8) == 0) m.dtype = FL_I64;
  new_input(g, m);
  if (rnd(2)) new_input(g, rand_meta());
  nops = 2 + (int)rnd(7);
  for (tries = 0; made < nops && tries < 100 && g->n < MAXN - 8; tries++) {
    int id = add_random_op(g);
    if (id >= 0 && g->nodes[id].kind == IR_OP) { made++; last = id; }
  }
  if (last < 0) { ir_free(g); return NULL; }
  ir_add_output(g, last, NULL);
  for (i = 0; i < 2; i++) {
    int o = any_node(g);
    if (g->nodes[o].kind == IR_OP && o != last && rnd(2)) { ir_add_output(g, o, NULL); break; }
  }
  return g;
}

static void fill_inputs(ir_graph *g, fl_tensor *in, uint64_t seed) {
  int i;
  fl_err e;
  rs = seed * 31 + 7;
  rnd(1);
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    int64_t j, n;
    if (nd->kind != IR_INPUT) continue;
    ten_empty(&in[nd->index], &nd->meta, &e);
    n = meta_numel(&nd->meta);
    for (j = 0; j < n; j++) {
      double v = nd->meta.dtype == FL_I64 ? (double)((int)rnd(11) - 5) :
                 ((double)rnd(1u << 20) / (1u << 20)) * 4.0 - 2.0;
      ten_set(&in[nd->index], j, v);
    }
  }
}

/* 0 when got matches want within the dtype's tolerance */
static int mismatch(const fl_tensor *got, const fl_tensor *want, char *why, size_t n) {
  int64_t i, cnt = meta_numel(&want->m);
  fl_dtype dt = want->m.dtype;
  double rt = dt == FL_F16 ? 1e-2 : dt == FL_BF16 ? 3e-2 : 2e-3;
  char s1[96], s2[96];
  if (got->m.dtype != dt || !meta_same_shape(&got->m, &want->m)) {
    snprintf(why, n, "result %s %s, expected %s %s", dtype_name(got->m.dtype),
             meta_shape_str(&got->m, s1, sizeof s1), dtype_name(dt), meta_shape_str(&want->m, s2, sizeof s2));
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

typedef struct item {
  uint64_t seed;
  ir_graph *g;
  cpu_program *pr[2];     /* fused, unfused */
} item;

static int failures;

typedef struct half { cpu_program **prs; int n, rc; fl_err e; } half;

static void *compile_half(void *arg) {
  half *h = arg;
  h->rc = h->n ? cpu_compile_batch(h->prs, h->n, &h->e) : FL_OK;
  return NULL;
}

static void report(const item *it, const char *what) {
  char *s = ir_listing(it->g);
  failures++;
  printf("# FAILED graph seed %llu: %s\n", (unsigned long long)it->seed, what);
  printf("# reproduce: FUSELAB_DIFF_SEED=%llu FUSELAB_DIFF_GRAPHS=1 tests/unit/test_diff\n",
         (unsigned long long)it->seed);
  if (s) {
    char *line;
    for (line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) printf("#   %s\n", line);
  }
  free(s);
}

/* run item it's programs and the reference on the same inputs */
static void check_item(item *it) {
  fl_tensor in[MAXN], want[8], got[8];
  const fl_tensor *inp[MAXN];
  fl_err e;
  char why[1400];
  int i, f, o;
  memset(in, 0, sizeof in);
  memset(want, 0, sizeof want);
  fill_inputs(it->g, in, it->seed);
  for (i = 0; i < it->g->ninputs; i++) inp[i] = &in[i];
  if (ir_run(it->g, ref_apply, inp, it->g->ninputs, want, &e) != FL_OK) {
    /* the oracle refuses (e.g. pow of negative integers): not a compiler test */
    goto done;
  }
  for (f = 0; f < 2; f++) {
    memset(got, 0, sizeof got);
    if (cpu_program_run(it->pr[f], inp, it->g->ninputs, got, &e) != FL_OK) {
      snprintf(why, sizeof why, "%s run failed: %s", f ? "unfused" : "fused", e.msg);
      report(it, why);
    } else {
      for (o = 0; o < it->g->nout; o++) {
        char w2[300];
        if (mismatch(&got[o], &want[o], w2, sizeof w2)) {
          snprintf(why, sizeof why, "%s output %d: %s", f ? "unfused" : "fused", o, w2);
          report(it, why);
          break;
        }
      }
    }
    for (o = 0; o < 8; o++) ten_release(&got[o]);
  }
done:
  for (i = 0; i < MAXN; i++) ten_release(&in[i]);
  for (o = 0; o < 8; o++) ten_release(&want[o]);
}

int main(void) {
  const char *eg = getenv("FUSELAB_DIFF_GRAPHS"), *es = getenv("FUSELAB_DIFF_SEED");
  const char *et = getenv("FUSELAB_DIFF_SECONDS");
  long total = eg ? atol(eg) : 2000, done = 0, skipped = 0;
  uint64_t seed0 = es ? strtoull(es, NULL, 10) : 1;
  double limit = et ? atof(et) : 1200, t0 = (double)time(NULL);
  uint64_t next = seed0;
  item *items = calloc(BATCH, sizeof *items);
  cpu_program **prs = calloc(2 * BATCH, sizeof *prs);
  char tmpl[] = "/tmp/fl-diff-XXXXXX";
  int timed_out = 0;
  fl_err e;
  /* a private cache: batches are never reused, and clearing it at the end
  ** must not touch the cache other tests share */
  if (mkdtemp(tmpl)) setenv("FUSELAB_CACHE_DIR", tmpl, 1);
  while (done < total && !timed_out) {
    int n = 0, np = 0, i, f;
    while (n < BATCH && done + n < total) {
      item *it = &items[n];
      fuse_opts o;
      memset(it, 0, sizeof *it);
      it->seed = next++;
      if (!(it->g = random_graph(it->seed))) { skipped++; continue; }
      for (f = 0; f < 2; f++) {
        fuse_plan *p;
        char prefix[32];
        fuse_opts_default(&o);
        o.fuse = !f;
        if (!(p = fuse_plan_build(it->g, &o, &e))) { report(it, e.msg); break; }
        snprintf(prefix, sizeof prefix, "g%llu%c_", (unsigned long long)it->seed, f ? 'u' : 'f');
        it->pr[f] = cpu_codegen_prefixed(p, prefix, &e);
        fuse_plan_free(p);
        if (!it->pr[f]) { report(it, e.msg); break; }
        prs[np++] = it->pr[f];
      }
      n++;
    }
    {
      half h[2];
      pthread_t th;
      int split = np / 2 + (np / 2) % 2, started;   /* even: items stay whole */
      h[0].prs = prs; h[0].n = split;
      h[1].prs = prs + split; h[1].n = np - split;
      started = pthread_create(&th, NULL, compile_half, &h[1]) == 0;
      if (!started) compile_half(&h[1]);
      compile_half(&h[0]);
      if (started) pthread_join(th, NULL);
      for (f = 0; f < 2; f++)
        if (h[f].rc != FL_OK) {
          /* find the graphs whose code does not compile, one by one */
          int j, t;
          printf("# batch compile failed: %s\n", h[f].e.msg);
          for (j = 0; j < n; j++)
            for (t = 0; t < 2; t++) {
              char why[1400];
              int in_half = 0, q;
              for (q = 0; q < h[f].n; q++) in_half |= h[f].prs[q] == items[j].pr[t];
              if (!in_half || cpu_program_compile(items[j].pr[t], &e) == FL_OK) continue;
              snprintf(why, sizeof why, "%s program does not compile: %.500s\n%.600s",
                       t ? "unfused" : "fused", e.msg, cpu_program_log(items[j].pr[t]));
              report(&items[j], why);
            }
          failures++;
          np = -1;
        }
    }
    if (np >= 0) {
      for (i = 0; i < n; i++)
        if (items[i].pr[0] && items[i].pr[1]) check_item(&items[i]);
    }
    for (i = 0; i < n; i++) {
      cpu_program_free(items[i].pr[0]);
      cpu_program_free(items[i].pr[1]);
      ir_free(items[i].g);
    }
    done += n;
    cache_forget_memory();
    if ((double)time(NULL) - t0 > limit) timed_out = 1;
  }
  ok(failures == 0, "%ld random graphs (seeds %llu..%llu), fused and unfused, match the reference",
     done, (unsigned long long)seed0, (unsigned long long)(next - 1));
  ok(done >= total, "checked %ld of %ld graphs in %.0f s%s", done, total,
     (double)time(NULL) - t0, timed_out ? " (time bound reached)" : "");
  if (skipped) printf("# %ld seeds gave no graph\n", skipped);
  if (!getenv("FUSELAB_KEEP_CACHE")) { fl_err e2; cache_clear(&e2); rmdir(tmpl); }
  free(items);
  free(prs);
  return tap_done();
}
