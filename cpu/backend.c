/*
** backend.c -- what the C backend does that no other does (backend.h):
** render with codegen.c, compile through the cache, launch a kernel as a
** call on the plan's buffers with a row scratch where it needs one, and
** run an extern step with the eager kernels into its planned buffer.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"
#include "codegen.h"
#include "eager.h"
#include "../exec/cache.h"
#include "../graph/rng.h"
#include "../graph/view.h"

/* One step of an extern's epilogue run as a oneDNN post-op. */
typedef struct cpu_post {
  cpu_mm_pkind kind;
  float alpha, beta;   /* CPU_MM_AFFINE */
  int acc;             /* CPU_MM_ADD / CPU_MM_MUL: the access of the operand */
} cpu_post;

/* launch info: row-scratch floats per reduced element (codegen.h); for a
** product whose epilogue is a chain oneDNN can apply in its own call, that
** chain (npost > 0), the access of the product's result and the store */
typedef struct cpu_kinfo {
  int scratch;
  int npost;
  cpu_post post[CPU_MM_MAXPOST];
  int anchor_acc, store_acc;
  int swap, swap0, swap1;    /* the product is written with dims swap0 and
                                swap1 swapped (plan_layout) */
  int blk;                   /* a convolution's result written in blocks of
                                this many channels (plan_block), 0 plain */
  int nhwc_ok;               /* ... or left channels last, where its kernel
                                writes so: one convolution reads it */
  int shuffled;              /* a depthwise convolution whose input is a
                                channel shuffle (plan_shuffle) */
} cpu_kinfo;

/* --- epilogues as post-ops ----------------------------------------------
** A product's epilogue, when it is a chain oneDNN applies inside its own
** call, runs there: the product is written once, already finished,
** instead of written, read back and written again.  The chain is matched
** on the kernel's SSA steps, one post-op at a time, from the product's
** value v: an activation (relu, gelu's tanh form, tanh, sigmoid, silu,
** exp, also in the decomposed forms fl.compile's decompose pass leaves:
** gelu tanh as x*0.5*(1+tanh(...)), silu as x*sigmoid(x)), v (+, -, *) a
** constant (an affine post-op), or v + t, v * t with t another float32
** buffer (a residual, a gate).  GELU's erf form is not one: oneDNN 2.6's
** gelu_erf post-op costs as much as the generated epilogue (cpu/erff.h's
** erf) where the product's values are small, and more where they are not
** (a 1024x256 -> 1024 linear with values of a few units: 3.2 against 2.8
** ms, the product alone 2.4), and its erf is less exact (bench/RESULTS.md). */

typedef struct matcher {
  const ir_graph *g;
  const fk_kernel *k;
  int anchor;
  int *region;          /* per step: the post-op it belongs to, -1 for v's
                           load, -2 unassigned */
  int p;                /* the post-op being matched */
} matcher;

/* the value of constant step i as the float32 arithmetic around it sees
** it (an integer constant of a float op is promoted), 0 when not one */
static int const_value(const matcher *m, int i, double *v) {
  const fk_instr *in = &m->k->instr[i];
  if (in->opc != FKI_CONST) return 0;
  if (in->dtype == FL_I64) *v = (double)in->ivalue;
  else if (dtype_is_float(in->dtype)) *v = in->value;
  else return 0;
  return 1;
}

static int is_const(const matcher *m, int i, double c) {
  double v;
  return const_value(m, i, &v) && fabs(v - c) <= 1e-6 * fabs(c);
}

/* step j is op(c, y) in either order with c the constant value c; *other
** gets y */
static int elem2c(const matcher *m, int j, fl_op op, double c, int *other) {
  const fk_instr *in = &m->k->instr[j];
  int s;
  if (in->opc != FKI_ELEM || in->op != op || in->narg != 2 || in->dtype != FL_F32 || m->region[j] != -2)
    return 0;
  for (s = 0; s < 2; s++)
    if (is_const(m, in->arg[s], c)) { *other = in->arg[1 - s]; return 1; }
  return 0;
}

/* step j is op(x, y) in either order with x == a; *other gets y */
static int elem2(const matcher *m, int j, fl_op op, int a, int *other) {
  const fk_instr *in = &m->k->instr[j];
  if (in->opc != FKI_ELEM || in->op != op || in->narg != 2 || in->dtype != FL_F32 ||
      m->region[j] != -2)
    return 0;
  if (in->arg[0] == a) { *other = in->arg[1]; return 1; }
  if (in->arg[1] == a) { *other = in->arg[0]; return 1; }
  return 0;
}

static int elem1(const matcher *m, int j, fl_op op, int a) {
  const fk_instr *in = &m->k->instr[j];
  return in->opc == FKI_ELEM && in->op == op && in->narg == 1 && in->arg[0] == a &&
         in->dtype == FL_F32 && m->region[j] == -2;
}

/* mul(x, c) in either order */
static int mulc(const matcher *m, int j, int x, double c) {
  int o;
  return elem2(m, j, OP_MUL, x, &o) && is_const(m, o, c);
}

/* root j = mul(mul(v, 0.5), add(inner, 1)): the gelu forms' shell; *inner
** gets the step inside */
static int gelu_shell(matcher *m, int j, int v, int *half, int *plus1, int *inner) {
  const fk_instr *in = &m->k->instr[j];
  int s;
  if (in->opc != FKI_ELEM || in->op != OP_MUL || in->narg != 2 || m->region[j] != -2) return 0;
  for (s = 0; s < 2; s++) {
    int a = in->arg[s], b = in->arg[1 - s], o;
    if (mulc(m, a, v, 0.5) && elem2(m, b, OP_ADD, -1, &o) == 0) {
      const fk_instr *bi = &m->k->instr[b];
      if (bi->opc != FKI_ELEM || bi->op != OP_ADD || bi->narg != 2 || m->region[b] != -2) continue;
      if (is_const(m, bi->arg[1], 1.0)) *inner = bi->arg[0];
      else if (is_const(m, bi->arg[0], 1.0)) *inner = bi->arg[1];
      else continue;
      *half = a;
      *plus1 = b;
      return 1;
    }
  }
  return 0;
}

/* Does load a read one value per output channel of convolution anchor (a
** batch norm's scale or shift, [C, 1, 1] or [1, C, 1, 1]), or one value?
** Its shape is that of the edge it was read through: a view of a [C]
** vector is folded into the load's indexing. */
static int per_channel(const ir_graph *g, const fk_access *a, int anchor) {
  int id = a->via_node >= 0 ? g->nodes[a->via_node].in[a->via_in] : a->node;
  const fl_meta *v = &g->nodes[id].meta, *y = &g->nodes[anchor].meta;
  int d;
  if (g->nodes[anchor].op != OP_CONV2D || y->ndim != 4 || v->ndim > 4 || meta_numel(v) == meta_numel(y))
    return 0;
  for (d = 0; d < v->ndim; d++)
    if (v->shape[d] != 1 && (4 - v->ndim + d != 1 || v->shape[d] != y->shape[1])) return 0;
  return 1;
}

static void take(matcher *m, int i) { if (m->k->instr[i].opc == FKI_ELEM) m->region[i] = m->p; }

/* Match one post-op over v at root j: its kind (and affine constants, or
** operand access) in *po, its steps marked as region m->p.  0: no match.
** composite: only the decomposed forms (tried first, over every step, so
** gelu's inner mul(v, sqrt .5) is not taken for an affine post-op). */
static int match_post(matcher *m, int j, int v, int composite, cpu_post *po) {
  const fk_kernel *k = m->k;
  const fk_instr *in = &k->instr[j];
  int o, half, plus1, inner, a, b, c, t;
  if (in->opc != FKI_ELEM || in->dtype != FL_F32 || m->region[j] != -2) return 0;
  memset(po, 0, sizeof *po);
  if (!composite && in->narg == 1 && in->arg[0] == v) {
    switch (in->op) {
    case OP_RELU: po->kind = CPU_MM_RELU; break;
    case OP_GELU_TANH: po->kind = CPU_MM_GELU_TANH; break;
    case OP_TANH: po->kind = CPU_MM_TANH; break;
    case OP_SIGMOID: po->kind = CPU_MM_SIGMOID; break;
    case OP_SILU: po->kind = CPU_MM_SILU; break;
    case OP_EXP: po->kind = CPU_MM_EXP; break;
    default: return 0;
    }
    take(m, j);
    return 1;
  }
  /* hardswish as the ONNX loader writes it: mul(v, clamp(add(div(v, 6),
  ** .5), 0, 1)), oneDNN's x * relu6(x + 3) / 6 */
  if (composite && elem2(m, j, OP_MUL, v, &o)) {
    const fk_instr *ci = &k->instr[o], *di;
    int ad, dv;
    if (ci->opc == FKI_ELEM && ci->op == OP_CLAMP && ci->narg == 1 && m->region[o] == -2 &&
        ci->dtype == FL_F32 && ci->attrs.f[0] == 0.0 && ci->attrs.f[1] == 1.0 &&
        elem2c(m, ad = ci->arg[0], OP_ADD, 0.5, &dv) && (di = &k->instr[dv])->opc == FKI_ELEM &&
        di->op == OP_DIV && di->narg == 2 && di->arg[0] == v && m->region[dv] == -2 &&
        di->dtype == FL_F32 && is_const(m, di->arg[1], 6.0)) {
      po->kind = CPU_MM_HARDSWISH;
      take(m, j); take(m, o); take(m, ad); take(m, dv);
      return 1;
    }
  }
  /* silu decomposed: mul(v, sigmoid(v)) */
  if (composite && elem2(m, j, OP_MUL, v, &o) && elem1(m, o, OP_SIGMOID, v)) {
    po->kind = CPU_MM_SILU;
    take(m, j); take(m, o);
    return 1;
  }
  /* gelu tanh decomposed: mul(mul(v, .5), add(inner, 1)) with inner
  ** tanh(mul(add(v, mul(mul(mul(v, v), v), .044715)), sqrt(2/pi))) */
  if (composite && gelu_shell(m, j, v, &half, &plus1, &inner)) {
    const fk_instr *ii = &k->instr[inner];
    if (ii->opc == FKI_ELEM && ii->op == OP_TANH && ii->narg == 1 && m->region[inner] == -2) {
      a = ii->arg[0];                                  /* mul(t, sqrt(2/pi)) */
      if (elem2(m, a, OP_MUL, -1, &o) == 0 && k->instr[a].opc == FKI_ELEM && k->instr[a].op == OP_MUL) {
        int s;
        for (s = 0; s < 2; s++) {
          int tt = k->instr[a].arg[s];
          if (!is_const(m, k->instr[a].arg[1 - s], 0.79788456080286535588)) continue;
          /* t = add(v, mul(x3, .044715)) */
          if (!elem2(m, tt, OP_ADD, v, &b)) continue;
          if (k->instr[b].opc != FKI_ELEM || k->instr[b].op != OP_MUL || k->instr[b].narg != 2) continue;
          for (c = 0; c < 2; c++) {
            int x3 = k->instr[b].arg[c], x2;
            if (!is_const(m, k->instr[b].arg[1 - c], 0.044715)) continue;
            /* x3 = mul(mul(v, v), v) */
            if (!elem2(m, x3, OP_MUL, v, &x2)) continue;
            if (!elem2(m, x2, OP_MUL, v, &t) || t != v) continue;
            po->kind = CPU_MM_GELU_TANH;
            take(m, j); take(m, half); take(m, plus1); take(m, inner); take(m, a); take(m, tt);
            take(m, b); take(m, x3); take(m, x2);
            return 1;
          }
        }
      }
    }
  }
  if (!composite && in->narg == 2 && (in->arg[0] == v) != (in->arg[1] == v)) {
    int left = in->arg[0] == v, other = in->arg[left ? 1 : 0];
    const fk_instr *oi = &k->instr[other];
    double dv;
    if (const_value(m, other, &dv)) {
      float cv = (float)dv;
      po->kind = CPU_MM_AFFINE;
      if (in->op == OP_ADD) { po->alpha = 1.0f; po->beta = cv; }
      else if (in->op == OP_MUL) { po->alpha = cv; po->beta = 0.0f; }
      else if (in->op == OP_SUB) { po->alpha = left ? 1.0f : -1.0f; po->beta = left ? -cv : cv; }
      else return 0;
      take(m, j);
      return 1;
    }
    if (oi->opc == FKI_LOAD && oi->dtype == FL_F32 && k->acc[oi->access].node != m->anchor &&
        (in->op == OP_ADD || in->op == OP_MUL)) {
      po->kind = in->op == OP_ADD ? CPU_MM_ADD : CPU_MM_MUL;
      if (per_channel(m->g, &k->acc[oi->access], m->anchor))
        po->kind = in->op == OP_ADD ? CPU_MM_ADD_C : CPU_MM_MUL_C;
      po->acc = oi->access;
      take(m, j);
      return 1;
    }
  }
  return 0;
}

static int conv_blockable(const ir_graph *g, int id, int b, int writing);

/* Can kernel k's epilogue run as post-ops of its product?  The product's
** own value must be read by nothing else (it is never written then); every
** step must belong to one matched post-op and read only its own steps,
** constants, other buffers, or the previous post-op's result; the last
** result is what is stored.  Layouts are checked at launch (launch_posts).
** Fills ki (npost 0: no). */
static void plan_posts(const fuse_plan *p, int k, cpu_kinfo *ki) {
  const fk_kernel *kk = &p->kernels[k];
  const ir_graph *g = p->g;
  int anchor = kk->anchor, run = -1, i, j, nstore = 0, npost = 0, a;
  int outs[CPU_MM_MAXPOST + 1];
  int region[512];
  cpu_post post[CPU_MM_MAXPOST];
  matcher m;
  ki->npost = 0;
  if (kk->kind != FK_EXTERN || kk->nnodes == 0 || kk->nred != 0 || kk->nrng || kk->ninstr > 512) return;
  if (g->nodes[anchor].op != OP_MATMUL && g->nodes[anchor].op != OP_LINEAR &&
      !(g->nodes[anchor].op == OP_CONV2D && cpu_conv_enabled()))
    return;
  if (g->nodes[anchor].meta.dtype != FL_F32) return;
  for (i = 0; i < g->nout; i++) if (g->outputs[i] == anchor) return;
  for (j = 0; j < p->nkernels; j++) {
    const fk_kernel *o = &p->kernels[j];
    if (j == k) continue;
    for (i = 0; i < o->nbufs; i++) if (o->bufs[i] == anchor) return;
    if (o->kind == FK_EXTERN) {
      const ir_node *an = &g->nodes[o->anchor];
      for (i = 0; i < an->nin; i++) if (an->in[i] == anchor) return;
    }
  }
  for (i = 0; i < kk->nacc; i++)
    if (kk->acc[i].store) { nstore++; ki->store_acc = i; }
  if (nstore != 1) return;
  for (i = 0; i < kk->ninstr; i++) {
    const fk_instr *in = &kk->instr[i];
    region[i] = -2;
    if (in->opc == FKI_LOAD && kk->acc[in->access].node == anchor) {
      if (run >= 0 || in->dtype != FL_F32) return;
      run = i;
      region[i] = -1;
      ki->anchor_acc = in->access;
    } else if (in->opc != FKI_LOAD && in->opc != FKI_CONST && in->opc != FKI_ELEM) {
      return;
    }
  }
  if (run < 0) return;
  m.g = g; m.k = kk; m.anchor = anchor; m.region = region;
  outs[0] = run;
  for (;;) {
    int found = 0, composite;
    for (composite = 1; composite >= 0 && !found; composite--)
      for (j = 0; j < kk->ninstr && !found; j++) {
        if (kk->instr[j].opc != FKI_ELEM || region[j] != -2) continue;
        if (npost == CPU_MM_MAXPOST) return;
        m.p = npost;
        if (match_post(&m, j, run, composite, &post[npost])) {
          found = 1;
          run = j;
          if (post[npost].kind == CPU_MM_AFFINE && npost > 0 && post[npost - 1].kind == CPU_MM_AFFINE) {
            /* a2 (a1 x + b1) + b2 as one step: its steps join the previous post-op */
            cpu_post *q = &post[npost - 1];
            q->beta = post[npost].alpha * q->beta + post[npost].beta;
            q->alpha *= post[npost].alpha;
            for (i = 0; i < kk->ninstr; i++) if (region[i] == npost) region[i] = npost - 1;
            outs[npost] = j;
            continue;
          }
          if (post[npost].kind == CPU_MM_AFFINE)
            for (i = 0; i < npost; i++)
              /* oneDNN 2.6 runs every linear post-op of a product with the
              ** first one's constants (tests/lua/matmul.lua shows it) */
              if (post[i].kind == CPU_MM_AFFINE) return;
          outs[++npost] = j;
        }
      }
    if (!found) break;
  }
  if (npost == 0 || kk->acc[ki->store_acc].value != run) return;
  /* every step in a post-op, reading only its own post-op's steps, the
  ** previous result, constants and other buffers */
  for (j = 0; j < kk->ninstr; j++) {
    const fk_instr *in = &kk->instr[j];
    if (in->opc != FKI_ELEM) continue;
    if (region[j] < 0) return;
    for (a = 0; a < in->narg; a++) {
      int x = in->arg[a];
      const fk_instr *xi = &kk->instr[x];
      if (region[x] == region[j] || x == outs[region[j]]) continue;
      if (xi->opc == FKI_CONST || (xi->opc == FKI_LOAD && region[x] != -1)) continue;
      return;
    }
  }
  for (i = 0, a = 0; i < npost; i++) {
    /* a batch norm's per-channel scale and shift run inside the call on
    ** the blocked kernels; oneDNN's gemm convolutions apply such post-ops
    ** in a slow generic loop (9 ms for a 0.8 ms ResNet-50 1x1).  No kernel
    ** takes a residual add after them as its sum: cpu_conv_run adds it
    ** over the result after the call (conv_tail), so another per-channel
    ** post-op may not follow it */
    if (post[i].kind == CPU_MM_ADD_C || post[i].kind == CPU_MM_MUL_C) {
      if (!cpu_conv_block() || !conv_blockable(g, anchor, cpu_conv_block(), 1) || a > 1) return;
      a = 1;
    } else if (a && (post[i].kind == CPU_MM_ADD || post[i].kind == CPU_MM_MUL)) {
      a = 2;
    }
  }
  memcpy(ki->post, post, sizeof post);
  ki->npost = npost;
}

/* The only reader of node id, or -1 when it has none or several. */
static int sole_reader(const ir_graph *g, int id) {
  int i, j, who = -1;
  for (i = id + 1; i < g->n; i++)
    for (j = 0; j < g->nodes[i].nin; j++)
      if (g->nodes[i].in[j] == id) {
        if (who >= 0) return -1;
        who = i;
      }
  return who;
}

/* A matmul read only by a transpose that a reshape then merges (attention
** putting its heads back into the model dim, [b,h,t,d] -> [b,t,h*d]) is
** written in the transposed order: the reshape is then a view of it, not
** a copy made each call (0.23-0.38 ms of a transformer block's 10,
** bench/RESULTS.md).  oneDNN writes any layout whose rows are dense, so
** the swapped dims must not be the last.  Fills ki's swap. */
static void plan_layout(const fuse_plan *p, int k, cpu_kinfo *ki) {
  const ir_graph *g = p->g;
  int id = p->kernels[k].anchor, tr, rs, nd;
  int64_t i0, i1;
  ki->swap = 0;
  /* no product to lay out, or an epilogue reads it in the plan's layout */
  if (p->kernels[k].kind != FK_EXTERN || id < 0 || p->kernels[k].nnodes > 0) return;
  nd = g->nodes[id].meta.ndim;
  if (g->nodes[id].op != OP_MATMUL || (tr = sole_reader(g, id)) < 0 ||
      g->nodes[tr].kind != IR_OP || g->nodes[tr].op != OP_TRANSPOSE || (rs = sole_reader(g, tr)) < 0 ||
      g->nodes[rs].kind != IR_OP || g->nodes[rs].op != OP_RESHAPE)
    return;
  i0 = g->nodes[tr].attrs.i[0];
  i1 = g->nodes[tr].attrs.i[1];
  if (i0 == i1 || i0 < 0 || i1 < 0 || i0 >= nd - 1 || i1 >= nd - 1) return;
  ki->swap = 1;
  ki->swap0 = (int)i0;
  ki->swap1 = (int)i1;
}

/* t's strides for ki's swap: contiguous in the transposed order. */
static void apply_layout(const cpu_kinfo *ki, fl_tensor *t) {
  int64_t s = 1;
  int d;
  for (d = t->m.ndim - 1; d >= 0; d--) {
    int src = d == ki->swap0 ? ki->swap1 : d == ki->swap1 ? ki->swap0 : d;
    t->stride[src] = s;
    s *= t->m.shape[src];
  }
}

/* --- a blocked layout carried between convolutions ----------------------
** oneDNN's direct convolution kernels read and write channels in blocks
** (nChw8c on AVX2, nChw16c on AVX-512, cpu_conv_block); given plain nchw,
** a convolution reorders its input into blocks and its result out of them
** on every call, or runs slower kernels on the plain layout (ResNet-50's
** 55 reorders a call, ShuffleNet's a third of its time: bench/RESULTS.md).
** So a value that one convolution writes and only convolutions read (as
** their input, or as the residual their sum post-op adds) is written in
** blocks and read that way, as onnxruntime's NCHWc regions and oneDNN's
** own graphs do: its reorders out and in both go.  The plan only asks:
** each run tags a value with the layout it was written in (exec_run.blk),
** and every other reader gets it plain (unblock), so a convolution that
** refuses the layout costs a reorder, never a wrong answer. */

/* The kernel whose extern step is node id, or -1. */
static int extern_of(const fuse_plan *p, int id) {
  int k;
  for (k = 0; k < p->nkernels; k++)
    if (p->kernels[k].kind == FK_EXTERN && p->kernels[k].anchor == id) return k;
  return -1;
}

/* Does oneDNN have a blocked kernel for convolution id: float32, 4-d, its
** groups' channels whole blocks of b, or one channel each (depthwise)?
** writing: only its result in blocks, where an ungrouped convolution may
** read any number of channels plain (a network's first, from 3). */
static int conv_blockable(const ir_graph *g, int id, int b, int writing) {
  const ir_node *nd = &g->nodes[id];
  const ir_node *x, *w;
  op_win2d win;
  int64_t cg, og;
  if (nd->kind != IR_OP || nd->op != OP_CONV2D || nd->nin < 2 || nd->in[0] < 0 || nd->in[1] < 0)
    return 0;
  x = &g->nodes[nd->in[0]];
  w = &g->nodes[nd->in[1]];
  if (nd->meta.dtype != FL_F32 || x->meta.dtype != FL_F32 || nd->meta.ndim != 4 || x->meta.ndim != 4 ||
      w->meta.ndim != 4 || x->sym[1] || nd->sym[1])
    return 0;
  op_win2d_of(nd->op, &nd->attrs, w->meta.shape[2], w->meta.shape[3], &win);
  if (win.groups < 1) win.groups = 1;
  cg = x->meta.shape[1] / win.groups;
  og = nd->meta.shape[1] / win.groups;
  return (cg == 1 && og == 1) || (og % b == 0 && (cg % b == 0 || (writing && win.groups == 1)));
}

/* Does convolution kernel k run as one library call (bare, or with its
** epilogue as post-ops)? */
static int conv_call(const fuse_plan *p, int k) {
  cpu_kinfo ki;
  if (k < 0) return 0;
  if (p->kernels[k].nnodes == 0) return 1;
  plan_posts(p, k, &ki);
  return ki.npost > 0;
}

/* Is node i (reading v) the add of a residual that convolution kernel j
** runs as a post-op? */
static int residual_post(const fuse_plan *p, int i, int v) {
  int j, q, n;
  cpu_kinfo ki;
  for (j = 0; j < p->nkernels; j++) {
    const fk_kernel *kk = &p->kernels[j];
    if (kk->kind != FK_EXTERN || kk->anchor < 0 || p->g->nodes[kk->anchor].op != OP_CONV2D) continue;
    for (n = 0; n < kk->nnodes && kk->nodes[n] != i; n++) {}
    if (n == kk->nnodes) continue;
    plan_posts(p, j, &ki);
    for (q = 0; q < ki.npost; q++)
      if (ki.post[q].kind == CPU_MM_ADD && kk->acc[ki.post[q].acc].node == v) return 1;
    return 0;
  }
  return 0;
}

/* A bare extern step (no epilogue) over float32 images that reads and
** writes blocks of b channels: a max or average pool
** (eager_pool2d_blocked), or a concatenation along the channels of inputs
** whose channels are whole blocks, which then is the same copy per image
** as in the plain layout (each input's image is one contiguous run). */
static int block_step(const fuse_plan *p, int k, int b) {
  const ir_graph *g = p->g;
  const ir_node *nd;
  int i;
  if (k < 0 || p->kernels[k].kind != FK_EXTERN || p->kernels[k].nnodes != 0) return 0;
  nd = &g->nodes[p->kernels[k].anchor];
  if (nd->meta.dtype != FL_F32 || nd->meta.ndim != 4) return 0;
  if (nd->op == OP_MAX_POOL2D || nd->op == OP_AVG_POOL2D) return 1;
  if (nd->op != OP_CAT || nd->attrs.i[0] != 1) return 0;
  for (i = 0; i < nd->nin; i++) {
    const ir_node *x = nd->in[i] >= 0 ? &g->nodes[nd->in[i]] : NULL;
    if (!x || x->meta.ndim != 4 || x->meta.dtype != FL_F32 || x->meta.shape[1] % b || x->sym[1]) return 0;
  }
  return 1;
}

/* Can value v stay in blocks of b: no graph output, and every node reading
** it a blockable convolution reading it as its input, a residual post-op,
** or a pool or concatenation whose own result can stay in blocks (depth
** bounds the walk through them). */
static int blocks_for_readers(const fuse_plan *p, int v, int b, int depth) {
  const ir_graph *g = p->g;
  int i, j, readers = 0;
  if (depth > 8 || g->nodes[v].meta.ndim != 4 || g->nodes[v].meta.shape[1] % b || g->nodes[v].sym[1])
    return 0;
  for (i = 0; i < g->nout; i++) if (g->outputs[i] == v) return 0;
  for (i = v + 1; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    for (j = 0; j < nd->nin; j++) {
      if (nd->in[j] != v) continue;
      readers++;
      if (j == 0 && nd->kind == IR_OP && nd->op == OP_CONV2D && conv_blockable(g, i, b, 0) &&
          conv_call(p, extern_of(p, i)))
        continue;
      if (nd->kind == IR_OP && nd->op == OP_ADD && residual_post(p, i, v)) continue;
      if ((j == 0 || nd->op == OP_CAT) && nd->kind == IR_OP && block_step(p, extern_of(p, i), b) &&
          blocks_for_readers(p, i, b, depth + 1))
        continue;
      return 0;
    }
  }
  return readers > 0;
}

/* Is node i a depthwise convolution? */
static int depthwise(const ir_graph *g, int i) {
  const ir_node *nd = &g->nodes[i];
  op_win2d win;
  if (nd->kind != IR_OP || nd->op != OP_CONV2D || nd->nin < 2 || nd->in[0] < 0 || nd->in[1] < 0 ||
      g->nodes[nd->in[1]].meta.ndim != 4)
    return 0;
  op_win2d_of(nd->op, &nd->attrs, g->nodes[nd->in[1]].meta.shape[2], g->nodes[nd->in[1]].meta.shape[3], &win);
  return win.groups > 1 && win.groups == g->nodes[nd->in[0]].meta.shape[1] && win.groups == nd->meta.shape[1];
}

/* Is v read by one convolution alone, as its input, and by nothing else
** (no output, no concatenation in place, not kept)?  Then the run may
** leave it channels last where oneDNN's kernel writes it so (brgconv with
** AVX-512, chosen at the first call): the reader takes it as it is, and
** a pair of such convolutions (DenseNet's 1x1 and 3x3) has no reorder
** between them, where blocks cost one out of the first and one into the
** second.  The reader has no groups, or is depthwise (an inverted
** residual's expansion then its 3x3: cpu/conv_dw.c reads channels last
** as it reads blocks); not grouped otherwise, as cpu/conv_pw.c reads
** blocks and not channels last. */
static int conv_reads_alone(const fuse_plan *p, int k, int v) {
  const ir_graph *g = p->g;
  const ir_node *rd;
  op_win2d win;
  int i, j, reader = -1;
  for (i = 0; i < g->nout; i++) if (g->outputs[i] == v) return 0;
  if ((p->keep && p->keep[k]) || (p->into && p->into[v] >= 0)) return 0;
  for (i = v + 1; i < g->n; i++)
    for (j = 0; j < g->nodes[i].nin; j++)
      if (g->nodes[i].in[j] == v) {
        if (reader >= 0 || j != 0) return 0;
        reader = i;
      }
  if (reader < 0 || (rd = &g->nodes[reader])->kind != IR_OP || rd->op != OP_CONV2D || rd->nin < 2 ||
      rd->in[1] < 0 || g->nodes[rd->in[1]].meta.ndim != 4)
    return 0;
  op_win2d_of(rd->op, &rd->attrs, g->nodes[rd->in[1]].meta.shape[2], g->nodes[rd->in[1]].meta.shape[3], &win);
  return (win.groups <= 1 || depthwise(g, reader)) && conv_call(p, extern_of(p, reader));
}

/* May kernel k write its result (*v) in blocks of b? */
static int block_at(const fuse_plan *p, int k, const cpu_kinfo *ki, int b, int *v) {
  const fk_kernel *kk = &p->kernels[k];
  if (block_step(p, k, b)) *v = kk->anchor;
  else if (!conv_blockable(p->g, kk->anchor, b, 1)) return 0;
  else if (ki->npost > 0) *v = kk->acc[ki->store_acc].node;
  else if (kk->nnodes == 0) *v = kk->anchor;
  else return 0;
  return blocks_for_readers(p, *v, b, 0);
}

/* Does a depthwise convolution write v (kernel k's), read it, or write
** what kernel k's convolution reads (a projection after it)? */
static int by_depthwise(const fuse_plan *p, int k, int v) {
  const ir_graph *g = p->g;
  const ir_node *an = &g->nodes[p->kernels[k].anchor];
  int i, src = an->nin > 0 ? an->in[0] : -1;
  if (depthwise(g, p->kernels[k].anchor)) return 1;
  if (src >= 0 && p->kernel_of[src] >= 0 && p->kernels[p->kernel_of[src]].kind == FK_EXTERN &&
      depthwise(g, p->kernels[p->kernel_of[src]].anchor))
    return 1;
  for (i = v + 1; i < g->n; i++)
    if (g->nodes[i].kind == IR_OP && g->nodes[i].nin > 0 && g->nodes[i].in[0] == v && depthwise(g, i)) return 1;
  return 0;
}

/* Kernel k's convolution, pool or concatenation writes its result in
** blocks (ki->blk) when every reader takes them (blocks_for_readers).  A
** pool or concatenation does so only where its inputs came in blocks: the
** run decides (launch_block_step).  Where the CPU's blocks are 16 wide
** and the channels are whole blocks of 8 but not of 16 (MobileNetV3's
** 72, 88 and 120), blocks of 8 for a depthwise convolution's input and
** result and its projection's: oneDNN's kernels of eight and fuselab's
** loops read and write them in place, where plain values cost the
** depthwise loop a transposition in and out (MobileNetV3-small 0.80-0.86
** -> 0.77-0.79 ms, bench/RESULTS.md).  Not elsewhere: EfficientNet's 24-
** and 40-channel projections, from a plain input, run oneDNN's gemm
** convolution with their residual summed in place, which no kernel has
** for a plain input and a blocked result. */
static void plan_block(const fuse_plan *p, int k, cpu_kinfo *ki) {
  const fk_kernel *kk = &p->kernels[k];
  int b = cpu_conv_block(), v = -1;
  ki->blk = 0;
  ki->nhwc_ok = 0;
  if (!b || kk->kind != FK_EXTERN || kk->anchor < 0) return;
  if (block_at(p, k, ki, b, &v)) ki->blk = b;
  else if (b == 16 && block_at(p, k, ki, 8, &v) && by_depthwise(p, k, v)) ki->blk = 8;
  ki->nhwc_ok = ki->blk && !block_step(p, k, ki->blk) && conv_reads_alone(p, k, v);
}

static int layout(const exec_program *pr, int k, char *buf, size_t n) {
  const cpu_kinfo *ki = EXEC_KINFO(pr, k);
  if (!ki->blk) return 0;
  snprintf(buf, n, "nChw%dc (blocks of %d channels, read so by the convolutions after it%s)", ki->blk, ki->blk,
           ki->nhwc_ok ? "; or nhwc, channels last, where its kernel writes so" : "");
  return 1;
}

/* --- concatenations written in place (fuse/plan.c plan_into) -----------
** Each input's kernel stored it in its place in the concatenation's
** memory (exec_buffer), in whatever layout it chose (blocks of channels,
** or plain).  The concatenation's kernel copies nothing where every input
** is still there and all share one layout (cat_in_place); else it brings
** the rest to the plain layout in place.  A value in place that a reader
** wants plain is put back plain where it lies (with every value in place
** within it), never copied out: the memory it shares stays one layout. */

/* Is id's tensor still its run in its concatenation's memory? */
static int in_place(const exec_run *r, int id) {
  const fuse_plan *p = r->pr->plan;
  const fl_tensor *v = &r->vals[id], *c;
  if (!p->into || p->into[id] < 0) return 0;
  c = &r->vals[p->into[id]];
  return v->st && c->st == v->st && v->offset == c->offset + p->into_off[id] && ten_is_contiguous(v);
}

/* Is u, in place, inside top's memory? */
static int inside_of(const exec_run *r, int u, int top) {
  while (u != top && in_place(r, u)) u = r->pr->plan->into[u];
  return u == top;
}

/* v's contiguous memory from blocks of b channels to plain, where it is
** (through a copy); 4-d float32. */
static int unblock_here(fl_tensor *v, int b, fl_err *e) {
  fl_tensor t;
  int rc;
  if ((rc = ten_uninit(&t, &v->m, e)) != FL_OK) return rc;
  cpu_unblock_nchw(ten_data(v), ten_data(&t), v->m.shape[0], v->m.shape[1], v->m.shape[2] * v->m.shape[3], b);
  memcpy(ten_data(v), ten_data(&t), (size_t)meta_numel(&v->m) * sizeof(float));
  ten_release(&t);
  return FL_OK;
}

/* Node id's value out of blocks: a plain tensor of its own, or, where it
** lies in a concatenation's memory, plain in place -- and with it the
** concatenation around it where that one was declared in blocks too (so
** that a concatenation is never part blocks, part plain), and every value
** in place within what was converted. */
static int unblock(exec_run *r, int id, fl_err *e) {
  fl_tensor *v = &r->vals[id], t;
  int b = r->blk[id], rc, top = id, u;
  if (!v->st) { r->blk[id] = 0; return FL_OK; }
  if (in_place(r, id)) {
    const int *into = r->pr->plan->into;
    while (in_place(r, top) && r->blk[into[top]] == b) top = into[top];
    if ((rc = unblock_here(&r->vals[top], b, e)) != FL_OK) return rc;
    for (u = 0; u < r->g->n; u++)
      if (inside_of(r, u, top)) r->blk[u] = 0;
    return FL_OK;
  }
  r->blk[id] = 0;
  if ((rc = ten_uninit(&t, &v->m, e)) != FL_OK) return rc;
  cpu_unblock_nchw(ten_data(v), ten_data(&t), v->m.shape[0], v->m.shape[1],
                   v->m.shape[2] * v->m.shape[3], b);
  ten_release(v);
  *v = t;
  return FL_OK;
}

/* Kernel k's concatenation (fuse_cat_in_place), its inputs where they lie:
** nothing to do where all are in place in one layout, which it takes
** (blocks, read so by the convolutions after it, or plain).  Else those
** in place in blocks are put back plain where they lie, and an input
** elsewhere (a product written in a swapped layout, or given a plain copy
** of its own) is copied into its place, plain.  0 where its memory is not
** one contiguous run (the extern step copies), 1 done, < 0 an error. */
static int cat_in_place(exec_run *r, const fk_kernel *k, fl_err *e) {
  const ir_node *nd = &r->g->nodes[k->anchor];
  fl_tensor *y = &r->vals[k->anchor];
  int i, rc, lay = -1, mixed = 0;
  if (!y->st && (rc = exec_buffer(r, k->anchor, y, e)) != FL_OK) return -1;
  if (!ten_is_contiguous(y)) return 0;
  for (i = 0; i < nd->nin; i++) {
    int v = nd->in[i];
    int l = in_place(r, v) ? r->blk[v] : -1;
    if (l < 0 || (lay >= 0 && l != lay)) mixed = 1;
    if (lay < 0) lay = l;
  }
  for (i = 0; i < nd->nin && mixed; i++) {
    int v = nd->in[i];
    fl_tensor t, *x = &r->vals[v];
    if (in_place(r, v)) {
      if (r->blk[v] && unblock(r, v, e) != FL_OK) return -1;
      continue;
    }
    /* a copy of its own first: it may lie in y's memory in another layout */
    if (exec_value(r, v, 0, e) != FL_OK || ten_uninit(&t, &r->metas[v], e) != FL_OK) return -1;
    if (ten_copy(&t, x, e) != FL_OK) { ten_release(&t); return -1; }
    ten_release(x);
    if (exec_buffer(r, v, x, e) != FL_OK) { ten_release(&t); return -1; }
    if (!in_place(r, v)) { ten_release(&t); return 0; }
    memcpy(ten_data(x), ten_data(&t), (size_t)meta_numel(&t.m) * dtype_size(t.m.dtype));
    ten_release(&t);
  }
  r->blk[k->anchor] = (unsigned char)(mixed || lay < 0 ? 0 : lay);
  return 1;
}

/* --- a channel shuffle read where it lies ------------------------------
** ShuffleNet's channel shuffle (reshape [n, g, c/g, h, w], swap the two
** channel dims, reshape back) moves whole planes, in an order no strides
** express, so the reshape back copied the value on every call, into fresh
** memory (at 136 x 28 x 28, 0.02-0.03 ms of a 0.15 ms unit; at the
** stage's first unit, 112 x 56 x 56, more).  The depthwise convolution
** that reads it (ShuffleNet's every 3x3) takes each plane where it lies
** instead: an offset per image and channel (cpu_conv.xoff), on
** cpu/conv_dw.c's loop, which reads 8 planes at a time anyway. */

/* Is kernel k a depthwise convolution reading a reshape of a transpose? */
static void plan_shuffle(const fuse_plan *p, int k, cpu_kinfo *ki) {
  const ir_graph *g = p->g;
  const fk_kernel *kk = &p->kernels[k];
  const ir_node *nd, *x, *w;
  op_win2d win;
  ki->shuffled = 0;
  if (kk->kind != FK_EXTERN || kk->anchor < 0) return;
  nd = &g->nodes[kk->anchor];
  if (nd->kind != IR_OP || nd->op != OP_CONV2D || nd->nin < 2 || nd->in[0] < 0 || nd->in[1] < 0) return;
  x = &g->nodes[nd->in[0]];
  w = &g->nodes[nd->in[1]];
  if (x->kind != IR_OP || x->op != OP_RESHAPE || !fk_is_view(g, nd->in[0]) || x->in[0] < 0 ||
      g->nodes[x->in[0]].kind != IR_OP ||
      (g->nodes[x->in[0]].op != OP_TRANSPOSE && g->nodes[x->in[0]].op != OP_PERMUTE) ||
      x->meta.ndim != 4 || w->meta.ndim != 4)
    return;
  op_win2d_of(nd->op, &nd->attrs, w->meta.shape[2], w->meta.shape[3], &win);
  ki->shuffled = win.groups == x->meta.shape[1] && nd->meta.shape[1] == x->meta.shape[1];
}

/* Node id's value (a 4-d reshape the strides cannot follow) as its
** source's planes where they lie: *xv its shape over the source's memory,
** (*off)[i * c + j] image i's channel j's first float from there.  1 done
** (free *off), 0 where they are not whole planes (or are a view after
** all), else an error's code. */
static int shuffled_planes(exec_run *r, int id, fl_tensor *xv, int64_t **off, fl_err *e) {
  const ir_node *nd = &r->g->nodes[id];
  const fl_meta *m = &r->metas[id];
  const fl_tensor *s;
  fl_tensor v;
  fl_err e2;
  int64_t idx[FL_MAX_DIMS] = {0}, q, L;
  int d, lead, rc;
  if (r->vals[id].st || m->ndim != 4 || m->dtype != FL_F32) return 0;
  if ((rc = exec_value(r, nd->in[0], 0, e)) != FL_OK) return rc;
  s = &r->vals[nd->in[0]];
  lead = s->m.ndim - 2;
  if (s->m.dtype != FL_F32 || lead < 1 || s->m.shape[lead] != m->shape[2] ||
      s->m.shape[lead + 1] != m->shape[3] || s->stride[lead + 1] != 1 || s->stride[lead] != m->shape[3] ||
      meta_numel(&s->m) != meta_numel(m))
    return 0;
  err_clear(&e2);
  if (view_apply(nd->op, s, &nd->attrs, m, &v, &e2) == FL_OK) {   /* a view: nothing to copy */
    ten_release(&v);
    return 0;
  }
  L = m->shape[0] * m->shape[1];
  if (!(*off = malloc((size_t)(L > 0 ? L : 1) * sizeof **off)))
    return err_set(e, FL_ENOMEM, "out of memory for %lld plane offsets", (long long)L);
  for (q = 0; q < L; q++) {       /* the leading dims in row-major order */
    int64_t o = 0;
    for (d = 0; d < lead; d++) o += idx[d] * s->stride[d];
    (*off)[q] = o;
    for (d = lead - 1; d >= 0 && ++idx[d] == s->m.shape[d]; d--) idx[d] = 0;
  }
  *xv = *s;                      /* not a reference of its own: never released */
  xv->m = *m;
  ten_set_contiguous_strides(xv);
  return 1;
}

static int reads(const exec_program *pr, int k, char *buf, size_t n) {
  const cpu_kinfo *ki = EXEC_KINFO(pr, k);
  if (!ki->shuffled) return 0;
  snprintf(buf, n, "its input a channel shuffle, whose planes fuselab's depthwise loop reads where they lie "
                   "(oneDNN's convolutions read a copy)");
  return 1;
}

static void preamble(strbuf *b, const fuse_plan *const *plans, int n);

static void preamble(strbuf *b, const fuse_plan *const *plans, int n) {
  (void)plans; (void)n;
  cpu_emit_preamble(b);
}

static int render(strbuf *b, const fuse_plan *p, int k, const char *sym, void *kinfo,
                  const int64_t *known, fl_err *e) {
  (void)e;
  plan_posts(p, k, kinfo);
  plan_layout(p, k, kinfo);
  plan_block(p, k, kinfo);
  plan_shuffle(p, k, kinfo);
  return cpu_emit_kernel(b, p, k, sym, known, &((cpu_kinfo *)kinfo)->scratch);
}

static int compile(const char *head, const char *const *units, int nunits, void **image,
                   char **log, int *how, fl_err *e) {
  cache_while_linking(cpu_mm_warm);   /* oneDNN's first-product setup, off the first call */
  return cache_load_units(head, units, nunits, (cache_obj **)image, log, how, e);
}

static void *image_retain(void *img) { return cache_retain(img); }
static void image_release(void *img) { cache_release(img); }

static int load(exec_program *pr, fl_err *e) {
  int64_t *par = cache_sym(pr->image, "fl_par_min");
  int k;
  for (k = 0; k < pr->plan->nkernels; k++) {
    const char *sym = pr->alias[k] ? pr->alias[k] : pr->syms[k];
    if (!pr->syms[k]) continue;
    if (!(pr->fns[k] = cache_sym(pr->image, sym)))
      return err_set(e, FL_ECOMPILE, "compile: kernel %s missing from the object", sym);
  }
  if (par) *par = cpu_par_min();      /* this process's wait policy (cpu/codegen.c) */
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
static int run_extern(exec_run *r, const fk_kernel *k, const cpu_kinfo *in, fl_err *e) {
  const ir_graph *g = r->g;
  const ir_node *nd = &g->nodes[k->anchor];
  const fl_tensor *args[64];
  fl_tensor t;
  int i, rc, laid = 0;
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
  else if (r->pr->plan->slot[k->anchor] >= 0 ||
           (r->pr->plan->into && r->pr->plan->into[k->anchor] >= 0)) {
    if ((rc = exec_buffer(r, k->anchor, &t, e)) != FL_OK) return rc;
    if ((laid = in->swap && t.m.dtype == FL_F32))
      apply_layout(in, &t);
  }
  if (rng_op(nd->op) && r->rng_start) {
    /* a random op run eagerly (float64) draws where the run reserved its
    ** draws, as eager would: not a second time from the stream */
    uint64_t k0, b0;
    rng_get_state(&k0, &b0);
    rng_set_state(r->rng_key, r->rng_start[k->anchor]);
    rc = eager_apply_into(nd->op, args, nd->nin, &nd->attrs, &t, e);
    rng_set_state(k0, b0);
  } else {
    rc = eager_apply_into(nd->op, args, nd->nin, &nd->attrs, &t, e);
  }
  if (rc == FL_EUNSUPPORTED && laid) {      /* that layout refused: the plain one */
    err_clear(e);
    laid = 0;
    if ((rc = exec_buffer(r, k->anchor, &t, e)) != FL_OK) return rc;
    rc = eager_apply_into(nd->op, args, nd->nin, &nd->attrs, &t, e);
  }
  if (rc != FL_OK) return rc;
  if (t.st != r->vals[k->anchor].st) {
    ten_release(&r->vals[k->anchor]);
    if (laid) ten_share(&r->vals[k->anchor], &t);
    else rc = ten_contiguous(&r->vals[k->anchor], &t, e);
  }
  ten_release(&t);
  return rc;
}

/* Kernel k as one product with its epilogue as post-ops, written straight
** into the epilogue's stored buffer, or a bare convolution (no epilogue)
** whose input or result is in blocks: 1 when done, 0 when these shapes or
** this build do not allow it (the caller runs the extern step and the
** kernel), < 0 on an error.  Allowed when the store is contiguous and the
** product's value and every residual operand are read at exactly the
** store's indices (same strides and offset), and shapes agree.  A
** convolution reads its input and residuals in the blocks they were
** written in, and writes its result in blocks where the plan asks
** (plan_block); where oneDNN refuses that, it runs again on plain ones. */
static int launch_posts(exec_run *r, const fk_kernel *k, const cpu_kinfo *in, const fl_tensor *xv,
                        const int64_t *xoff, fl_err *e) {
  const ir_graph *g = r->g;
  const ir_node *nd = &g->nodes[k->anchor];
  const int64_t *args = r->args;
  int d = k->nkept + k->nred, i, j, rc, try;
  int sid = k->nnodes ? k->acc[in->store_acc].node : k->anchor;
  const fl_tensor *ins[8];
  cpu_mm_post posts[CPU_MM_MAXPOST];
  eager_layouts lay;
  fl_err e2;
  if (!(nd->op == OP_CONV2D ? cpu_conv_enabled() : cpu_mm_enabled()) || nd->nin > 8) return 0;
  if (!meta_same_shape(&r->metas[sid], &r->metas[k->anchor]) || r->metas[sid].dtype != FL_F32) return 0;
  if (k->nnodes) {
    const int64_t *ss = args + d + in->store_acc * (d + 1);
    int64_t want = 1;
    if (ss[d] != 0) return 0;
    for (j = d - 1; j >= 0; j--) {
      if (args[j] != 1 && ss[j] != want) return 0;
      want *= args[j];
    }
    for (i = 0; i < k->nacc; i++) {
      const int64_t *as = args + d + i * (d + 1);
      if (k->acc[i].store) continue;
      for (j = 0; j <= d; j++)
        if ((j == d || args[j] != 1) && as[j] != ss[j]) break;
      if (j <= d) {
        int used = i == in->anchor_acc;
        for (j = 0; j < in->npost; j++)
          used |= (in->post[j].kind == CPU_MM_ADD || in->post[j].kind == CPU_MM_MUL) && in->post[j].acc == i;
        if (used) return 0;
      }
    }
  }
  if (!r->vals[sid].st && (rc = exec_buffer(r, sid, &r->vals[sid], e)) != FL_OK) return rc;
  if (!ten_is_contiguous(&r->vals[sid])) return 0;
  /* the first try keeps blocks where they are and where the plan asks for
  ** them; the second has every operand plain */
  for (try = 0; try < 2; try++) {
    int plain = try == 1 || nd->op != OP_CONV2D;
    int xblk = 0, yblk = !plain && in->blk && !exec_value_kept(r->pr, sid) ? in->blk : 0;
    int sum, wrote;
    memset(posts, 0, sizeof posts);
    for (i = 0; i < in->npost; i++) posts[i].kind = in->post[i].kind;
    sum = cpu_conv_sum_post(posts, in->npost);   /* the residual oneDNN adds as its sum */
    /* the sum reads its residual in any layout; other operands in y's */
    for (i = 0; i < in->npost && yblk; i++)
      if ((in->post[i].kind == CPU_MM_ADD || in->post[i].kind == CPU_MM_MUL) && i != sum &&
          r->blk[k->acc[in->post[i].acc].node] != yblk)
        yblk = 0;
    for (i = 0; i < nd->nin; i++) {
      ins[i] = NULL;
      if (nd->in[i] < 0) continue;
      if (i == 0 && xoff) { ins[0] = xv; continue; }
      if (i == 0 && !plain && r->blk[nd->in[0]] && r->vals[nd->in[0]].st) xblk = r->blk[nd->in[0]];
      else if ((rc = exec_value(r, nd->in[i], 0, e)) != FL_OK) return rc;
      ins[i] = &r->vals[nd->in[i]];
    }
    for (i = 0; i < nd->nin; i++)
      if (ins[i] && ins[i]->st == r->vals[sid].st) return 0;
    for (i = 0; i < in->npost; i++) {
      posts[i].alpha = in->post[i].alpha;
      posts[i].beta = in->post[i].beta;
      if (posts[i].kind == CPU_MM_ADD_C || posts[i].kind == CPU_MM_MUL_C) {
        int id = k->acc[in->post[i].acc].node;
        if ((rc = exec_value(r, id, 1, e)) != FL_OK) return rc;
        if (r->vals[id].m.dtype != FL_F32) return 0;
        posts[i].src.p = (const float *)ten_data(&r->vals[id]);
        posts[i].src.shape[0] = meta_numel(&r->vals[id].m);
      } else if (posts[i].kind == CPU_MM_ADD || posts[i].kind == CPU_MM_MUL) {
        int id = k->acc[in->post[i].acc].node;
        const fl_tensor *t;
        /* read in blocks where y is in the same ones, or by the sum */
        if (!plain && r->blk[id] && (r->blk[id] == yblk || i == sum) && r->vals[id].st)
          posts[i].blk = i == sum ? r->blk[id] : 0;
        else if ((rc = exec_value(r, id, 1, e)) != FL_OK)
          return rc;
        t = &r->vals[id];
        if (t->m.dtype != FL_F32 || meta_numel(&t->m) != meta_numel(&r->metas[sid])) return 0;
        /* oneDNN may accumulate partial sums in dst before it reads the
        ** operand: never the same memory (a caller's output given in
        ** place), but for the residual its sum adds, stored over by the
        ** result (fuse/plan.c residual_over): that one is read from dst,
        ** where it then already is, in dst's layout */
        if (t->st == r->vals[sid].st &&
            (i != sum || t->offset != r->vals[sid].offset || posts[i].blk != yblk))
          return 0;
        /* read at the store's indices: the store's own contiguous layout */
        posts[i].src.p = (const float *)ten_data(t);
        posts[i].like_dst = 1;
      }
    }
    if (plain && !in->npost && !xoff) return 0;   /* a bare product: the extern step */
    if (xblk && !r->blk[nd->in[0]]) xblk = 0;  /* the input was a residual too, put back plain */
    err_clear(&e2);
    wrote = yblk;
    lay.xblk = xblk;
    lay.yblk = yblk;
    lay.wrote = yblk && in->nhwc_ok ? &wrote : NULL;
    lay.xoff = xoff;
    rc = eager_product_posts(nd->op, ins, nd->nin, &nd->attrs, posts, in->npost, &lay, &r->vals[sid], &e2);
    if (rc == FL_OK) {
      r->blk[sid] = (unsigned char)wrote;
      return 1;
    }
    if (rc != FL_EUNSUPPORTED) return err_set(e, rc, "%s", e2.msg);
    if (plain || xoff) return 0;     /* shuffled planes refused: the extern step copies them */
  }
  return 0;
}

/* Kernel k's depthwise convolution on shuffled planes where they lie
** (plan_shuffle): as launch_posts, 0 where they cannot be. */
static int launch_shuffled(exec_run *r, const fk_kernel *k, const cpu_kinfo *in, fl_err *e) {
  fl_tensor xv;
  int64_t *off = NULL;
  int rc = shuffled_planes(r, r->g->nodes[k->anchor].in[0], &xv, &off, e);
  if (rc <= 0) return rc;
  rc = launch_posts(r, k, in, &xv, off, e);
  free(off);
  return rc;
}

/* Does kernel k's convolution meet a blocked layout, read or written? */
static int meets_blocks(const exec_run *r, const fk_kernel *k, const cpu_kinfo *in) {
  const ir_node *nd;
  if (k->kind != FK_EXTERN || k->anchor < 0) return 0;
  nd = &r->g->nodes[k->anchor];
  return nd->op == OP_CONV2D && (k->nnodes == 0 || in->npost > 0) &&
         (in->blk || (nd->nin > 0 && nd->in[0] >= 0 && r->blk[nd->in[0]]));
}

/* A bare pool or concatenation (block_step) whose inputs came in blocks
** and whose result stays in them (plan_block): 1 when done, 0 for the
** extern step (it reads its inputs plain), < 0 on an error. */
static int launch_block_step(exec_run *r, const fk_kernel *k, const cpu_kinfo *in, fl_err *e) {
  const ir_node *nd = &r->g->nodes[k->anchor];
  const fl_meta *m = &r->metas[k->anchor];
  const fl_tensor *ins[64];
  fl_tensor *y = &r->vals[k->anchor];
  int i, rc;
  if (!in->blk || nd->nin < 1 || nd->nin > 64 || exec_value_kept(r->pr, k->anchor)) return 0;
  for (i = 0; i < nd->nin; i++) {
    int x = nd->in[i];
    if (x < 0 || r->blk[x] != in->blk || !r->vals[x].st || r->vals[x].m.dtype != FL_F32 ||
        !ten_is_contiguous(&r->vals[x]))
      return 0;
    ins[i] = &r->vals[x];
  }
  if (!y->st && (rc = exec_buffer(r, k->anchor, y, e)) != FL_OK) return rc;
  if (!ten_is_contiguous(y) || y->m.dtype != FL_F32) return 0;
  for (i = 0; i < nd->nin; i++) if (ins[i]->st == y->st) return 0;
  if (nd->op == OP_CAT)
    rc = eager_apply_into(nd->op, ins, nd->nin, &nd->attrs, y, e);   /* the same copy per image */
  else
    rc = eager_pool2d_blocked(nd->op, &nd->attrs, ten_data(ins[0]), ten_data(y), m->shape[0], m->shape[1],
                              ins[0]->m.shape[2], ins[0]->m.shape[3], m->shape[2], m->shape[3], in->blk);
  if (rc == FL_EUNSUPPORTED) { err_clear(e); return 0; }
  if (rc != FL_OK) return -1;
  r->blk[k->anchor] = (unsigned char)in->blk;
  return 1;
}

static int launch(exec_run *r, int ki, fl_err *e) {
  exec_program *pr = r->pr;
  const fk_kernel *k = &pr->plan->kernels[ki];
  const cpu_kinfo *in = EXEC_KINFO(pr, ki);
  void *bufs[257];
  void *scratch = NULL;
  int i, rc;
  if (fuse_cat_in_place(pr->plan, ki) && (rc = cat_in_place(r, k, e)) != 0) return rc < 0 ? e->code : FL_OK;
  if (in->shuffled && (rc = launch_shuffled(r, k, in, e)) != 0) return rc < 0 ? rc : FL_OK;
  if ((in->npost > 0 || meets_blocks(r, k, in)) && (rc = launch_posts(r, k, in, NULL, NULL, e)) != 0)
    return rc < 0 ? rc : FL_OK;
  if (in->blk && k->nnodes == 0 && (rc = launch_block_step(r, k, in, e)) != 0) return rc < 0 ? e->code : FL_OK;
  if (k->kind == FK_EXTERN && (rc = run_extern(r, k, in, e)) != FL_OK) return rc;
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
    if ((!r->vals[id].st || r->blk[id]) && (rc = exec_value(r, id, 0, e)) != FL_OK) return rc;
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
    scratch = aligned_alloc(64, (size_t)threads * (size_t)in->scratch *
                                    (size_t)CPU_SCRATCH_STRIDE(nr ? nr : 1) * sizeof(float));
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
  load, to_device, copy_into, launch, no_sync, nargs, NULL, unblock, layout, NULL, reads
};
