/*
** eager_rnn.c -- rnn (ONNX's RNN, GRU and LSTM cells, ops.def's layout).
** Per direction: one sgemm for X_t W^T of every step at once, then per
** step one sgemm for h_{t-1} R^T (two for a GRU whose reset gate comes
** before the product) and the gate math over the batch, in float32.
** Unrolled into graph ops, the same cell was hundreds of small kernels;
** here a step is one product and one pass over B x H.
** Rows past a sequence_lens entry keep their state and write zeros, as
** ONNX says (and the oracle, ref_rnn, does).
*/
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "blas.h"
#include "eager_impl.h"

/* Every operand as contiguous float32 (sequence_lens as int64). */
typedef struct rnn_ops {
  const float *x, *w, *r, *b, *h0, *c0, *p;
  float *owned[7];
  fl_tensor lens;
  const int64_t *len;
} rnn_ops;

static void rnn_ops_free(rnn_ops *o) {
  int k;
  for (k = 0; k < 7; k++) free(o->owned[k]);
  if (o->len) ten_release(&o->lens);
}

static int rnn_ops_get(fl_op op, const fl_tensor *const *in, int nin, rnn_ops *o, fl_err *e) {
  const float **dst[7];
  int k, slot[7] = {0, 1, 2, 3, 5, 6, 7};
  memset(o, 0, sizeof *o);
  dst[0] = &o->x; dst[1] = &o->w; dst[2] = &o->r; dst[3] = &o->b;
  dst[4] = &o->h0; dst[5] = &o->c0; dst[6] = &o->p;
  for (k = 0; k < 7; k++) {
    if (slot[k] >= nin || !in[slot[k]]) continue;
    if (!(*dst[k] = eager_f32(in[slot[k]], &o->owned[k], op_name(op), e))) {
      rnn_ops_free(o);
      return FL_ENOMEM;
    }
  }
  if (nin > 4 && in[4]) {
    if (ten_contiguous(&o->lens, in[4], e) != FL_OK) {
      rnn_ops_free(o);
      return err_prefix(e, "%s", op_name(op));
    }
    o->len = (const int64_t *)ten_data(&o->lens);
  }
  return FL_OK;
}

static inline float rnn_actf(int act, float v) {
  switch (act) {
  case OP_RNN_ACT_SIGMOID: return 1.0f / (1.0f + expf(-v));
  case OP_RNN_ACT_TANH: return tanhf(v);
  case OP_RNN_ACT_RELU: return v < 0.0f ? 0.0f : v;
  case OP_RNN_ACT_SOFTSIGN: return v / (1.0f + fabsf(v));
  /* log(1 + e^v) without e^v overflowing: v + log(1 + e^-v) above 0 */
  case OP_RNN_ACT_SOFTPLUS: return v > 0.0f ? v + log1pf(expf(-v)) : log1pf(expf(v));
  default: return v;
  }
}

static inline float rnn_clipf(const op_rnn *c, float v) {
  float k = (float)c->clip;
  if (!c->clip_on || v != v) return v;
  return v < -k ? -k : v > k ? k : v;
}

/* The state of one direction: h and c (B x H), their next values, the
** step's recurrent products hr (B x G*H) and GRU's r * h. */
typedef struct rnn_dir {
  const op_rnn *c;
  int d;
  int64_t T, B, NI, H, G;
  const float *rbh;        /* GRU linear_before_reset's Rbh (H), or NULL */
  const float *p;          /* LSTM peepholes i o f (3 H), or NULL */
  float *xw, *h, *c_, *hn, *cn, *hr, *rh;
} rnn_dir;

/* hr[:, col0 : col0 + n] = a R_d[row0 : row0 + n]^T, a being B x H */
static void rnn_rprod(const rnn_dir *s, const float *rd, const float *a, int64_t row0, int64_t n) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)s->B, (int)n, (int)s->H, 1.0f, a,
              (int)s->H, rd + row0 * s->H, (int)s->H, 0.0f, s->hr + row0, (int)(s->G * s->H));
}

/* One step at time t: hn, cn from h, c, then Y (or zeros past a row's
** length, the state kept). */
static void rnn_step(rnn_dir *s, const float *rd, const int64_t *len, int64_t t, float *y) {
  const op_rnn *c = s->c;
  const int *act = c->act[s->d];
  int64_t B = s->B, H = s->H, GH = s->G * s->H, b, j;
  const float *xw = s->xw + t * B * GH;
  if (c->cell == OP_RNN_CELL_GRU && !c->lbr) {
    /* z and r first: the candidate's product reads r * h */
    rnn_rprod(s, rd, s->h, 0, 2 * H);
    for (b = 0; b < B; b++)
      for (j = 0; j < H; j++) {
        float r = rnn_actf(act[0], rnn_clipf(c, xw[b * GH + H + j] + s->hr[b * GH + H + j]));
        s->rh[b * H + j] = r * s->h[b * H + j];
      }
    rnn_rprod(s, rd, s->rh, 2 * H, H);
  } else {
    rnn_rprod(s, rd, s->h, 0, GH);
  }
  for (b = 0; b < B; b++) {
    const float *xb = xw + b * GH, *hb = s->hr + b * GH, *h = s->h + b * H, *cc = s->c_ + b * H;
    float *hn = s->hn + b * H, *cn = s->cn + b * H, *yb = y + b * H;
    int live = !len || t < len[b];
    if (!live) {
      memcpy(hn, h, (size_t)H * sizeof *hn);
      memcpy(cn, cc, (size_t)H * sizeof *cn);
      memset(yb, 0, (size_t)H * sizeof *yb);
      continue;
    }
    if (c->cell == OP_RNN_CELL_RNN) {
      for (j = 0; j < H; j++) hn[j] = rnn_actf(act[0], rnn_clipf(c, xb[j] + hb[j]));
    } else if (c->cell == OP_RNN_CELL_GRU) {
      for (j = 0; j < H; j++) {
        float z = rnn_actf(act[0], rnn_clipf(c, xb[j] + hb[j])), hh;
        if (c->lbr) {
          float r = rnn_actf(act[0], rnn_clipf(c, xb[H + j] + hb[H + j]));
          float rb = s->rbh ? s->rbh[j] : 0.0f;
          hh = rnn_actf(act[1], rnn_clipf(c, xb[2 * H + j] + r * (hb[2 * H + j] + rb)));
        } else {
          hh = rnn_actf(act[1], rnn_clipf(c, xb[2 * H + j] + hb[2 * H + j]));
        }
        hn[j] = (1.0f - z) * hh + z * h[j];
      }
    } else {
      const float *p = s->p;
      for (j = 0; j < H; j++) {
        float pi = p ? p[j] : 0.0f, po = p ? p[H + j] : 0.0f, pf = p ? p[2 * H + j] : 0.0f;
        float gi = rnn_actf(act[0], rnn_clipf(c, xb[j] + hb[j] + pi * cc[j]));
        float gf = rnn_actf(act[0], rnn_clipf(c, xb[2 * H + j] + hb[2 * H + j] + pf * cc[j]));
        float gc = rnn_actf(act[1], rnn_clipf(c, xb[3 * H + j] + hb[3 * H + j]));
        float go;
        cn[j] = gf * cc[j] + gi * gc;
        go = rnn_actf(act[0], rnn_clipf(c, xb[H + j] + hb[H + j] + po * cn[j]));
        hn[j] = go * rnn_actf(act[2], cn[j]);
      }
    }
    memcpy(yb, hn, (size_t)H * sizeof *yb);
  }
  { float *u = s->h; s->h = s->hn; s->hn = u; }
  if (c->cell == OP_RNN_CELL_LSTM) { float *u = s->c_; s->c_ = s->cn; s->cn = u; }
}

int eager_rnn(fl_op op, const fl_tensor *const *in, int nin, const op_attrs *a, fl_tensor *out,
              fl_err *e) {
  op_rnn c;
  rnn_ops o;
  rnn_dir s;
  float *yo = NULL, *y, *buf;
  int64_t T = in[0]->m.shape[0], B = in[0]->m.shape[1], NI = in[0]->m.shape[2];
  int64_t H = in[2]->m.shape[2], G, GH, S, D, t, k, n;
  int d, rc;
  op_rnn_of(a, &c);
  G = c.gates; GH = G * H; S = c.states; D = c.dirs;
  if (T * B > INT32_MAX || GH > INT32_MAX || NI > INT32_MAX)
    return err_set(e, FL_EUNSUPPORTED, "%s: sizes beyond BLAS's int (seq*batch %lld, gates*hidden %lld)",
                   op_name(op), (long long)(T * B), (long long)GH);
  if ((rc = rnn_ops_get(op, in, nin, &o, e)) != FL_OK) return rc;
  if (!(y = eager_out_f32(out, &yo, op_name(op), e))) { rnn_ops_free(&o); return FL_ENOMEM; }
  /* xw (T B GH), bias (GH), h c hn cn rh (B H each), hr (B GH) */
  n = T * B * GH + GH + 5 * B * H + B * GH;
  if (!(buf = eager_alloc((size_t)n * sizeof *buf, op_name(op), e))) {
    free(yo);
    rnn_ops_free(&o);
    return FL_ENOMEM;
  }
  cpu_blas_pick();
  for (d = 0; d < D; d++) {
    int rev = D == 2 ? d == 1 : c.reverse;
    const float *wd = o.w + (int64_t)d * GH * NI, *rd = o.r + (int64_t)d * GH * H;
    float *bias;
    memset(&s, 0, sizeof s);
    s.c = &c; s.d = d; s.T = T; s.B = B; s.NI = NI; s.H = H; s.G = G;
    s.xw = buf; bias = s.xw + T * B * GH;
    s.h = bias + GH; s.c_ = s.h + B * H; s.hn = s.c_ + B * H; s.cn = s.hn + B * H;
    s.rh = s.cn + B * H; s.hr = s.rh + B * H;
    s.p = o.p ? o.p + (int64_t)d * 3 * H : NULL;
    /* both biases fold into X W^T, but for GRU's linear_before_reset,
    ** where Rbh sits inside r * (h Rh^T + Rbh) */
    for (k = 0; k < GH; k++) {
      const float *bd = o.b ? o.b + (int64_t)d * 2 * GH : NULL;
      int inner = c.cell == OP_RNN_CELL_GRU && c.lbr && k >= 2 * H;
      bias[k] = bd ? bd[k] + (inner ? 0.0f : bd[GH + k]) : 0.0f;
    }
    s.rbh = o.b && c.cell == OP_RNN_CELL_GRU && c.lbr ? o.b + (int64_t)d * 2 * GH + GH + 2 * H : NULL;
    if (NI == 0) memset(s.xw, 0, (size_t)(T * B * GH) * sizeof *s.xw);
    else if (T * B > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(T * B), (int)GH, (int)NI, 1.0f,
                  o.x, (int)NI, wd, (int)NI, 0.0f, s.xw, (int)GH);
    for (t = 0; t < T * B; t++)
      for (k = 0; k < GH; k++) s.xw[t * GH + k] += bias[k];
    for (k = 0; k < B * H; k++) {
      s.h[k] = o.h0 ? o.h0[(int64_t)d * B * H + k] : 0.0f;
      s.c_[k] = o.c0 ? o.c0[(int64_t)d * B * H + k] : 0.0f;
    }
    for (k = 0; k < T; k++) {
      t = rev ? T - 1 - k : k;
      rnn_step(&s, rd, o.len, t, y + ((S + t) * D + d) * B * H);
    }
    memcpy(y + (int64_t)d * B * H, s.h, (size_t)(B * H) * sizeof *y);
    if (S == 2) memcpy(y + (D + d) * B * H, s.c_, (size_t)(B * H) * sizeof *y);
  }
  free(buf);
  eager_out_done(out, yo);
  rnn_ops_free(&o);
  return FL_OK;
}
