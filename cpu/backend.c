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
  const fk_kernel *k;
  int anchor;
  int *region;          /* per step: the post-op it belongs to, -1 for v's
                           load, -2 unassigned */
  int p;                /* the post-op being matched */
} matcher;

/* the value of constant step i as the float32 arithmetic around it sees
** it (an integer constant of a float op is promoted), 0 when not one */
static int const_value(const fk_instr *in, double *v) {
  if (in->opc != FKI_CONST) return 0;
  if (in->dtype == FL_I64) *v = (double)in->ivalue;
  else if (dtype_is_float(in->dtype)) *v = in->value;
  else return 0;
  return 1;
}

static int is_const(const matcher *m, int i, double c) {
  double v;
  return const_value(&m->k->instr[i], &v) && fabs(v - c) <= 1e-6 * fabs(c);
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
    if (const_value(oi, &dv)) {
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
      po->acc = oi->access;
      take(m, j);
      return 1;
    }
  }
  return 0;
}

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
  m.k = kk; m.anchor = anchor; m.region = region;
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
  else if (r->pr->plan->slot[k->anchor] >= 0) {
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
** into the epilogue's stored buffer: 1 when done, 0 when these shapes or
** this build do not allow it (the caller runs the extern step and the
** kernel), < 0 on an error.  Allowed when the store is contiguous and the
** product's value and every residual operand are read at exactly the
** store's indices (same strides and offset), and shapes agree. */
static int launch_posts(exec_run *r, const fk_kernel *k, const cpu_kinfo *in, fl_err *e) {
  const ir_graph *g = r->g;
  const ir_node *nd = &g->nodes[k->anchor];
  const int64_t *args = r->args;
  int d = k->nkept + k->nred, i, j, rc, sid = k->acc[in->store_acc].node;
  const int64_t *ss = args + d + in->store_acc * (d + 1);
  const fl_tensor *ins[8];
  cpu_mm_post posts[CPU_MM_MAXPOST];
  int64_t want = 1;
  fl_err e2;
  if (!(nd->op == OP_CONV2D ? cpu_conv_enabled() : cpu_mm_enabled()) || nd->nin > 8) return 0;
  if (!meta_same_shape(&r->metas[sid], &r->metas[k->anchor]) || r->metas[sid].dtype != FL_F32) return 0;
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
  for (i = 0; i < nd->nin; i++) {
    ins[i] = NULL;
    if (nd->in[i] < 0) continue;
    if ((rc = exec_value(r, nd->in[i], 0, e)) != FL_OK) return rc;
    ins[i] = &r->vals[nd->in[i]];
  }
  if (!r->vals[sid].st && (rc = exec_buffer(r, sid, &r->vals[sid], e)) != FL_OK) return rc;
  if (!ten_is_contiguous(&r->vals[sid])) return 0;
  for (i = 0; i < nd->nin; i++)
    if (ins[i] && ins[i]->st == r->vals[sid].st) return 0;
  memset(posts, 0, sizeof posts);
  for (i = 0; i < in->npost; i++) {
    posts[i].kind = in->post[i].kind;
    posts[i].alpha = in->post[i].alpha;
    posts[i].beta = in->post[i].beta;
    if (posts[i].kind == CPU_MM_ADD || posts[i].kind == CPU_MM_MUL) {
      int id = k->acc[in->post[i].acc].node;
      const fl_tensor *t;
      if ((rc = exec_value(r, id, 1, e)) != FL_OK) return rc;
      t = &r->vals[id];
      if (t->m.dtype != FL_F32 || meta_numel(&t->m) != meta_numel(&r->metas[sid])) return 0;
      /* oneDNN may accumulate partial sums in dst before it reads the
      ** operand: never the same memory (a caller's output given in place) */
      if (t->st == r->vals[sid].st) return 0;
      /* read at the store's indices: the store's own contiguous layout */
      posts[i].src.p = (const float *)ten_data(t);
      posts[i].like_dst = 1;
    }
  }
  err_clear(&e2);
  rc = eager_product_posts(nd->op, ins, nd->nin, &nd->attrs, posts, in->npost, &r->vals[sid], &e2);
  if (rc == FL_EUNSUPPORTED) return 0;
  if (rc != FL_OK) return err_set(e, rc, "%s", e2.msg);
  return 1;
}

static int launch(exec_run *r, int ki, fl_err *e) {
  exec_program *pr = r->pr;
  const fk_kernel *k = &pr->plan->kernels[ki];
  const cpu_kinfo *in = EXEC_KINFO(pr, ki);
  void *bufs[257];
  void *scratch = NULL;
  int i, rc;
  if (in->npost > 0 && (rc = launch_posts(r, k, in, e)) != 0) return rc < 0 ? rc : FL_OK;
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
  load, to_device, copy_into, launch, no_sync, nargs, NULL
};
