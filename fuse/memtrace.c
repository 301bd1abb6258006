/*
** memtrace.c -- bytes alive at each step (memtrace.h).  Each curve is one
** walk of its schedule with the planner's own rules (memplan.c's
** fuse_graph_cost for op by op, through the fuse_mem_* wrappers there,
** and fuse_plan_walk itself for fused), so the tops of the curves are the
** peaks p:stats() reports.  A second walk stops at the peak to name what
** is alive there, which sums to the peak by construction.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtrace.h"
#include "../graph/strbuf.h"

static int is_op(const ir_graph *g, int i) {
  return g->nodes[i].kind == IR_OP && !fk_is_view(g, i);
}

/* Op by op: last[s] is the op that reads s last (g->n for an output, -1
** for nobody), as fuse_graph_cost counts it. */
static void op_last_reads(const ir_graph *g, int *last) {
  int i, j;
  for (i = 0; i < g->n; i++) last[i] = -1;
  for (i = 0; i < g->n; i++) {
    if (!is_op(g, i)) continue;
    for (j = 0; j < g->nodes[i].nin; j++)
      if (fuse_mem_first_read(g, i, j)) last[fuse_mem_op_source(g, i, j)] = i;
  }
  for (i = 0; i < g->nout; i++) {
    int s = g->outputs[i];
    while (s >= 0 && g->nodes[s].kind == IR_OP && fk_is_view(g, s)) s = g->nodes[s].in[0];
    if (s >= 0) last[s] = g->n;
  }
}

/* One walk of g op by op.  steps (may be NULL) gets each step's bytes;
** alive (may be NULL) what is alive at step stop (-1: walk all). */
static int64_t walk_ops(const ir_graph *g, const int *last, fuse_mem_step *steps,
                        int64_t *alive, int stop, int *peak_at) {
  int64_t live = 0, peak = 0;
  int i, j, n = 0;
  *peak_at = -1;
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    if (!is_op(g, i)) continue;
    live += fuse_node_bytes(g, i);
    if (alive) alive[i] += fuse_node_bytes(g, i);
    if (steps) {
      snprintf(steps[n].name, sizeof steps[n].name, "%%%d %s", i, op_name(nd->op));
      steps[n].id = i;
      steps[n].bytes = live;
    }
    if (live > peak) { peak = live; *peak_at = n; }
    if (n == stop) return peak;
    for (j = 0; j < nd->nin; j++) {
      int s = fuse_mem_op_source(g, i, j);
      if (fuse_mem_first_read(g, i, j) && g->nodes[s].kind == IR_OP && last[s] == i) {
        live -= fuse_node_bytes(g, s);
        if (alive) alive[s] -= fuse_node_bytes(g, s);
      }
    }
    if (last[i] < 0) {                       /* read by nobody: dead at once */
      live -= fuse_node_bytes(g, i);
      if (alive) alive[i] -= fuse_node_bytes(g, i);
    }
    n++;
  }
  return peak;
}

static int by_bytes(const void *a, const void *b) {
  const fuse_mem_buf *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  return x->id - y->id;
}

/* The buffers alive (non-zero counts), largest first. */
static int take_alive(fuse_mem_curve *c, const int64_t *alive) {
  const ir_graph *g = c->g;
  int i, n = 0;
  for (i = 0; i < g->n; i++) n += alive[i] != 0;
  c->bufs = calloc((size_t)(n ? n : 1), sizeof *c->bufs);
  if (!c->bufs) return FL_ENOMEM;
  for (i = 0; i < g->n; i++) {
    fuse_mem_buf *b;
    if (!alive[i]) continue;
    b = &c->bufs[c->nbufs++];
    b->id = i;
    b->bytes = alive[i];
    b->scope = g->nodes[i].scope;
    snprintf(b->name, sizeof b->name, "%s",
             g->nodes[i].kind == IR_OP ? op_name(g->nodes[i].op) : "value");
  }
  qsort(c->bufs, (size_t)c->nbufs, sizeof *c->bufs, by_bytes);
  return FL_OK;
}

static int before_curve(const ir_graph *g, fuse_mem_curve *c) {
  int *last = malloc((size_t)(g->n ? g->n : 1) * sizeof *last);
  int64_t *alive = calloc((size_t)(g->n ? g->n : 1), sizeof *alive);
  int i, n = 0, at, rc = FL_ENOMEM;
  c->g = g;
  for (i = 0; i < g->n; i++) n += is_op(g, i);
  c->steps = calloc((size_t)(n ? n : 1), sizeof *c->steps);
  if (last && alive && c->steps) {
    c->n = n;
    op_last_reads(g, last);
    c->peak = walk_ops(g, last, c->steps, NULL, -1, &c->peak_at);
    if (c->peak_at >= 0) walk_ops(g, last, NULL, alive, c->peak_at, &at);
    rc = take_alive(c, alive);
  }
  free(last);
  free(alive);
  return rc;
}

static int after_curve(const fuse_plan *p, fuse_mem_curve *c) {
  int64_t *alive = calloc((size_t)(p->g->n ? p->g->n : 1), sizeof *alive);
  int64_t *at = calloc((size_t)(p->nkernels ? p->nkernels : 1), sizeof *at);
  int k, rc = FL_ENOMEM;
  c->g = p->g;
  c->steps = calloc((size_t)(p->nkernels ? p->nkernels : 1), sizeof *c->steps);
  if (alive && at && c->steps) {
    c->n = p->nkernels;
    c->peak = fuse_plan_walk(p, at, NULL, -1, &c->peak_at);
    for (k = 0; k < p->nkernels; k++) {
      snprintf(c->steps[k].name, sizeof c->steps[k].name, "k%d %s", k, p->kernels[k].name);
      c->steps[k].id = k;
      c->steps[k].bytes = at[k];
    }
    if (c->peak_at >= 0) fuse_plan_walk(p, NULL, alive, c->peak_at, &k);
    rc = c->peak < 0 ? FL_ENOMEM : take_alive(c, alive);
  }
  free(alive);
  free(at);
  return rc;
}

/* True when captured is the graph p's "before" was counted from: its cost
** op by op is the one p->g recorded. */
static int is_origin(const fuse_plan *p, const ir_graph *captured) {
  ir_opcost c;
  const ir_opcost *o = &p->g->origin;
  if (!captured || !o->known || fuse_graph_cost(captured, &c) != FL_OK) return 0;
  return c.kernels == o->kernels && c.bytes == o->bytes && c.peak_bytes == o->peak_bytes;
}

int fuse_mem_trace_build(const fuse_plan *p, const ir_graph *captured, fuse_mem_trace *t,
                         fl_err *e) {
  const ir_graph *ref = p->g;
  memset(t, 0, sizeof *t);
  if (p->g->origin.known) {
    if (is_origin(p, captured)) ref = captured;
    else t->before_own = 1;
  }
  if (before_curve(ref, &t->before) != FL_OK || after_curve(p, &t->after) != FL_OK) {
    fuse_mem_trace_free(t);
    return err_set(e, FL_ENOMEM, "memory: out of memory");
  }
  return FL_OK;
}

void fuse_mem_trace_free(fuse_mem_trace *t) {
  free(t->before.steps);
  free(t->before.bufs);
  free(t->after.steps);
  free(t->after.bufs);
  memset(t, 0, sizeof *t);
}

/* ---- text ---------------------------------------------------------------- */

void fuse_mem_bufs_str(const fuse_mem_curve *c, int most, char *buf, size_t n) {
  size_t at = 0;
  int i;
  char h[32];
  buf[0] = '\0';
  for (i = 0; i < c->nbufs && i < most && at < n; i++) {
    const fuse_mem_buf *b = &c->bufs[i];
    fuse_bytes_str(b->bytes, h, sizeof h);
    at += (size_t)snprintf(buf + at, n - at, "%s%%%d %s%s%s %s", i ? ", " : "", b->id, b->name,
                           b->scope ? " in " : "", b->scope ? b->scope : "", h);
  }
  if (c->nbufs > most && at < n)
    snprintf(buf + at, n - at, ", and %d more", c->nbufs - most);
}

static void peak_lines(strbuf *b, const char *what, const fuse_mem_curve *c) {
  char h[32], s[32];
  int i;
  fuse_bytes_str(c->peak, h, sizeof h);
  if (c->peak_at < 0) {
    strbuf_printf(b, "%s: no step keeps an op result (peak 0 B)\n", what);
    return;
  }
  strbuf_printf(b, "%s: peak %s at step %d of %d, %s; alive there:\n", what, h, c->peak_at + 1,
                c->n, c->steps[c->peak_at].name);
  for (i = 0; i < c->nbufs && i < 8; i++) {
    const fuse_mem_buf *bf = &c->bufs[i];
    fuse_bytes_str(bf->bytes, s, sizeof s);
    strbuf_printf(b, "  %%%-5d %-14s %10s%s%s\n", bf->id, bf->name, s, bf->scope ? "  in " : "",
                  bf->scope ? bf->scope : "");
  }
  if (c->nbufs > 8) strbuf_printf(b, "  and %d more\n", c->nbufs - 8);
}

/* The steps of c: all of them when there are at most rows, else a few
** either side of its peak, with "..." for what is left out. */
static void step_table(strbuf *b, const char *what, const fuse_mem_curve *c, int rows) {
  int i, lo = 0, hi = c->n - 1, gap = 0;
  char h[32];
  if (c->n > rows && c->peak_at >= 0) {
    int w = rows / 2 > 1 ? rows / 2 : 1;
    lo = c->peak_at - w;
    hi = c->peak_at + w;
  }
  strbuf_printf(b, "%s, bytes alive at each step%s:\n", what,
                c->n > rows ? " (the steps near its peak)" : "");
  for (i = 0; i < c->n; i++) {
    if (i < lo || i > hi) {
      if (!gap) strbuf_printf(b, "  ...\n");
      gap = 1;
      continue;
    }
    gap = 0;
    fuse_bytes_str(c->steps[i].bytes, h, sizeof h);
    strbuf_printf(b, "  %5d  %10s  %s%s\n", i + 1, h, c->steps[i].name,
                  i == c->peak_at ? "   <- peak" : "");
  }
}

char *fuse_mem_text(const fuse_mem_trace *t, int rows) {
  strbuf b;
  const char *before = t->before_own ? "op by op (the planned graph: the captured one is gone)"
                                     : "op by op (the captured graph)";
  memset(&b, 0, sizeof b);
  strbuf_printf(&b, "Memory: op results alive at each step (each freed after its last reader, "
                "outputs to the end, views free; fused: an extern's operands freed once its "
                "call has read them, an epilogue stored over its product, kept values held "
                "from the start)\n");
  peak_lines(&b, before, &t->before);
  peak_lines(&b, "fused (the plan's kernels in run order)", &t->after);
  if (rows > 0) {
    step_table(&b, "op by op", &t->before, rows);
    step_table(&b, "fused", &t->after, rows);
  }
  return strbuf_take(&b);
}
