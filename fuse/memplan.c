/*
** memplan.c -- the cost model (bytes each kernel reads and writes, the
** graph run op by op, peak memory) and the memory planner (which buffer
** slot each intermediate lives in).  Every number a view shows about bytes
** comes from here: p:stats(), the listing, pictures, the report.
** Invariant: two intermediates share a slot only when the first is dead
** (its last reader has run) before the second is written, and never within
** one kernel, so no kernel reads and writes the same memory.
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
void fuse_kernel_traffic(const ir_graph *g, const fk_kernel *k, int64_t *rd, int64_t *wr) {
  int i;
  *rd = *wr = 0;
  for (i = 0; i < k->nbufs; i++) *(i < k->nin ? rd : wr) += nbytes(g, k->bufs[i]);
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
  case OP_MATMUL: case OP_LINEAR:
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

/* True when input `in` of id reads memory not read by an earlier input;
** a scalar constant is a literal in the generated code, never a read. */
static int first_read(const ir_graph *g, int id, int in) {
  int s = op_source(g, id, in), j;
  if (s < 0) return 0;
  if (g->nodes[s].kind == IR_CONST && meta_numel(&g->nodes[s].meta) == 1 && g->nodes[s].value.st)
    return 0;
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
}

/* Peak of live bytes when every buffer is allocated by its kernel and freed
** after its last reader (outputs live to the end): the same rule as the
** op-by-op peak of fuse_graph_cost, so the two compare. */
/* Node i's buffer is freed once kernel k has run (one nobody reads dies
** in the kernel that writes it). */
static int freed_after(const fuse_plan *p, int i, int k) {
  return p->last_use[i] == k || (p->last_use[i] < 0 && p->kernel_of[i] == k);
}

static int64_t live_peak(const fuse_plan *p, int *at) {
  const ir_graph *g = p->g;
  int64_t live = 0, peak = 0;
  int k, i;
  *at = -1;
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kk = &p->kernels[k];
    for (i = kk->nin; i < kk->nbufs; i++) live += nbytes(g, kk->bufs[i]);
    /* the product an epilogue reads back is alive during the kernel */
    if (has_epilogue(kk)) live += nbytes(g, kk->anchor);
    if (live > peak) { peak = live; *at = k; }
    for (i = 0; i < g->n; i++)
      if (p->stored[i] && g->nodes[i].kind == IR_OP && freed_after(p, i, k)) live -= nbytes(g, i);
  }
  return peak;
}

/* True when node i's buffer is alive while kernel k runs. */
static int alive_at(const fuse_plan *p, int i, int k) {
  if (!p->stored[i] || p->g->nodes[i].kind != IR_OP || p->kernel_of[i] < 0) return 0;
  if (p->kernel_of[i] > k) return 0;
  return p->last_use[i] >= k || (p->last_use[i] < 0 && p->kernel_of[i] == k);
}

/* Says what is alive at the peak kernel k, and why when an extern's
** operand is kept only because its epilogue runs first. */
static void explain_peak(fuse_plan *p, int k) {
  const ir_graph *g = p->g;
  const fk_kernel *kk = &p->kernels[k];
  fuse_stats *st = &p->stats;
  strbuf b;
  char h[32];
  int i, j, n = 0, kept = -1;
  memset(&b, 0, sizeof b);
  fuse_bytes_str(st->peak_bytes_after - st->peak_bytes_before, h, sizeof h);
  strbuf_printf(&b, "needs %s more memory at its peak than the captured graph op by op: "
                "while k%d %s runs, ", h, k, kk->name);
  for (i = 0; i < g->n; i++)
    if (alive_at(p, i, k)) {
      fuse_bytes_str(nbytes(g, i), h, sizeof h);
      strbuf_printf(&b, "%s%%%d (%s)", n++ ? ", " : "", i, h);
    }
  strbuf_printf(&b, " are alive");
  /* buffers made from parameters alone (a batch_norm folded into a conv's
  ** weights) exist only in the plan: the captured graph read the params */
  {
    char *fromp = calloc((size_t)(g->n ? g->n : 1), 1);
    int m = 0;
    for (i = 0; fromp && i < g->n; i++) {
      const ir_node *nd = &g->nodes[i];
      fromp[i] = nd->kind == IR_PARAM || nd->kind == IR_CONST;
      if (nd->kind == IR_OP) {
        fromp[i] = 1;
        for (j = 0; j < nd->nin; j++) if (nd->in[j] >= 0 && !fromp[nd->in[j]]) fromp[i] = 0;
      }
    }
    for (i = 0; fromp && i < g->n; i++)
      if (alive_at(p, i, k) && fromp[i])
        strbuf_printf(&b, "%s%%%d", m++ ? ", " : "; of them ", i);
    if (m) strbuf_printf(&b, " %s computed from parameters alone, each call", m == 1 ? "is" : "are");
    free(fromp);
  }
  /* an operand of the extern no later kernel and not the epilogue reads */
  if (has_epilogue(kk))
    for (i = 0; i < g->nodes[kk->anchor].nin && kept < 0; i++) {
      int s = op_source(g, kk->anchor, i), in_epi = 0;
      if (s < 0 || !alive_at(p, s, k) || p->last_use[s] != k) continue;
      for (j = 0; j < kk->nacc; j++) in_epi |= !kk->acc[j].store && kk->acc[j].node == s;
      if (!in_epi) kept = s;
    }
  if (kept >= 0)
    strbuf_printf(&b, "; %%%d only because %s's epilogue runs before its operands are freed",
                  kept, op_name(g->nodes[kk->anchor].op));
  if (b.p) snprintf(st->note, sizeof st->note, "%s", b.p);
  free(b.p);
}

/* Greedy slots: a kernel's outputs take the smallest free slot big enough
** (else grow the biggest free one, else a new slot); then the buffers
** whose last reader it was are freed. */
static void assign_slots(fuse_plan *p) {
  const ir_graph *g = p->g;
  char *busy = calloc((size_t)(g->n ? g->n : 1), 1);
  int64_t *bytes = calloc((size_t)(g->n ? g->n : 1), sizeof *bytes);
  int k, i, s;
  p->nslots = 0;
  for (i = 0; i < g->n; i++) p->slot[i] = -1;
  if (!busy || !bytes) { free(busy); free(bytes); return; }
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kk = &p->kernels[k];
    for (i = kk->nin; i < kk->nbufs; i++) {
      int id = kk->bufs[i], best = -1, big = -1;
      int64_t need = nbytes(g, id);
      if (is_output(g, id) || p->slot[id] >= 0) continue;
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
    for (i = 0; i < g->n; i++)
      if (p->slot[i] >= 0 && p->last_use[i] == k) busy[p->slot[i]] = 0;
    /* an intermediate nobody reads is dead at once */
    for (i = kk->nin; i < kk->nbufs; i++) {
      int id = kk->bufs[i];
      if (p->slot[id] >= 0 && p->last_use[id] < 0) busy[p->slot[id]] = 0;
    }
  }
  free(p->slot_bytes);
  p->slot_bytes = malloc((size_t)(p->nslots ? p->nslots : 1) * sizeof *p->slot_bytes);
  if (p->slot_bytes) memcpy(p->slot_bytes, bytes, (size_t)p->nslots * sizeof *bytes);
  free(busy);
  free(bytes);
}

/* True when node m is an add of a vector (the bias decompose() split off
** linear) to the product of matmul a. */
static int bias_add(const ir_graph *g, int a, int m) {
  const ir_node *nd = &g->nodes[m];
  int j;
  if (nd->kind != IR_OP || nd->op != OP_ADD || g->nodes[a].op != OP_MATMUL) return 0;
  for (j = 0; j < nd->nin; j++) {
    int s = op_source(g, m, j);
    if (s >= 0 && s != a && g->nodes[s].meta.ndim == 1) return 1;
  }
  return 0;
}

/* Why a plan moves more than the op-by-op reference (empty when not). */
static void explain_excess(fuse_plan *p, int peak_at) {
  const ir_graph *g = p->g;
  fuse_stats *st = &p->stats;
  char h[32];
  int k;
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
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kk = &p->kernels[k];
    if (has_epilogue(kk) && bias_add(g, kk->anchor, kk->nodes[0])) {
      snprintf(st->note, sizeof st->note, "moves %s more than the captured graph op by op: "
               "%%%d matmul writes its product and %%%d add reads it back to add the bias "
               "(decompose() split linear, which adds it in the library call); "
               "optimize() before fuse() re-forms linear", h, kk->anchor, kk->nodes[0]);
      return;
    }
  }
  snprintf(st->note, sizeof st->note, "moves %s more than the captured graph op by op: "
           "decompose() split composite ops that ran as one kernel each into primitives "
           "fusion could not join again", h);
}

void fuse_plan_measure(fuse_plan *p) {
  const ir_graph *g = p->g;
  int k, i, nout_bufs = 0, peak_at;
  ir_opcost ref, own;
  fuse_stats *st = &p->stats;
  memset(st, 0, sizeof *st);
  for (k = 0; k < p->nkernels; k++) {
    p->kernels[k].bytes = kernel_bytes(g, &p->kernels[k]);
    st->bytes_after += p->kernels[k].bytes;
  }
  last_uses(p);
  assign_slots(p);
  st->kernels = p->nkernels;
  st->nodes = ir_op_count(g);
  for (i = 0; i < g->n; i++)
    if (p->stored[i] && g->nodes[i].kind == IR_OP && is_output(g, i)) nout_bufs++;
  st->buffers_after = p->nslots + nout_bufs;
  st->peak_bytes_after = live_peak(p, &peak_at);
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
int fuse_mem_freed_after(const fuse_plan *p, int i, int k) { return freed_after(p, i, k); }
int fuse_mem_has_epilogue(const fk_kernel *k) { return has_epilogue(k); }
