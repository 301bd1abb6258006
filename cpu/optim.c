/*
** optim.c -- the fused optimizer updates of optim.h.  Each element runs
** PyTorch's single-tensor formula (torch/optim/adam.py, sgd.py) with the
** same float32 operations in the same order; the library is built
** without floating-point contraction (-std=c11), so no step is fused
** into an FMA that PyTorch's kernels would round twice.
*/
#include <math.h>
#include <string.h>

#include "eager_impl.h"
#include "optim.h"

/* float32, on the CPU, p's shape; contiguous where written */
static int usable(const fl_tensor *t, const fl_tensor *p, int written) {
  return t && t->st && t->m.dtype == FL_F32 && t->m.device == FL_DEV_CPU &&
         meta_same_shape(&t->m, &p->m) && (!written || ten_is_contiguous(t));
}

/* grad as a contiguous float32 array (a copy when it is a view) */
static const float *grad_data(const fl_tensor *grad, fl_tensor *copy, fl_err *e) {
  if (ten_is_contiguous(grad)) return (const float *)ten_data(grad);
  if (ten_contiguous(copy, grad, e) != FL_OK) return NULL;
  return (const float *)ten_data(copy);
}

int cpu_adam_step(fl_tensor *p, const fl_tensor *grad, fl_tensor *m, fl_tensor *v,
                  fl_tensor *vmax, const cpu_adam *o, fl_err *e) {
  const int64_t n = meta_numel(&p->m);
  const double bc1 = 1 - pow(o->beta1, (double)o->step), bc2 = 1 - pow(o->beta2, (double)o->step);
  const float w = (float)(1 - o->beta1), b2 = (float)o->beta2, cb2 = (float)(1 - o->beta2);
  const float decay = (float)(1 - o->lr * o->weight_decay), wd = (float)o->weight_decay;
  const float step = (float)(-(o->lr / bc1)), bc2s = (float)sqrt(bc2), eps = (float)o->eps;
  const int coupled = o->weight_decay != 0 && !o->decoupled, dec = o->weight_decay != 0 && o->decoupled;
  fl_tensor copy = {0};
  float *P, *M, *V, *X;
  const float *G;
  int64_t i;
  if (!usable(p, p, 1) || !usable(grad, p, 0) || !usable(m, p, 1) || !usable(v, p, 1) ||
      (vmax && !usable(vmax, p, 1)))
    return FL_EUNSUPPORTED;
  if (!(G = grad_data(grad, &copy, e))) return e ? e->code : FL_ENOMEM;
  P = (float *)ten_data(p);
  M = (float *)ten_data(m);
  V = (float *)ten_data(v);
  X = vmax ? (float *)ten_data(vmax) : NULL;
  EAGER_PRAGMA(omp parallel for simd schedule(static) if (n > EAGER_PAR_MIN))
  for (i = 0; i < n; i++) {
    float g = o->maximize ? -G[i] : G[i], vi, den;
    if (dec) P[i] = P[i] * decay;
    if (coupled) g = g + wd * P[i];
    /* lerp(m, g, w), as PyTorch's kernel computes it on either side of 0.5 */
    M[i] = w < 0.5f ? M[i] + w * (g - M[i]) : g - (g - M[i]) * (1.0f - w);
    V[i] = V[i] * b2 + cb2 * g * g;
    vi = V[i];
    if (X) { X[i] = X[i] > vi || X[i] != X[i] ? X[i] : vi; vi = X[i]; }
    den = sqrtf(vi) / bc2s + eps;
    P[i] = P[i] + step * M[i] / den;
  }
  ten_release(&copy);
  ten_wrote(p);
  ten_wrote(m);
  ten_wrote(v);
  if (vmax) ten_wrote(vmax);
  return FL_OK;
}

int cpu_sgd_step(fl_tensor *p, const fl_tensor *grad, fl_tensor *buf, const cpu_sgd *o,
                 fl_err *e) {
  const int64_t n = meta_numel(&p->m);
  const float wd = (float)o->weight_decay, mom = (float)o->momentum;
  const float damp = (float)(1 - o->dampening), lr = (float)(-o->lr);
  fl_tensor copy = {0};
  float *P, *Bf;
  const float *G;
  int64_t i;
  if (!usable(p, p, 1) || !usable(grad, p, 0) || (buf && !usable(buf, p, 1)))
    return FL_EUNSUPPORTED;
  if (!(G = grad_data(grad, &copy, e))) return e ? e->code : FL_ENOMEM;
  P = (float *)ten_data(p);
  Bf = buf ? (float *)ten_data(buf) : NULL;
  EAGER_PRAGMA(omp parallel for simd schedule(static) if (n > EAGER_PAR_MIN))
  for (i = 0; i < n; i++) {
    float g = o->maximize ? -G[i] : G[i];
    if (o->weight_decay != 0) g = g + wd * P[i];
    if (Bf) {
      Bf[i] = o->first ? g : Bf[i] * mom + damp * g;
      g = o->nesterov ? g + mom * Bf[i] : Bf[i];
    }
    P[i] = P[i] + lr * g;
  }
  ten_release(&copy);
  ten_wrote(p);
  if (buf) ten_wrote(buf);
  return FL_OK;
}
