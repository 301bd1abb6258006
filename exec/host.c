/*
** host.c -- the host program of a Program as a reader wants it first, as
** Inductor's output_code shows its call(): the arguments, every buffer
** with its memory-plan slot (two values in one slot are a reuse), then the
** steps in the order they run -- generated kernels and library (extern)
** calls with their arguments -- where each buffer is freed, and what is
** returned.  The kernels' C (or CUDA) follows it; the preamble only on
** request (print(k) and cm:code() leave it out).
**
** Invariant: the listing is read off the plan exactly as exec_program_run
** walks it (kernels in order, a value released after its last_use
** kernel), so what it says happens is what happens.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/program.h"
#include "graph/dtype.h"
#include "graph/op.h"

/* A value's name in the listing: an argument or parameter by its name,
** a graph output "out<i>" (an argument returned keeps its name), a value
** kept between calls "kept<id>", a stored intermediate "buf<slot>", one
** stored in a concatenation's memory (plan_into) that memory's elements
** "buf<slot>[from:to]", anything else (kept inside one kernel) by its
** node id. */
static void value_name(const exec_program *pr, int id, char *buf, size_t n) {
  const fuse_plan *p = pr->plan;
  const ir_graph *g = p->g;
  const ir_node *nd = &g->nodes[id];
  int i;
  if (p->into && p->into[id] >= 0) {
    int64_t off = 0;
    int h = id;
    size_t at;
    for (; p->into[h] >= 0; h = p->into[h]) off += p->into_off[h];
    value_name(pr, h, buf, n);
    at = strlen(buf);
    if (at < n)
      snprintf(buf + at, n - at, "[%lld:%lld]", (long long)off, (long long)(off + meta_numel(&nd->meta)));
    return;
  }
  if (nd->kind == IR_INPUT) {
    if (nd->name) snprintf(buf, n, "%s", nd->name);
    else snprintf(buf, n, "arg%d", nd->index);
    return;
  }
  if (nd->kind == IR_PARAM) {
    if (nd->name) snprintf(buf, n, "%s", nd->name);
    else snprintf(buf, n, "param%%%d", id);
    return;
  }
  for (i = 0; i < g->nout; i++)
    if (g->outputs[i] == id) {
      snprintf(buf, n, "out%d", i);
      return;
    }
  if (nd->kind == IR_CONST) snprintf(buf, n, "const%%%d", id);
  else if (exec_value_kept(pr, id)) snprintf(buf, n, "kept%d", id);
  else if (p->slot[id] >= 0) snprintf(buf, n, "buf%d", p->slot[id]);
  else snprintf(buf, n, "%%%d", id);
}

static void meta_str(const fl_meta *m, char *buf, size_t n) {
  size_t at = (size_t)snprintf(buf, n, "%s[", dtype_name(m->dtype));
  int d;
  for (d = 0; d < m->ndim && at < n; d++)
    at += (size_t)snprintf(buf + at, n - at, "%s%lld", d ? "," : "", (long long)m->shape[d]);
  if (at < n) snprintf(buf + at, n - at, "]");
}

static void bytes_str(int64_t b, char *buf, size_t n) {
  if (b >= 1 << 20) snprintf(buf, n, "%.1f MiB", (double)b / (1 << 20));
  else if (b >= 1 << 10) snprintf(buf, n, "%.1f KiB", (double)b / (1 << 10));
  else snprintf(buf, n, "%lld B", (long long)b);
}

static int is_output(const ir_graph *g, int id) {
  int i;
  for (i = 0; i < g->nout; i++) if (g->outputs[i] == id) return 1;
  return 0;
}

char *exec_program_host(const exec_program *pr) {
  const fuse_plan *p = pr->plan;
  const ir_graph *g = p->g;
  strbuf b = {0};
  char nm[160], mt[96], by[32], rd[192];
  int i, k, first;
  int *shown_at = malloc((size_t)(g->n ? g->n : 1) * sizeof *shown_at);  /* empty() said at */
  if (!shown_at) return NULL;
  for (i = 0; i < g->n; i++) shown_at[i] = -1;
  strbuf_printf(&b, "/* host program (%s): what runs on every call, in order; the kernels follow */\n",
                pr->be->name);
  strbuf_printf(&b, "call(");
  for (i = 0, first = 1; i < g->n; i++)
    if (g->nodes[i].kind == IR_INPUT) {
      value_name(pr, i, nm, sizeof nm);
      meta_str(&g->nodes[i].meta, mt, sizeof mt);
      strbuf_printf(&b, "%s%s: %s", first ? "" : ", ", nm, mt);
      first = 0;
    }
  strbuf_printf(&b, "):\n");
  {
    int col = 0;                       /* wrapped at about 100 columns */
    for (i = 0, first = 1; i < g->n; i++)
      if (g->nodes[i].kind == IR_PARAM) {
        value_name(pr, i, nm, sizeof nm);
        meta_str(&g->nodes[i].meta, mt, sizeof mt);
        if (first) col = 4 + (int)strlen("parameters (by reference): ");
        if (first) strbuf_printf(&b, "  # parameters (by reference): ");
        else if (col + (int)(strlen(nm) + strlen(mt)) + 3 > 100) {
          strbuf_printf(&b, ",\n  #   ");
          col = 6;
        } else {
          strbuf_printf(&b, ", ");
          col += 2;
        }
        strbuf_printf(&b, "%s %s", nm, mt);
        col += (int)(strlen(nm) + strlen(mt)) + 1;
        first = 0;
      }
    if (!first) strbuf_printf(&b, "\n");
  }
  {
    /* the slots as runs grow them: the largest value each holds, the
    ** kept values (memory of their own) not counted */
    int64_t *sb = calloc((size_t)(p->nslots ? p->nslots : 1), sizeof *sb), kb = 0;
    int used = 0, nkept = 0;
    for (i = 0; sb && i < g->n; i++) {
      int64_t nb = fuse_node_bytes(g, i);
      if (exec_value_kept(pr, i)) { kb += nb; nkept++; }
      else if (p->slot[i] >= 0 && nb > sb[p->slot[i]]) sb[p->slot[i]] = nb;
    }
    for (k = 0; sb && k < p->nslots; k++) used += sb[k] > 0;
    if (used > 0) {
      strbuf_printf(&b, "  # buffers: %d slot%s kept between calls", used, used == 1 ? "" : "s");
      for (k = 0, first = 1; k < p->nslots; k++) {
        if (!sb[k]) continue;
        bytes_str(sb[k], by, sizeof by);
        strbuf_printf(&b, "%s buf%d %s", first ? ":" : ",", k, by);
        first = 0;
      }
      strbuf_printf(&b, "\n");
    }
    if (nkept > 0) {
      bytes_str(kb, by, sizeof by);
      strbuf_printf(&b, "  # kept between calls: %d value%s computed from weights alone, %s;\n"
                    "  # their kernels run on the first call and again only when a weight is\n"
                    "  # written or the input shapes change\n", nkept, nkept == 1 ? "" : "s", by);
    }
    free(sb);
  }
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kr = &p->kernels[k];
    const char *in = exec_kernel_kept(pr, k) ? "  " : "";
    int j, epilogue = 0;
    if (*in && !exec_kernel_kept(pr, k - 1)) strbuf_printf(&b, "  if weights_changed:\n");
    /* values first stored here: a slot taken (again: a reuse); a
    ** concatenation's, by the first value stored in it */
    for (j = kr->nin; j < kr->nbufs; j++) {
      int id = kr->bufs[j], s, o;
      id = fuse_home(p, id);
      if ((s = p->slot[id]) < 0 || shown_at[id] >= 0) continue;
      shown_at[id] = k;
      value_name(pr, id, nm, sizeof nm);
      meta_str(&g->nodes[id].meta, mt, sizeof mt);
      for (o = 0; o < id; o++)
        if (p->slot[o] == s && p->kernel_of[o] >= 0 && p->kernel_of[o] < k && !exec_value_kept(pr, o)) break;
      if (p->alias && p->alias[id] >= 0 && p->alias[id] != kr->anchor) {
        /* fuse/plan.c residual_over: stored over the residual it adds */
        strbuf_printf(&b, "%s  # %s: k%d stores its result over the residual it adds, read by nothing after\n",
                      in, nm, k);
        continue;
      }
      strbuf_printf(&b, "%s  %s = empty(%s)%s\n", in, nm, mt,
                    *in ? "   # memory of its own" :
                    o < id ? "   # reuses the slot of a value no longer needed" : "");
    }
    if (fuse_cat_in_place(p, k)) {
      value_name(pr, kr->anchor, nm, sizeof nm);
      strbuf_printf(&b, "%s  # k%d %s: nothing to copy, its inputs were stored in place in %s\n", in, k,
                    kr->name, nm);
      continue;
    }
    if (kr->kind == FK_EXTERN && kr->anchor >= 0) {
      strbuf_printf(&b, "%s  extern %s(", in, op_name(g->nodes[kr->anchor].op));
    } else {
      strbuf_printf(&b, "%s  k%d %s(", in, k, kr->name);
    }
    for (j = 0, first = 1; j < kr->nin; j++) {
      if (kr->bufs[j] == kr->anchor) continue;   /* the library's result, read by the epilogue */
      value_name(pr, kr->bufs[j], nm, sizeof nm);
      strbuf_printf(&b, "%s%s", first ? "" : ", ", nm);
      first = 0;
    }
    strbuf_printf(&b, ")");
    if (kr->kind == FK_EXTERN) {
      int shown = 0;
      for (j = 0; j < kr->nnodes; j++) {
        const ir_node *nd = &g->nodes[kr->nodes[j]];
        if (kr->nodes[j] == kr->anchor || nd->kind != IR_OP) continue;
        if (shown == 0) strbuf_printf(&b, " + epilogue");
        if (shown++ == 4) { strbuf_printf(&b, " ..."); break; }
        strbuf_printf(&b, " %s", op_name(nd->op));
      }
      epilogue = shown > 0;
    }
    strbuf_printf(&b, " -> ");
    for (j = kr->nin; j < kr->nbufs; j++) {
      value_name(pr, kr->bufs[j], nm, sizeof nm);
      strbuf_printf(&b, "%s%s", j > kr->nin ? ", " : "", nm);
    }
    if (pr->be->layout && pr->be->layout(pr, k, nm, sizeof nm))
      strbuf_printf(&b, " in %s", nm);     /* where layouts change: a reorder on the way out is gone */
    bytes_str(kr->bytes, by, sizeof by);
    rd[0] = 0;                            /* an input read where it lies (cpu: a shuffle's) */
    if (pr->be->reads && pr->be->reads(pr, k, rd + 2, sizeof rd - 2)) memcpy(rd, "; ", 2);
    if (kr->kind == FK_EXTERN)
      strbuf_printf(&b, "   # k%d %s: library call%s, %s moved%s\n", k, kr->name,
                    epilogue ? " with its epilogue fused" : "", by, rd);
    else
      strbuf_printf(&b, "   # %d op%s, %s moved\n", kr->nnodes, kr->nnodes == 1 ? "" : "s", by);
    /* what this kernel read for the last time is freed (its slot reusable) */
    first = 1;
    for (i = 0; i < g->n; i++)
      if (p->last_use[i] == k && g->nodes[i].kind == IR_OP && p->slot[i] >= 0 && !is_output(g, i) &&
          !exec_value_kept(pr, i)) {
        value_name(pr, i, nm, sizeof nm);
        strbuf_printf(&b, "%s%s", first ? "  del " : ", ", nm);
        first = 0;
      }
    if (!first) strbuf_printf(&b, "\n");
  }
  /* the captured in-place updates: after every kernel, into the caller's
  ** storage (ir_writeback) */
  for (i = 0; i < g->nwb; i++) {
    char dst[96];
    int src = g->outputs[ir_nresults(g) + i];
    value_name(pr, src, nm, sizeof nm);
    value_name(pr, g->wb[i], dst, sizeof dst);
    if (p->inplace && p->inplace[src] == g->wb[i])
      /* plan_inplace: the kernel stores into dst when it is contiguous */
      strbuf_printf(&b, "  # %s = %s: stored in place by k%d (a copy only if %s is strided)\n", dst, nm,
                    p->kernel_of[src], dst);
    else
      strbuf_printf(&b, "  %s.copy_(%s)    # write-back: the in-place update of %s\n", dst, nm, dst);
  }
  strbuf_printf(&b, "  return ");
  for (i = 0; i < ir_nresults(g); i++) {
    value_name(pr, g->outputs[i], nm, sizeof nm);
    strbuf_printf(&b, "%s%s", i ? ", " : "", nm);
  }
  strbuf_printf(&b, "\n\n");
  free(shown_at);
  return strbuf_take(&b);
}

const char *exec_program_body(const exec_program *pr) { return pr->body ? pr->body : ""; }
