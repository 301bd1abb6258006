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
** can be rebuilt alone.  One graph in three also writes one of its
** results back into an input of its shape and dtype (an in-place update
** captured, ir_add_writeback): the input after the run is compared too.
**
** Compiling each graph with cc would take ~0.3 s apiece on this machine;
** instead BATCH graphs (fused and unfused programs both) are generated
** with distinct symbol prefixes and compiled as translation units of
** BATCH/2 graphs each, one shared object per unit (exec_compile_batch), the
** two halves by two compiler runs side by side (two cores).  Kernels whose
** code is identical across graphs are compiled once (aliases).
**
** Backward: one graph in four (by seed) is also trained.  Its float32
** results, each times a random weight and summed, are a loss; its float32
** inputs require grad; the loss's joint graph (graph/joint.h) is split by
** the minimum-cut partitioner, and the compiled forward then the compiled
** backward (given what the forward saved) must give the gradients the
** reference interpreter computes from the joint graph.
**
** Tolerances against the double-precision oracle: float32 |got - want| <=
** 2e-3 (1 + |want|); float16 1e-2, bfloat16 3e-2 relative; int64 (some
** inputs beyond 2^53, to the ends of the range: overflow wraps) and bool
** exact, every bit; NaN matches NaN.
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
#include "random_graph.h"
#include "fuse_graphs.h"
#include "fuse/plan.h"
#include "cpu/backend.h"
#include "exec/cache.h"
#include "graph/ref.h"
#include "graph/build.h"
#include "graph/joint.h"
#include "fuse/partition.h"

#define BATCH 100
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
    if (dt == FL_I64) {   /* every bit: through double 2^60 + 1 == 2^60 */
      int64_t p = dtype_load_i64(dt, ten_elem_ptr(got, i)), q = dtype_load_i64(dt, ten_elem_ptr(want, i));
      if (p == q) continue;
      snprintf(why, n, "element %lld: got %lld, want %lld", (long long)i, (long long)p, (long long)q);
      return 1;
    }
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
  exec_program *pr[2];     /* fused, unfused */
  ir_graph *joint;         /* a loss of g's results: its joint graph, or NULL */
  exec_program *fw, *bw;   /* its halves, compiled */
  part_info info;
} item;

static int failures;

typedef struct half { exec_program **prs; int n, rc; fl_err e; } half;

static void *compile_half(void *arg) {
  half *h = arg;
  h->rc = h->n ? exec_compile_batch(h->prs, h->n, &h->e) : FL_OK;
  return NULL;
}

/* Prints graph it with what went wrong, counted in *count. */
static void report_in(const item *it, const char *what, long *count) {
  char *s = ir_listing(it->g);
  (*count)++;
  printf("# FAILED graph seed %llu: %s\n", (unsigned long long)it->seed, what);
  printf("# reproduce: FUSELAB_DIFF_SEED=%llu FUSELAB_DIFF_GRAPHS=1 tests/unit/test_diff\n",
         (unsigned long long)it->seed);
  if (s) {
    char *line;
    for (line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) printf("#   %s\n", line);
  }
  free(s);
}

static void report(const item *it, const char *what) {
  long n = 0;
  report_in(it, what, &n);
  failures++;
}

/* One graph in three (by seed): a result written back into an input of
** its type, the last output of that type that is not the input itself. */
static void add_random_writeback(ir_graph *g, uint64_t seed) {
  int o, i;
  fl_err e;
  if (seed % 3 != 0 || g->nout >= 8) return;   /* (outputs: at most 8) */
  for (o = g->nout - 1; o >= 0; o--) {
    const ir_node *src = &g->nodes[g->outputs[o]];
    for (i = 0; i < g->n; i++) {
      const ir_node *in = &g->nodes[i];
      if (in->kind != IR_INPUT || i == g->outputs[o] || in->meta.dtype != src->meta.dtype ||
          !meta_same_shape(&in->meta, &src->meta))
        continue;
      ir_add_writeback(g, g->outputs[o], i, &e);
      return;
    }
  }
}

/* g's float32 results, each times a random weight and summed: the loss
** of a training step whose float32 inputs require grad.  NULL when g has
** no float32 result or input. */
static ir_graph *loss_graph(const ir_graph *g, uint64_t seed, fl_err *e) {
  ir_graph *h = ir_clone(g);
  gbuild b;
  int i, loss = -1, leaves = 0, nres = ir_nresults(g);
  uint64_t r = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  if (!h) return NULL;
  gb_init(&b, h, e);
  for (i = 0; i < nres && !b.rc; i++) {
    int o = g->outputs[i], s;
    fl_tensor w = {0};
    fl_meta m = g->nodes[o].meta;
    int64_t k, n = meta_numel(&m);
    if (m.dtype != FL_F32 || n == 0) continue;
    m.wrapped = 0;
    if (ten_empty(&w, &m, e) != FL_OK) break;
    for (k = 0; k < n; k++) {
      r = r * 6364136223846793005ULL + 1442695040888963407ULL;
      ten_set(&w, k, (double)(r >> 40) / (double)(1 << 24) * 2.0 - 1.0);
    }
    s = gb_reduce(&b, OP_SUM, gb_op2(&b, OP_MUL, o, gb_tensor(&b, &w)), NULL, 0, 0);
    ten_release(&w);
    loss = loss < 0 ? s : gb_op2(&b, OP_ADD, loss, s);
  }
  for (i = 0; i < h->n; i++)
    if (h->nodes[i].kind == IR_INPUT && h->nodes[i].meta.dtype == FL_F32) {
      h->nodes[i].requires_grad = 1;
      leaves++;
    }
  h->nout = 0;
  h->nwb = 0;
  free(h->wb);
  h->wb = NULL;
  if (b.rc || loss < 0 || !leaves || ir_add_output(h, loss, e) != FL_OK) { ir_free(h); return NULL; }
  return h;
}

/* it's training step: its joint graph split, both halves planned fused
** and generated (1), or nothing to train (0: no float32 path from an input
** to a result, an op without a rule on every path). */
static int add_backward(item *it, fl_err *e) {
  ir_graph *l = it->seed % 4 == 0 ? loss_graph(it->g, it->seed, e) : NULL, *fw = NULL, *bw = NULL;
  fuse_plan *p;
  char prefix[32];
  int h;
  if (!l) return 0;
  err_clear(e);
  it->joint = ir_joint(l, 0, e);
  ir_free(l);
  if (!it->joint) return 0;
  if (fuse_partition(it->joint, PART_MINCUT, &fw, &bw, &it->info, e) != FL_OK) {
    report(it, e->msg);
    return 0;
  }
  for (h = 0; h < 2; h++) {
    snprintf(prefix, sizeof prefix, "g%llu%c_", (unsigned long long)it->seed, h ? 'b' : 'w');
    p = fuse_plan_build(h ? bw : fw, NULL, e);
    if (!p) { report(it, e->msg); break; }
    *(h ? &it->bw : &it->fw) = exec_codegen(&cpu_backend, p, prefix, e);
    fuse_plan_free(p);
    if (!*(h ? &it->bw : &it->fw)) { report(it, e->msg); break; }
  }
  ir_free(fw);
  ir_free(bw);
  return it->fw && it->bw;
}

/* The compiled forward, then the compiled backward on what it saved,
** against the oracle running the joint graph. */
static void check_backward(item *it) {
  const ir_graph *j = it->joint;
  fl_tensor in[RG_MAXN], want[64], fo[64], go[64];
  const fl_tensor *inp[RG_MAXN], *saved[256];
  int nres = ir_nresults(j), ng = nres - j->joint_nres, i, k = 0, nf;
  fl_err e;
  char why[1400], w2[300];
  memset(in, 0, sizeof in); memset(want, 0, sizeof want); memset(fo, 0, sizeof fo); memset(go, 0, sizeof go);
  if (ng > 63 || it->info.nsaved > 256) return;
  rg_fill_inputs(it->g, in, it->seed);
  for (i = 0; i < j->ninputs; i++) inp[i] = &in[i];
  if (ir_run(j, ref_apply, inp, j->ninputs, want, &e) != FL_OK) goto done;
  nf = it->fw->plan->g->nout;
  if (nf > 64 || exec_program_run(it->fw, inp, j->ninputs, fo, &e) != FL_OK) {
    snprintf(why, sizeof why, "compiled forward of the training step failed: %s", e.msg);
    report(it, why);
    goto done;
  }
  for (i = 0; i < it->info.nsaved; i++) {
    const ir_node *nd = &j->nodes[it->info.saved[i].node];
    saved[i] = nd->kind == IR_INPUT ? inp[nd->index] : &fo[j->joint_nres + k++];
  }
  if (exec_program_run(it->bw, saved, it->info.nsaved, go, &e) != FL_OK) {
    snprintf(why, sizeof why, "compiled backward failed: %s", e.msg);
    report(it, why);
    goto done;
  }
  if (mismatch(&fo[0], &want[0], w2, sizeof w2)) {
    snprintf(why, sizeof why, "the training step's loss: %s", w2);
    report(it, why);
  }
  for (i = 0; i < ng; i++)
    if (mismatch(&go[i], &want[j->joint_nres + i], w2, sizeof w2)) {
      snprintf(why, sizeof why, "gradient %d of input %%%d: %s", i, j->joint_wrt[i], w2);
      report(it, why);
      break;
    }
done:
  for (i = 0; i < RG_MAXN; i++) ten_release(&in[i]);
  for (i = 0; i < 64; i++) { ten_release(&want[i]); ten_release(&fo[i]); ten_release(&go[i]); }
}

/* Fresh copies of the inputs at in (each run writes back into its own). */
static void copy_inputs(const ir_graph *g, const fl_tensor *in, fl_tensor *out,
                        const fl_tensor **outp) {
  int i;
  fl_err e;
  for (i = 0; i < g->ninputs; i++) {
    out[i].st = NULL;
    if (ten_empty(&out[i], &in[i].m, &e) == FL_OK) ten_copy(&out[i], &in[i], &e);
    outp[i] = &out[i];
  }
}

/* run item it's programs and the reference on the same inputs */
static void check_item(item *it) {
  fl_tensor in[RG_MAXN], ref_in[RG_MAXN], run_in[RG_MAXN], want[8], got[8];
  const fl_tensor *inp[RG_MAXN], *runp[RG_MAXN];
  fl_err e;
  char why[1400];
  int i, f, o;
  memset(in, 0, sizeof in);
  memset(ref_in, 0, sizeof ref_in);
  memset(run_in, 0, sizeof run_in);
  memset(want, 0, sizeof want);
  rg_fill_inputs(it->g, in, it->seed);
  copy_inputs(it->g, in, ref_in, inp);
  if (ir_run(it->g, ref_apply, inp, it->g->ninputs, want, &e) != FL_OK) {
    /* the oracle refuses (e.g. pow of negative integers): not a compiler test */
    goto done;
  }
  for (f = 0; f < 2; f++) {
    memset(got, 0, sizeof got);
    for (i = 0; i < it->g->ninputs; i++) ten_release(&run_in[i]);
    copy_inputs(it->g, in, run_in, runp);
    if (exec_program_run(it->pr[f], runp, it->g->ninputs, got, &e) != FL_OK) {
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
      for (i = 0; i < it->g->ninputs; i++) {
        char w2[300];
        if (mismatch(&run_in[i], &ref_in[i], w2, sizeof w2)) {
          snprintf(why, sizeof why, "%s input %d after its write-back: %s", f ? "unfused" : "fused", i, w2);
          report(it, why);
          break;
        }
      }
    }
    for (o = 0; o < 8; o++) ten_release(&got[o]);
  }
done:
  for (i = 0; i < RG_MAXN; i++) {
    ten_release(&ref_in[i]);
    ten_release(&run_in[i]);
  }
  for (i = 0; i < RG_MAXN; i++) ten_release(&in[i]);
  for (o = 0; o < 8; o++) ten_release(&want[o]);
}

/* The memory plan's two promises, checked from the plan's own fields
** without its walk: (1) no two buffers alive at once share a slot.  Each
** stored node lives over half-steps: an extern's product from 2k (its
** library call), any other value from 2k+1 (the kernel's stores); an
** operand the library call alone read last dies after 2k, anything else
** after 2 last_use + 1; an epilogue stored over its product (p->alias)
** and an output taking its kernel's dead operand's slot are the sharing
** the plan means.  (2) the fused plan moves no more bytes and needs no
** more memory at its peak than the graph run op by op. */
/* A graph returning a view (of an input, or of another value) is left out
** of promise (2): op by op that view costs nothing, where a compiled
** program copies it into memory the caller owns. */
static int view_output(const ir_graph *g) {
  int i;
  for (i = 0; i < g->nout; i++)
    if (g->nodes[g->outputs[i]].kind != IR_OP || fk_is_view(g, g->outputs[i])) return 1;
  return 0;
}

static int slot_overlap(const fuse_plan *p, char *why, size_t n) {
  const ir_graph *g = p->g;
  int *from = malloc((size_t)(g->n ? g->n : 1) * sizeof *from);
  int *to = malloc((size_t)(g->n ? g->n : 1) * sizeof *to);
  int i, j, k, bad = 0;
  if (!from || !to) { free(from); free(to); return 0; }
  for (i = 0; i < g->n; i++) {
    k = p->kernel_of[i];
    from[i] = to[i] = -1;
    if (p->slot[i] < 0 || k < 0) continue;
    from[i] = p->kernels[k].kind == FK_EXTERN && p->kernels[k].anchor == i ? 2 * k : 2 * k + 1;
    to[i] = p->last_use[i] < 0 ? 2 * k + 1 : 2 * p->last_use[i] + 1;
  }
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kk = &p->kernels[k];
    const ir_node *an;
    if (kk->kind != FK_EXTERN || kk->nnodes == 0) continue;
    an = &g->nodes[kk->anchor];
    for (j = 0; j < an->nin; j++) {
      int s = an->in[j], a, read = 0;
      while (s >= 0 && g->nodes[s].kind == IR_OP && fk_is_view(g, s)) s = g->nodes[s].in[0];
      if (s < 0 || p->slot[s] < 0 || p->last_use[s] != k || s == kk->anchor) continue;
      for (a = 0; a < kk->nacc; a++) read |= !kk->acc[a].store && kk->acc[a].node == s;
      if (!read) to[s] = 2 * k;
    }
  }
  for (i = 0; i < g->n && !bad; i++)
    for (j = i + 1; j < g->n && !bad; j++) {
      if (from[i] < 0 || from[j] < 0 || p->slot[i] != p->slot[j]) continue;
      if ((p->alias && (p->alias[i] == j || p->alias[j] == i))) continue;
      if (from[i] <= to[j] && from[j] <= to[i]) {
        snprintf(why, n, "%%%d (half-steps %d..%d) and %%%d (%d..%d) share slot %d", i, from[i],
                 to[i], j, from[j], to[j], p->slot[i]);
        bad = 1;
      }
    }
  free(from);
  free(to);
  return bad;
}

int main(void) {
  const char *eg = getenv("FUSELAB_DIFF_GRAPHS"), *es = getenv("FUSELAB_DIFF_SEED");
  const char *et = getenv("FUSELAB_DIFF_SECONDS");
  long total = eg ? atol(eg) : 2000, done = 0, skipped = 0, wbs = 0, mem_peak = 0, mem_bytes = 0, mem_slots = 0;
  uint64_t seed0 = es ? strtoull(es, NULL, 10) : 1;
  double limit = et ? atof(et) : 1200, t0 = (double)time(NULL);
  uint64_t next = seed0;
  item *items = calloc(BATCH, sizeof *items);
  exec_program **prs = calloc(4 * BATCH, sizeof *prs);
  long trained = 0;
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
      if (!(it->g = rg_random_graph(it->seed))) { skipped++; continue; }
      add_random_writeback(it->g, it->seed);
      wbs += it->g->nwb;
      for (f = 0; f < 2; f++) {
        fuse_plan *p;
        char prefix[32];
        fuse_opts_default(&o);
        o.fuse = !f;
        if (!(p = fuse_plan_build(it->g, &o, &e))) { report(it, e.msg); break; }
        {
          char why[200];
          const fuse_stats *st = &p->stats;
          if (slot_overlap(p, why, sizeof why)) report_in(it, why, &mem_slots);
          if (o.fuse && !view_output(it->g) &&
              (st->bytes_after > st->bytes_before || st->peak_bytes_after > st->peak_bytes_before)) {
            snprintf(why, sizeof why, "fused plan: bytes %lld -> %lld, peak %lld -> %lld",
                     (long long)st->bytes_before, (long long)st->bytes_after,
                     (long long)st->peak_bytes_before, (long long)st->peak_bytes_after);
            report_in(it, why, st->peak_bytes_after > st->peak_bytes_before ? &mem_peak : &mem_bytes);
            if (getenv("FUSELAB_DIFF_LISTING")) {
              char *l = fuse_plan_listing(p, 1);
              printf("%s\n", l ? l : "");
              free(l);
            }
          }
        }
        snprintf(prefix, sizeof prefix, "g%llu%c_", (unsigned long long)it->seed, f ? 'u' : 'f');
        it->pr[f] = exec_codegen(&cpu_backend, p, prefix, &e);
        fuse_plan_free(p);
        if (!it->pr[f]) { report(it, e.msg); break; }
        prs[np++] = it->pr[f];
      }
      if (add_backward(it, &e)) {
        prs[np++] = it->fw;
        prs[np++] = it->bw;
        trained++;
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
              if (!in_half || exec_program_compile(items[j].pr[t], &e) == FL_OK) continue;
              snprintf(why, sizeof why, "%s program does not compile: %.500s\n%.600s",
                       t ? "unfused" : "fused", e.msg, exec_program_log(items[j].pr[t]));
              report(&items[j], why);
            }
          failures++;
          np = -1;
        }
    }
    if (np >= 0) {
      for (i = 0; i < n; i++) {
        if (items[i].pr[0] && items[i].pr[1]) check_item(&items[i]);
        if (items[i].fw && items[i].bw) check_backward(&items[i]);
      }
    }
    for (i = 0; i < n; i++) {
      exec_program_free(items[i].pr[0]);
      exec_program_free(items[i].pr[1]);
      exec_program_free(items[i].fw);
      exec_program_free(items[i].bw);
      if (items[i].joint) part_info_free(&items[i].info);
      ir_free(items[i].joint);
      ir_free(items[i].g);
    }
    done += n;
    cache_forget_memory();
    if ((double)time(NULL) - t0 > limit) timed_out = 1;
  }
  ok(mem_slots == 0, "no two buffers alive at once share a slot (%ld plans do)", mem_slots);
  ok(mem_peak + mem_bytes == 0, "no fused plan needs more memory at its peak (%ld do) or moves more "
     "bytes (%ld do) than its graph op by op", mem_peak, mem_bytes);
  ok(failures == 0, "%ld random graphs (seeds %llu..%llu; %ld write back into an input), fused and "
     "unfused, match the reference; %ld trained: compiled forward and backward give the "
     "reference's gradients", done, (unsigned long long)seed0, (unsigned long long)(next - 1), wbs,
     trained);
  ok(trained * 8 >= done || done < 40, "at least one graph in eight trained (%ld of %ld)", trained, done);
  /* the time bound shortens a run on a slow or busy machine, never fails
  ** it: what ran is said, and at least one batch always runs */
  ok(done > 0, "checked %ld of %ld graphs in %.0f s", done, total, (double)time(NULL) - t0);
  if (timed_out)
    printf("# time bound (%.0f s) reached after %ld of %ld graphs\n", limit, done, total);
  if (skipped) printf("# %ld seeds gave no graph\n", skipped);
  if (!getenv("FUSELAB_KEEP_CACHE")) { fl_err e2; cache_clear(&e2); rmdir(tmpl); }
  free(items);
  free(prs);
  return tap_done();
}
