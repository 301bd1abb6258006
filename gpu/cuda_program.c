/*
** cuda_program.c -- CUDA programs: source assembly, NVRTC compilation,
** binding and launching kernels on device tensors, CUDA graphs, autotune.
** Invariant (as cpu/compile.c's): a kernel is launched only with buffers
** that exist on the device and are contiguous in the shapes the launch
** metadata says, with the arguments fk_bind computed for exactly those
** shapes; an extern kernel runs its epilogue in its store only when the
** epilogue's space is the anchor's output, element for element (checked
** at every launch), else the epilogue runs as its own kernel afterwards.
*/
#include "config.h"
#include "../fuse/render.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_program.h"
#include "cublas.h"
#include "../cpu/cache.h"
#include "../cpu/codegen.h"
#include "../graph/view.h"
#include "../graph/rng.h"

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* --- codegen ---------------------------------------------------------------- */

cuda_program *cuda_codegen_prefixed(const fuse_plan *p, const char *prefix, fl_err *e) {
  cuda_program *pr = calloc(1, sizeof *pr);
  size_t nk = (size_t)(p->nkernels ? p->nkernels : 1);
  strbuf b, all;
  int k, rc;
  if (!pr) { err_set(e, FL_ENOMEM, "codegen(cuda): out of memory"); return NULL; }
  cpu_c_ident(prefix ? prefix : "fl_", pr->prefix, sizeof pr->prefix);
  pr->plan = fuse_plan_ref((fuse_plan *)p);   /* counted, not modified */
  pr->syms = calloc(nk, sizeof *pr->syms);
  pr->info = calloc(nk, sizeof *pr->info);
  pr->fns = calloc(nk, sizeof *pr->fns);
  pr->epis = calloc(nk, sizeof *pr->epis);
  pr->block = calloc(nk, sizeof *pr->block);
  pr->ktext = calloc(nk, sizeof *pr->ktext);
  pr->alias = calloc(nk, sizeof *pr->alias);
  if (!pr->syms || !pr->info || !pr->fns || !pr->epis || !pr->block || !pr->ktext || !pr->alias)
    goto oom;
  memset(&b, 0, sizeof b);
  memset(&all, 0, sizeof all);
  for (k = 0; k < p->nkernels; k++) {
    char sym[200];
    snprintf(sym, sizeof sym, "%sk%d_%s", pr->prefix, k, p->kernels[k].name);
    cpu_c_ident(sym, sym, sizeof sym);
    strbuf kb;
    memset(&kb, 0, sizeof kb);
    rc = cuda_emit_kernel(&kb, p, k, sym, &pr->info[k], e);
    if (rc < 0) {
      strbuf_free(&kb);
      strbuf_free(&b);
      cuda_program_free(pr);
      return NULL;
    }
    if (rc > 0) {
      if (!(pr->syms[k] = dupstr(sym)) || !(pr->ktext[k] = strbuf_take(&kb))) {
        strbuf_free(&kb);
        strbuf_free(&b);
        goto oom;
      }
      strbuf_printf(&b, "%s", pr->ktext[k]);
    }
    strbuf_free(&kb);
    pr->block[k] = pr->info[k].block;
  }
  if (!b.p && !b.oom) strbuf_printf(&b, "/* no generated kernels */\n");
  if (b.oom) { strbuf_free(&b); goto oom; }
  pr->body = strbuf_take(&b);
  cuda_emit_preamble(&all, cuda_plan_has_extern(p));
  strbuf_printf(&all, "%s", pr->body ? pr->body : "");
  pr->source = strbuf_take(&all);
  if (!pr->body || !pr->source) goto oom;
  return pr;
oom:
  cuda_program_free(pr);
  err_set(e, FL_ENOMEM, "codegen(cuda): out of memory");
  return NULL;
}

cuda_program *cuda_codegen(const fuse_plan *p, fl_err *e) {
  return cuda_codegen_prefixed(p, "fl_", e);
}

const char *cuda_program_source(const cuda_program *pr) { return pr->source; }
const char *cuda_program_log(const cuda_program *pr) {
  return pr->log ? pr->log : pr->img.log ? pr->img.log : "";
}
const char *cuda_program_ptx(const cuda_program *pr) { return pr->compiled ? pr->img.ptx : NULL; }

/* --- compile ------------------------------------------------------------------ */

static int compile_source(const char *src, nvrtc_image *img, char **log, fl_err *e) {
  return nvrtc_compile(src, "fuselab.cu", nvrtc_default_arch(), img, log, e);
}

int cuda_program_compile(cuda_program *pr, fl_err *e) {
  char *log = NULL;
  int rc, k;
  if (pr->compiled) return FL_OK;
  free(pr->log);
  pr->log = NULL;
  /* its own source holds every kernel: no aliases into a batch */
  for (k = 0; k < pr->plan->nkernels; k++) { free(pr->alias[k]); pr->alias[k] = NULL; }
  rc = compile_source(pr->source, &pr->img, &log, e);
  pr->log = log;
  pr->compile_ms = pr->img.ms;
  if (rc == FL_OK) pr->compiled = 1;
  return rc;
}

static int copy_img(nvrtc_image *dst, const nvrtc_image *src) {
  *dst = *src;
  dst->ptx = malloc(src->ptx_n + 1);
  dst->cubin = src->cubin ? malloc(src->cubin_n ? src->cubin_n : 1) : NULL;
  dst->log = dupstr(src->log ? src->log : "");
  if (!dst->ptx || (src->cubin && !dst->cubin) || !dst->log) { nvrtc_image_free(dst); return FL_ENOMEM; }
  memcpy(dst->ptx, src->ptx, src->ptx_n + 1);
  if (src->cubin) memcpy(dst->cubin, src->cubin, src->cubin_n);
  return FL_OK;
}


/* The source of n programs in one unit.  A kernel identical to an earlier
** one is left out and its program loads the earlier one's symbol (random
** graphs and repeated layers share many), as cpu/compile.c aliases them. */
static char *batch_source(cuda_program **prs, int n) {
  strbuf b;
  char **keys = NULL, **first = NULL;
  int nk = 0, cap = 0, i, k, j, ext = 0;
  memset(&b, 0, sizeof b);
  for (i = 0; i < n; i++) ext |= cuda_plan_has_extern(prs[i]->plan);
  cuda_emit_preamble(&b, ext);
  for (i = 0; i < n && !b.oom; i++)
    for (k = 0; k < prs[i]->plan->nkernels; k++) {
      cuda_program *pr = prs[i];
      char *key;
      if (!pr->ktext[k]) continue;
      if (!(key = fk_kernel_key(pr->ktext[k], pr->syms[k]))) { b.oom = 1; break; }
      for (j = 0; j < nk; j++) if (strcmp(keys[j], key) == 0) break;
      if (j < nk) {
        free(key);
        free(pr->alias[k]);
        if (!(pr->alias[k] = dupstr(first[j]))) { b.oom = 1; break; }
        continue;
      }
      if (nk == cap) {
        char **nkeys, **nfirst;
        cap = cap ? 2 * cap : 64;
        nkeys = realloc(keys, (size_t)cap * sizeof *keys);
        if (nkeys) keys = nkeys;
        nfirst = realloc(first, (size_t)cap * sizeof *first);
        if (nfirst) first = nfirst;
        if (!nkeys || !nfirst) { b.oom = 1; free(key); break; }
      }
      keys[nk] = key;
      first[nk++] = pr->syms[k];
      strbuf_printf(&b, "%s", pr->ktext[k]);
    }
  for (j = 0; j < nk; j++) free(keys[j]);
  free(keys);
  free(first);
  return strbuf_take(&b);
}

int cuda_compile_batch(cuda_program **prs, int n, fl_err *e) {
  nvrtc_image img;
  char *src, *log = NULL;
  int i, rc;
  if (!(src = batch_source(prs, n))) return err_set(e, FL_ENOMEM, "compile(cuda): out of memory");
  rc = compile_source(src, &img, &log, e);
  free(src);
  for (i = 0; i < n; i++) {
    cuda_program *pr = prs[i];
    free(pr->log);
    pr->log = log ? dupstr(log) : NULL;
    if (rc == FL_OK) {
      nvrtc_image_free(&pr->img);
      if (copy_img(&pr->img, &img) != FL_OK) { rc = err_set(e, FL_ENOMEM, "compile(cuda): out of memory"); break; }
      pr->compiled = 1;
      pr->compile_ms = img.ms;
    }
  }
  if (rc == FL_OK) nvrtc_image_free(&img);
  free(log);
  return rc;
}

/* Load the image and find every kernel (needs a device). */
static int load(cuda_program *pr, fl_err *e) {
  char esym[240];
  int k, rc;
  if (pr->mod) return FL_OK;
  if ((rc = cuda_rt_init(e)) != FL_OK) return rc;
  if ((rc = cuda_program_compile(pr, e)) != FL_OK) return rc;
  if ((rc = cuda_module_load(pr->img.cubin ? pr->img.cubin : (void *)pr->img.ptx, &pr->mod, e)) != FL_OK)
    return rc;
  for (k = 0; k < pr->plan->nkernels && rc == FL_OK; k++) {
    if (!pr->syms[k]) continue;
    const char *sym = pr->alias[k] ? pr->alias[k] : pr->syms[k];
    rc = cuda_module_kernel(pr->mod, sym, &pr->fns[k], e);
    if (rc == FL_OK && pr->info[k].epi) {
      snprintf(esym, sizeof esym, "%s_epi", sym);
      rc = cuda_module_kernel(pr->mod, esym, &pr->epis[k], e);
    }
  }
  return rc;
}

/* --- running --------------------------------------------------------------------- */

typedef struct run_ctx {
  cuda_program *pr;
  const ir_graph *g;
  fl_meta *metas;
  fl_tensor *vals;
  int64_t *args;        /* fk_nargs + extern slots */
  uint64_t *block;      /* the parameter block being built */
  int capture;          /* 1 while capturing a CUDA graph: hold, never free */
  uint64_t key;         /* this run's Philox key */
  uint64_t *start;      /* per node: start block of a random node's draw */
} run_ctx;


/* The value of view node id on the device: a view of its source (metadata
** only), made contiguous when `contig` (a kernel buffer must be). */
static int value_of(run_ctx *c, int id, int contig, fl_err *e) {
  const ir_node *nd = &c->g->nodes[id];
  fl_tensor v, t;
  int rc;
  if (c->vals[id].st) {
    if (!contig || ten_is_contiguous(&c->vals[id])) return FL_OK;
    if ((rc = cuda_contiguous(&t, &c->vals[id], e)) != FL_OK) return rc;
    ten_release(&c->vals[id]);
    c->vals[id] = t;
    return FL_OK;
  }
  if (nd->kind != IR_OP || !fk_is_view(c->g, id) || nd->in[0] < 0)
    return err_set(e, FL_EINVAL, "run: %%%d has no value (plan out of order)", id);
  if ((rc = value_of(c, nd->in[0], 0, e)) != FL_OK) return rc;
  if (nd->op == OP_CONTIGUOUS) {
    rc = cuda_contiguous(&c->vals[id], &c->vals[nd->in[0]], e);
    return rc;
  }
  rc = view_apply(nd->op, &c->vals[nd->in[0]], &nd->attrs, &c->metas[id], &v, e);
  if (rc == FL_EUNSUPPORTED) {
    /* reshape of a strided tensor: through a contiguous copy */
    if ((rc = cuda_contiguous(&t, &c->vals[nd->in[0]], e)) != FL_OK) return rc;
    rc = view_apply(nd->op, &t, &nd->attrs, &c->metas[id], &v, e);
    ten_release(&t);
  }
  if (rc != FL_OK) return rc;
  c->vals[id] = v;
  return contig ? value_of(c, id, 1, e) : FL_OK;
}

/* A device buffer for stored node id, uninitialized: a view of its
** memory-plan slot, or a fresh one for graph outputs. */
static int buffer_for(run_ctx *c, int id, fl_err *e) {
  cuda_program *pr = c->pr;
  const fuse_plan *p = pr->plan;
  const fl_meta *m = &c->metas[id];
  int s = p->slot[id], rc;
  size_t need = (size_t)meta_numel(m) * dtype_size(m->dtype);
  fl_tensor *st;
  if (s < 0 || s >= p->nslots) return ten_empty(&c->vals[id], m, e);
  if (!pr->slots && !(pr->slots = calloc((size_t)p->nslots, sizeof *pr->slots)))
    return err_set(e, FL_ENOMEM, "run: out of memory");
  st = &pr->slots[s];
  if (!st->st || st->st->nbytes < need) {
    fl_meta bm;
    memset(&bm, 0, sizeof bm);
    bm.dtype = FL_BOOL;
    bm.device = FL_DEV_CUDA;
    bm.ndim = 1;
    bm.shape[0] = (int64_t)(need ? need : 1);
    ten_release(st);
    if ((rc = ten_empty(st, &bm, e)) != FL_OK) return rc;
  }
  ten_share(&c->vals[id], st);
  c->vals[id].m = *m;
  c->vals[id].offset = 0;
  ten_set_contiguous_strides(&c->vals[id]);
  return FL_OK;
}

static int slot_of(const fk_kernel *k, int node) {
  int i;
  for (i = 0; i < k->nbufs; i++) if (k->bufs[i] == node) return i;
  return -1;
}

/* Operand `in` of the anchor as a strided device view of its kernel
** buffer: the folded views replayed on metadata.  *rel gets the view's
** offset relative to the buffer's first element. */
static int anchor_operand(run_ctx *c, const fk_kernel *k, int in, fl_tensor *out, int64_t *rel,
                          fl_err *e) {
  const ir_graph *g = c->g;
  int chain[64], n = 0, s = g->nodes[k->anchor].in[in], rc, i;
  fl_tensor t, v;
  while (fk_is_view(g, s) && !c->pr->plan->stored[s] && slot_of(k, s) < 0 && n < 64) {
    chain[n++] = s;
    s = g->nodes[s].in[0];
  }
  if (slot_of(k, s) < 0) return err_set(e, FL_EUNSUPPORTED, "%s: operand %d has no buffer", k->name, in + 1);
  if ((rc = value_of(c, s, 1, e)) != FL_OK) return rc;
  ten_share(&t, &c->vals[s]);
  for (i = n - 1; i >= 0; i--) {
    const ir_node *nd = &g->nodes[chain[i]];
    if (nd->op == OP_CONTIGUOUS) continue;     /* strides serve as they are */
    rc = view_apply(nd->op, &t, &nd->attrs, &c->metas[chain[i]], &v, e);
    ten_release(&t);
    if (rc != FL_OK) {
      /* a reshape the strides cannot follow: not expressible on the
      ** buffer, so refuse rather than read the wrong elements */
      return err_set(e, FL_EUNSUPPORTED, "%s: operand %d: a reshape of a strided view has no "
                     "CUDA lowering yet", k->name, in + 1);
    }
    t = v;
  }
  *rel = t.offset - c->vals[s].offset;
  *out = t;
  return FL_OK;
}

static int64_t numel_of(const fl_meta *m) { return meta_numel(m); }

/* The anchor's own arguments (cuda_codegen.h's slots) into X. */
static int extern_args(run_ctx *c, const fk_kernel *k, int64_t *X, fl_err *e) {
  const ir_node *an = &c->g->nodes[k->anchor];
  const fl_meta *om = &c->metas[k->anchor];
  int64_t *Y = X + CUX_OP, rel[CUDA_CAT_MAX];
  fl_tensor op[CUDA_CAT_MAX];
  int i, d, rc = FL_OK, nop = an->nin < CUDA_CAT_MAX ? an->nin : CUDA_CAT_MAX;
  memset(op, 0, sizeof op);
  for (i = 0; i < nop && rc == FL_OK; i++)
    if (an->in[i] >= 0) rc = anchor_operand(c, k, i, &op[i], &rel[i], e);
  if (rc != FL_OK) goto done;
  X[CUX_TOTAL] = numel_of(om);
  switch (an->op) {
  case OP_MATMUL: case OP_LINEAR: {
    const fl_tensor *A = &op[0], *B = &op[1];
    int lin = an->op == OP_LINEAR, nba, nbb, nbd;
    int64_t M, K, N, cnt = 1;
    if (A->m.ndim == 1) { M = 1; K = A->m.shape[0]; Y[CUM_SAM] = 0; Y[CUM_SAK] = A->stride[0]; nba = 0; }
    else {
      M = A->m.shape[A->m.ndim - 2]; K = A->m.shape[A->m.ndim - 1];
      Y[CUM_SAM] = A->stride[A->m.ndim - 2]; Y[CUM_SAK] = A->stride[A->m.ndim - 1];
      nba = A->m.ndim - 2;
    }
    if (lin) {
      if (B->m.ndim == 1) { N = 1; Y[CUM_SBK] = B->stride[0]; Y[CUM_SBN] = 0; }
      else { N = B->m.shape[0]; Y[CUM_SBK] = B->stride[1]; Y[CUM_SBN] = B->stride[0]; }
      nbb = 0;
    } else if (B->m.ndim == 1) { N = 1; Y[CUM_SBK] = B->stride[0]; Y[CUM_SBN] = 0; nbb = 0; }
    else {
      N = B->m.shape[B->m.ndim - 1];
      Y[CUM_SBK] = B->stride[B->m.ndim - 2]; Y[CUM_SBN] = B->stride[B->m.ndim - 1];
      nbb = B->m.ndim - 2;
    }
    nbd = nba > nbb ? nba : nbb;
    if (nbd > 6) { rc = err_set(e, FL_EUNSUPPORTED, "%s: more than 6 batch dims", k->name); goto done; }
    for (d = 0; d < nbd; d++) {
      int da = d - (nbd - nba), db = d - (nbd - nbb);
      int64_t sa = da >= 0 ? A->m.shape[da] : 1, sb = db >= 0 ? B->m.shape[db] : 1;
      Y[CUM_BSIZE + d] = sa == 1 ? sb : sa;
      Y[CUM_BSA + d] = da >= 0 && sa != 1 ? A->stride[da] : 0;
      Y[CUM_BSB + d] = db >= 0 && sb != 1 ? B->stride[db] : 0;
      cnt *= Y[CUM_BSIZE + d];
    }
    Y[CUM_B] = cnt; Y[CUM_M] = M; Y[CUM_N] = N; Y[CUM_K] = K; Y[CUM_NBD] = nbd;
    Y[CUM_OA] = rel[0]; Y[CUM_OB] = rel[1];
    Y[CUM_HASBIAS] = lin && an->nin > 2 && an->in[2] >= 0;
    if (Y[CUM_HASBIAS]) {
      Y[CUM_SBIAS] = op[2].m.ndim ? op[2].stride[op[2].m.ndim - 1] : 0;
      Y[CUM_OBIAS] = rel[2];
    }
    if (cnt * M * N != X[CUX_TOTAL])
      rc = err_set(e, FL_EUNSUPPORTED, "%s: %lld x %lld x %lld results for %lld outputs", k->name,
                   (long long)cnt, (long long)M, (long long)N, (long long)X[CUX_TOTAL]);
    break;
  }
  case OP_CONV2D: {
    const fl_tensor *x = &op[0], *w = &op[1];
    int b3 = x->m.ndim == 3;
    Y[CUC_N] = b3 ? 1 : x->m.shape[0];
    Y[CUC_C] = x->m.shape[b3 ? 0 : 1]; Y[CUC_H] = x->m.shape[b3 ? 1 : 2]; Y[CUC_W] = x->m.shape[b3 ? 2 : 3];
    Y[CUC_CO] = w->m.shape[0]; Y[CUC_KH] = w->m.shape[2]; Y[CUC_KW] = w->m.shape[3];
    Y[CUC_OH] = om->shape[om->ndim - 2]; Y[CUC_OW] = om->shape[om->ndim - 1];
    Y[CUC_SH] = an->attrs.i[0]; Y[CUC_SW] = an->attrs.i[1];
    Y[CUC_PH] = an->attrs.i[2]; Y[CUC_PW] = an->attrs.i[3];
    Y[CUC_XS] = b3 ? 0 : x->stride[0];
    for (d = 0; d < 3; d++) Y[CUC_XS + 1 + d] = x->stride[d + (b3 ? 0 : 1)];
    Y[CUC_XO] = rel[0];
    for (d = 0; d < 4; d++) Y[CUC_WS + d] = w->stride[d];
    Y[CUC_WO] = rel[1];
    Y[CUC_HASBIAS] = an->nin > 2 && an->in[2] >= 0;
    if (Y[CUC_HASBIAS]) { Y[CUC_SBIAS] = op[2].m.ndim ? op[2].stride[0] : 0; Y[CUC_OBIAS] = rel[2]; }
    break;
  }
  case OP_MAX_POOL2D: case OP_AVG_POOL2D: {
    const fl_tensor *x = &op[0];
    int b3 = x->m.ndim == 3;
    Y[CUP_C] = x->m.shape[b3 ? 0 : 1]; Y[CUP_H] = x->m.shape[b3 ? 1 : 2]; Y[CUP_W] = x->m.shape[b3 ? 2 : 3];
    Y[CUP_OH] = om->shape[om->ndim - 2]; Y[CUP_OW] = om->shape[om->ndim - 1];
    Y[CUP_KH] = an->attrs.i[0]; Y[CUP_KW] = an->attrs.i[1];
    Y[CUP_SH] = an->attrs.i[2] > 0 ? an->attrs.i[2] : an->attrs.i[0];
    Y[CUP_SW] = an->attrs.i[3] > 0 ? an->attrs.i[3] : an->attrs.i[1];
    Y[CUP_PH] = an->attrs.i[4]; Y[CUP_PW] = an->attrs.i[5];
    Y[CUP_XS] = b3 ? 0 : x->stride[0];
    for (d = 0; d < 3; d++) Y[CUP_XS + 1 + d] = x->stride[d + (b3 ? 0 : 1)];
    Y[CUP_XO] = rel[0];
    break;
  }
  case OP_EMBEDDING: {
    const fl_tensor *ix = &op[0], *w = &op[1];
    Y[CUE_V] = w->m.shape[0]; Y[CUE_D] = w->m.shape[1];
    Y[CUE_SWV] = w->stride[0]; Y[CUE_SWD] = w->stride[1]; Y[CUE_OW] = rel[1];
    Y[CUE_ND] = ix->m.ndim;
    for (d = 0; d < ix->m.ndim; d++) { Y[CUE_ISIZE + d] = ix->m.shape[d]; Y[CUE_ISTR + d] = ix->stride[d]; }
    Y[CUE_IO] = rel[0];
    break;
  }
  case OP_CAT: {
    int dim = (int)an->attrs.i[0];
    Y[CUT_ND] = om->ndim; Y[CUT_DIM] = dim;
    for (d = 0; d < om->ndim; d++) Y[CUT_OSIZE + d] = om->shape[d];
    for (i = 0; i < nop; i++) {
      int64_t *I = Y + CUT_IN + i * CUT_PER;
      const fl_tensor *t = &op[i];
      if (an->in[i] < 0 || t->m.ndim != om->ndim) continue;   /* an empty 1-d input: extent 0 */
      I[0] = t->m.shape[dim];
      I[1] = rel[i];
      for (d = 0; d < t->m.ndim; d++) I[2 + d] = t->stride[d];
    }
    break;
  }
  default:
    rc = err_set(e, FL_EUNSUPPORTED, "%s: %s has no CUDA lowering yet", k->name, op_name(an->op));
  }
done:
  for (i = 0; i < CUDA_CAT_MAX; i++) ten_release(&op[i]);
  return rc;
}

/* Is the epilogue's space the anchor's output, read element for element? */
static int epilogue_fits(const fk_kernel *k, const int64_t *args, int64_t total) {
  int D = k->nkept + k->nred, a, d;
  int64_t cs[FL_MAX_DIMS], n = 1;
  for (d = D - 1; d >= 0; d--) { cs[d] = n; n *= args[d]; }
  if (n != total) return 0;
  for (a = 0; a < k->nacc; a++) {
    const int64_t *st = args + D + a * (D + 1);
    if (k->acc[a].node != k->anchor || k->acc[a].store) continue;
    if (st[D] != 0) return 0;
    for (d = 0; d < D; d++)
      if (args[d] > 1 && st[d] != cs[d]) return 0;
  }
  return 1;
}

static unsigned cap_grid(int64_t want) {
  int64_t cap = (int64_t)(cuda_sm_count() > 0 ? cuda_sm_count() : 80) * 32;
  if (want < 1) want = 1;
  return (unsigned)(want < cap ? want : cap);
}

/* The parameter block is the buffer addresses (already in c->block) then
** the int64 arguments: fl_params<NB, NA>'s layout. */
static int launch(run_ctx *c, void *fn, const cuda_kinfo *in, const unsigned grid[3],
                  unsigned block, fl_err *e) {
  memcpy(c->block + in->nbuf, c->args, (size_t)in->narg * sizeof(int64_t));
  return cuda_launch(fn, grid, block, c->block, (size_t)(in->nbuf + in->narg) * 8, e);
}

/* Extern kernel k's product (matmul, linear without bias; float32, at
** most one batch dim) on cuBLAS, into the anchor's buffer.  X holds the
** slots extern_args filled.  FL_EUNSUPPORTED: not a product cuBLAS can do
** here, the caller launches the generated kernel. */
static int cublas_step(run_ctx *c, const fk_kernel *k, const int64_t *X, fl_err *e) {
  const ir_graph *g = c->g;
  const ir_node *an = &g->nodes[k->anchor];
  const int64_t *Y = X + CUX_OP;
  int sa, sb;
  cublas_operand A, B;
  if ((an->op != OP_MATMUL && an->op != OP_LINEAR) || Y[CUM_HASBIAS] || Y[CUM_NBD] > 1 ||
      c->metas[k->anchor].dtype != FL_F32 || g->nodes[an->in[0]].meta.dtype != FL_F32 ||
      g->nodes[an->in[1]].meta.dtype != FL_F32)
    return err_set(e, FL_EUNSUPPORTED, "%s: not a product cuBLAS runs here", k->name);
  sa = cuda_operand_slot(c->pr->plan, k, 0);
  sb = cuda_operand_slot(c->pr->plan, k, 1);
  if (sa < 0 || sb < 0) return err_set(e, FL_EUNSUPPORTED, "%s: operand without a buffer", k->name);
  A.p = (const float *)(uintptr_t)c->block[sa] + Y[CUM_OA];
  A.srow = Y[CUM_SAM]; A.scol = Y[CUM_SAK]; A.sbatch = Y[CUM_NBD] ? Y[CUM_BSA] : 0;
  B.p = (const float *)(uintptr_t)c->block[sb] + Y[CUM_OB];
  B.srow = Y[CUM_SBK]; B.scol = Y[CUM_SBN]; B.sbatch = Y[CUM_NBD] ? Y[CUM_BSB] : 0;
  return cublas_matmul(Y[CUM_B], Y[CUM_M], Y[CUM_N], Y[CUM_K], A, B,
                       (float *)ten_data(&c->vals[k->anchor]), e);
}

static int run_kernel(run_ctx *c, int ki, fl_err *e) {
  cuda_program *pr = c->pr;
  const ir_graph *g = c->g;
  const fk_kernel *k = &pr->plan->kernels[ki];
  const cuda_kinfo *in = &pr->info[ki];
  int i, rc, D = k->nkept + k->nred, ea = fk_nargs(k);
  unsigned grid[3] = {1, 1, 1}, bs = (unsigned)(pr->block[ki] ? pr->block[ki] : 256);
  int64_t work = 1;
  if (!in->emitted) return FL_OK;
  if (!pr->fns[ki]) return err_set(e, FL_EUNSUPPORTED, "%s: no generated code", k->name);
  /* what the kernel writes */
  for (i = 0; i < k->nacc; i++) {
    int id = k->acc[i].node;
    if (!k->acc[i].store || c->vals[id].st) continue;
    if ((rc = buffer_for(c, id, e)) != FL_OK) return rc;
  }
  if (k->kind == FK_EXTERN && !c->vals[k->anchor].st && (rc = buffer_for(c, k->anchor, e)) != FL_OK)
    return rc;
  /* what it reads: buffers (views made contiguous; an extern's operands
  ** keep their own base buffers and strides) */
  for (i = 0; i < k->nbufs; i++) {
    int id = k->bufs[i];
    if ((rc = value_of(c, id, 1, e)) != FL_OK) return rc;
    c->block[i] = (uint64_t)(uintptr_t)ten_data(&c->vals[id]);
  }
  memset(c->args, 0, (size_t)in->narg * sizeof(int64_t));
  if (k->nnodes > 0 && (rc = fk_bind(k, g, c->metas, c->args, e)) != FL_OK) return rc;
  if (k->nrng && c->start) fk_rng_args(k, c->key, c->start, c->args);
  if (k->kind == FK_EXTERN) {
    int64_t *X = c->args + ea, total;
    const ir_node *an = &g->nodes[k->anchor];
    if ((rc = extern_args(c, k, X, e)) != FL_OK) return rc;
    total = X[CUX_TOTAL];
    X[CUX_FUSE] = k->nnodes > 0 && epilogue_fits(k, c->args, total);
    X[CUX_KEEP] = k->nnodes == 0 || pr->plan->last_use[k->anchor] != ki || !X[CUX_FUSE];
    if (total == 0) return FL_OK;
    /* max-autotune's pick: the product on cuBLAS into the anchor's buffer,
    ** then the epilogue kernel; a layout cuBLAS cannot take keeps ours */
    if (pr->cublas && pr->cublas[ki]) {
      if ((rc = cublas_step(c, k, X, e)) == FL_OK) {
        X[CUX_FUSE] = 0;
        goto epilogue;
      }
      if (rc != FL_EUNSUPPORTED) return rc;
      err_clear(e);
    }
    if (X[CUX_FUSE]) pr->fused_epilogues++;
    if (an->op == OP_MATMUL || an->op == OP_LINEAR) {
      const int64_t *Y = X + CUX_OP;
      int64_t tn = (Y[CUM_N] + 63) / 64, tm = (Y[CUM_M] + 63) / 64, nb = Y[CUM_B];
      grid[0] = (unsigned)(tn < 65535 ? tn : 65535);
      grid[1] = (unsigned)(tm < 65535 ? tm : 65535);
      grid[2] = (unsigned)(nb < 65535 ? nb : 65535);
      bs = 256;   /* the matmul templates assume 256 threads */
    } else {
      grid[0] = cap_grid((total + 255) / 256);
      bs = 256;
    }
    if ((rc = launch(c, pr->fns[ki], in, grid, bs, e)) != FL_OK) return rc;
  epilogue:
    if (k->nnodes == 0 || X[CUX_FUSE]) return FL_OK;
    /* the epilogue on its own, reading the anchor's buffer */
    for (i = 0; i < D - 1; i++) work *= c->args[i];
    work *= D ? c->args[D - 1] : 1;
    grid[0] = cap_grid((work + 255) / 256);
    grid[1] = grid[2] = 1;
    return launch(c, pr->epis[ki], in, grid, 256, e);
  }
  if (k->kind == FK_REDUCE) {
    int64_t rows = 1, nr = 1;
    for (i = 0; i < k->nkept; i++) rows *= c->args[i];
    for (i = k->nkept; i < D; i++) nr *= c->args[i];
    if (rows == 0) return FL_OK;
    /* threads: the row's length rounded up to warps, at most the chosen */
    {
      unsigned t = 32;
      while ((int64_t)t < nr && t < bs) t *= 2;
      bs = t;
    }
    grid[0] = (unsigned)(rows < (1 << 24) ? rows : (1 << 24));
    return launch(c, pr->fns[ki], in, grid, bs, e);
  }
  for (i = 0; i < D; i++) work *= c->args[i];
  if (work == 0) return FL_OK;
  grid[0] = cap_grid((in->vec ? (work + 3) / 4 : work) / bs + 1);
  return launch(c, pr->fns[ki], in, grid, bs, e);
}

/* Device values of params and consts: consts uploaded once, params every
** run (they are bound by reference: in-place changes must be seen), into
** the same device buffers, so a captured graph sees them too. */
static int bind_leaves(run_ctx *c, fl_err *e) {
  cuda_program *pr = c->pr;
  const ir_graph *g = c->g;
  int i, rc;
  if (!pr->consts && !(pr->consts = calloc((size_t)(g->n ? g->n : 1), sizeof *pr->consts)))
    return err_set(e, FL_ENOMEM, "run: out of memory");
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    fl_tensor *dv = &pr->consts[i];
    if (nd->kind != IR_PARAM && nd->kind != IR_CONST) continue;
    if (nd->value.m.device == FL_DEV_CUDA) {
      ten_release(dv);
      if ((rc = cuda_contiguous(dv, &nd->value, e)) != FL_OK) return rc;
    } else if (!dv->st) {
      if ((rc = cuda_copy_to(dv, &nd->value, FL_DEV_CUDA, e)) != FL_OK) return rc;
    } else if (nd->kind == IR_PARAM) {
      fl_tensor h;
      if ((rc = ten_contiguous(&h, &nd->value, e)) != FL_OK) return rc;
      rc = cuda_copy_into(dv, &h, e);
      ten_release(&h);
      if (rc != FL_OK) return rc;
    }
  }
  return FL_OK;
}

static int run(cuda_program *pr, const fl_tensor *const *inputs, int ninputs, fl_tensor *outs,
               int into, int capture, fl_err *e) {
  const fuse_plan *p = pr->plan;
  const ir_graph *g = p->g;
  run_ctx c;
  char *is_out = NULL;
  int i, k, rc = FL_OK, maxargs = 1, maxbuf = 1;
  memset(&c, 0, sizeof c);
  c.pr = pr;
  c.g = g;
  c.capture = capture;
  if (ninputs != g->ninputs)
    return err_set(e, FL_EINVAL, "run: expected %d input(s), got %d", g->ninputs, ninputs);
  for (i = 0; i < ninputs; i++)
    if (!inputs[i] || !inputs[i]->st) return err_set(e, FL_EINVAL, "run: input %d has no data", i + 1);
  if ((rc = load(pr, e)) != FL_OK) return rc;
  for (k = 0; k < p->nkernels; k++) {
    if (pr->info[k].narg > maxargs) maxargs = pr->info[k].narg;
    if (pr->info[k].nbuf > maxbuf) maxbuf = pr->info[k].nbuf;
  }
  c.metas = malloc((size_t)(g->n ? g->n : 1) * sizeof *c.metas);
  c.vals = calloc((size_t)(g->n ? g->n : 1), sizeof *c.vals);
  c.args = calloc((size_t)maxargs, sizeof *c.args);
  c.block = calloc((size_t)(maxargs + maxbuf), sizeof *c.block);
  is_out = calloc((size_t)(g->n ? g->n : 1), 1);
  if (!c.metas || !c.vals || !c.args || !c.block || !is_out) {
    rc = err_set(e, FL_ENOMEM, "run: out of memory");
    goto done;
  }
  if ((rc = ir_infer_metas(g, inputs, FL_DEV_CUDA, c.metas, e)) != FL_OK) goto done;
  if (!capture && (rc = bind_leaves(&c, e)) != FL_OK) goto done;
  for (i = 0; i < g->nout; i++) is_out[g->outputs[i]] = 1;
  /* every run draws anew, each random node in node order (cpu/compile.c) */
  for (i = 0; i < g->n; i++) {
    if (g->nodes[i].kind != IR_OP || !rng_op(g->nodes[i].op)) continue;
    if (!c.start) {
      if (!(c.start = calloc((size_t)g->n, sizeof *c.start))) {
        rc = err_set(e, FL_ENOMEM, "run: out of memory");
        goto done;
      }
      c.key = rng_key();
    }
    c.start[i] = rng_reserve(rng_draws(&c.metas[i]));
  }
  for (i = 0; i < g->nout && into; i++) {
    int id = g->outputs[i];
    const fl_tensor *o = &outs[i];
    if (o->st && o->m.device == FL_DEV_CUDA && g->nodes[id].kind == IR_OP && p->stored[id] &&
        !c.vals[id].st && o->m.dtype == c.metas[id].dtype && meta_same_shape(&o->m, &c.metas[id]) &&
        ten_is_contiguous(o))
      ten_share(&c.vals[id], o);
  }
  for (i = 0; i < g->n && rc == FL_OK; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind == IR_INPUT) {
      const fl_tensor *x = inputs[nd->index];
      if (x->m.device == FL_DEV_CUDA) rc = cuda_contiguous(&c.vals[i], x, e);
      else rc = cuda_copy_to(&c.vals[i], x, FL_DEV_CUDA, e);
    } else if (nd->kind != IR_OP) {
      ten_share(&c.vals[i], &pr->consts[i]);
    }
  }
  for (k = 0; k < p->nkernels && rc == FL_OK; k++) {
    rc = run_kernel(&c, k, e);
    if (capture) continue;     /* a captured graph keeps every buffer */
    for (i = 0; i < g->n && rc == FL_OK; i++)
      if (p->last_use[i] == k && g->nodes[i].kind == IR_OP && !is_out[i]) ten_release(&c.vals[i]);
  }
  for (i = 0; i < g->nout && rc == FL_OK; i++) {
    int id = g->outputs[i];
    if ((rc = value_of(&c, id, 0, e)) != FL_OK) break;
    if (into && outs[i].st) {
      if (outs[i].st != c.vals[id].st) {
        fl_tensor t;
        if ((rc = cuda_contiguous(&t, &c.vals[id], e)) != FL_OK) break;
        rc = cuda_copy_into(&outs[i], &t, e);
        ten_release(&t);
      }
    } else {
      ten_share(&outs[i], &c.vals[id]);
    }
  }
  if (rc == FL_OK && capture) {
    /* hold what the graph's launches address until the graph goes */
    pr->ghold = calloc((size_t)(g->n ? g->n : 1), sizeof *pr->ghold);
    if (!pr->ghold) rc = err_set(e, FL_ENOMEM, "run: out of memory");
    else for (i = 0; i < g->n; i++) ten_share(&pr->ghold[i], &c.vals[i]);
  }
  if (rc == FL_OK) pr->runs++;
done:
  if (c.vals) for (i = 0; i < g->n; i++) ten_release(&c.vals[i]);
  free(c.metas); free(c.vals); free(c.args); free(c.block); free(is_out); free(c.start);
  return rc;
}

static void drop_graph(cuda_program *pr) {
  const ir_graph *g = pr->plan->g;
  int i;
  cuda_graph_free(pr->graph);
  pr->graph = NULL;
  if (pr->gin) for (i = 0; i < g->ninputs; i++) ten_release(&pr->gin[i]);
  if (pr->gout) for (i = 0; i < g->nout; i++) ten_release(&pr->gout[i]);
  if (pr->ghold) for (i = 0; i < g->n; i++) ten_release(&pr->ghold[i]);
  free(pr->gin); free(pr->gout); free(pr->ghold);
  pr->gin = pr->gout = pr->ghold = NULL;
}

/* Capture the program for these inputs' shapes: static input buffers, one
** plain run (it allocates everything), then the captured run. */
static int capture(cuda_program *pr, const fl_tensor *const *inputs, int n, fl_err *e) {
  const ir_graph *g = pr->plan->g;
  const fl_tensor *gi[256];
  fl_tensor *warm;
  int i, rc = FL_OK, r2;
  drop_graph(pr);
  if (n > 256) return err_set(e, FL_EUNSUPPORTED, "run: too many inputs for a CUDA graph");
  pr->gin = calloc((size_t)(n ? n : 1), sizeof *pr->gin);
  pr->gout = calloc((size_t)(g->nout ? g->nout : 1), sizeof *pr->gout);
  warm = calloc((size_t)(g->nout ? g->nout : 1), sizeof *warm);
  if (!pr->gin || !pr->gout || !warm) { free(warm); drop_graph(pr); return err_set(e, FL_ENOMEM, "run: out of memory"); }
  for (i = 0; i < n && rc == FL_OK; i++) {
    rc = cuda_copy_to(&pr->gin[i], inputs[i], FL_DEV_CUDA, e);
    gi[i] = &pr->gin[i];
  }
  if (rc == FL_OK) rc = run(pr, gi, n, warm, 0, 0, e);
  for (i = 0; i < g->nout && rc == FL_OK; i++) {
    fl_meta m = warm[i].m;
    m.device = FL_DEV_CUDA;
    rc = ten_empty(&pr->gout[i], &m, e);
  }
  for (i = 0; i < g->nout; i++) ten_release(&warm[i]);
  free(warm);
  if (rc == FL_OK && (rc = cuda_sync(e)) == FL_OK && (rc = cuda_capture_begin(e)) == FL_OK) {
    rc = run(pr, gi, n, pr->gout, 1, 1, e);
    r2 = cuda_capture_end(&pr->graph, e);
    if (rc == FL_OK) rc = r2;
  }
  if (rc != FL_OK) drop_graph(pr);
  return rc;
}

static int same_shapes(const cuda_program *pr, const fl_tensor *const *inputs, int n) {
  int i;
  if (!pr->graph) return 0;
  for (i = 0; i < n; i++)
    if (!meta_same_shape(&pr->gin[i].m, &inputs[i]->m) || pr->gin[i].m.dtype != inputs[i]->m.dtype)
      return 0;
  return 1;
}

static int run_graph(cuda_program *pr, const fl_tensor *const *inputs, int n, fl_tensor *outs,
                     fl_err *e) {
  const ir_graph *g = pr->plan->g;
  run_ctx c;
  int i, rc;
  if (n != g->ninputs) return err_set(e, FL_EINVAL, "run: expected %d input(s), got %d", g->ninputs, n);
  if (!same_shapes(pr, inputs, n) && (rc = capture(pr, inputs, n, e)) != FL_OK) return rc;
  /* inputs and params into the graph's static buffers, then replay */
  for (i = 0; i < n; i++) {
    fl_tensor t;
    if (inputs[i]->m.device == FL_DEV_CUDA) rc = cuda_contiguous(&t, inputs[i], e);
    else rc = ten_contiguous(&t, inputs[i], e);
    if (rc == FL_OK) rc = cuda_copy_into(&pr->gin[i], &t, e);
    ten_release(&t);
    if (rc != FL_OK) return rc;
  }
  memset(&c, 0, sizeof c);
  c.pr = pr;
  c.g = g;
  if ((rc = bind_leaves(&c, e)) != FL_OK) return rc;
  if ((rc = cuda_graph_replay(pr->graph, e)) != FL_OK) return rc;
  /* results are fresh tensors: the static outputs are rewritten next call */
  for (i = 0; i < g->nout && rc == FL_OK; i++) rc = cuda_copy_to(&outs[i], &pr->gout[i], FL_DEV_CUDA, e);
  if (rc != FL_OK) for (i = 0; i < g->nout; i++) ten_release(&outs[i]);
  if (rc == FL_OK) { pr->runs++; pr->replays++; }
  return rc;
}

static int has_random(const ir_graph *g) {
  int i;
  for (i = 0; i < g->n; i++)
    if (g->nodes[i].kind == IR_OP && rng_op(g->nodes[i].op)) return 1;
  return 0;
}

int cuda_program_run(cuda_program *pr, const fl_tensor *const *inputs, int ninputs,
                     fl_tensor *outs, fl_err *e) {
  int rc;
  if ((rc = cuda_rt_init(e)) != FL_OK) return rc;
  /* a replayed CUDA graph would repeat its captured draws: a program with
  ** random nodes launches its kernels one by one, each run drawing anew */
  if (pr->mode == CUDA_MODE_GRAPH && !has_random(pr->plan->g))
    return run_graph(pr, inputs, ninputs, outs, e);
  return run(pr, inputs, ninputs, outs, 0, 0, e);
}

void cuda_program_set_mode(cuda_program *pr, int mode) {
  if (pr->mode != mode) drop_graph(pr);
  pr->mode = mode;
}

/* Best of 3 timed runs after a warm-up, in ms. */
static int time_runs(cuda_program *pr, const fl_tensor *const *inputs, int ninputs,
                     fl_tensor *outs, double *best, fl_err *e) {
  const ir_graph *g = pr->plan->g;
  int r, i, rc;
  *best = 1e30;
  for (r = 0; r < 4; r++) {
    double ms;
    if ((rc = cuda_timer_start(e)) != FL_OK) return rc;
    rc = run(pr, inputs, ninputs, outs, 0, 0, e);
    for (i = 0; i < g->nout; i++) ten_release(&outs[i]);
    if (rc != FL_OK) return rc;
    if ((rc = cuda_timer_stop(&ms, e)) != FL_OK) return rc;
    if (r > 0 && ms < *best) *best = ms;
  }
  return FL_OK;
}

/* The products on cuBLAS (then their epilogue kernels) against ours,
** timed on the inputs: the faster is kept, and said in note. */
static int tune_cublas(cuda_program *pr, const fl_tensor *const *inputs, int ninputs,
                       fl_tensor *outs, double ours, char *note, size_t n, fl_err *e) {
  double theirs;
  int k, any = 0, rc;
  fl_err why;
  for (k = 0; k < pr->plan->nkernels; k++) {
    const ir_node *an = &pr->plan->g->nodes[pr->plan->kernels[k].anchor];
    any |= pr->plan->kernels[k].kind == FK_EXTERN && (an->op == OP_MATMUL || an->op == OP_LINEAR);
  }
  if (!any) return FL_OK;
  err_clear(&why);
  if (!cublas_ready(&why)) {
    snprintf(note, n, "; products: ours (%s)", why.msg);
    return FL_OK;
  }
  free(pr->cublas);
  if (!(pr->cublas = malloc((size_t)pr->plan->nkernels))) return err_set(e, FL_ENOMEM, "autotune: out of memory");
  memset(pr->cublas, 1, (size_t)pr->plan->nkernels);
  if ((rc = time_runs(pr, inputs, ninputs, outs, &theirs, e)) != FL_OK) {
    free(pr->cublas);
    pr->cublas = NULL;
    return rc;
  }
  snprintf(note, n, "; products: ours %.4f ms, cuBLAS %.4f ms -> %s", ours, theirs,
           theirs < ours ? "cuBLAS" : "ours");
  if (theirs >= ours) {
    free(pr->cublas);
    pr->cublas = NULL;
  }
  return FL_OK;
}

int cuda_program_autotune(cuda_program *pr, const fl_tensor *const *inputs, int ninputs, fl_err *e) {
  static const int choices[] = {128, 256, 512};
  const ir_graph *g = pr->plan->g;
  double best = 1e30, t[3];
  int c, k, rc, n, pick = 1, mode = pr->mode;
  fl_tensor *outs = calloc((size_t)(g->nout ? g->nout : 1), sizeof *outs);
  if (!outs) return err_set(e, FL_ENOMEM, "autotune: out of memory");
  pr->mode = CUDA_MODE_DEFAULT;
  drop_graph(pr);              /* a captured graph has the old choices baked in */
  free(pr->cublas);            /* and an earlier pick must not skew the timings */
  pr->cublas = NULL;
  for (c = 0; c < 3; c++) {
    for (k = 0; k < pr->plan->nkernels; k++)
      if (pr->plan->kernels[k].kind != FK_EXTERN) pr->block[k] = choices[c];
    if ((rc = time_runs(pr, inputs, ninputs, outs, &t[c], e)) != FL_OK) goto fail;
    if (t[c] < best) { best = t[c]; pick = c; }
  }
  for (k = 0; k < pr->plan->nkernels; k++)
    if (pr->plan->kernels[k].kind != FK_EXTERN) pr->block[k] = choices[pick];
  n = snprintf(pr->tune, sizeof pr->tune, "threads per block: 128 %.4f ms, 256 %.4f ms, 512 %.4f ms -> %d",
               t[0], t[1], t[2], choices[pick]);
  if ((rc = tune_cublas(pr, inputs, ninputs, outs, best, pr->tune + n, sizeof pr->tune - (size_t)n, e)) != FL_OK)
    goto fail;
fail:
  pr->mode = mode;
  free(outs);
  return rc;
}

void cuda_program_free(cuda_program *pr) {
  int k;
  if (!pr) return;
  if (pr->plan) {
    drop_graph(pr);
    if (pr->syms) for (k = 0; k < pr->plan->nkernels; k++) free(pr->syms[k]);
    if (pr->ktext) for (k = 0; k < pr->plan->nkernels; k++) free(pr->ktext[k]);
    if (pr->alias) for (k = 0; k < pr->plan->nkernels; k++) free(pr->alias[k]);
    if (pr->slots) for (k = 0; k < pr->plan->nslots; k++) ten_release(&pr->slots[k]);
    if (pr->consts) for (k = 0; k < pr->plan->g->n; k++) ten_release(&pr->consts[k]);
  }
  free(pr->syms); free(pr->ktext); free(pr->alias); free(pr->info); free(pr->fns); free(pr->epis); free(pr->block);
  free(pr->cublas);
  free(pr->body); free(pr->source); free(pr->log);
  free(pr->slots); free(pr->consts);
  nvrtc_image_free(&pr->img);
  cuda_module_free(pr->mod);
  fuse_plan_free(pr->plan);
  free(pr);
}
