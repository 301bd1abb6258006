/*
** pair.c -- a compiled training pair (see pair.h).
*/
#include <stdlib.h>
#include <string.h>

#include "exec/pair.h"
#include "fuse/plan.h"

exec_pair *exec_pair_new(exec_program *fw, exec_program *bw, int nres, int nsaved,
                         const int *saved_in, int seeded, int ntan, const int *tan, fl_err *e) {
  const ir_graph *fg = fw->plan->g, *bg = bw->plan->g;
  exec_pair *p;
  int k, nout = 0;
  for (k = 0; k < nsaved; k++) {
    if (saved_in[k] >= fg->ninputs) {
      err_set(e, FL_EINVAL, "pair: saved value %d is input %d of a forward of %d", k + 1,
              saved_in[k] + 1, fg->ninputs);
      return NULL;
    }
    if (saved_in[k] < 0) nout++;
  }
  if (nres < 1 || nres + nout > fg->nout) {
    err_set(e, FL_EINVAL, "pair: %d results and %d saved outputs from a forward of %d outputs",
            nres, nout, fg->nout);
    return NULL;
  }
  if (bg->ninputs != nsaved + (seeded ? 1 + ntan : 0) || (ntan && !seeded)) {
    err_set(e, FL_EINVAL, "pair: %d saved values and %d tangents for a backward of %d inputs",
            nsaved, seeded ? ntan + 1 : 0, bg->ninputs);
    return NULL;
  }
  for (k = 0; k < ntan; k++)
    if (tan[k] < 1 || tan[k] >= nres) {
      err_set(e, FL_EINVAL, "pair: tangent %d is result %d of %d", k + 1, tan[k] + 1, nres);
      return NULL;
    }
  if (!(p = calloc(1, sizeof *p)) || !(p->saved_in = malloc((size_t)(nsaved + 1) * sizeof *p->saved_in)) ||
      !(p->tan = malloc((size_t)(ntan + 1) * sizeof *p->tan))) {
    if (p) free(p->saved_in);
    free(p);
    err_set(e, FL_ENOMEM, "pair: out of memory");
    return NULL;
  }
  memcpy(p->saved_in, saved_in, (size_t)nsaved * sizeof *saved_in);
  memcpy(p->tan, tan, (size_t)ntan * sizeof *tan);
  p->refs = 1;
  p->fw = exec_program_retain(fw);
  p->bw = exec_program_retain(bw);
  p->nres = nres;
  p->nsaved = nsaved;
  p->nsaved_out = nout;
  p->seeded = seeded != 0;
  p->ntan = ntan;
  return p;
}

exec_pair *exec_pair_ref(exec_pair *p) {
  if (p) p->refs++;
  return p;
}

void exec_pair_free(exec_pair *p) {
  if (!p || --p->refs > 0) return;
  exec_program_free(p->fw);
  exec_program_free(p->bw);
  free(p->saved_in);
  free(p->tan);
  free(p);
}

int exec_pair_forward(exec_pair *p, const fl_tensor *const *in, fl_tensor *outs, fl_tensor *saved,
                      fl_err *e) {
  const ir_graph *fg = p->fw->plan->g;
  int k, j = p->nres, rc = exec_program_run(p->fw, in, fg->ninputs, outs, e);
  if (rc != FL_OK) return rc;
  for (k = 0; k < p->nsaved; k++) ten_share(&saved[k], p->saved_in[k] >= 0 ? in[p->saved_in[k]] : &outs[j++]);
  return FL_OK;
}

int exec_pair_backward(exec_pair *p, const fl_tensor *saved, const fl_tensor *gout,
                       const fl_tensor *tan, fl_tensor *gin, fl_err *e) {
  int n = p->nsaved + (p->seeded ? 1 + p->ntan : 0), k, rc;
  const fl_tensor **in = malloc((size_t)(n + 1) * sizeof *in);
  if (!in) return err_set(e, FL_ENOMEM, "backward: out of memory");
  for (k = 0; k < p->nsaved; k++) in[k] = &saved[k];
  if (p->seeded) {
    in[p->nsaved] = gout;
    for (k = 0; k < p->ntan; k++) in[p->nsaved + 1 + k] = &tan[k];
  }
  rc = exec_program_run(p->bw, in, n, gin, e);
  free(in);
  return rc;
}
