/*
** compile.c -- programs: source assembly, compilation through the cache,
** and running kernels on tensors.
** Invariant: a kernel is only called with buffers that exist and are
** contiguous in the shapes the launch metadata says (inputs are made
** contiguous first, every stored value is allocated from its re-inferred
** shape), with the arguments fk_bind computed for exactly those shapes.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "program.h"
#include "../fuse/render.h"
#include "codegen.h"
#include "eager.h"
#include "../graph/rng.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* the body of a program whose every step is extern */
static const char no_kernels[] = "/* no generated kernels: every step is extern */\n";

cpu_program *cpu_codegen_prefixed(const fuse_plan *p, const char *prefix, fl_err *e) {
  cpu_program *pr = calloc(1, sizeof *pr);
  strbuf b, all;
  int k;
  if (!pr) { err_set(e, FL_ENOMEM, "codegen: out of memory"); return NULL; }
  cpu_c_ident(prefix ? prefix : "fl_", pr->prefix, sizeof pr->prefix);
  pr->plan = fuse_plan_ref((fuse_plan *)p);   /* counted, not modified */
  pr->syms = calloc((size_t)(p->nkernels ? p->nkernels : 1), sizeof *pr->syms);
  pr->fns = calloc((size_t)(p->nkernels ? p->nkernels : 1), sizeof *pr->fns);
  pr->ktext = calloc((size_t)(p->nkernels ? p->nkernels : 1), sizeof *pr->ktext);
  pr->scratch = calloc((size_t)(p->nkernels ? p->nkernels : 1), sizeof *pr->scratch);
  if (!pr->syms || !pr->fns || !pr->ktext || !pr->scratch) goto oom;
  memset(&b, 0, sizeof b);
  memset(&all, 0, sizeof all);
  for (k = 0; k < p->nkernels; k++) {
    char sym[200];
    snprintf(sym, sizeof sym, "%sk%d_%s", pr->prefix, k, p->kernels[k].name);
    cpu_c_ident(sym, sym, sizeof sym);
    strbuf kb;
    memset(&kb, 0, sizeof kb);
    if (cpu_emit_kernel(&kb, p, k, sym, &pr->scratch[k])) {
      if (!(pr->syms[k] = dupstr(sym)) || !(pr->ktext[k] = strbuf_take(&kb))) goto oom;
      strbuf_printf(&b, "%s", pr->ktext[k]);
    }
    strbuf_free(&kb);
  }
  if (!b.p && !b.oom) strbuf_printf(&b, "%s", no_kernels);
  if (b.oom) { strbuf_free(&b); goto oom; }
  pr->body = strbuf_take(&b);
  cpu_emit_preamble(&all);
  strbuf_printf(&all, "%s", pr->body ? pr->body : "");
  pr->source = strbuf_take(&all);
  if (!pr->body || !pr->source) goto oom;
  return pr;
oom:
  cpu_program_free(pr);
  err_set(e, FL_ENOMEM, "codegen: out of memory");
  return NULL;
}

cpu_program *cpu_codegen(const fuse_plan *p, fl_err *e) {
  return cpu_codegen_prefixed(p, "fl_", e);
}

const char *cpu_program_source(const cpu_program *pr) { return pr->source; }
const char *cpu_program_log(const cpu_program *pr) { return pr->log ? pr->log : ""; }

/* Resolve every kernel symbol in the loaded object. */
static int resolve(cpu_program *pr, fl_err *e) {
  int k;
  for (k = 0; k < pr->plan->nkernels; k++) {
    if (!pr->syms[k]) continue;
    pr->fns[k] = cache_sym(pr->obj, pr->syms[k]);
    if (!pr->fns[k])
      return err_set(e, FL_ECOMPILE, "compile: kernel %s missing from the object", pr->syms[k]);
  }
  return FL_OK;
}


/* The kernels of several programs as compile units, one per distinct
** kernel: a kernel identical to an earlier one becomes an alias of it, in
** the earlier one's unit (random graphs, repeated layers). */
static int batch_units(cpu_program **prs, int n, strbuf **units_out, int *nunits) {
  strbuf *units = NULL;
  char **keys = NULL;
  const char **first = NULL;
  int nk = 0, cap = 0, i, k, j, oom = 0;
  for (i = 0; i < n && !oom; i++)
    for (k = 0; k < prs[i]->plan->nkernels && !oom; k++) {
      char *key;
      if (!prs[i]->ktext[k]) continue;
      if (!(key = fk_kernel_key(prs[i]->ktext[k], prs[i]->syms[k]))) { oom = 1; break; }
      for (j = 0; j < nk; j++) if (strcmp(keys[j], key) == 0) break;
      if (j < nk) {
        strbuf_printf(&units[j], "void %s(void **restrict buf, const int64_t *restrict arg)\n"
                      "  __attribute__((alias(\"%s\")));   /* same code as %s */\n\n",
                      prs[i]->syms[k], first[j], first[j]);
        free(key);
        continue;
      }
      if (nk == cap) {
        cap = cap ? 2 * cap : 64;
        keys = realloc(keys, (size_t)cap * sizeof *keys);
        first = realloc(first, (size_t)cap * sizeof *first);
        units = realloc(units, (size_t)cap * sizeof *units);
        if (!keys || !first || !units) { oom = 1; free(key); break; }
      }
      keys[nk] = key;
      first[nk] = prs[i]->syms[k];
      memset(&units[nk], 0, sizeof units[nk]);
      strbuf_printf(&units[nk++], "%s", prs[i]->ktext[k]);
    }
  for (j = 0; j < nk; j++) { free(keys[j]); oom |= units[j].oom; }
  free(keys);
  free(first);
  *units_out = units;
  *nunits = nk;
  return oom;
}

/* Compile head + units through the cache into every program given. */
static int load_into(cpu_program **prs, int n, const char *const *units, int nunits, fl_err *e) {
  cache_obj *obj = NULL;
  char *log = NULL;
  strbuf head;
  double t0 = now_ms();
  int i, rc, how = 0;
  const char *none = no_kernels;
  memset(&head, 0, sizeof head);
  cpu_emit_preamble(&head);
  if (head.oom) { strbuf_free(&head); return err_set(e, FL_ENOMEM, "compile: out of memory"); }
  rc = nunits ? cache_load_units(head.p, units, nunits, &obj, &log, &how, e)
              : cache_load_units(head.p, &none, 1, &obj, &log, &how, e);
  strbuf_free(&head);
  for (i = 0; i < n; i++) {
    cpu_program *pr = prs[i];
    free(pr->log);
    pr->log = log ? dupstr(log) : NULL;
    cache_release(pr->obj);
    pr->obj = NULL;
    pr->how = how;
    pr->compile_ms = now_ms() - t0;
    if (rc == FL_OK) {
      pr->obj = cache_retain(obj);
      if ((rc = resolve(pr, e)) != FL_OK) break;
    }
  }
  cache_release(obj);
  free(log);
  return rc;
}

int cpu_compile_batch(cpu_program **prs, int n, fl_err *e) {
  strbuf *units = NULL;
  const char **texts;
  int i, nunits = 0, rc;
  if (batch_units(prs, n, &units, &nunits) ||
      !(texts = malloc((size_t)(nunits > 0 ? nunits : 1) * sizeof *texts))) {
    for (i = 0; i < nunits; i++) strbuf_free(&units[i]);
    free(units);
    return err_set(e, FL_ENOMEM, "compile: out of memory");
  }
  for (i = 0; i < nunits; i++) texts[i] = units[i].p;
  rc = load_into(prs, n, texts, nunits, e);
  for (i = 0; i < nunits; i++) strbuf_free(&units[i]);
  free(units);
  free(texts);
  return rc;
}

int cpu_program_compile(cpu_program *pr, fl_err *e) {
  int k, n = 0, rc, nk = pr->plan->nkernels > 0 ? pr->plan->nkernels : 1;
  const char **texts = malloc((size_t)nk * sizeof *texts);
  if (!texts) return err_set(e, FL_ENOMEM, "compile: out of memory");
  for (k = 0; k < pr->plan->nkernels; k++)
    if (pr->ktext[k]) texts[n++] = pr->ktext[k];
  rc = load_into(&pr, 1, texts, n, e);
  free(texts);
  return rc;
}

void cpu_program_free(cpu_program *pr) {
  int k;
  if (!pr) return;
  if (pr->syms && pr->plan)
    for (k = 0; k < pr->plan->nkernels; k++) free(pr->syms[k]);
  if (pr->ktext && pr->plan)
    for (k = 0; k < pr->plan->nkernels; k++) free(pr->ktext[k]);
  free(pr->syms);
  free(pr->ktext);
  free(pr->scratch);
  free(pr->fns);
  free(pr->body);
  free(pr->source);
  free(pr->log);
  cache_release(pr->obj);
  if (pr->slots && pr->plan)
    for (k = 0; k < pr->plan->nslots; k++) ten_release(&pr->slots[k]);
  free(pr->slots);
  free(pr->bound_in);
  free(pr->bound_metas);
  free(pr->bound_args);
  free(pr->kernel_ms);
  free(pr->last_ms);
  fuse_plan_free(pr->plan);
  free(pr);
}

/* --- running ------------------------------------------------------------ */

int cpu_program_set_profile(cpu_program *pr, int on, fl_err *e) {
  size_t n = (size_t)(pr->plan->nkernels > 0 ? pr->plan->nkernels : 1);
  pr->profile = 0;
  if (!on) return FL_OK;
  if (!pr->kernel_ms) pr->kernel_ms = calloc(n, sizeof *pr->kernel_ms);
  if (!pr->last_ms) pr->last_ms = calloc(n, sizeof *pr->last_ms);
  if (!pr->kernel_ms || !pr->last_ms) return err_set(e, FL_ENOMEM, "profile: out of memory");
  memset(pr->kernel_ms, 0, n * sizeof *pr->kernel_ms);
  memset(pr->last_ms, 0, n * sizeof *pr->last_ms);
  pr->profiled_runs = 0;
  pr->profile = 1;
  return FL_OK;
}

void cpu_program_print_profile(const cpu_program *pr, FILE *f, const char *indent) {
  int k;
  if (!pr->last_ms || !pr->profiled_runs) return;
  for (k = 0; k < pr->plan->nkernels; k++) {
    const fk_kernel *kr = &pr->plan->kernels[k];
    double ms = pr->last_ms[k];
    fprintf(f, "%sk%-3d %-44s %9.3f ms", indent, k, kr->name, ms);
    if (ms > 0 && kr->bytes > 0) fprintf(f, "  %7.2f GB/s", (double)kr->bytes / (ms * 1e6));
    fputc('\n', f);
  }
}


/* The value of node id as a tensor: its buffer, or a view of one built
** with the eager kernels (for extern inputs). */
static int value_of(const ir_graph *g, fl_tensor *vals, int id, fl_err *e) {
  const ir_node *nd = &g->nodes[id];
  const fl_tensor *arg;
  int rc;
  if (vals[id].st) return FL_OK;
  if (nd->kind != IR_OP || !fk_is_view(g, id) || nd->in[0] < 0)
    return err_set(e, FL_EINVAL, "run: %%%d has no value (plan out of order)", id);
  if ((rc = value_of(g, vals, nd->in[0], e)) != FL_OK) return rc;
  arg = &vals[nd->in[0]];
  return eager_apply(nd->op, &arg, 1, &nd->attrs, &vals[id], e);
}

/* A buffer for stored node id: a view of its memory-plan slot (grown when
** these shapes need more), or a fresh tensor for graph outputs. */
static int buffer_for(cpu_program *pr, int id, const fl_meta *m, fl_tensor *out, fl_err *e) {
  const fuse_plan *p = pr->plan;
  int s = p->slot[id], rc;
  size_t need;
  fl_tensor *st;
  /* ten_empty names a size no buffer can hold */
  if (s < 0 || s >= p->nslots || !sz_bytes(meta_numel(m), dtype_size(m->dtype), &need))
    return ten_empty(out, m, e);
  if (!pr->slots && !(pr->slots = calloc((size_t)p->nslots, sizeof *pr->slots)))
    return err_set(e, FL_ENOMEM, "run: out of memory");
  st = &pr->slots[s];
  if (!st->st || st->st->nbytes < need) {
    fl_meta bm;
    memset(&bm, 0, sizeof bm);
    bm.dtype = FL_BOOL;
    bm.ndim = 1;
    bm.shape[0] = (int64_t)(need ? need : 1);
    ten_release(st);
    if ((rc = ten_empty(st, &bm, e)) != FL_OK) return rc;
  }
  ten_share(out, st);
  out->m = *m;
  out->offset = 0;
  ten_set_contiguous_strides(out);
  return FL_OK;
}

/* The extern op of kernel k (a product), written into its planned buffer:
** the same memory every call, no fresh pages. */
static int run_extern(cpu_program *pr, const fk_kernel *k, const fl_meta *metas,
                      fl_tensor *vals, fl_err *e) {
  const ir_graph *g = pr->plan->g;
  const ir_node *nd = &g->nodes[k->anchor];
  const fl_tensor *args[64];
  fl_tensor t;
  int i, rc;
  memset(&t, 0, sizeof t);
  for (i = 0; i < nd->nin && i < 64; i++) {
    args[i] = NULL;
    if (nd->in[i] < 0) continue;
    if ((rc = value_of(g, vals, nd->in[i], e)) != FL_OK) return rc;
    args[i] = &vals[nd->in[i]];
  }
  /* the target: the caller's output tensor when it was given one, else
  ** the planned slot (fresh memory for graph outputs) */
  if (vals[k->anchor].st) ten_share(&t, &vals[k->anchor]);
  else if (pr->plan->slot[k->anchor] >= 0 &&
           (rc = buffer_for(pr, k->anchor, &metas[k->anchor], &t, e)) != FL_OK)
    return rc;
  if ((rc = eager_apply_into(nd->op, args, nd->nin, &nd->attrs, &t, e)) != FL_OK) return rc;
  if (t.st != vals[k->anchor].st) {
    ten_release(&vals[k->anchor]);
    rc = ten_contiguous(&vals[k->anchor], &t, e);
  }
  ten_release(&t);
  return rc;
}

static int run_kernel(cpu_program *pr, int ki, const fl_meta *metas, fl_tensor *vals,
                      const int64_t *args, fl_err *e) {
  const ir_graph *g = pr->plan->g;
  const fk_kernel *k = &pr->plan->kernels[ki];
  void *bufs[257];
  void *scratch = NULL;
  int i, rc;
  if (k->kind == FK_EXTERN && (rc = run_extern(pr, k, metas, vals, e)) != FL_OK) return rc;
  if (k->nnodes == 0) return FL_OK;
  if (!pr->fns[ki]) return err_set(e, FL_EUNSUPPORTED, "%s: no generated code", k->name);
  if (k->nbufs > 256) return err_set(e, FL_EUNSUPPORTED, "%s: too many buffers", k->name);
  for (i = 0; i < k->nacc; i++) {
    int id = k->acc[i].node;
    if (!k->acc[i].store || vals[id].st) continue;
    if ((rc = buffer_for(pr, id, &metas[id], &vals[id], e)) != FL_OK) return rc;
  }
  for (i = 0; i < k->nbufs; i++) {
    int id = k->bufs[i];
    if (!vals[id].st && (rc = value_of(g, vals, id, e)) != FL_OK) return rc;
    bufs[i] = ten_data(&vals[id]);
  }
  if (pr->scratch[ki]) {
    /* the reduced elements of one row, per value kept, per thread */
    int64_t nr = 1;
    int d, threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    for (d = k->nkept; d < k->nkept + k->nred; d++) nr *= args[d];
    scratch = malloc((size_t)threads * (size_t)pr->scratch[ki] * (size_t)(nr ? nr : 1) * sizeof(float));
    if (!scratch)
      return err_set(e, FL_ENOMEM, "%s: cannot allocate its row scratch (%d x %lld floats)",
                     k->name, threads * pr->scratch[ki], (long long)nr);
  }
  bufs[k->nbufs] = scratch;
  ((cpu_kernel_fn)pr->fns[ki])(bufs, args);
  free(scratch);
  return FL_OK;
}

/* Shapes and kernel arguments for these inputs, computed once per set of
** input shapes: the same shapes again (a loop, a steady-state service)
** reuse the last binding, so a call costs the kernels and little else. */
static int bind(cpu_program *pr, const fl_tensor *const *inputs, fl_err *e) {
  const fuse_plan *p = pr->plan;
  const ir_graph *g = p->g;
  int i, k, rc, same = pr->bound_in != NULL && pr->bound_in[0].ndim >= 0;
  for (i = 0; i < g->ninputs && same; i++) {
    fl_meta m = inputs[i]->m;
    m.wrapped = 0;
    same = memcmp(&m, &pr->bound_in[i], sizeof m) == 0;
  }
  if (same) return FL_OK;
  if (!pr->bound_metas) {
    pr->maxargs = 1;
    for (k = 0; k < p->nkernels; k++)
      if (fk_nargs(&p->kernels[k]) > pr->maxargs) pr->maxargs = fk_nargs(&p->kernels[k]);
    pr->bound_in = calloc((size_t)(g->ninputs ? g->ninputs : 1), sizeof *pr->bound_in);
    pr->bound_metas = malloc((size_t)(g->n ? g->n : 1) * sizeof *pr->bound_metas);
    pr->bound_args = malloc((size_t)(p->nkernels ? p->nkernels : 1) * (size_t)pr->maxargs *
                            sizeof *pr->bound_args);
    if (!pr->bound_in || !pr->bound_metas || !pr->bound_args) {
      free(pr->bound_in); free(pr->bound_metas); free(pr->bound_args);
      pr->bound_in = NULL; pr->bound_metas = NULL; pr->bound_args = NULL;
      return err_set(e, FL_ENOMEM, "run: out of memory");
    }
  }
  /* invalid until complete: a failure below leaves no stale binding */
  pr->bound_in[0].ndim = -1;
  if ((rc = ir_infer_metas(g, inputs, FL_DEV_CPU, pr->bound_metas, e)) != FL_OK) return rc;
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kr = &p->kernels[k];
    if (kr->nnodes == 0 || !pr->fns[k]) continue;   /* nothing generated runs */
    if ((rc = fk_bind(kr, g, pr->bound_metas, pr->bound_args + (size_t)k * (size_t)pr->maxargs,
                      e)) != FL_OK)
      return rc;
  }
  pr->bound_in[0].ndim = 0;                   /* valid (no inputs: always) */
  for (i = 0; i < g->ninputs; i++) {
    pr->bound_in[i] = inputs[i]->m;
    pr->bound_in[i].wrapped = 0;
  }
  return FL_OK;
}

static int run(cpu_program *pr, const fl_tensor *const *inputs, int ninputs,
               fl_tensor *outs, int into, fl_err *e);

int cpu_program_run(cpu_program *pr, const fl_tensor *const *inputs, int ninputs,
                    fl_tensor *outs, fl_err *e) {
  return run(pr, inputs, ninputs, outs, 0, e);
}

int cpu_program_run_out(cpu_program *pr, const fl_tensor *const *inputs, int ninputs,
                        fl_tensor *outs, fl_err *e) {
  return run(pr, inputs, ninputs, outs, 1, e);
}

static int run(cpu_program *pr, const fl_tensor *const *inputs, int ninputs,
               fl_tensor *outs, int into, fl_err *e) {
  const fuse_plan *p = pr->plan;
  const ir_graph *g = p->g;
  const fl_meta *metas;
  fl_tensor *vals = NULL;
  char *is_out = NULL;
  uint64_t *start = NULL, key = 0;
  int64_t *rargs = NULL;
  int i, k, rc = FL_OK;
  if (ninputs != g->ninputs)
    return err_set(e, FL_EINVAL, "run: expected %d input(s), got %d", g->ninputs, ninputs);
  for (i = 0; i < ninputs; i++)
    if (!inputs[i] || !inputs[i]->st || inputs[i]->m.device != FL_DEV_CPU)
      return err_set(e, FL_EINVAL, "run: input %d is not a CPU tensor", i + 1);
  if (!pr->obj && (rc = cpu_program_compile(pr, e)) != FL_OK) return rc;
  if ((rc = bind(pr, inputs, e)) != FL_OK) return rc;
  metas = pr->bound_metas;
  vals = calloc((size_t)(g->n ? g->n : 1), sizeof *vals);
  is_out = calloc((size_t)(g->n ? g->n : 1), 1);
  if (!vals || !is_out) { rc = err_set(e, FL_ENOMEM, "run: out of memory"); goto done; }
  for (i = 0; i < g->nout; i++) is_out[g->outputs[i]] = 1;
  /* every run draws anew: each random node reserves its draw in node order
  ** (the order eager code draws in), whichever kernel computes it */
  for (i = 0; i < g->n && rc == FL_OK; i++) {
    if (g->nodes[i].kind != IR_OP || !rng_op(g->nodes[i].op)) continue;
    if (!start) {
      start = calloc((size_t)g->n, sizeof *start);
      rargs = malloc((size_t)pr->maxargs * sizeof *rargs);
      if (!start || !rargs) { rc = err_set(e, FL_ENOMEM, "run: out of memory"); goto done; }
      key = rng_key();
    }
    start[i] = rng_reserve(rng_draws(&metas[i]));
  }
  /* results straight into the caller's tensors where they fit */
  for (i = 0; i < g->nout && into; i++) {
    int id = g->outputs[i];
    const fl_tensor *o = &outs[i];
    if (o->st && g->nodes[id].kind == IR_OP && p->stored[id] && !vals[id].st &&
        o->m.dtype == metas[id].dtype && meta_same_shape(&o->m, &metas[id]) &&
        ten_is_contiguous(o))
      ten_share(&vals[id], o);
  }
  for (i = 0; i < g->n && rc == FL_OK; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind == IR_INPUT) rc = ten_contiguous(&vals[i], inputs[nd->index], e);
    else if (nd->kind != IR_OP) rc = ten_contiguous(&vals[i], &nd->value, e);
  }
  for (k = 0; k < p->nkernels && rc == FL_OK; k++) {
    double t0 = pr->profile ? now_ms() : 0;
    const int64_t *args = pr->bound_args + (size_t)k * (size_t)pr->maxargs;
    if (p->kernels[k].nrng && rargs) {
      memcpy(rargs, args, (size_t)fk_nargs(&p->kernels[k]) * sizeof *rargs);
      fk_rng_args(&p->kernels[k], key, start, rargs);
      args = rargs;
    }
    rc = run_kernel(pr, k, metas, vals, args, e);
    if (pr->profile) {
      pr->last_ms[k] = now_ms() - t0;
      pr->kernel_ms[k] += pr->last_ms[k];
    }
    /* free what no later kernel reads: peak memory as planned */
    for (i = 0; i < g->n && rc == FL_OK; i++)
      if (p->last_use[i] == k && g->nodes[i].kind == IR_OP && !is_out[i]) ten_release(&vals[i]);
  }
  for (i = 0; i < g->nout && rc == FL_OK; i++) {
    int id = g->outputs[i];
    if (!vals[id].st) rc = value_of(g, vals, id, e);
    if (rc != FL_OK) break;
    if (into && outs[i].st) {
      if (outs[i].st != vals[id].st) rc = ten_copy(&outs[i], &vals[id], e);
    } else {
      ten_share(&outs[i], &vals[id]);
    }
  }
  if (rc == FL_OK) pr->runs++;
  if (rc == FL_OK && pr->profile) pr->profiled_runs++;
done:
  if (vals) for (i = 0; i < g->n; i++) ten_release(&vals[i]);
  free(vals); free(is_out); free(start); free(rargs);
  return rc;
}
