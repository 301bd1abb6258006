/*
** backend.c -- what the C backend does that no other does (backend.h):
** render with codegen.c, compile through the cache, launch a kernel as a
** call on the plan's buffers with a row scratch where it needs one, and
** run an extern step with the eager kernels into its planned buffer.
*/
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"
#include "codegen.h"
#include "eager.h"
#include "../exec/cache.h"

/* launch info: row-scratch floats per reduced element (codegen.h) */
typedef struct cpu_kinfo { int scratch; } cpu_kinfo;

static void preamble(strbuf *b, const fuse_plan *const *plans, int n) {
  (void)plans; (void)n;
  cpu_emit_preamble(b);
}

static int render(strbuf *b, const fuse_plan *p, int k, const char *sym, void *kinfo, fl_err *e) {
  (void)e;
  return cpu_emit_kernel(b, p, k, sym, &((cpu_kinfo *)kinfo)->scratch);
}

static int compile(const char *head, const char *const *units, int nunits, void **image,
                   char **log, int *how, fl_err *e) {
  return cache_load_units(head, units, nunits, (cache_obj **)image, log, how, e);
}

static void *image_retain(void *img) { return cache_retain(img); }
static void image_release(void *img) { cache_release(img); }

static int load(exec_program *pr, fl_err *e) {
  int k;
  for (k = 0; k < pr->plan->nkernels; k++) {
    const char *sym = pr->alias[k] ? pr->alias[k] : pr->syms[k];
    if (!pr->syms[k]) continue;
    if (!(pr->fns[k] = cache_sym(pr->image, sym)))
      return err_set(e, FL_ECOMPILE, "compile: kernel %s missing from the object", sym);
  }
  return FL_OK;
}

static int to_device(fl_tensor *dst, const fl_tensor *src, fl_err *e) {
  if (src->m.device != FL_DEV_CPU)
    return err_set(e, FL_EINVAL, "a %s tensor: the C backend runs on CPU tensors (x:cpu())",
                   src->m.device == FL_DEV_CUDA ? "CUDA" : "device");
  return ten_contiguous(dst, src, e);
}

static int copy_into(fl_tensor *dst, const fl_tensor *src, fl_err *e) { return ten_copy(dst, src, e); }
static int no_sync(fl_err *e) { (void)e; return FL_OK; }
static int nargs(const exec_program *pr, int k) { return fk_nargs(&pr->plan->kernels[k]); }

/* The extern op of kernel k (a product), written into its planned buffer:
** the same memory every call, no fresh pages. */
static int run_extern(exec_run *r, const fk_kernel *k, fl_err *e) {
  const ir_graph *g = r->g;
  const ir_node *nd = &g->nodes[k->anchor];
  const fl_tensor *args[64];
  fl_tensor t;
  int i, rc;
  memset(&t, 0, sizeof t);
  for (i = 0; i < nd->nin && i < 64; i++) {
    args[i] = NULL;
    if (nd->in[i] < 0) continue;
    if ((rc = exec_value(r, nd->in[i], 0, e)) != FL_OK) return rc;
    args[i] = &r->vals[nd->in[i]];
  }
  /* the target: the caller's output tensor when it was given one, else
  ** the planned slot (fresh memory for graph outputs) */
  if (r->vals[k->anchor].st) ten_share(&t, &r->vals[k->anchor]);
  else if (r->pr->plan->slot[k->anchor] >= 0 && (rc = exec_buffer(r, k->anchor, &t, e)) != FL_OK)
    return rc;
  if ((rc = eager_apply_into(nd->op, args, nd->nin, &nd->attrs, &t, e)) != FL_OK) return rc;
  if (t.st != r->vals[k->anchor].st) {
    ten_release(&r->vals[k->anchor]);
    rc = ten_contiguous(&r->vals[k->anchor], &t, e);
  }
  ten_release(&t);
  return rc;
}

static int launch(exec_run *r, int ki, fl_err *e) {
  exec_program *pr = r->pr;
  const fk_kernel *k = &pr->plan->kernels[ki];
  const cpu_kinfo *in = EXEC_KINFO(pr, ki);
  void *bufs[257];
  void *scratch = NULL;
  int i, rc;
  if (k->kind == FK_EXTERN && (rc = run_extern(r, k, e)) != FL_OK) return rc;
  if (k->nnodes == 0) return FL_OK;
  if (!pr->fns[ki]) return err_set(e, FL_EUNSUPPORTED, "%s: no generated code", k->name);
  if (k->nbufs > 256) return err_set(e, FL_EUNSUPPORTED, "%s: too many buffers", k->name);
  for (i = 0; i < k->nacc; i++) {
    int id = k->acc[i].node;
    if (!k->acc[i].store || r->vals[id].st) continue;
    if ((rc = exec_buffer(r, id, &r->vals[id], e)) != FL_OK) return rc;
  }
  for (i = 0; i < k->nbufs; i++) {
    int id = k->bufs[i];
    if (!r->vals[id].st && (rc = exec_value(r, id, 0, e)) != FL_OK) return rc;
    bufs[i] = ten_data(&r->vals[id]);
  }
  if (in->scratch) {
    /* the reduced elements of one row, per value kept, per thread */
    int64_t nr = 1;
    int d, threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    for (d = k->nkept; d < k->nkept + k->nred; d++) nr *= r->args[d];
    scratch = malloc((size_t)threads * (size_t)in->scratch * (size_t)(nr ? nr : 1) * sizeof(float));
    if (!scratch)
      return err_set(e, FL_ENOMEM, "%s: cannot allocate its row scratch (%d x %lld floats)",
                     k->name, threads * in->scratch, (long long)nr);
  }
  bufs[k->nbufs] = scratch;
  ((cpu_kernel_fn)pr->fns[ki])(bufs, r->args);
  free(scratch);
  return FL_OK;
}

const exec_backend cpu_backend = {
  "cpu", FL_DEV_CPU, sizeof(cpu_kinfo),
  preamble, render,
  compile, image_retain, image_release,
  load, to_device, copy_into, launch, no_sync, nargs, NULL
};
