/*
** memplan.c -- the cost model (bytes each kernel reads and writes) and the
** memory planner (which buffer slot each intermediate lives in).
** Invariant: two intermediates share a slot only when the first is dead
** (its last reader has run) before the second is written, and never within
** one kernel, so no kernel reads and writes the same memory.
*/
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* A view may name 2^62 elements: such a count saturates just above what
** can be allocated (running it fails there, naming the size), so sums of
** many stay far from wrapping. */
static int64_t nbytes(const ir_graph *g, int id) {
  int64_t b;
  if (!sz_mul(meta_numel(&g->nodes[id].meta),
              (int64_t)dtype_size(g->nodes[id].meta.dtype), &b) ||
      b > FL_MAX_ALLOC)
    b = FL_MAX_ALLOC + 1;
  return b;
}

/* Bytes a kernel moves: each buffer read once, each written once; an
** extern with an epilogue also reads its own result back. */
static int64_t kernel_bytes(const ir_graph *g, const fk_kernel *k) {
  int64_t b = 0;
  int i;
  for (i = 0; i < k->nbufs; i++) b += nbytes(g, k->bufs[i]);
  if (k->kind == FK_EXTERN && k->nnodes > 0) b += nbytes(g, k->anchor);
  return b;
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
** after its last reader (outputs live to the end). */
static int64_t live_peak(const fuse_plan *p) {
  const ir_graph *g = p->g;
  int64_t live = 0, peak = 0;
  int k, i;
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kk = &p->kernels[k];
    for (i = kk->nin; i < kk->nbufs; i++) live += nbytes(g, kk->bufs[i]);
    if (live > peak) peak = live;
    for (i = 0; i < g->n; i++)
      if (p->stored[i] && g->nodes[i].kind == IR_OP && p->last_use[i] == k) live -= nbytes(g, i);
  }
  return peak;
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

void fuse_plan_measure(fuse_plan *p, const fuse_plan *base) {
  const ir_graph *g = p->g;
  int k, i, nout_bufs = 0, nbase = 0;
  int64_t outb = 0, slotb = 0;
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
    if (p->stored[i] && g->nodes[i].kind == IR_OP && is_output(g, i)) {
      nout_bufs++;
      outb += nbytes(g, i);
    }
  for (i = 0; i < p->nslots; i++) slotb += p->slot_bytes ? p->slot_bytes[i] : 0;
  st->buffers_after = p->nslots + nout_bufs;
  st->peak_bytes_after = slotb + outb;
  for (k = 0; k < base->nkernels; k++)
    st->bytes_before += base == p ? p->kernels[k].bytes : kernel_bytes(base->g, &base->kernels[k]);
  for (i = 0; i < base->g->n; i++)
    nbase += base->stored[i] && base->g->nodes[i].kind == IR_OP;
  st->buffers_before = nbase;
  if (base == p) {
    st->peak_bytes_before = live_peak(p);
  } else {
    /* the baseline's last uses, computed on a scratch copy */
    fuse_plan tmp = *base;
    tmp.last_use = malloc((size_t)(base->g->n ? base->g->n : 1) * sizeof(int));
    if (tmp.last_use) {
      last_uses(&tmp);
      st->peak_bytes_before = live_peak(&tmp);
      free(tmp.last_use);
    }
  }
}
