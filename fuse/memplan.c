/*
** memplan.c -- the cost model (bytes each kernel reads and writes, the
** graph run op by op, peak memory) and the memory planner (which buffer
** slot each intermediate lives in).  Every number a view shows about bytes
** comes from here: p:stats(), the listing, pictures, the report.
** Invariant: two intermediates share a slot only when the first is dead
** (its last reader has run) before the second is written, and never within
** one kernel, so no kernel reads and writes the same memory -- but where
** plan_alias stores an epilogue's value over its product or over the
** residual it adds, each element read before the same element is written.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "../graph/strbuf.h"

/* A view may name 2^62 elements: such a count saturates just above what
** can be allocated (running it fails there, naming the size), so sums of
** many stay far from wrapping. */
int64_t fuse_node_bytes(const ir_graph *g, int id) {
  int64_t b;
  if (!sz_mul(meta_numel(&g->nodes[id].meta),
              (int64_t)dtype_size(g->nodes[id].meta.dtype), &b) ||
      b > FL_MAX_ALLOC)
    b = FL_MAX_ALLOC + 1;
  return b;
}
#define nbytes fuse_node_bytes

/* True for an extern kernel that also runs an epilogue: the library call
** writes its product to memory and the generated loop reads it back. */
static int has_epilogue(const fk_kernel *k) { return k->kind == FK_EXTERN && k->nnodes > 0; }

/* The one cost model of bytes moved: each buffer a kernel reads is read
** once (through a broadcast too), each it writes is written once; an
** extern step reads its operands and writes its result, and an epilogue
** after it reads that result back (it is one of bufs[0..nin)).  Every view
** (p:stats(), the plan listing, pictures, the report) shows these. */
/* A scalar constant is a literal in the generated code, never a read (an
** extern step gets it as an argument). */
static int scalar_const(const ir_graph *g, int id) {
  return g->nodes[id].kind == IR_CONST && meta_numel(&g->nodes[id].meta) == 1 && g->nodes[id].value.st;
}

void fuse_kernel_traffic(const ir_graph *g, const fk_kernel *k, int64_t *rd, int64_t *wr) {
  int i;
  *rd = *wr = 0;
  for (i = 0; i < k->nbufs; i++)
    if (i >= k->nin || !scalar_const(g, k->bufs[i])) *(i < k->nin ? rd : wr) += nbytes(g, k->bufs[i]);
  if (has_epilogue(k)) *wr += nbytes(g, k->anchor);
}

/* a * b, saturating (a count past 2^62 is beyond any machine anyway) */
static int64_t flop_mul(int64_t a, int64_t b) {
  int64_t r;
  return sz_mul(a, b, &r) && r <= (INT64_C(1) << 62) ? r : INT64_C(1) << 62;
}

/* The one count of floating-point work, next to the one count of bytes:
** a product or convolution 2 per multiply-add (2 M N K; a convolution's K
** is its window, C/groups kh kw, per output element), a bias 1 per output
** element; an elementwise op 1 per result element; a reduction 1 per
** element it reads; a composite what its primitives do per element
** (softmax: max, subtract, exp, sum, divide); a pool its window per output;
** views, copies, casts and gathers nothing.  Estimates for teaching a
** roofline, not an instruction count: exp and erf cost one like add. */
int64_t fuse_node_flops(const ir_graph *g, int id) {
  const ir_node *nd = &g->nodes[id];
  const fl_meta *in0;
  int64_t out, rd, k;
  op_kind kind;
  if (nd->kind != IR_OP || fk_is_view(g, id)) return 0;
  out = meta_numel(&nd->meta);
  in0 = nd->nin > 0 && nd->in[0] >= 0 ? &g->nodes[nd->in[0]].meta : NULL;
  rd = in0 ? meta_numel(in0) : out;
  kind = op_info_of(nd->op)->kind;
  switch (nd->op) {
  case OP_TO: return 0;
  case OP_MATMUL: case OP_LINEAR: case OP_MATMUL_INT8:
    k = in0 && in0->ndim > 0 ? in0->shape[in0->ndim - 1] : 1;
    return flop_mul(flop_mul(2, out), k) +
           (nd->op == OP_LINEAR && nd->nin > 2 && nd->in[2] >= 0 ? out : 0);
  case OP_CONV2D: {
    const fl_meta *w = nd->nin > 1 && nd->in[1] >= 0 ? &g->nodes[nd->in[1]].meta : NULL;
    k = w && w->ndim == 4 && w->shape[0] > 0 ? meta_numel(w) / w->shape[0] : 1;
    return flop_mul(flop_mul(2, out), k) + (nd->nin > 2 && nd->in[2] >= 0 ? out : 0);
  }
  case OP_MAX_POOL2D: case OP_AVG_POOL2D: {
    op_win2d w;
    op_win2d_of(nd->op, &nd->attrs, 0, 0, &w);
    return flop_mul(out, w.kh > 0 && w.kw > 0 ? flop_mul(w.kh, w.kw) : 1);
  }
  case OP_VAR: return flop_mul(3, rd);                 /* subtract, square, sum */
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: return flop_mul(5, rd);
  case OP_LAYER_NORM: return flop_mul(7, rd);          /* mean, var (3), normalize, w, b */
  case OP_RMS_NORM: return flop_mul(4, rd);            /* square, sum, scale, w */
  case OP_BATCH_NORM: return flop_mul(4, out);         /* (x - mean) * rstd * w + b */
  case OP_CUMSUM: return out;
  case OP_RNN: {
    /* X W^T and h R^T per step and direction (2 per multiply-add), and
    ** about ten per gate element for the activations and the update */
    const fl_meta *r = nd->nin > 2 && nd->in[2] >= 0 ? &g->nodes[nd->in[2]].meta : NULL;
    int64_t gh = r && r->ndim == 3 ? r->shape[1] : 0, h = r && r->ndim == 3 ? r->shape[2] : 0;
    int64_t steps = in0 && in0->ndim == 3 ? flop_mul(in0->shape[0], in0->shape[1]) : 0;
    int64_t dirs = r && r->ndim == 3 ? r->shape[0] : 1, i = in0 && in0->ndim == 3 ? in0->shape[2] : 0;
    return flop_mul(flop_mul(flop_mul(2, steps), flop_mul(dirs, gh)), i + h) +
           flop_mul(flop_mul(10, steps), flop_mul(dirs, gh));
  }
  default: break;
  }
  if (kind == OPK_ELEMWISE || kind == OPK_BROADCAST) return out;
  if (kind == OPK_REDUCTION) return rd;
  return 0;                                            /* injective: data movement */
}

int64_t fuse_kernel_flops(const ir_graph *g, const fk_kernel *k) {
  int64_t f = 0;
  int i;
  for (i = 0; i < k->nnodes; i++) f += fuse_node_flops(g, k->nodes[i]);
  if (k->kind == FK_EXTERN && k->anchor >= 0) f += fuse_node_flops(g, k->anchor);
  return f < (INT64_C(1) << 62) ? f : INT64_C(1) << 62;
}

static int64_t kernel_bytes(const ir_graph *g, const fk_kernel *k) {
  int64_t r, w;
  fuse_kernel_traffic(g, k, &r, &w);
  return r + w;
}

/* What input `in` of node id really reads: views are followed to the
** value they show (a view costs nothing op by op). */
static int op_source(const ir_graph *g, int id, int in) {
  int s = g->nodes[id].in[in];
  while (s >= 0 && g->nodes[s].kind == IR_OP && fk_is_view(g, s)) s = g->nodes[s].in[0];
  return s;
}

/* True when input `in` of id reads memory not read by an earlier input. */
static int first_read(const ir_graph *g, int id, int in) {
  int s = op_source(g, id, in), j;
  if (s < 0) return 0;
  if (scalar_const(g, s)) return 0;
  for (j = 0; j < in; j++) if (op_source(g, id, j) == s) return 0;
  return 1;
}

/* Op by op, as eager runs it: see ir_opcost. */
int fuse_graph_cost(const ir_graph *g, ir_opcost *c) {
  int *last = malloc((size_t)(g->n ? g->n : 1) * sizeof *last);
  int i, j;
  int64_t live = 0;
  memset(c, 0, sizeof *c);
  if (!last) return FL_ENOMEM;
  for (i = 0; i < g->n; i++) last[i] = -1;
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_OP || fk_is_view(g, i)) continue;
    c->kernels++;
    c->bytes += nbytes(g, i);
    for (j = 0; j < nd->nin; j++)
      if (first_read(g, i, j)) {
        c->bytes += nbytes(g, op_source(g, i, j));
        last[op_source(g, i, j)] = i;
      }
  }
  c->buffers = c->kernels;
  for (i = 0; i < g->nout; i++) {
    int s = g->outputs[i];
    while (s >= 0 && g->nodes[s].kind == IR_OP && fk_is_view(g, s)) s = g->nodes[s].in[0];
    if (s >= 0) last[s] = g->n;
  }
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_OP || fk_is_view(g, i)) continue;
    live += nbytes(g, i);
    if (live > c->peak_bytes) c->peak_bytes = live;
    for (j = 0; j < nd->nin; j++) {
      int s = op_source(g, i, j);
      if (first_read(g, i, j) && g->nodes[s].kind == IR_OP && last[s] == i) live -= nbytes(g, s);
    }
    if (last[i] < 0) live -= nbytes(g, i);   /* read by nobody: dead at once */
  }
  c->known = 1;
  free(last);
  return FL_OK;
}

void fuse_reference_cost(const ir_graph *g, ir_opcost *c) {
  if (g->origin.known) *c = g->origin;
  else if (fuse_graph_cost(g, c) != FL_OK) memset(c, 0, sizeof *c);
}

static int is_output(const ir_graph *g, int id) {
  int i;
  for (i = 0; i < g->nout; i++) if (g->outputs[i] == id) return 1;
  return 0;
}

int fuse_home(const fuse_plan *p, int id) {
  while (p->into && p->into[id] >= 0) id = p->into[id];
  return id;
}

int fuse_cat_in_place(const fuse_plan *p, int k) {
  const fk_kernel *kk = &p->kernels[k];
  const ir_node *nd;
  int i;
  if (!p->into || kk->kind != FK_EXTERN || kk->nnodes || kk->anchor < 0) return 0;
  nd = &p->g->nodes[kk->anchor];
  if (nd->kind != IR_OP || nd->op != OP_CAT) return 0;
  for (i = 0; i < nd->nin; i++)
    if (nd->in[i] < 0 || p->into[nd->in[i]] != kk->anchor) return 0;
  return 1;
}

static void last_uses(fuse_plan *p) {
  const ir_graph *g = p->g;
  int i, k;
  for (i = 0; i < g->n; i++) p->last_use[i] = -1;
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kk = &p->kernels[k];
    for (i = 0; i < kk->nin; i++) p->last_use[kk->bufs[i]] = k;
    if (kk->kind == FK_EXTERN && kk->nnodes > 0) p->last_use[kk->anchor] = k;
  }
  for (i = 0; i < g->nout; i++) p->last_use[g->outputs[i]] = p->nkernels;
  /* a concatenation's memory lives as long as what is stored in it is read */
  for (i = 0; i < g->n; i++) {
    int h = fuse_home(p, i);
    if (h != i && p->last_use[i] > p->last_use[h]) p->last_use[h] = p->last_use[i];
  }
}

/* Node i's buffer is freed once kernel k has run (one nobody reads dies
** in the kernel that writes it). */
static int freed_after(const fuse_plan *p, int i, int k) {
  return p->last_use[i] == k || (p->last_use[i] < 0 && p->kernel_of[i] == k);
}

/* An op result the plan stores with memory of its own (none inside a
** concatenation's: plan_into), which the walk and the slots count. */
static int counted(const fuse_plan *p, int i) {
  return p->stored[i] && p->g->nodes[i].kind == IR_OP && fuse_home(p, i) == i;
}

/* The kernel after which node i's buffer is freed (freed_after), or -1. */
static int dies_after(const fuse_plan *p, int i) {
  int d = !counted(p, i) ? -1 : p->last_use[i] >= 0 ? p->last_use[i] : p->kernel_of[i];
  return d < p->nkernels ? d : -1;
}

/* Computed by a kept kernel: held from the first call on. */
static int held(const fuse_plan *p, int i) {
  return p->keep && p->kernel_of[i] >= 0 && p->keep[p->kernel_of[i]];
}

/* The epilogue of kernel kk reads node s itself (not only its extern). */
static int epilogue_reads(const fk_kernel *kk, int s) {
  int j;
  for (j = 0; j < kk->nacc; j++) if (!kk->acc[j].store && kk->acc[j].node == s) return 1;
  return 0;
}

/* Operand s of extern kernel k is dead once the library call has read it:
** nothing after k reads it and the epilogue does not either. */
static int call_frees(const fuse_plan *p, const fk_kernel *kk, int k, int s) {
  return s >= 0 && counted(p, s) && !held(p, s) && p->last_use[s] == k && s != kk->anchor &&
         !epilogue_reads(kk, s);
}

/* The one walk (plan.h).  Kernel k: an extern with an epilogue first
** writes its product; the operands its call alone read are then freed;
** the kernel's stored values are written (one stored over the product,
** p->alias, takes none); then what k read last dies.  Kept values are
** alive from the start and never die. */
int64_t fuse_plan_walk(const fuse_plan *p, int64_t *at, int64_t *alive, int stop, int *peak_at) {
  const ir_graph *g = p->g;
  char *on = calloc((size_t)(g->n ? g->n : 1), 1);
  char *over = calloc((size_t)(g->n ? g->n : 1), 1);  /* product taken over by its epilogue */
  int *first = malloc((size_t)(p->nkernels + 1) * sizeof *first);
  int *dies = malloc((size_t)(g->n ? g->n : 1) * sizeof *dies);  /* by the kernel after which */
  int64_t live = 0, peak = 0;
  int k, i, j;
  *peak_at = -1;
  if (!on || !over || !first || !dies) { free(on); free(over); free(first); free(dies); return -1; }
  /* what dies after each kernel, listed once (a walk is linear) */
  for (k = 0; k <= p->nkernels; k++) first[k] = 0;
  for (i = 0; i < g->n; i++) if (dies_after(p, i) >= 0) first[dies_after(p, i) + 1]++;
  for (k = 0; k < p->nkernels; k++) first[k + 1] += first[k];
  for (i = 0; i < g->n; i++) if (dies_after(p, i) >= 0) dies[first[dies_after(p, i)]++] = i;
  for (k = p->nkernels; k > 0; k--) first[k] = first[k - 1];
  first[0] = 0;
#define TAKE(id) do { on[id] = 1; live += nbytes(g, id); } while (0)
#define DROP(id) do { on[id] = 0; if (!over[id]) live -= nbytes(g, id); } while (0)
  for (i = 0; i < g->n; i++) if (counted(p, i) && held(p, i)) TAKE(i);
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kk = &p->kernels[k];
    int64_t top;
    if (has_epilogue(kk) && !on[fuse_home(p, kk->anchor)]) TAKE(fuse_home(p, kk->anchor));
    top = live;
    if (k == stop && alive)
      for (i = 0; i < g->n; i++) alive[i] = on[i] ? nbytes(g, i) : 0;
    if (has_epilogue(kk))
      for (j = 0; j < g->nodes[kk->anchor].nin; j++) {
        int s = op_source(g, kk->anchor, j);
        if (s >= 0 && on[s] && call_frees(p, kk, k, s)) DROP(s);
      }
    for (i = kk->nin; i < kk->nbufs; i++) {
      int id = fuse_home(p, kk->bufs[i]), a = p->alias ? p->alias[id] : -1;
      if (on[id]) continue;
      if (a >= 0 && on[a]) { on[id] = 1; over[a] = 1; }
      else TAKE(id);
    }
    if (live > top) {
      top = live;
      if (k == stop && alive)
        for (i = 0; i < g->n; i++) alive[i] = on[i] && !over[i] ? nbytes(g, i) : 0;
    }
    if (at) at[k] = top;
    if (top > peak) { peak = top; *peak_at = k; }
    for (j = first[k]; j < first[k + 1]; j++)
      if (on[dies[j]] && !held(p, dies[j])) DROP(dies[j]);
  }
#undef TAKE
#undef DROP
  free(on);
  free(over);
  free(first);
  free(dies);
  return peak;
}

/* Says what is alive at the peak kernel k. */
static void explain_peak(fuse_plan *p, int k) {
  const ir_graph *g = p->g;
  const fk_kernel *kk = &p->kernels[k];
  fuse_stats *st = &p->stats;
  int64_t *alive = calloc((size_t)(g->n ? g->n : 1), sizeof *alive);
  strbuf b;
  char h[32];
  int i, n = 0, m = 0, at;
  if (!alive) return;
  memset(&b, 0, sizeof b);
  fuse_plan_walk(p, NULL, alive, k, &at);
  fuse_bytes_str(st->peak_bytes_after - st->peak_bytes_before, h, sizeof h);
  strbuf_printf(&b, "needs %s more memory at its peak than the captured graph op by op: "
                "while k%d %s runs, ", h, k, kk->name);
  for (i = 0; i < g->n; i++)
    if (alive[i]) {
      fuse_bytes_str(alive[i], h, sizeof h);
      strbuf_printf(&b, "%s%%%d (%s)", n++ ? ", " : "", i, h);
    }
  strbuf_printf(&b, " are alive");
  /* values kept between calls exist only in the plan: the captured graph
  ** read the params they are computed from */
  for (i = 0; i < g->n; i++)
    if (alive[i] && held(p, i)) strbuf_printf(&b, "%s%%%d", m++ ? ", " : "; of them ", i);
  if (m) strbuf_printf(&b, " %s computed from parameters alone and kept between calls",
                       m == 1 ? "is" : "are");
  if (b.p) snprintf(st->note, sizeof st->note, "%s", b.p);
  free(b.p);
  free(alive);
}

/* Node id's buffer into a slot (none for graph outputs, kept values and
** what already has one): the smallest free one big enough, else the
** biggest free one grown, else a new one. */
static void take_slot(fuse_plan *p, int id, char *busy, int64_t *bytes) {
  const ir_graph *g = p->g;
  int64_t need = nbytes(g, id);
  int s, best = -1, big = -1;
  if (is_output(g, id) || held(p, id) || p->slot[id] >= 0) return;
  for (s = 0; s < p->nslots; s++) {
    if (busy[s]) continue;
    if (bytes[s] >= need && (best < 0 || bytes[s] < bytes[best])) best = s;
    if (big < 0 || bytes[s] > bytes[big]) big = s;
  }
  if (best < 0) best = big;
  if (best < 0) best = p->nslots++;
  if (bytes[best] < need) bytes[best] = need;
  busy[best] = 1;
  p->slot[id] = best;
}

/* Slots as the walk counts memory: a kernel's new buffers (an extern's
** product first, then after its operands are freed the stored values;
** one stored over the product shares its slot) take the smallest free
** slot big enough, else grow the biggest free one, else a new slot; then
** the buffers whose last reader it was are freed.  Graph outputs and kept
** values have memory of their own (exec/program.c). */
static void assign_slots(fuse_plan *p) {
  const ir_graph *g = p->g;
  char *busy = calloc((size_t)(g->n ? g->n : 1), 1);
  char *over = calloc((size_t)(g->n ? g->n : 1), 1);  /* slot handed on: not freed by it */
  int64_t *bytes = calloc((size_t)(g->n ? g->n : 1), sizeof *bytes);
  int k, i, j;
  p->nslots = 0;
  for (i = 0; i < g->n; i++) p->slot[i] = -1;
  if (!busy || !bytes || !over) { free(busy); free(bytes); free(over); return; }
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kk = &p->kernels[k];
    if (has_epilogue(kk)) {
      int into_out = 0;   /* stored over by a graph output: lives in its memory */
      for (i = kk->nin; i < kk->nbufs && p->alias; i++)
        into_out |= p->alias[kk->bufs[i]] == kk->anchor && is_output(g, kk->bufs[i]);
      if (!into_out) take_slot(p, fuse_home(p, kk->anchor), busy, bytes);
      for (j = 0; j < g->nodes[kk->anchor].nin; j++) {
        int s = op_source(g, kk->anchor, j);
        if (s >= 0 && p->slot[s] >= 0 && !over[s] && call_frees(p, kk, k, s)) {
          busy[p->slot[s]] = 0;
          over[s] = 1;          /* its slot is no longer its own to free */
        }
      }
    }
    for (i = kk->nin; i < kk->nbufs; i++) {
      int id = fuse_home(p, kk->bufs[i]), a = p->alias ? p->alias[id] : -1;
      if (a >= 0 && p->slot[a] >= 0 && p->slot[id] < 0) {
        p->slot[id] = p->slot[a];
        over[a] = 1;
      } else {
        take_slot(p, id, busy, bytes);
      }
    }
    for (i = 0; i < g->n; i++)
      if (p->slot[i] >= 0 && !over[i] && freed_after(p, i, k)) busy[p->slot[i]] = 0;
  }
  free(p->slot_bytes);
  p->slot_bytes = malloc((size_t)(p->nslots ? p->nslots : 1) * sizeof *p->slot_bytes);
  if (p->slot_bytes) memcpy(p->slot_bytes, bytes, (size_t)p->nslots * sizeof *bytes);
  free(busy);
  free(bytes);
  free(over);
}

/* Why a plan moves more than the op-by-op reference (empty when not). */
static void explain_excess(fuse_plan *p, int peak_at) {
  fuse_stats *st = &p->stats;
  char h[32];
  st->note[0] = '\0';
  if (st->bytes_after <= st->bytes_before) {
    if (st->peak_bytes_after > st->peak_bytes_before && peak_at >= 0) explain_peak(p, peak_at);
    return;
  }
  fuse_bytes_str(st->bytes_after - st->bytes_before, h, sizeof h);
  if (!p->opts.fuse) {
    snprintf(st->note, sizeof st->note, "moves %s more than the captured graph op by op: "
             "fusion is off, so every primitive the passes made runs as its own kernel", h);
    return;
  }
  snprintf(st->note, sizeof st->note, "moves %s more than the captured graph op by op: "
           "decompose() split composite ops that ran as one kernel each into primitives "
           "fusion could not join again", h);
}

int64_t fuse_plan_peak(fuse_plan *p) {
  int at;
  last_uses(p);
  return fuse_plan_walk(p, NULL, NULL, -1, &at);
}

void fuse_plan_measure(fuse_plan *p) {
  const ir_graph *g = p->g;
  int k, i, nout_bufs = 0, peak_at;
  ir_opcost ref, own;
  fuse_stats *st = &p->stats;
  memset(st, 0, sizeof *st);
  for (k = 0; k < p->nkernels; k++) {
    /* a concatenation its inputs were stored into moves nothing */
    p->kernels[k].bytes = fuse_cat_in_place(p, k) ? 0 : kernel_bytes(g, &p->kernels[k]);
    st->bytes_after += p->kernels[k].bytes;
  }
  last_uses(p);
  assign_slots(p);
  st->kernels = p->nkernels;
  st->nodes = ir_op_count(g);
  for (i = 0; i < g->n; i++)
    if (p->stored[i] && g->nodes[i].kind == IR_OP && is_output(g, i)) nout_bufs++;
  st->buffers_after = p->nslots + nout_bufs;
  st->peak_bytes_after = fuse_plan_walk(p, NULL, NULL, -1, &peak_at);
  fuse_reference_cost(g, &ref);
  st->kernels_before = ref.kernels;
  st->buffers_before = ref.buffers;
  st->bytes_before = ref.bytes;
  st->peak_bytes_before = ref.peak_bytes;
  for (i = 0; i < p->ndec; i++)
    if (p->dec[i].fused) st->bytes_decisions += p->dec[i].bytes_saved;
  st->bytes_graph = fuse_graph_cost(g, &own) == FL_OK ? own.bytes : st->bytes_before;
  explain_excess(p, peak_at);
}

void fuse_bytes_causes(const fuse_stats *s, char *buf, size_t n) {
  const int64_t passes = s->bytes_graph - s->bytes_before;
  const int64_t shared = s->bytes_graph - s->bytes_after - s->bytes_decisions;
  char d[32], sh[32], pa[32], gr[32];
  int at;
  buf[0] = 0;
  if (passes == 0 && shared == 0) return;
  fuse_bytes_str(s->bytes_decisions, d, sizeof d);
  fuse_bytes_str(shared < 0 ? -shared : shared, sh, sizeof sh);
  fuse_bytes_str(passes < 0 ? -passes : passes, pa, sizeof pa);
  fuse_bytes_str(s->bytes_graph, gr, sizeof gr);
  at = snprintf(buf, n, "the decisions save %s", d);
  if (shared && at >= 0 && (size_t)at < n)
    at += snprintf(buf + at, n - (size_t)at, shared > 0
                   ? "; shared reads save %s more (a fused kernel reads a buffer once for all its ops)"
                   : "; %s of what they count is not saved (a buffer read again)", sh);
  if (passes && at >= 0 && (size_t)at < n)
    snprintf(buf + at, n - (size_t)at, "; the passes before fusion %s %s (the planned graph "
             "op by op moves %s)", passes > 0 ? "added" : "removed", pa, gr);
}

/* "512 B", "4 KiB", "1.5 MiB", "12.3 GiB": three significant digits at
** most, the same in every view. */
char *fuse_bytes_str(int64_t bytes, char *buf, size_t n) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  if (bytes < 1024) {
    snprintf(buf, n, "%lld B", (long long)bytes);
    return buf;
  }
  while (v >= 1024.0 && u < 4) { v /= 1024.0; u++; }
  if (v >= 100.0 || v == (double)(int64_t)v) snprintf(buf, n, "%.0f %s", v, unit[u]);
  else if (v >= 10.0) snprintf(buf, n, "%.1f %s", v, unit[u]);
  else snprintf(buf, n, "%.2g %s", v, unit[u]);
  return buf;
}

/* ---- the peak's rules one step at a time (fuse/memtrace.h) -------------
** The memory picture walks the same schedule the two peaks above walk;
** these hand it the rules themselves, so it never restates them. */
int fuse_mem_op_source(const ir_graph *g, int id, int in) { return op_source(g, id, in); }
int fuse_mem_first_read(const ir_graph *g, int id, int in) { return first_read(g, id, in); }

