/*
** random_graph.h -- the random graph generator of test_diff.c, shared with
** the CUDA tests (test_nvrtc.c, tests/gpu/test_gpu.c): random DAGs over
** the ops the code generators lower, on random shapes with broadcasting,
** size-1 and odd sizes, mostly float32 with some int64, bool, float16 and
** bfloat16 values, plus matmul as an extern step.  Graph i is
** rg_random_graph(seed + i): any graph can be rebuilt alone.  One
** generator for every differential test, so a seed names the same graph
** everywhere.
*/
#ifndef FL_RANDOM_GRAPH_H
#define FL_RANDOM_GRAPH_H

#include <math.h>
#include <string.h>

#include "fuse_graphs.h"

#define RG_MAXN 64

static uint64_t rg_state __attribute__((unused));
static inline unsigned rg_rnd(unsigned n) {
  rg_state ^= rg_state << 13; rg_state ^= rg_state >> 7; rg_state ^= rg_state << 17;
  return n ? (unsigned)(rg_state % n) : 0;
}

static inline int64_t rg_pick_dim(void) {
  static const int64_t dims[] = {1, 1, 2, 3, 4, 5, 7, 8, 16, 33};
  return dims[rg_rnd(sizeof dims / sizeof dims[0])];
}

static inline fl_meta rg_rand_meta(void) {
  fl_meta m;
  int d;
  memset(&m, 0, sizeof m);
  m.dtype = FL_F32;
  m.ndim = 1 + (int)rg_rnd(3);
  if (rg_rnd(12) == 0) { m.ndim = 1; m.shape[0] = 1023; return m; }
  if (rg_rnd(16) == 0) { m.ndim = 2; m.shape[0] = 3; m.shape[1] = 1023; return m; }
  for (d = 0; d < m.ndim; d++) m.shape[d] = rg_pick_dim();
  return m;
}

static inline int rg_new_input(ir_graph *g, fl_meta m) {
  fl_err e;
  return ir_add_input(g, &m, NULL, &e);
}

/* a shape that broadcasts against m: some dims 1, maybe fewer dims */
static inline fl_meta rg_bcast_of(const fl_meta *m) {
  fl_meta r = *m;
  int d, drop = m->ndim > 1 && rg_rnd(3) == 0 ? 1 : 0;
  r.ndim = m->ndim - drop;
  for (d = 0; d < r.ndim; d++) {
    r.shape[d] = m->shape[d + drop];
    if (rg_rnd(3) == 0) r.shape[d] = 1;
  }
  return r;
}

static inline int rg_any_node(ir_graph *g) {
  return (int)rg_rnd((unsigned)g->n);
}

static inline int rg_try_op(ir_graph *g, fl_op op, const int *in, int nin, const op_attrs *a) {
  fl_err e;
  int id = ir_add_op(g, op, in, nin, a, NULL, NULL, &e);
  if (id >= 0 && meta_numel(&g->nodes[id].meta) > 20000) return -1;  /* keep the oracle fast */
  return id;
}

static inline int rg_is_float(ir_graph *g, int id) { return dtype_is_float(g->nodes[id].meta.dtype); }

static inline int rg_add_random_op(ir_graph *g) {
  static const fl_op un[] = {OP_ABS, OP_NEG, OP_EXP, OP_LOG, OP_SQRT, OP_RSQRT, OP_SIN, OP_COS,
                             OP_TANH, OP_SIGMOID, OP_RELU, OP_GELU, OP_GELU_TANH, OP_SILU, OP_ERF, OP_CLAMP};
  static const fl_op bin[] = {OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAXIMUM, OP_MINIMUM, OP_POW,
                              OP_ADD, OP_MUL, OP_SUB};
  static const fl_op cmp[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
  static const fl_op red[] = {OP_SUM, OP_MEAN, OP_AMAX, OP_AMIN, OP_VAR, OP_SUM};
  op_attrs a;
  int x = rg_any_node(g), in[3], k = (int)rg_rnd(100);
  const fl_meta *m = &g->nodes[x].meta;
  if (k < 22) {
    fl_op op = un[rg_rnd(sizeof un / sizeof un[0])];
    op_attrs_init(op, &a);
    if (op == OP_CLAMP) { a.f[0] = -0.5; a.f[1] = rg_rnd(2) ? 0.75 : INFINITY; }
    return rg_try_op(g, op, &x, 1, &a);
  }
  if (k < 50) {
    fl_op op = k < 44 ? bin[rg_rnd(sizeof bin / sizeof bin[0])] : cmp[rg_rnd(sizeof cmp / sizeof cmp[0])];
    int y, c = (int)rg_rnd(4);
    if (c == 0) y = fg_scalar(g, (double)(int)rg_rnd(5) - 1.5);
    else if (c == 1) {
      int t, tries;
      for (y = -1, tries = 0; tries < 8 && y < 0; tries++) {
        t = rg_any_node(g);
        if (meta_same_shape(&g->nodes[t].meta, m)) y = t;
      }
      if (y < 0) y = rg_new_input(g, rg_bcast_of(m));
    } else {
      fl_meta bm = rg_bcast_of(m);
      if (rg_rnd(6) == 0 && rg_is_float(g, x)) bm.dtype = FL_I64;
      y = rg_new_input(g, bm);
    }
    /* integer pow: exact, wrapping, negative exponents as PyTorch */
    if (op == OP_POW && !rg_is_float(g, x) && (c == 0 || g->nodes[x].meta.dtype != FL_I64)) op = OP_MUL;
    in[0] = rg_rnd(2) ? x : y;
    in[1] = in[0] == x ? y : x;
    /* pow's exponent fresh from [-2, 2]: a computed exponent of 1e10 makes
    ** the sign of the result hang on its last bit (exp's 1-ulp freedom) */
    if (op == OP_POW) {
      fl_meta em = rg_bcast_of(m);
      in[0] = x;
      in[1] = c == 0 ? y : rg_new_input(g, em);
    }
    op_attrs_init(op, &a);
    return rg_try_op(g, op, in, 2, &a);
  }
  if (k < 56) {
    int c = -1, i;
    for (i = g->n - 1; i >= 0; i--)
      if (g->nodes[i].meta.dtype == FL_BOOL && rg_rnd(2)) { c = i; break; }
    if (c < 0) {
      int y = rg_new_input(g, rg_bcast_of(m));
      in[0] = x; in[1] = y;
      op_attrs_init(OP_GT, &a);
      if ((c = rg_try_op(g, OP_GT, in, 2, &a)) < 0) return -1;
    }
    in[0] = c; in[1] = x; in[2] = rg_rnd(2) ? fg_scalar(g, 0.25) : rg_new_input(g, rg_bcast_of(m));
    op_attrs_init(OP_WHERE, &a);
    return rg_try_op(g, OP_WHERE, in, 3, &a);
  }
  if (k < 70 && m->ndim > 0) {
    fl_op op = red[rg_rnd(sizeof red / sizeof red[0])];
    int d0 = (int)rg_rnd((unsigned)m->ndim), d1 = (int)rg_rnd((unsigned)m->ndim);
    op_attrs_init(op, &a);
    a.ndims = rg_rnd(5) == 0 ? 0 : (d0 != d1 && rg_rnd(3) == 0) ? 2 : 1;
    a.dims[0] = d0 < d1 || a.ndims == 1 ? d0 : d1;
    a.dims[1] = d0 < d1 ? d1 : d0;
    a.keepdim = (int)rg_rnd(2);
    if (op == OP_VAR) a.f[0] = rg_rnd(2);
    if (op == OP_AMAX && rg_rnd(4) == 0 && g->nodes[x].kind == IR_INPUT) {
      op = OP_ARGMAX;       /* on raw inputs only: ties there are impossible */
      a.ndims = 1;
      a.dims[0] = d0;
    }
    return rg_try_op(g, op, &x, 1, &a);
  }
  if (k < 78 && m->ndim > 0 && rg_is_float(g, x)) {
    int c = (int)rg_rnd(4), nd = m->ndim >= 2 && rg_rnd(3) == 0 ? 2 : 1;
    fl_op op = c == 0 ? OP_SOFTMAX : c == 1 ? OP_LOG_SOFTMAX : c == 2 ? OP_LAYER_NORM : OP_RMS_NORM;
    op_attrs_init(op, &a);
    in[0] = x;
    if (op == OP_SOFTMAX || op == OP_LOG_SOFTMAX) {
      a.i[0] = rg_rnd((unsigned)m->ndim);
      return rg_try_op(g, op, in, 1, &a);
    } else {
      fl_meta wm;
      int n = 1, d;
      memset(&wm, 0, sizeof wm);
      wm.dtype = FL_F32;
      wm.ndim = nd;
      for (d = 0; d < nd; d++) wm.shape[d] = m->shape[m->ndim - nd + d];
      a.i[0] = nd;
      if (rg_rnd(3)) in[n++] = fg_param(g, wm, "w", 0.5, 1.0);
      if (op == OP_LAYER_NORM && n == 2 && rg_rnd(2)) in[n++] = fg_param(g, wm, "b", 0.5, 0.0);
      return rg_try_op(g, op, in, n, &a);
    }
  }
  if (k < 92 && m->ndim > 0) {
    int c = (int)rg_rnd(9), d = (int)rg_rnd((unsigned)m->ndim), j;
    fl_op op;
    op_attrs_init(OP_TRANSPOSE, &a);
    switch (c) {
    case 0:
      if (m->ndim < 2) return -1;
      op = OP_TRANSPOSE; a.i[0] = d; a.i[1] = (d + 1) % m->ndim;
      break;
    case 1:
      op = OP_PERMUTE; a.ndims = m->ndim;
      for (j = 0; j < m->ndim; j++) a.dims[j] = (j + 1) % m->ndim;
      break;
    case 2:
      op = OP_UNSQUEEZE; a.i[0] = (int)rg_rnd((unsigned)m->ndim + 1);
      break;
    case 3:
      op = OP_EXPAND; a.ndims = m->ndim;
      for (j = 0; j < m->ndim; j++) a.dims[j] = m->shape[j] == 1 && rg_rnd(2) ? 3 : m->shape[j];
      break;
    case 4:
      if (m->shape[d] < 2) return -1;
      op = OP_NARROW; a.i[0] = d; a.i[1] = 1; a.i[2] = m->shape[d] - 1 - (int64_t)rg_rnd(2) * (m->shape[d] > 2);
      break;
    case 6:                       /* a strided slice: a view fusion follows */
      if (m->shape[d] < 2) return -1;
      op = OP_SLICE; a.i[0] = d; a.i[1] = (int64_t)rg_rnd(2); a.i[3] = 1 + (int64_t)rg_rnd(2);
      a.i[2] = (m->shape[d] - 1 - a.i[1]) / a.i[3] + 1;
      break;
    case 7:                       /* pad or crop one dim, any mode */
      op = OP_PAD; a.ndims = m->ndim;
      a.i[8] = (int64_t)rg_rnd(3);
      a.dims[d] = m->shape[d] > 1 && rg_rnd(2) ? -1 : (int64_t)rg_rnd(2) * (a.i[8] != 1 || m->shape[d] > 1);
      a.i[d] = a.i[8] == 1 && m->shape[d] - (a.dims[d] < 0) < 2 ? 0 : 1;
      a.f[0] = -0.5;
      break;
    case 8:
      op = OP_FLIP; a.ndims = 1; a.dims[0] = d;
      break;
    default:
      op = OP_RESHAPE; a.ndims = 1; a.dims[0] = meta_numel(m);
      if (rg_rnd(2) && m->ndim == 1 && m->shape[0] % 2 == 0) { a.ndims = 2; a.dims[0] = 2; a.dims[1] = m->shape[0] / 2; }
      break;
    }
    return rg_try_op(g, op, &x, 1, &a);
  }
  if (k < 96) {
    static const fl_dtype to[] = {FL_F16, FL_BF16, FL_F32, FL_F32, FL_I64, FL_BOOL};
    op_attrs_init(OP_TO, &a);
    a.dtype = to[rg_rnd(sizeof to / sizeof to[0])];
    /* float -> int64 only from values made integral-safe by a clamp */
    if (a.dtype == FL_I64 && rg_is_float(g, x)) return -1;
    return rg_try_op(g, OP_TO, &x, 1, &a);
  }
  if (m->ndim == 2 && rg_is_float(g, x) && g->nodes[x].meta.dtype == FL_F32) {
    fl_meta wm = fg_meta(FL_F32, 2, m->shape[1], rg_pick_dim() + 1);
    in[0] = x;
    in[1] = fg_param(g, wm, "w", 0.3, 0.0);
    op_attrs_init(OP_MATMUL, &a);
    return rg_try_op(g, OP_MATMUL, in, 2, &a);
  }
  return -1;
}

static inline ir_graph *rg_random_graph(uint64_t seed) {
  ir_graph *g = ir_new();
  int i, nops, made = 0, last = -1, tries;
  fl_meta m;
  rg_state = seed * 0x9E3779B97F4A7C15ull + 12345;
  rg_rnd(1);
  m = rg_rand_meta();
  if (rg_rnd(8) == 0) m.dtype = FL_I64;
  rg_new_input(g, m);
  if (rg_rnd(2)) rg_new_input(g, rg_rand_meta());
  nops = 2 + (int)rg_rnd(7);
  for (tries = 0; made < nops && tries < 100 && g->n < RG_MAXN - 8; tries++) {
    int id = rg_add_random_op(g);
    if (id >= 0 && g->nodes[id].kind == IR_OP) { made++; last = id; }
  }
  if (last < 0) { ir_free(g); return NULL; }
  ir_add_output(g, last, NULL);
  for (i = 0; i < 2; i++) {
    int o = rg_any_node(g);
    if (g->nodes[o].kind == IR_OP && o != last && rg_rnd(2)) { ir_add_output(g, o, NULL); break; }
  }
  return g;
}

static inline void rg_fill_inputs(ir_graph *g, fl_tensor *in, uint64_t seed) {
  int i;
  fl_err e;
  rg_state = seed * 31 + 7;
  rg_rnd(1);
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    int64_t j, n;
    if (nd->kind != IR_INPUT) continue;
    ten_empty(&in[nd->index], &nd->meta, &e);
    n = meta_numel(&nd->meta);
    for (j = 0; j < n; j++) {
      double v = nd->meta.dtype == FL_I64 ? (double)((int)rg_rnd(11) - 5) :
                 ((double)rg_rnd(1u << 20) / (1u << 20)) * 4.0 - 2.0;
      ten_set(&in[nd->index], j, v);
      /* int64 beyond 2^53 in some inputs (near a nanosecond timestamp, the
      ** ends of the range): exact everywhere, wrapping on overflow */
      if (nd->meta.dtype == FL_I64 && i % 4 == 1 && rg_rnd(3) == 0) {
        static const int64_t big[] = {1733000000123456789LL, INT64_MAX, INT64_MIN,
                                      (int64_t)1 << 62, -1733000000123456789LL};
        int64_t w = (int64_t)((uint64_t)big[rg_rnd(5)] + (uint64_t)((int64_t)rg_rnd(5) - 2));
        *(int64_t *)ten_elem_ptr(&in[nd->index], j) = w;
      }
    }
  }
}

#endif
