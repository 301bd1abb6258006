/*
** program.c -- the executor (program.h): rendering a plan through a
** backend, compiling each distinct kernel once, binding sizes per input
** shapes, and running the kernels on tensors.  Nothing here knows a
** device: what differs is behind exec_backend.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "program.h"
#include "measure.h"
#include "roofline.h"
#include "../fuse/render.h"
#include "../graph/rng.h"
#include "../graph/view.h"
#include "exec/measure.h"

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

void exec_c_ident(const char *s, char *out, size_t n) {
  size_t i = 0;
  if (n == 0) return;
  if (s && (*s >= '0' && *s <= '9') && i + 1 < n) out[i++] = '_';
  for (; s && *s && i + 1 < n; s++) {
    char c = *s;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    out[i++] = ok ? c : '_';
  }
  out[i] = '\0';
}

/* --- values from weights alone ------------------------------------------- */

/* A kernel whose every value is computed from params, consts and sizes
** alone (a batch norm's scale folded into its convolution's weights, a
** mask from fl.arange) gives the same values on every call until a
** param's values or the input shapes change: it runs on the first call
** and then only after such a change, and its values stay in memory of
** their own between calls (a slot would be overwritten by later values).
** This is Inductor's freezing without its price: the weights stay
** params, and a weight written in place (its storage's version moves,
** graph/tensor.h) is seen on the next call.  Which kernels the plan
** decides (fuse/plan.c plan_keep: never random ops nor a value a graph
** output is or views, and only while the memory held fits its peak).
** CPU only: a CUDA graph replays every
** launch it captured.  FUSELAB_KEEP=0 launches every kernel every call
** (to measure the difference). */
static int keep_enabled(void) {
  const char *v = getenv("FUSELAB_KEEP");
  return !(v && strcmp(v, "0") == 0);
}

static int find_kept(exec_program *pr) {
  const fuse_plan *p = pr->plan;
  const ir_graph *g = p->g;
  size_t n = (size_t)(g->n ? g->n : 1);
  char *need = calloc(n, 1);
  int i, j, k, any = 0;
  if (!need) goto oom;
  /* which kernels: the plan's choice (fuse/plan.c plan_keep), which its
  ** memory walk holds from the start */
  if (!(pr->keep = calloc((size_t)(p->nkernels ? p->nkernels : 1), 1))) goto oom;
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kr = &p->kernels[k];
    int ok = p->keep && p->keep[k];
    pr->keep[k] = (char)ok;
    any |= ok;
    for (j = 0; j < kr->nnodes && ok; j++) need[kr->nodes[j]] = 1;
    if (ok && kr->anchor >= 0) need[kr->anchor] = 1;
  }
  if (!any) {
    free(pr->keep);
    pr->keep = NULL;
  } else {
    /* the params they read: only those decide whether the kept are current */
    for (i = g->n - 1; i >= 0; i--)
      for (j = 0; need[i] && g->nodes[i].kind == IR_OP && j < g->nodes[i].nin; j++)
        if (g->nodes[i].in[j] >= 0) need[g->nodes[i].in[j]] = 1;
    pr->kept = calloc(n, sizeof *pr->kept);
    pr->kept_ver = calloc(2 * n, sizeof *pr->kept_ver);
    if (!pr->kept || !pr->kept_ver) goto oom;
    for (i = 0; i < g->n; i++)
      if (g->nodes[i].kind == IR_PARAM && !need[i]) pr->kept_ver[2 * i] = UINT64_MAX;
  }
  free(need);
  return FL_OK;
oom:
  free(need);
  return FL_ENOMEM;
}

int exec_kernel_kept(const exec_program *pr, int k) {
  return pr->keep && k >= 0 && k < pr->plan->nkernels && pr->keep[k];
}

int exec_value_kept(const exec_program *pr, int id) {
  const fuse_plan *p = pr->plan;
  return pr->keep && id >= 0 && id < p->g->n && p->stored[id] && exec_kernel_kept(pr, p->kernel_of[id]);
}

/* 1 when kept[] still holds what the keep kernels would compute now */
static int kept_current(const exec_program *pr) {
  const ir_graph *g = pr->plan->g;
  int i;
  if (!pr->kept_ok) return 0;
  for (i = 0; i < g->n; i++) {
    const fl_storage *st = g->nodes[i].value.st;
    if (g->nodes[i].kind != IR_PARAM || pr->kept_ver[2 * i] == UINT64_MAX) continue;
    if (!st || st->id != pr->kept_ver[2 * i] || st->version != pr->kept_ver[2 * i + 1]) return 0;
  }
  return 1;
}

static void kept_stamp(exec_program *pr) {
  const ir_graph *g = pr->plan->g;
  int i;
  for (i = 0; i < g->n; i++) {
    const fl_storage *st = g->nodes[i].value.st;
    if (g->nodes[i].kind != IR_PARAM || pr->kept_ver[2 * i] == UINT64_MAX) continue;
    pr->kept_ver[2 * i] = st ? st->id : 0;
    pr->kept_ver[2 * i + 1] = st ? st->version : 0;
  }
  pr->kept_ok = 1;
}

/* kernel k's values between kept[] and the run: saved after it ran
** (save), or handed to the run instead of running it */
static void kept_move(exec_program *pr, exec_run *r, int k, int save) {
  const fk_kernel *kr = &pr->plan->kernels[k];
  int j;
  for (j = -1; j < kr->nnodes; j++) {
    int id = j < 0 ? kr->anchor : kr->nodes[j];
    if (id < 0) continue;
    if (save && r->vals[id].st) {
      ten_release(&pr->kept[id]);
      ten_share(&pr->kept[id], &r->vals[id]);
    } else if (!save && pr->kept[id].st && !r->vals[id].st) {
      ten_share(&r->vals[id], &pr->kept[id]);
    }
  }
}

/* --- rendering ---------------------------------------------------------- */

/* 64-bit hash of a kernel's text without comments and its name */
static int text_hash(const char *text, const char *sym, uint64_t *h) {
  char *key = fk_kernel_key(text, sym);
  if (!key) return -1;
  *h = XXH3_64bits(key, strlen(key));
  free(key);
  return 0;
}

/* Kernels of a graph without symbolic sizes may hold their sizes as
** constants: GCC then writes one loop where it wrote several, in about
** half the compile time.  But such a function serves one size, so where a
** structure (its text in argument form) recurs at more than two sizes
** (DenseNet's batch norms, one per channel count) it stays in argument
** form, compiled once for all of them.  The others are rendered again
** with their sizes, which pr->known keeps for the bind to check. */
static int fix_sizes(exec_program *pr, fl_err *e) {
  const fuse_plan *p = pr->plan;
  int n = p->nkernels, k, j, rc = FL_OK;
  uint64_t *form, *size;    /* hashes of the argument-form text, of the sizes */
  char *first;
  if (p->g->nsyms > 0 || p->g->has_asym) return FL_OK;
  form = calloc((size_t)n + 1, sizeof *form);
  size = calloc((size_t)n + 1, sizeof *size);
  first = calloc((size_t)n + 1, 1);
  if (!form || !size || !first) goto oom;
  for (k = 0; k < n; k++) {
    int na;
    if (!pr->ktext[k]) continue;
    if (text_hash(pr->ktext[k], pr->syms[k], &form[k]) ||
        !(pr->known[k] = malloc((size_t)(fk_nargs(&p->kernels[k]) + 1) * sizeof **pr->known)))
      goto oom;
    na = fk_static_args(&p->kernels[k], p->g, pr->known[k]);
    size[k] = XXH3_64bits(pr->known[k], (size_t)na * sizeof **pr->known);
    if (!na) { free(pr->known[k]); pr->known[k] = NULL; }
  }
  for (k = 0; k < n; k++) {       /* first[k]: no earlier kernel has k's form and sizes */
    first[k] = pr->known[k] != NULL;
    for (j = 0; j < k && first[k]; j++)
      first[k] = !pr->known[j] || form[j] != form[k] || size[j] != size[k];
  }
  for (k = 0; k < n; k++) {
    int sizes = 0;
    for (j = 0; j < n; j++) sizes += first[j] && form[j] == form[k];
    if (pr->known[k] && sizes > 2) { free(pr->known[k]); pr->known[k] = NULL; }
  }
  for (k = 0; k < n; k++) {
    strbuf kb;
    if (!pr->known[k]) continue;
    memset(&kb, 0, sizeof kb);
    if ((rc = pr->be->render(&kb, p, k, pr->syms[k], EXEC_KINFO(pr, k), pr->known[k], e)) < 0) {
      strbuf_free(&kb);
      goto out;
    }
    rc = FL_OK;
    if (kb.oom || !kb.p) { strbuf_free(&kb); goto oom; }
    free(pr->ktext[k]);
    pr->ktext[k] = strbuf_take(&kb);
  }
  goto out;
oom:
  rc = err_set(e, FL_ENOMEM, "codegen(%s): out of memory", pr->be->name);
out:
  free(form);
  free(size);
  free(first);
  return rc;
}

exec_program *exec_codegen(const exec_backend *be, const fuse_plan *p, const char *prefix,
                           fl_err *e) {
  exec_program *pr = calloc(1, sizeof *pr);
  size_t nk = (size_t)(p->nkernels ? p->nkernels : 1);
  strbuf b, all;
  int k, rc;
  if (!pr) { err_set(e, FL_ENOMEM, "codegen(%s): out of memory", be->name); return NULL; }
  pr->refs = 1;
  pr->be = be;
  exec_c_ident(prefix ? prefix : "fl_", pr->prefix, sizeof pr->prefix);
  pr->plan = fuse_plan_ref((fuse_plan *)p);   /* counted, not modified */
  pr->syms = calloc(nk, sizeof *pr->syms);
  pr->ktext = calloc(nk, sizeof *pr->ktext);
  pr->alias = calloc(nk, sizeof *pr->alias);
  pr->fns = calloc(nk, sizeof *pr->fns);
  pr->kinfo = calloc(nk, be->kinfo_size ? be->kinfo_size : 1);
  pr->known = calloc(nk, sizeof *pr->known);
  if (!pr->syms || !pr->ktext || !pr->alias || !pr->fns || !pr->kinfo || !pr->known) goto oom;
  memset(&b, 0, sizeof b);
  memset(&all, 0, sizeof all);
  for (k = 0; k < p->nkernels; k++) {
    char sym[200];
    strbuf kb;
    snprintf(sym, sizeof sym, "%sk%d_%s", pr->prefix, k, p->kernels[k].name);
    exec_c_ident(sym, sym, sizeof sym);
    memset(&kb, 0, sizeof kb);
    rc = be->render(&kb, p, k, sym, EXEC_KINFO(pr, k), NULL, e);
    if (rc < 0) {
      strbuf_free(&kb);
      strbuf_free(&b);
      exec_program_free(pr);
      return NULL;
    }
    if (rc > 0 && (!(pr->syms[k] = dupstr(sym)) || !(pr->ktext[k] = strbuf_take(&kb)))) {
      strbuf_free(&kb);
      strbuf_free(&b);
      goto oom;
    }
    strbuf_free(&kb);
  }
  if ((rc = fix_sizes(pr, e)) != FL_OK) {
    strbuf_free(&b);
    exec_program_free(pr);
    return NULL;
  }
  for (k = 0; k < p->nkernels; k++)
    if (pr->ktext[k]) strbuf_printf(&b, "%s", pr->ktext[k]);
  if (!b.p && !b.oom) strbuf_printf(&b, "/* no generated kernels: every step is extern */\n");
  if (b.oom) { strbuf_free(&b); goto oom; }
  pr->body = strbuf_take(&b);
  be->preamble(&all, (const fuse_plan *const *)&pr->plan, 1);
  strbuf_printf(&all, "%s", pr->body ? pr->body : "");
  pr->source = strbuf_take(&all);
  if (!pr->body || !pr->source) goto oom;
  if (be->dev == FL_DEV_CPU && keep_enabled() && find_kept(pr) != FL_OK) goto oom;
  return pr;
oom:
  exec_program_free(pr);
  err_set(e, FL_ENOMEM, "codegen(%s): out of memory", be->name);
  return NULL;
}

const char *exec_program_source(const exec_program *pr) { return pr->source; }
const char *exec_program_log(const exec_program *pr) { return pr->log ? pr->log : ""; }

/* --- compiling ---------------------------------------------------------- */

/* The distinct kernels of n programs as compile units: a kernel identical
** to an earlier one (repeated layers, random graphs) is compiled once and
** its program loads the earlier one's symbol. */
static int batch_units(exec_program **prs, int n, const char ***units_out, int *nunits) {
  const char **units = NULL;
  char **keys = NULL;
  const char **first = NULL;
  int nk = 0, cap = 0, i, k, j, oom = 0;
  for (i = 0; i < n && !oom; i++)
    for (k = 0; k < prs[i]->plan->nkernels && !oom; k++) {
      exec_program *pr = prs[i];
      char *key;
      free(pr->alias[k]);
      pr->alias[k] = NULL;
      if (!pr->ktext[k]) continue;
      if (!(key = fk_kernel_key(pr->ktext[k], pr->syms[k]))) { oom = 1; break; }
      for (j = 0; j < nk; j++) if (strcmp(keys[j], key) == 0) break;
      if (j < nk) {
        free(key);
        if (!(pr->alias[k] = dupstr(first[j]))) oom = 1;
        continue;
      }
      if (nk == cap) {
        char **nkeys;
        const char **nfirst, **nunit;
        cap = cap ? 2 * cap : 64;
        if ((nkeys = realloc(keys, (size_t)cap * sizeof *keys))) keys = nkeys;
        if ((nfirst = realloc(first, (size_t)cap * sizeof *first))) first = nfirst;
        if ((nunit = realloc(units, (size_t)cap * sizeof *units))) units = nunit;
        if (!nkeys || !nfirst || !nunit) { oom = 1; free(key); break; }
      }
      keys[nk] = key;
      first[nk] = pr->syms[k];
      units[nk++] = pr->ktext[k];
    }
  for (j = 0; j < nk; j++) free(keys[j]);
  free(keys);
  free(first);
  *units_out = units;
  *nunits = nk;
  return oom;
}

int exec_compile_batch(exec_program **prs, int n, fl_err *e) {
  const exec_backend *be = prs[0]->be;
  const fuse_plan **plans = malloc((size_t)(n > 0 ? n : 1) * sizeof *plans);
  const char **units = NULL;
  const char *none = "/* no generated kernels: every step is extern */\n";
  void *image = NULL;
  char *log = NULL;
  strbuf head;
  double t0 = meas_now() * 1e3;
  int i, nunits = 0, how = 0, rc;
  memset(&head, 0, sizeof head);
  if (!plans || batch_units(prs, n, &units, &nunits)) {
    free(plans);
    free(units);
    return err_set(e, FL_ENOMEM, "compile(%s): out of memory", be->name);
  }
  for (i = 0; i < n; i++) plans[i] = prs[i]->plan;
  be->preamble(&head, plans, n);
  free(plans);
  if (head.oom) {
    strbuf_free(&head);
    free(units);
    return err_set(e, FL_ENOMEM, "compile(%s): out of memory", be->name);
  }
  rc = nunits ? be->compile(head.p, units, nunits, &image, &log, &how, e)
              : be->compile(head.p, &none, 1, &image, &log, &how, e);
  strbuf_free(&head);
  free(units);
  for (i = 0; i < n; i++) {
    exec_program *pr = prs[i];
    free(pr->log);
    pr->log = log ? dupstr(log) : NULL;
    if (pr->image) be->image_release(pr->image);
    pr->image = rc == FL_OK ? be->image_retain(image) : NULL;
    pr->loaded = 0;
    pr->how = how;
    pr->compile_ms = meas_now() * 1e3 - t0;
  }
  if (image) be->image_release(image);
  free(log);
  return rc;
}

int exec_program_compile(exec_program *pr, fl_err *e) {
  if (pr->image) return FL_OK;
  return exec_compile_batch(&pr, 1, e);
}

static int load(exec_program *pr, fl_err *e) {
  int rc;
  if (pr->loaded) return FL_OK;
  if (!pr->image && (rc = exec_program_compile(pr, e)) != FL_OK) return rc;
  if ((rc = pr->be->load(pr, e)) != FL_OK) return rc;
  pr->loaded = 1;
  return FL_OK;
}

exec_program *exec_program_retain(exec_program *pr) {
  if (pr) pr->refs++;
  return pr;
}

void exec_program_free(exec_program *pr) {
  int k;
  if (!pr || --pr->refs > 0) return;
  if (pr->be->free_priv) pr->be->free_priv(pr);
  if (pr->plan) {
    for (k = 0; k < pr->plan->nkernels; k++) {
      if (pr->syms) free(pr->syms[k]);
      if (pr->ktext) free(pr->ktext[k]);
      if (pr->alias) free(pr->alias[k]);
      if (pr->known) free(pr->known[k]);
    }
    if (pr->slots) for (k = 0; k < pr->plan->nslots; k++) ten_release(&pr->slots[k]);
    if (pr->leaves) for (k = 0; k < pr->plan->g->n; k++) ten_release(&pr->leaves[k]);
    if (pr->kept) for (k = 0; k < pr->plan->g->n; k++) ten_release(&pr->kept[k]);
  }
  free(pr->syms); free(pr->ktext); free(pr->alias); free(pr->fns); free(pr->kinfo); free(pr->known);
  free(pr->body); free(pr->source); free(pr->log);
  if (pr->image) pr->be->image_release(pr->image);
  free(pr->slots); free(pr->leaves);
  free(pr->bound_in); free(pr->bound_metas); free(pr->bound_args);
  free(pr->kernel_ms); free(pr->last_ms); free(pr->kernel_ran);
  free(pr->keep); free(pr->kept); free(pr->kept_ver);
  free(pr->free_at); free(pr->frees);
  fuse_plan_free(pr->plan);
  free(pr);
}

/* --- profiling ------------------------------------------------------------ */

int exec_program_set_profile(exec_program *pr, int on, fl_err *e) {
  size_t n = (size_t)(pr->plan->nkernels > 0 ? pr->plan->nkernels : 1);
  pr->profile = 0;
  if (!on) return FL_OK;
  if (!pr->kernel_ms) pr->kernel_ms = calloc(n, sizeof *pr->kernel_ms);
  if (!pr->last_ms) pr->last_ms = calloc(n, sizeof *pr->last_ms);
  if (!pr->kernel_ran) pr->kernel_ran = calloc(n, sizeof *pr->kernel_ran);
  if (!pr->kernel_ms || !pr->last_ms || !pr->kernel_ran) return err_set(e, FL_ENOMEM, "profile: out of memory");
  memset(pr->kernel_ms, 0, n * sizeof *pr->kernel_ms);
  memset(pr->last_ms, 0, n * sizeof *pr->last_ms);
  memset(pr->kernel_ran, 0, n * sizeof *pr->kernel_ran);
  pr->profiled_runs = 0;
  pr->profile = 1;
  return FL_OK;
}

void exec_program_print_profile(const exec_program *pr, FILE *f, const char *indent) {
  roof_peaks pk;
  int k, roofs;
  if (!pr->last_ms || !pr->profiled_runs) return;
  /* the roofs are this CPU's (measured once per machine, then cached) */
  roofs = pr->be->dev == FL_DEV_CPU && roof_machine_peaks(&pk, 0, NULL) == FL_OK;
  for (k = 0; k < pr->plan->nkernels; k++) {
    const fk_kernel *kr = &pr->plan->kernels[k];
    double ms = pr->last_ms[k];
    roof_kernel rk;
    fprintf(f, "%sk%-3d %-44s %9.3f ms", indent, k, kr->name, ms);
    if (exec_kernel_kept(pr, k) && pr->kept_last) {
      fprintf(f, "  kept: its weights did not change");
    } else if (ms > 0 && kr->bytes > 0) {
      fprintf(f, "  %7.2f GB/s", (double)kr->bytes / (ms * 1e6));
      if (roofs) {
        roof_kernel_at(pr, k, ms, &pk, &rk);
        if (rk.flops > 0) fprintf(f, "  %8.2f GFLOP/s", rk.gflops);
        else fprintf(f, "  %8s GFLOP/s", "-");
        fprintf(f, "  %4.0f%% of roof (%s)", rk.roof_pct, roof_bound_name(rk.bound));
      }
    }
    fputc('\n', f);
  }
}

/* --- values and buffers ----------------------------------------------------- */

int exec_value(exec_run *r, int id, int contig, fl_err *e) {
  const exec_backend *be = r->pr->be;
  const ir_node *nd = &r->g->nodes[id];
  fl_tensor v, t;
  int rc;
  if (r->blk && r->blk[id] && (rc = be->unblock(r, id, e)) != FL_OK) return rc;
  if (r->vals[id].st) {
    if (!contig || ten_is_contiguous(&r->vals[id])) return FL_OK;
    if ((rc = be->to_device(&t, &r->vals[id], e)) != FL_OK) return rc;
    ten_release(&r->vals[id]);
    r->vals[id] = t;
    return FL_OK;
  }
  if (nd->kind != IR_OP || !fk_is_view(r->g, id) || nd->in[0] < 0)
    return err_set(e, FL_EINVAL, "run: %%%d has no value (plan out of order)", id);
  if ((rc = exec_value(r, nd->in[0], 0, e)) != FL_OK) return rc;
  if (nd->op == OP_CONTIGUOUS) return be->to_device(&r->vals[id], &r->vals[nd->in[0]], e);
  rc = view_apply(nd->op, &r->vals[nd->in[0]], &nd->attrs, &r->metas[id], &v, e);
  if (rc == FL_EUNSUPPORTED) {
    /* a reshape the strides cannot follow: through a contiguous copy */
    err_clear(e);
    if ((rc = be->to_device(&t, &r->vals[nd->in[0]], e)) != FL_OK) return rc;
    rc = view_apply(nd->op, &t, &nd->attrs, &r->metas[id], &v, e);
    ten_release(&t);
  }
  if (rc != FL_OK) return rc;
  r->vals[id] = v;
  return contig ? exec_value(r, id, 1, e) : FL_OK;
}

int exec_buffer(exec_run *r, int id, fl_tensor *out, fl_err *e) {
  exec_program *pr = r->pr;
  const fuse_plan *p = pr->plan;
  const fl_meta *m = &r->metas[id];
  int s = p->slot[id], rc;
  size_t need;
  fl_tensor *st;
  /* ten_uninit names a size no buffer can hold; every buffer here is
  ** written whole by the kernel that stores it, so none is zero-filled */
  if (p->inplace && p->inplace[id] >= 0 && !exec_value_kept(pr, id)) {
    /* stored into the leaf its write-back copies it to (plan_inplace) */
    const fl_tensor *leaf = &r->vals[p->inplace[id]];
    if (leaf->st && leaf->m.device == m->device && leaf->m.dtype == m->dtype &&
        meta_same_shape(&leaf->m, m) && ten_is_contiguous(leaf)) {
      ten_share(out, leaf);
      ten_wrote(out);
      return FL_OK;
    }
  }
  if (p->into && p->into[id] >= 0 && !exec_value_kept(pr, id)) {
    /* stored in its place in a concatenation's memory (plan_into): the
    ** concatenation's kernel then copies nothing */
    fl_tensor *cv = &r->vals[p->into[id]];
    if (!cv->st && (rc = exec_buffer(r, p->into[id], cv, e)) != FL_OK) return rc;
    if (ten_is_contiguous(cv) && cv->m.dtype == m->dtype && cv->m.device == m->device) {
      ten_share(out, cv);
      out->m = *m;
      out->offset = cv->offset + p->into_off[id];
      ten_set_contiguous_strides(out);
      ten_wrote(out);
      return FL_OK;
    }
  }
  if (s < 0 || s >= p->nslots || exec_value_kept(pr, id) ||
      !sz_bytes(meta_numel(m), dtype_size(m->dtype), &need))
    return ten_uninit(out, m, e);
  if (!pr->slots && !(pr->slots = calloc((size_t)p->nslots, sizeof *pr->slots)))
    return err_set(e, FL_ENOMEM, "run: out of memory");
  st = &pr->slots[s];
  /* the slot's planned size at once: the first of its buffers may be the
  ** smallest, and growing it for a later one frees and allocates it again */
  if (p->slot_bytes && (size_t)p->slot_bytes[s] > need) need = (size_t)p->slot_bytes[s];
  if (!st->st || st->st->nbytes < need) {
    fl_meta bm;
    memset(&bm, 0, sizeof bm);
    bm.dtype = FL_BOOL;
    bm.device = m->device;
    bm.ndim = 1;
    bm.shape[0] = (int64_t)(need ? need : 1);
    ten_release(st);
    if ((rc = ten_uninit(st, &bm, e)) != FL_OK) return rc;
  }
  ten_share(out, st);
  out->m = *m;
  out->offset = 0;
  ten_set_contiguous_strides(out);
  ten_wrote(out);                /* a slot kept from call to call is written again */
  return FL_OK;
}

/* A product whose epilogue is stored over it (fuse/plan.c plan_alias)
** into a graph output is written into the output's memory: the extern
** writes it there and the epilogue rewrites it in place, one buffer where
** there were two.  Not when that memory is also read by the kernel (a
** caller's output given in place over an input): the product then gets
** memory of its own. */
static int product_in_output(exec_run *r, int k, const char *is_out, fl_err *e) {
  const fuse_plan *p = r->pr->plan;
  const fk_kernel *kk = &p->kernels[k];
  int i, o = -1, rc;
  if (!p->alias || kk->kind != FK_EXTERN || kk->nnodes == 0 || r->vals[kk->anchor].st) return FL_OK;
  for (i = kk->nin; i < kk->nbufs; i++)
    if (p->alias[kk->bufs[i]] == kk->anchor && is_out[kk->bufs[i]]) o = kk->bufs[i];
  if (o < 0) return FL_OK;
  if (!r->vals[o].st && (rc = exec_buffer(r, o, &r->vals[o], e)) != FL_OK) return rc;
  if (!ten_is_contiguous(&r->vals[o])) return FL_OK;
  /* the kernel's inputs: the product's operands and what the epilogue
  ** reads besides the product (a residual) */
  for (i = 0; i < kk->nin; i++) {
    int id = kk->bufs[i];
    if (id == kk->anchor) continue;
    /* a value already there is only compared (one in blocks stays so) */
    if (!r->vals[id].st && (rc = exec_value(r, id, 0, e)) != FL_OK) return rc;
    if (r->vals[id].st == r->vals[o].st) return FL_OK;
  }
  ten_share(&r->vals[kk->anchor], &r->vals[o]);
  r->vals[kk->anchor].m = r->metas[kk->anchor];
  r->vals[kk->anchor].offset = r->vals[o].offset;
  ten_set_contiguous_strides(&r->vals[kk->anchor]);
  return FL_OK;
}

int exec_bind_leaves(exec_program *pr, fl_err *e) {
  const exec_backend *be = pr->be;
  const ir_graph *g = pr->plan->g;
  int i, rc;
  if (!pr->leaves && !(pr->leaves = calloc((size_t)(g->n ? g->n : 1), sizeof *pr->leaves)))
    return err_set(e, FL_ENOMEM, "run: out of memory");
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    fl_tensor *dv = &pr->leaves[i], h;
    if (nd->kind != IR_PARAM && nd->kind != IR_CONST) continue;
    if (nd->value.m.device == be->dev) {
      ten_release(dv);
      rc = be->to_device(dv, &nd->value, e);
    } else if (!dv->st) {
      rc = be->to_device(dv, &nd->value, e);
    } else if (nd->kind == IR_PARAM) {
      if ((rc = ten_contiguous(&h, &nd->value, e)) != FL_OK) return rc;
      rc = be->copy_into(dv, &h, e);
      ten_release(&h);
    } else {
      rc = FL_OK;
    }
    if (rc != FL_OK) return err_prefix(e, "run: %s %%%d", nd->kind == IR_PARAM ? "param" : "const", i);
  }
  return FL_OK;
}

/* --- binding ------------------------------------------------------------------ */

/* Shapes and kernel arguments for these inputs, computed once per set of
** input shapes: the same shapes again (a loop, a steady-state service)
** reuse the last binding, so a call costs the kernels and little else. */
static int bind(exec_program *pr, const fl_tensor *const *inputs, fl_err *e) {
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
      if (pr->be->nargs(pr, k) > pr->maxargs) pr->maxargs = pr->be->nargs(pr, k);
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
  pr->kept_ok = 0;                            /* sizes may feed kept values */
  if ((rc = ir_infer_metas(g, inputs, pr->be->dev, pr->bound_metas, e)) != FL_OK) return rc;
  memset(pr->bound_args, 0, (size_t)(p->nkernels ? p->nkernels : 1) * (size_t)pr->maxargs *
         sizeof *pr->bound_args);
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kr = &p->kernels[k];
    if (kr->nnodes == 0) continue;   /* a pure extern step binds nothing */
    int64_t *args = pr->bound_args + (size_t)k * (size_t)pr->maxargs;
    if ((rc = fk_bind(kr, g, pr->bound_metas, args, e)) != FL_OK) return rc;
    /* a static graph's input check stops other shapes first; this keeps
    ** a kernel holding its sizes from running on wrong indices */
    if (pr->known[k] && memcmp(args, pr->known[k], (size_t)fk_static_nargs(kr) * sizeof *args))
      return err_set(e, FL_EUNSUPPORTED, "%s: compiled for other sizes than this call's", kr->name);
  }
  pr->bound_in[0].ndim = 0;                   /* valid (no inputs: always) */
  for (i = 0; i < g->ninputs; i++) {
    pr->bound_in[i] = inputs[i]->m;
    pr->bound_in[i].wrapped = 0;
  }
  return FL_OK;
}

/* --- running ------------------------------------------------------------------ */

int exec_program_run(exec_program *pr, const fl_tensor *const *inputs, int ninputs,
                     fl_tensor *outs, fl_err *e) {
  if (pr->be->run) return pr->be->run(pr, inputs, ninputs, outs, e);
  return exec_program_run_flags(pr, inputs, ninputs, outs, 0, NULL, e);
}

int exec_program_run_out(exec_program *pr, const fl_tensor *const *inputs, int ninputs,
                         fl_tensor *outs, fl_err *e) {
  return exec_program_run_flags(pr, inputs, ninputs, outs, EXEC_INTO, NULL, e);
}

/* A write-back's copy (ir_writeback): the backend copies whole
** contiguous buffers between its device and the host, so a strided host
** destination is written from a contiguous host copy. */
static int wb_copy(void *ctx, fl_tensor *dst, const fl_tensor *src, fl_err *e) {
  const exec_backend *be = (const exec_backend *)ctx;
  fl_tensor tmp;
  fl_meta m = src->m;
  int rc;
  if (dst->m.device == FL_DEV_CPU && src->m.device == FL_DEV_CPU) return ten_copy(dst, src, e);
  if (!ten_is_contiguous(src))
    return err_set(e, FL_EUNSUPPORTED, "a write from a strided device tensor");
  if (ten_is_contiguous(dst) && meta_same_shape(&dst->m, &src->m) && dst->m.dtype == src->m.dtype)
    return be->copy_into(dst, src, e);
  if (dst->m.device != FL_DEV_CPU)
    return err_set(e, FL_EUNSUPPORTED, "a write into a strided or converted device tensor");
  m.device = FL_DEV_CPU;
  tmp.st = NULL;
  if ((rc = ten_empty(&tmp, &m, e)) != FL_OK) return rc;
  if ((rc = be->copy_into(&tmp, src, e)) == FL_OK) rc = ten_copy(dst, &tmp, e);
  ten_release(&tmp);
  return rc;
}

/* pr's free lists (exec_program.free_at) from is_out, the run's outputs. */
static int free_lists(exec_program *pr, const char *is_out, fl_err *e) {
  const fuse_plan *p = pr->plan;
  const ir_graph *g = p->g;
  int i, k, n = 0;
  if (pr->free_at) return FL_OK;
  pr->free_at = malloc((size_t)(p->nkernels + 1) * sizeof *pr->free_at);
  pr->frees = malloc((size_t)(g->n ? g->n : 1) * sizeof *pr->frees);
  if (!pr->free_at || !pr->frees) {
    free(pr->free_at); free(pr->frees);
    pr->free_at = pr->frees = NULL;
    return err_set(e, FL_ENOMEM, "run: out of memory");
  }
  for (k = 0; k < p->nkernels; k++) {
    pr->free_at[k] = n;
    for (i = 0; i < g->n; i++)
      if (p->last_use[i] == k && g->nodes[i].kind == IR_OP && !is_out[i]) pr->frees[n++] = i;
  }
  pr->free_at[p->nkernels] = n;
  return FL_OK;
}

int exec_program_run_flags(exec_program *pr, const fl_tensor *const *inputs, int ninputs,
                           fl_tensor *outs, int flags, fl_tensor *hold, fl_err *e) {
  const exec_backend *be = pr->be;
  const fuse_plan *p = pr->plan;
  const ir_graph *g = p->g;
  exec_run r;
  char *is_out = NULL;
  uint64_t *start = NULL, key = 0;
  int i, k, rc = FL_OK, into = flags & EXEC_INTO, keep, reuse;
  double t0 = meas_now();
  memset(&r, 0, sizeof r);
  if (ninputs != g->ninputs)
    return err_set(e, FL_EINVAL, "run: expected %d input(s), got %d", g->ninputs, ninputs);
  for (i = 0; i < ninputs; i++)
    if (!inputs[i] || !inputs[i]->st) return err_set(e, FL_EINVAL, "run: input %d has no data", i + 1);
  if ((rc = load(pr, e)) != FL_OK) return rc;
  if ((rc = bind(pr, inputs, e)) != FL_OK) return rc;
  if (!(flags & EXEC_CAPTURE) && (rc = exec_bind_leaves(pr, e)) != FL_OK) return rc;
  r.pr = pr;
  r.g = g;
  r.metas = pr->bound_metas;
  r.capture = (flags & EXEC_CAPTURE) != 0;
  keep = pr->keep && !r.capture;
  reuse = keep && kept_current(pr);
  if (keep && !reuse) pr->kept_ok = 0;        /* until every keep kernel ran */
  r.vals = calloc((size_t)(g->n ? g->n : 1), sizeof *r.vals);
  r.args = malloc((size_t)pr->maxargs * sizeof *r.args);
  is_out = calloc((size_t)(g->n ? g->n : 1), 1);
  if (be->unblock) r.blk = calloc((size_t)(g->n ? g->n : 1), 1);
  if (!r.vals || !r.args || !is_out || (be->unblock && !r.blk)) { rc = err_set(e, FL_ENOMEM, "run: out of memory"); goto done; }
  for (i = 0; i < g->nout; i++) is_out[g->outputs[i]] = 1;
  if ((rc = free_lists(pr, is_out, e)) != FL_OK) goto done;
  /* every run draws anew: each random node reserves its draw in node order
  ** (the order eager code draws in), whichever kernel computes it */
  for (i = 0; i < g->n; i++) {
    if (g->nodes[i].kind != IR_OP || !rng_op(g->nodes[i].op)) continue;
    if (!start) {
      if (!(start = calloc((size_t)g->n, sizeof *start))) {
        rc = err_set(e, FL_ENOMEM, "run: out of memory");
        goto done;
      }
      key = rng_key();
    }
    start[i] = rng_reserve(rng_draws(&r.metas[i]));
  }
  r.rng_key = key;
  r.rng_start = start;
  /* results straight into the caller's tensors where they fit */
  for (i = 0; i < g->nout && into; i++) {
    int id = g->outputs[i];
    const fl_tensor *o = &outs[i];
    if (o->st && o->m.device == be->dev && g->nodes[id].kind == IR_OP && p->stored[id] &&
        !r.vals[id].st && o->m.dtype == r.metas[id].dtype &&
        meta_same_shape(&o->m, &r.metas[id]) && ten_is_contiguous(o)) {
      ten_share(&r.vals[id], o);
      ten_wrote(&r.vals[id]);
    }
  }
  for (i = 0; i < g->n && rc == FL_OK; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind == IR_INPUT) {
      if ((rc = be->to_device(&r.vals[i], inputs[nd->index], e)) != FL_OK)
        err_prefix(e, "run: input %d", nd->index + 1);
    } else if (nd->kind != IR_OP) {
      ten_share(&r.vals[i], &pr->leaves[i]);
    }
  }
  for (k = 0; k < p->nkernels && rc == FL_OK; k++) {
    double t0 = 0;
    memcpy(r.args, pr->bound_args + (size_t)k * (size_t)pr->maxargs,
           (size_t)pr->maxargs * sizeof *r.args);
    if (p->kernels[k].nrng && start) fk_rng_args(&p->kernels[k], key, start, r.args);
    if (keep && pr->keep[k] && reuse) {
      kept_move(pr, &r, k, 0);
      pr->kept_skips++;
      if (pr->profile) pr->last_ms[k] = 0;
    } else {
      if (pr->profile && (rc = be->sync(e)) == FL_OK) t0 = meas_now() * 1e3;
      if (rc == FL_OK) rc = product_in_output(&r, k, is_out, e);
      if (rc == FL_OK) rc = be->launch(&r, k, e);
      if (pr->profile && rc == FL_OK && (rc = be->sync(e)) == FL_OK) {
        pr->last_ms[k] = meas_now() * 1e3 - t0;
        pr->kernel_ms[k] += pr->last_ms[k];
        pr->kernel_ran[k]++;
      }
      if (rc == FL_OK && keep && pr->keep[k]) {
        kept_move(pr, &r, k, 1);
        pr->kept_runs++;
      }
    }
    if (r.capture) continue;      /* a captured graph keeps every buffer */
    /* free what no later kernel reads: peak memory as planned */
    for (i = pr->free_at[k]; i < pr->free_at[k + 1] && rc == FL_OK; i++) ten_release(&r.vals[pr->frees[i]]);
  }
  for (i = 0; i < g->nout && rc == FL_OK; i++) {
    int id = g->outputs[i];
    if ((rc = exec_value(&r, id, 0, e)) != FL_OK) break;
    if (into && outs[i].st) {
      if (outs[i].st != r.vals[id].st) {
        fl_tensor t;
        if ((rc = be->to_device(&t, &r.vals[id], e)) != FL_OK) break;
        rc = be->copy_into(&outs[i], &t, e);
        ten_release(&t);
      }
    } else {
      ten_share(&outs[i], &r.vals[id]);
    }
  }
  /* the captured in-place updates, after every result is computed */
  if (rc == FL_OK && g->nwb && !r.capture) rc = ir_writeback(g, inputs, outs, wb_copy, (void *)be, e);
  if (rc == FL_OK && hold)
    for (i = 0; i < g->n && rc == FL_OK; i++)
      if (!r.blk || !r.blk[i] || (rc = be->unblock(&r, i, e)) == FL_OK) ten_share(&hold[i], &r.vals[i]);
  if (rc == FL_OK && keep && !reuse) kept_stamp(pr);
  if (rc == FL_OK && keep) pr->kept_last = reuse;
  if (rc == FL_OK) { pr->runs++; pr->run_ms += (meas_now() - t0) * 1e3; }
  if (rc == FL_OK && pr->profile) pr->profiled_runs++;
done:
  if (r.vals) for (i = 0; i < g->n; i++) ten_release(&r.vals[i]);
  free(r.vals); free(r.args); free(is_out); free(start); free(r.blk);
  return rc;
}
