/*
** compose.c -- the composite ops in primitives (compose.h).
*/
#include "compose.h"

#define OP1(o, x) c->op(c->ctx, o, x, -1)
#define OP2(o, x, y) c->op(c->ctx, o, x, y)

/* softmax(x)     = e / sum(e)               with e = exp(x - amax(x))
** log_softmax(x) = (x - m) - log(sum(exp(x - m)))
** Subtracting the row max keeps exp from overflowing, as every real
** implementation does. */
static int softmax(const cbuild *c, int x, int log) {
  int z = OP2(OP_SUB, x, c->reduce(c->ctx, OP_AMAX, x));
  int ez = OP1(OP_EXP, z);
  int s = c->reduce(c->ctx, OP_SUM, ez);
  return log ? OP2(OP_SUB, z, OP1(OP_LOG, s)) : OP2(OP_DIV, ez, s);
}

/* (x - mean) * rsqrt(mean((x - mean)^2) + eps) * w + b: the population
** variance, as PyTorch */
static int layer_norm(const cbuild *c, const int *in, int nin, double eps) {
  int xc = OP2(OP_SUB, in[0], c->reduce(c->ctx, OP_MEAN, in[0]));
  int v = c->reduce(c->ctx, OP_MEAN, OP2(OP_MUL, xc, xc));
  int y = OP2(OP_MUL, xc, OP1(OP_RSQRT, OP2(OP_ADD, v, c->konst(c->ctx, eps))));
  if (nin > 1 && in[1] >= 0) y = OP2(OP_MUL, y, in[1]);
  if (nin > 2 && in[2] >= 0) y = OP2(OP_ADD, y, in[2]);
  return y;
}

/* x * rsqrt(mean(x^2) + eps) * w */
static int rms_norm(const cbuild *c, const int *in, int nin, double eps) {
  int ms = c->reduce(c->ctx, OP_MEAN, OP2(OP_MUL, in[0], in[0]));
  int y = OP2(OP_MUL, in[0], OP1(OP_RSQRT, OP2(OP_ADD, ms, c->konst(c->ctx, eps))));
  if (nin > 1 && in[1] >= 0) y = OP2(OP_MUL, y, in[1]);
  return y;
}

/* (x - mean) * rsqrt(var + eps) * w + b, mean and var given (inference,
** or training's batch statistics computed before it) */
static int batch_norm(const cbuild *c, const int *in, int nin, double eps) {
  int y = OP2(OP_SUB, in[0], in[1]);
  y = OP2(OP_MUL, y, OP1(OP_RSQRT, OP2(OP_ADD, in[2], c->konst(c->ctx, eps))));
  if (nin > 3 && in[3] >= 0) y = OP2(OP_MUL, y, in[3]);
  if (nin > 4 && in[4] >= 0) y = OP2(OP_ADD, y, in[4]);
  return y;
}

int compose(const cbuild *c, fl_op op, const op_attrs *a, const int *in, int nin) {
  switch (op) {
  case OP_SOFTMAX: return softmax(c, in[0], 0);
  case OP_LOG_SOFTMAX: return softmax(c, in[0], 1);
  case OP_LAYER_NORM: return layer_norm(c, in, nin, a->f[0]);
  case OP_RMS_NORM: return rms_norm(c, in, nin, a->f[0]);
  case OP_BATCH_NORM: return batch_norm(c, in, nin, a->f[0]);
  default: return -1;
  }
}
