/*
** cuda_eager.c -- one op on device tensors, as eager runs it.  A view only
** changes metadata, as on the CPU.  Anything else becomes a one-op graph
** that is planned, turned into CUDA C and compiled once -- cached here by
** the graph's fingerprint -- and launched on the real inputs; an op no
** CUDA kernel lowers runs on the host on copies, its result moved back.
**
** cuda_eager_apply is an ir_apply_fn: eager ops on device tensors, the
** backward graphs autograd runs on them and the op-by-op fallback of a
** graph all go through it, so a gradient stays where its tensors are.
*/
#include <stdlib.h>
#include <string.h>

#include "cuda_eager.h"
#include "cuda_program.h"
#include "../cpu/eager.h"
#include "../exec/pipeline.h"
#include "../graph/view.h"

/* The one-op programs, by fingerprint.  Its keys include scalar operands
** (a learning rate is a constant of its kernel), so the table is bounded:
** when full it is emptied and refills with what runs now. */
#define CACHE_SLOTS 2048
static struct { char key[33]; exec_program *pr; } cache[CACHE_SLOTS];
static int cached;

static void cache_clear(void) {
  int i;
  for (i = 0; i < CACHE_SLOTS; i++) {
    exec_program_free(cache[i].pr);
    cache[i].pr = NULL;
  }
  cached = 0;
}

/* The slot of key: its program, or the empty slot it goes to. */
static int cache_slot(const char *key) {
  unsigned h = 2166136261u;
  int i;
  for (i = 0; key[i]; i++) h = (h ^ (unsigned char)key[i]) * 16777619u;
  i = (int)(h % CACHE_SLOTS);
  while (cache[i].pr && strcmp(cache[i].key, key) != 0) i = (i + 1) % CACHE_SLOTS;
  return i;
}

int cuda_host_apply(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                    fl_tensor *out, fl_err *e) {
  fl_tensor host[64];
  const fl_tensor *hin[64];
  int k, rc = FL_OK;
  if (nin > 64) return err_set(e, FL_EUNSUPPORTED, "%s: too many inputs", op_name(op));
  memset(host, 0, sizeof host);
  for (k = 0; k < nin && rc == FL_OK; k++) {
    hin[k] = in[k];
    if (in[k] && in[k]->m.device == FL_DEV_CUDA && (rc = cuda_copy_to(&host[k], in[k], FL_DEV_CPU, e)) == FL_OK)
      hin[k] = &host[k];
  }
  if (rc == FL_OK) rc = eager_apply(op, hin, nin, a, out, e);
  for (k = 0; k < nin; k++) ten_release(&host[k]);
  return rc;
}

/* op on the host, its result moved to the device. */
static int on_host(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                   fl_tensor *out, fl_err *e) {
  fl_tensor h = {0};
  int rc = cuda_host_apply(op, in, nin, a, &h, e);
  if (rc == FL_OK) rc = cuda_copy_to(out, &h, FL_DEV_CUDA, e);
  ten_release(&h);
  return rc;
}

/* The compiled one-op program of op on in (NULL, FL_EUNSUPPORTED in e:
** no CUDA kernel lowers it); *inputs gets the tensors it takes, *n
** their count (wrapped scalars are its constants). */
static exec_program *program_of(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                                const fl_tensor **inputs, int *n, fl_err *e) {
  exec_pipeline_opts o = {&cuda_backend, 0, 1};   /* the op as given, one kernel */
  exec_pipeline b;
  ir_graph *g = ir_new();
  exec_program *pr = NULL;
  int ids[64], k, id, slot;
  char key[33];
  *n = 0;
  if (!g) { err_set(e, FL_ENOMEM, "%s: out of memory", op_name(op)); return NULL; }
  for (k = 0; k < nin; k++) {
    if (!in[k]) { ids[k] = -1; continue; }
    if (in[k]->m.wrapped) ids[k] = ir_add_const(g, in[k], e);
    else { ids[k] = ir_add_input(g, &in[k]->m, NULL, e); inputs[(*n)++] = in[k]; }
    if (ids[k] < 0) goto done;
  }
  if ((id = ir_add_op(g, op, ids, nin, a, NULL, NULL, e)) < 0 || ir_add_output(g, id, e) != FL_OK)
    goto done;
  ir_fingerprint(g, key);
  slot = cache_slot(key);
  if ((pr = cache[slot].pr)) goto done;
  if (exec_pipeline_build(g, &o, &b, e) != FL_OK) goto done;
  if (b.compile_rc != FL_OK) {
    *e = b.compile_err;
    exec_pipeline_clear(&b);
    goto done;
  }
  pr = b.pr;
  b.pr = NULL;
  exec_pipeline_clear(&b);
  if (cached >= CACHE_SLOTS / 2) {
    cache_clear();
    slot = cache_slot(key);
  }
  memcpy(cache[slot].key, key, sizeof key);
  cache[slot].pr = pr;
  cached++;
done:
  ir_free(g);
  return pr;
}

int cuda_eager_apply(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a,
                     fl_tensor *out, fl_err *e) {
  const fl_tensor *inputs[64];
  exec_program *pr;
  int n;
  memset(out, 0, sizeof *out);
  if (nin > 64) return err_set(e, FL_EUNSUPPORTED, "%s: too many inputs", op_name(op));
  if ((op_info_of(op)->flags & OPF_VIEW) && in[0]) {
    const fl_meta *m[1] = {&in[0]->m};
    fl_meta om;
    int rc;
    if ((rc = op_infer(op, m, 1, a, &om, e)) != FL_OK) return rc;
    if (view_apply(op, in[0], a, &om, out, e) == FL_OK) return FL_OK;
    err_clear(e);                  /* needs a copy: a generated kernel */
    memset(out, 0, sizeof *out);
  }
  if (!(pr = program_of(op, in, nin, a, inputs, &n, e))) {
    if (e->code != FL_EUNSUPPORTED) return e->code;
    err_clear(e);                  /* no CUDA kernel for it: the host's */
    return on_host(op, in, nin, a, out, e);
  }
  return exec_program_run(pr, inputs, n, out, e);
}

int cuda_fill(fl_tensor *t, double v, fl_err *e) {
  fl_tensor h = {0};
  fl_meta m = t->m;
  int rc;
  if (t->m.device != FL_DEV_CUDA) {
    ten_fill(t, v);
    return FL_OK;
  }
  m.device = FL_DEV_CPU;
  m.wrapped = 0;
  if ((rc = ten_uninit(&h, &m, e)) != FL_OK) return rc;
  ten_fill(&h, v);
  rc = cuda_copy_into(t, &h, e);
  ten_release(&h);
  return rc;
}

void cuda_eager_free(void) { cache_clear(); }
