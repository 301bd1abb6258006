/*
** test_codegen.c -- generated C against the reference interpreter, on many
** shapes; compiler failures; the kernel cache (warm hit, corrupt entry,
** unwritable directory, two processes compiling at once).
** Tolerance: float32 results within 1e-4 absolute + 1e-4 relative of the
** oracle (which computes in double), 1e-3 for sums over 1000+ elements.
*/
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tap.h"
#include "fuse_graphs.h"
#include "fuse/plan.h"
#include "cpu/backend.h"
#include "exec/cache.h"
#include "graph/ref.h"

/* Floats uniform in [lo, hi]; integers 0..3, valid indices for every
** graph here (fg_op_graph's integer inputs index dims of 4 or more). */
static void fill(fl_tensor *t, double lo, double hi) {
  int64_t i, n = meta_numel(&t->m);
  for (i = 0; i < n; i++) {
    double u = (double)rand() / RAND_MAX;
    if (t->m.dtype == FL_I64) ten_set_i64(t, i, rand() % 4);
    else ten_set(t, i, lo + (hi - lo) * u);
  }
}

/* max |got - want| / (atol + rtol |want|) over all outputs: <= 1 passes */
static double compare(const fl_tensor *got, const fl_tensor *want, double tol) {
  int64_t i, n = meta_numel(&want->m);
  double worst = 0;
  if (!meta_same_shape(&got->m, &want->m) || got->m.dtype != want->m.dtype) return 1e30;
  for (i = 0; i < n; i++) {
    double a = ten_get(got, i), b = ten_get(want, i), r;
    if (isnan(a) && isnan(b)) continue;
    if (a == b) continue;
    r = fabs(a - b) / (tol + tol * fabs(b));
    if (!(r <= worst)) worst = r;
  }
  return worst;
}

/* The shape checks are queued and compiled as one batch (one compiler run
** per CPU, as the differential test does): a separate `cc -O3` for each of
** the ~100 programs was most of this test's time. */
typedef struct pending {
  char what[96];
  ir_graph *g;
  double tol;
  exec_program *pr[2];   /* [0] fused, [1] unfused */
} pending;

#define MAXPEND 128
static pending pend[MAXPEND];
static int npend;

/* Run g's program pr on random inputs and compare with the reference. */
static int check(const char *what, ir_graph *g, exec_program *pr, int fuse, double tol) {
  fl_err e;
  fl_tensor in[8], got[8], want[8];
  const fl_tensor *inp[8];
  uint64_t key, block;
  int i, rc, good = 1;
  memset(in, 0, sizeof in); memset(got, 0, sizeof got); memset(want, 0, sizeof want);
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_INPUT) continue;
    ten_empty(&in[nd->index], &nd->meta, &e);
    fill(&in[nd->index], -2, 2);
    inp[nd->index] = &in[nd->index];
  }
  rng_get_state(&key, &block);         /* random ops: the same draws for both */
  rc = exec_program_run(pr, inp, g->ninputs, got, &e);   /* compiles if the batch did not */
  rng_set_state(key, block);
  if (rc) {
    ok(0, "%s (fuse=%d): run: %s", what, fuse, e.msg);
    printf("# log: %s\n", exec_program_log(pr));
    good = 0;
  } else if ((rc = ir_run(g, ref_apply, inp, g->ninputs, want, &e))) {
    ok(0, "%s: reference: %s", what, e.msg);
    good = 0;
  } else {
    double worst = 0;
    for (i = 0; i < g->nout; i++) {
      double w = compare(&got[i], &want[i], tol);
      if (w > worst) worst = w;
    }
    good = ok(worst <= 1, "%s (fuse=%d) matches the reference (worst %.3g of tolerance)", what, fuse, worst);
  }
  if (!good) {
    char *s = ir_listing(g);
    printf("# %s\n", s);
    free(s);
  }
  for (i = 0; i < 8; i++) { ten_release(&in[i]); ten_release(&got[i]); ten_release(&want[i]); }
  return good;
}

/* Queue g (owned from here on), fused and unfused. */
static void both(const char *what, ir_graph *g, double tol) {
  pending *q;
  if (npend == MAXPEND) { ok(0, "%s: too many queued checks", what); ir_free(g); return; }
  q = &pend[npend++];
  snprintf(q->what, sizeof q->what, "%s", what);
  q->g = g;
  q->tol = tol;
}

/* Plan, generate and batch-compile every queued graph, then check each. */
static void run_pending(void) {
  exec_program *prs[2 * MAXPEND];
  int i, f, np = 0;
  fl_err e;
  for (i = 0; i < npend; i++)
    for (f = 0; f < 2; f++) {
      fuse_opts o;
      fuse_plan *p;
      char prefix[32];
      fuse_opts_default(&o);
      o.fuse = !f;
      if (!(p = fuse_plan_build(pend[i].g, &o, &e))) { ok(0, "%s: plan: %s", pend[i].what, e.msg); continue; }
      snprintf(prefix, sizeof prefix, "t%d%c_", i, f ? 'u' : 'f');
      pend[i].pr[f] = exec_codegen(&cpu_backend, p, prefix, &e);
      fuse_plan_free(p);
      if (!pend[i].pr[f]) ok(0, "%s: codegen: %s", pend[i].what, e.msg);
      else prs[np++] = pend[i].pr[f];
    }
  /* a batch that does not compile leaves each program to compile (and
  ** report) on its own when it first runs */
  if (np && exec_compile_batch(prs, np, &e) != FL_OK) printf("# batch compile failed: %s\n", e.msg);
  for (i = 0; i < npend; i++) {
    for (f = 0; f < 2; f++)
      if (pend[i].pr[f]) check(pend[i].what, pend[i].g, pend[i].pr[f], !f, pend[i].tol);
    exec_program_free(pend[i].pr[0]);
    exec_program_free(pend[i].pr[1]);
    ir_free(pend[i].g);
  }
  npend = 0;
}

/* Every row of ops.def through the C generator, against the reference:
** each op alone and with a relu epilogue, in every dtype it takes, fused.
** A row the generator or the extern steps cannot run fails here, whatever
** switch forgot it.  Tolerances, by the result's dtype: float32 1e-4
** (+ relative), float16 and bfloat16 one unit in their last place (2e-3,
** 1e-2), int64, bool and float64 exactly. */
typedef struct opjob {
  char what[64];
  fl_op op;
  ir_graph *g;
  exec_program *pr;
  double tol;
} opjob;

/* Compile jobs[0..n) as one batch, check each, mark the ops that pass. */
static void run_ops(opjob *jobs, int n, int *covered) {
  exec_program *prs[128];
  fl_err e;
  int i;
  for (i = 0; i < n; i++) prs[i] = jobs[i].pr;
  if (n && exec_compile_batch(prs, n, &e) != FL_OK) printf("# batch compile failed: %s\n", e.msg);
  for (i = 0; i < n; i++) {
    if (check(jobs[i].what, jobs[i].g, jobs[i].pr, 1, jobs[i].tol)) covered[jobs[i].op] = 1;
    exec_program_free(jobs[i].pr);
    ir_free(jobs[i].g);
  }
}

static void test_every_op(void) {
  static const fl_dtype dts[] = {FL_F32, FL_F16, FL_BF16, FL_I64, FL_F64};
  static opjob jobs[128];
  int covered[OP_COUNT], op, d, epi, n = 0, nops = 0;
  char prefix[32];
  fl_err e;
  memset(covered, 0, sizeof covered);
  for (op = 0; op < OP_COUNT; op++)
    for (d = 0; d < 5; d++)
      for (epi = 0; epi < 2; epi++) {
        opjob *j = &jobs[n];
        fuse_plan *p;
        if (!(j->g = fg_op_graph((fl_op)op, dts[d], epi))) continue;
        snprintf(j->what, sizeof j->what, "every op: %s %s%s", op_name((fl_op)op),
                 dtype_name(dts[d]), epi ? " + relu" : "");
        p = fuse_plan_build(j->g, NULL, &e);
        /* a prefix of its own: one batch holds an op in every dtype, and
        ** kernels are named by op and size */
        snprintf(prefix, sizeof prefix, "op%d_%d_%d_", op, d, epi);
        j->pr = p ? exec_codegen(&cpu_backend, p, prefix, &e) : NULL;
        fuse_plan_free(p);
        if (!j->pr) { ok(0, "%s: %s", j->what, e.msg); ir_free(j->g); continue; }
        j->op = (fl_op)op;
        switch (j->g->nodes[j->g->outputs[0]].meta.dtype) {   /* the result's */
        case FL_F32: j->tol = 1e-4; break;
        case FL_F16: j->tol = 2e-3; break;
        case FL_BF16: j->tol = 1e-2; break;
        default: j->tol = 0; break;                            /* exact */
        }
        if (++n == 128) { run_ops(jobs, n, covered); n = 0; }
      }
  run_ops(jobs, n, covered);
  for (op = 0; op < OP_COUNT; op++) {
    if (covered[op]) nops++;
    else printf("# no passing C program for %s\n", op_name((fl_op)op));
  }
  ok(nops == OP_COUNT, "every op of ops.def runs as generated C, equal to the reference (%d of %d ops)",
     nops, OP_COUNT);
}

/* a chain with broadcasting, a transpose and narrow views */
static ir_graph *views(int64_t a, int64_t b) {
  ir_graph *g = ir_new();
  int x = fg_input(g, fg_meta(FL_F32, 2, a, b));
  int y = fg_input(g, fg_meta(FL_F32, 2, b, a));
  int r = fg_input(g, fg_meta(FL_F32, 1, a));
  op_attrs at;
  int t, n, z;
  op_attrs_init(OP_NARROW, &at);
  at.i[0] = 1; at.i[1] = 1; at.i[2] = a - 1;
  t = fg_transpose(g, y, 0, 1);                         /* [a, b] */
  z = fg_bin(g, OP_MUL, fg_un(g, OP_TANH, x), t);
  z = fg_bin(g, OP_ADD, z, fg_un(g, OP_SIGMOID, fg_transpose(g, fg_bin(g, OP_SUB, y, r), 0, 1)));
  n = fg_attr(g, OP_NARROW, &y, 1, &at);                /* [b, a-1] */
  ir_add_output(g, z, NULL);
  ir_add_output(g, fg_un(g, OP_EXP, n), NULL);
  return g;
}

/* calls of the cache's while-linking hook */
static int n_linking;
static void count_linking(void) { n_linking++; }

static int count_files(const char *dir, const char *suffix) {
  DIR *d = opendir(dir);
  struct dirent *de;
  int n = 0;
  if (!d) return 0;
  while ((de = readdir(d))) {
    size_t a = strlen(de->d_name), b = strlen(suffix);
    n += a > b && strcmp(de->d_name + a - b, suffix) == 0 && strncmp(de->d_name, "tmp-", 4);
  }
  closedir(d);
  return n;
}

static exec_program *program_for(ir_graph *g) {
  fl_err e;
  fuse_plan *p = fuse_plan_build(g, NULL, &e);
  exec_program *pr = p ? exec_codegen(&cpu_backend, p, NULL, &e) : NULL;
  fuse_plan_free(p);
  return pr;
}

int main(void) {
  static const int64_t shapes[][2] = {{1, 1}, {1, 7}, {7, 1}, {3, 5}, {64, 128}, {33, 1023}, {1024, 9}};
  char tmpl[] = "/tmp/fl-cache-test-XXXXXX", *cdir;
  size_t s;
  fl_err e;
  srand(1234);
  cdir = mkdtemp(tmpl);
  setenv("FUSELAB_CACHE_DIR", cdir, 1);
  cache_reset_dir();

  for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int64_t r = shapes[s][0], c = shapes[s][1];
    char w[96];
    snprintf(w, sizeof w, "softmax %lldx%lld", (long long)r, (long long)c);
    both(w, fg_softmax(r, c, 0, 0), 1e-4);
    snprintf(w, sizeof w, "softmax decomposed %lldx%lld", (long long)r, (long long)c);
    both(w, fg_softmax(r, c, 1, 0), 1e-4);
    snprintf(w, sizeof w, "log_softmax decomposed %lldx%lld", (long long)r, (long long)c);
    both(w, fg_softmax(r, c, 1, 1), 1e-4);
    snprintf(w, sizeof w, "layer_norm %lldx%lld", (long long)r, (long long)c);
    if (c > 1) both(w, fg_norm(r, c, 0, 0), 1e-3);
    snprintf(w, sizeof w, "layer_norm decomposed %lldx%lld", (long long)r, (long long)c);
    if (c > 1) both(w, fg_norm(r, c, 1, 0), 1e-3);
    snprintf(w, sizeof w, "rms_norm %lldx%lld", (long long)r, (long long)c);
    both(w, fg_norm(r, c, 0, 1), 1e-3);
    snprintf(w, sizeof w, "rms_norm decomposed %lldx%lld", (long long)r, (long long)c);
    both(w, fg_norm(r, c, 1, 1), 1e-3);
    snprintf(w, sizeof w, "views and broadcasting %lldx%lld", (long long)r, (long long)c);
    if (c > 1) both(w, views(r, c), 1e-4);
  }
  test_every_op();
  both("MLP 16x32x64", fg_mlp(16, 32, 64), 1e-3);
  both("conv-bn-relu 2x3x8x8 -> 4", fg_conv_bn_relu(2, 3, 4, 8), 1e-3);
  both("transformer block 2x8x16", fg_block(2, 8, 16), 2e-3);
  both("transformer block 2x8x16, 4 heads", fg_block_heads(2, 8, 16, 4), 2e-3);

  /* the source reads: named kernels, node comments, OpenMP, simd */
  {
    ir_graph *g = fg_softmax(4096, 1024, 1, 0);
    exec_program *pr = program_for(g);
    const char *src = pr ? exec_program_source(pr) : "";
    ok(strstr(src, "fused_amax_sub_exp_sum_div_4096x1024") != NULL, "kernel named after what it does");
    ok(strstr(src, "%3 = exp(%2)") != NULL, "header comment names the graph nodes");
    ok(strstr(src, "#pragma omp parallel for") && strstr(src, "#pragma omp simd reduction(+:"),
       "rows in parallel, reductions vectorized without atomics");
    ok(!strstr(src, "4096") || strstr(src, "4096x1024"), "sizes are arguments, not literals");
    ok(strstr(src, "const int64_t ns = (nr + 15) & ~(int64_t)15;") && strstr(src, "* ns + j1]"),
       "row scratch rows start on a 64-byte line (the launcher's CPU_SCRATCH_STRIDE)");
    exec_program_free(pr);
    ir_free(g);
  }

  /* one compiled program serves every size of a symbolic dim */
  {
    ir_graph *g = ir_new();
    fl_meta m = fg_meta(FL_F32, 2, (int64_t)64, (int64_t)100);
    int x, y, r;
    exec_program *pr;
    static const int64_t rows[] = {7, 1000, 2};
    size_t t;
    x = ir_add_input(g, &m, "x", &e);
    g->nodes[x].sym[0] = 1;
    g->nsyms = 1;
    y = fg_bin(g, OP_MUL, fg_un(g, OP_EXP, x), fg_red(g, OP_SUM, x, 1, 1));
    ir_add_output(g, y, NULL);
    pr = program_for(g);
    ok(pr && strstr(exec_program_source(pr), "_s0x100") != NULL, "kernel name shows the symbolic dim");
    for (t = 0; pr && t < sizeof rows / sizeof rows[0]; t++) {
      fl_tensor in, got[1], want[1];
      const fl_tensor *inp[1] = {&in};
      fl_meta mm = fg_meta(FL_F32, 2, rows[t], (int64_t)100);
      memset(got, 0, sizeof got); memset(want, 0, sizeof want);
      ten_empty(&in, &mm, &e);
      fill(&in, -1, 1);
      r = exec_program_run(pr, inp, 1, got, &e);
      if (r == FL_OK) r = ir_run(g, ref_apply, inp, 1, want, &e);
      ok(r == FL_OK && compare(&got[0], &want[0], 1e-4) <= 1, "symbolic rows = %lld: same program, right values%s%s",
         (long long)rows[t], r ? ": " : "", r ? e.msg : "");
      ten_release(&in); ten_release(&got[0]); ten_release(&want[0]);
    }
    is_int(pr ? pr->how : -1, CACHE_COMPILED, "compiled once");
    exec_program_free(pr);
    ir_free(g);
  }

  /* a graph with no ops (returns its input) and one whose output is a view */
  {
    ir_graph *g = ir_new();
    int x = fg_input(g, fg_meta(FL_F32, 2, (int64_t)3, (int64_t)4));
    ir_add_output(g, x, NULL);
    both("no ops: the input returned", g, 1e-6);
    g = ir_new();
    x = fg_input(g, fg_meta(FL_F32, 2, (int64_t)3, (int64_t)4));
    ir_add_output(g, fg_transpose(g, fg_un(g, OP_EXP, x), 0, 1), NULL);
    ir_add_output(g, fg_transpose(g, x, 0, 1), NULL);
    both("outputs that are views", g, 1e-6);
  }
  run_pending();

  /* compiler failures: CC=false, a compiler that does not exist */
  {
    ir_graph *g = fg_softmax(3, 11, 0, 0);
    const char *bad[] = {"false", "/nonexistent/bin/cc"};
    int i;
    for (i = 0; i < 2; i++) {
      exec_program *pr = program_for(g);
      int rc;
      setenv("CC", bad[i], 1);
      rc = exec_program_compile(pr, &e);
      is_int(rc, FL_ECOMPILE, "CC=%s gives FL_ECOMPILE", bad[i]);
      if (i == 1) ok(strstr(exec_program_log(pr), "nonexistent") != NULL, "the log keeps the shell's complaint: %s", exec_program_log(pr));
      else ok(strstr(e.msg, "failed") != NULL, "message: %s", e.msg);
      unsetenv("CC");
      exec_program_free(pr);
    }
    ir_free(g);
  }

  /* cache: cold compile, memory hit, disk hit after forgetting memory,
  ** corrupt entry rebuilt */
  {
    ir_graph *g = fg_softmax(5, 13, 1, 1);
    exec_program *a = program_for(g), *b = program_for(g), *c = program_for(g), *d = program_for(g);
    cache_info ci;
    char path[1400];
    FILE *f;
    fl_err e2;
    cache_clear(&e);
    is_int(exec_program_compile(a, &e), FL_OK, "cold compile");
    is_int(a->how, CACHE_COMPILED, "cold: the compiler ran");
    is_int(exec_program_compile(b, &e), FL_OK, "second compile");
    is_int(b->how, CACHE_MEMORY, "second: from memory");
    cache_forget_memory();
    is_int(exec_program_compile(c, &e), FL_OK, "after forgetting memory");
    is_int(c->how, CACHE_DISK, "warm: from disk, as a new process would");
    ok(c->compile_ms < 200, "warm load took %.1f ms", c->compile_ms);
    cache_get_info(&ci, &e2);
    ok(ci.entries >= 1 && ci.bytes > 0 && strcmp(ci.dir, cdir) == 0,
       "cache_info: %lld entries, %lld bytes in %s", (long long)ci.entries, (long long)ci.bytes, ci.dir);
    /* truncate every entry: the next load must notice and rebuild (the
    ** objects are unloaded first: a mapped file must not shrink under us) */
    exec_program_free(a); exec_program_free(b); exec_program_free(c);
    a = b = c = NULL;
    cache_forget_memory();
    {
      DIR *dd = opendir(cdir);
      struct dirent *de;
      while (dd && (de = readdir(dd))) {
        size_t l = strlen(de->d_name);
        if (l > 3 && strcmp(de->d_name + l - 3, ".so") == 0) {
          snprintf(path, sizeof path, "%s/%s", cdir, de->d_name);
          truncate(path, 1000);
        }
      }
      if (dd) closedir(dd);
    }
    is_int(exec_program_compile(d, &e), FL_OK, "corrupt entry: compile succeeds");
    is_int(d->how, CACHE_COMPILED, "corrupt entry: rebuilt, not loaded");
    /* a foreign object under the right name: also rebuilt */
    exec_program_free(d);
    cache_forget_memory();
    f = fopen(path, "w");
    if (f) { fputs("not an ELF file at all", f); fclose(f); }
    d = program_for(g);
    is_int(exec_program_compile(d, &e), FL_OK, "foreign entry: compile succeeds");
    is_int(d->how, CACHE_COMPILED, "foreign entry: rebuilt");
    is_int(cache_clear(&e), FL_OK, "cache_clear");
    is_int(count_files(cdir, ".so"), 0, "cache_clear removed the entries");
    exec_program_free(a); exec_program_free(b); exec_program_free(c); exec_program_free(d);
    ir_free(g);
  }

  /* two processes compiling the same graph at once both succeed */
  {
    ir_graph *g = fg_norm(9, 31, 0, 0);
    pid_t kids[2];
    int i, st, good = 1;
    cache_clear(&e);
    for (i = 0; i < 2; i++) {
      kids[i] = fork();
      if (kids[i] == 0) {
        exec_program *pr = program_for(g);
        fl_err e3;
        int rc = pr ? exec_program_compile(pr, &e3) : -1;
        _exit(rc == FL_OK ? 0 : 1);
      }
    }
    for (i = 0; i < 2; i++) {
      if (waitpid(kids[i], &st, 0) != kids[i] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) good = 0;
    }
    ok(good, "two processes compiling at once both succeed");
    is_int(count_files(cdir, ".so"), 1, "one entry in the cache after both");
    ir_free(g);
  }

  /* several compile units: compiled at once as separate translation units
  ** and linked; same key as the whole text; a unit may call another's
  ** function; a broken unit fails the whole with its message in the log;
  ** no temp file is left behind either way */
  {
    const char *head = "#include <stdint.h>\nstatic inline int twice(int x) { return 2 * x; }\n";
    const char *units[3] = {"int u_a(int x) { return twice(x) + 1; }\n",
                            "int u_a(int);\nint u_b(int x) { return u_a(x) * 10; }\n",
                            "int u_c(void) { return 7; }\n"};
    const char *broken[2] = {"int u_d(void) { return 1; }\n", "int u_e(void) { return nope; }\n"};
    char whole[512];
    cache_obj *o = NULL, *o2 = NULL;
    char *log = NULL;
    int how = -1;
    int (*ub)(int);
    cache_clear(&e);
    cache_while_linking(count_linking);
    n_linking = 0;
    is_int(cache_load_units(head, units, 3, &o, &log, &how, &e), FL_OK, "units: compiled and linked");
    is_int(how, CACHE_COMPILED, "units: the compiler ran");
    is_int(n_linking, 1, "the while-linking hook ran once for the compile");
    ub = (int (*)(int))cache_sym(o, "u_b");
    ok(ub && ub(4) == 90 && cache_sym(o, "u_c"), "units: one unit calls another's function");
    free(log);
    log = NULL;
    snprintf(whole, sizeof whole, "%s%s%s%s", head, units[0], units[1], units[2]);
    is_int(cache_load(whole, &o2, NULL, &how, &e), FL_OK, "the whole text as one source");
    is_int(how, CACHE_MEMORY, "the same key as its units");
    is_int(n_linking, 1, "and not for a hit");
    cache_release(o);
    cache_release(o2);
    is_int(cache_load_units(head, broken, 2, &o, &log, &how, &e), FL_ECOMPILE, "a broken unit fails");
    ok(log && strstr(log, "nope"), "its error is in the log: %.60s", log ? log : "(none)");
    is_int(n_linking, 1, "nor when a part fails before the link");
    free(log);
    log = NULL;
    is_int(cache_load("int one_unit(void) { return 3; }\n", &o, &log, &how, &e), FL_OK, "one source");
    is_int(n_linking, 2, "the hook ran while its only compile did");
    cache_release(o);
    cache_while_linking(NULL);
    free(log);
    is_int(count_files(cdir, ".o") + count_files(cdir, ".log"), 0, "no object or log files left");
    {
      DIR *dd = opendir(cdir);
      struct dirent *de;
      int tmp = 0;
      while (dd && (de = readdir(dd))) tmp += strncmp(de->d_name, "tmp-", 4) == 0;
      if (dd) closedir(dd);
      is_int(tmp, 0, "no temp files left");
    }
  }

  /* blobs: read only from a regular file owned by the user; a FIFO at the
  ** path does not block, a symlink is not followed (its target is kept) */
  {
    const char *parts[1] = {"blob test"};
    char key[33], path[1400], victim[1400];
    void *data = NULL;
    size_t n = 0;
    FILE *f;
    cache_blob_key(parts, 1, key);
    is_int(cache_put_blob(key, "bin", "payload", 7, &e), FL_OK, "blob: written");
    ok(cache_get_blob(key, "bin", &data, &n) && n == 7 && memcmp(data, "payload", 7) == 0,
       "blob: read back");
    free(data);
    snprintf(path, sizeof path, "%s/%s.bin", cdir, key);
    unlink(path);
    ok(mkfifo(path, 0600) == 0, "blob: a FIFO at its path");
    ok(!cache_get_blob(key, "bin", &data, &n), "blob: a FIFO is not a blob, and did not block");
    snprintf(victim, sizeof victim, "%s/../fl-blob-victim-%ld", cdir, (long)getpid());
    if ((f = fopen(victim, "w"))) { fputs("precious", f); fclose(f); }
    unlink(path);
    ok(symlink(victim, path) == 0, "blob: a symlink at its path");
    ok(!cache_get_blob(key, "bin", &data, &n), "blob: a symlink is not followed");
    is_int(cache_put_blob(key, "bin", "payload", 7, &e), FL_OK, "blob: written again");
    {
      char buf[32] = "";
      struct stat lst;
      if ((f = fopen(victim, "r"))) { if (!fgets(buf, sizeof buf, f)) buf[0] = '\0'; fclose(f); }
      ok(strcmp(buf, "precious") == 0 && lstat(path, &lst) == 0 && S_ISREG(lst.st_mode),
         "blob: the link's target is untouched, the blob a file of its own");
    }
    unlink(victim);
    is_int(cache_clear_blobs("bin"), 1, "blob: cleared");
  }

  /* per-kernel timing: off by default, counts while on, each kernel's
  ** time within the run's wall time, results unchanged */
  {
    ir_graph *g = fg_block(2, 8, 16);
    exec_program *pr = program_for(g);
    fl_tensor in, a[1], b[1];
    const fl_tensor *inp[1] = {&in};
    double sum = 0, wall;
    struct timespec t0, t1;
    int k, r = 0;
    memset(a, 0, sizeof a); memset(b, 0, sizeof b);
    ten_empty(&in, &g->nodes[0].meta, &e);
    fill(&in, -1, 1);
    r |= exec_program_run(pr, inp, 1, a, &e);
    ok(r == FL_OK && pr->kernel_ms == NULL && pr->profiled_runs == 0, "profile: off by default");
    r |= exec_program_set_profile(pr, 1, &e);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    r |= exec_program_run(pr, inp, 1, b, &e);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    wall = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    for (k = 0; r == FL_OK && k < pr->plan->nkernels; k++) sum += pr->last_ms[k];
    ok(r == FL_OK && pr->profiled_runs == 1 && sum > 0 && sum <= wall,
       "profile: %d kernels timed, %.3f ms of a %.3f ms run", pr->plan->nkernels, sum, wall);
    ok(r == FL_OK && compare(&a[0], &b[0], 0) == 0, "profile: same results");
    exec_program_set_profile(pr, 0, &e);
    ten_release(&b[0]);
    r |= exec_program_run(pr, inp, 1, b, &e);
    is_int((int)pr->profiled_runs, 1, "profile: off again, nothing counted");
    ten_release(&in); ten_release(&a[0]); ten_release(&b[0]);
    exec_program_free(pr);
    ir_free(g);
  }

  /* an unwritable cache dir falls back to a private temp dir, warning */
  {
    ir_graph *g = fg_softmax(2, 3, 0, 0);
    exec_program *pr;
    setenv("FUSELAB_CACHE_DIR", "/dev/null/fuselab", 1);
    cache_reset_dir();
    pr = program_for(g);
    is_int(exec_program_compile(pr, &e), FL_OK, "compiles with an unusable cache dir");
    ok(cache_warning() != NULL && strstr(cache_warning(), "/dev/null/fuselab"),
       "warning: %s", cache_warning() ? cache_warning() : "(none)");
    exec_program_free(pr);
    ir_free(g);
    {
      cache_info ci;
      cache_get_info(&ci, &e);
      cache_clear(&e);
      if (strncmp(ci.dir, "/tmp/fuselab-cache-", 19) == 0) rmdir(ci.dir);
    }
    setenv("FUSELAB_CACHE_DIR", cdir, 1);
    cache_reset_dir();
  }
  cache_clear(&e);
  rmdir(cdir);
  return tap_done();
}
