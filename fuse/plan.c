/*
** plan.c -- grouping graph nodes into kernels.
** Invariant: every op node that is not a folded view belongs to exactly one
** group; the groups form a DAG (no kernel waits on a kernel that waits on
** it); each group can be built into a kernel (fk_build succeeds).  A merge
** is only ever made after checking all three for the merged group.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "../graph/strbuf.h"

void fuse_opts_default(fuse_opts *o) {
  o->fuse = 1;
  o->max_nodes = 64;
  o->explain = 0;
}

/* planning state over one graph */
typedef struct planner {
  const ir_graph *g;
  fuse_opts o;
  char *compute;       /* node runs in some kernel (ops that are not folded views) */
  int *grp;            /* group representative per compute node */
  int *anchor;         /* per representative: extern op in the group, or -1 */
  int **readers;       /* per node: compute nodes reading it (through views) */
  int *nreaders;
  char *is_out;
  fuse_decision *dec;
  int ndec, capdec;
} planner;

/* Ops the generator has no loop nest for: they run as an extern step
** (sgemm, conv, eager kernel); matmul-like ones take elementwise epilogues. */
static int is_extern_op(fl_op op) {
  op_kind k = op_info_of(op)->kind;
  return k == OPK_OUTFUSABLE || k == OPK_OPAQUE || op == OP_CAT || op == OP_EMBEDDING ||
         op == OP_PAD || op == OP_FLIP || op == OP_GATHER;
}

/* Follow folded views from input `in` of node c to what it really reads. */
static int source_of(const planner *pl, int c, int in) {
  int s = pl->g->nodes[c].in[in];
  while (s >= 0 && !pl->compute[s] && fk_is_view(pl->g, s)) s = pl->g->nodes[s].in[0];
  return s;
}

static int find(planner *pl, int id) {
  while (pl->grp[id] != id) id = pl->grp[id] = pl->grp[pl->grp[id]];
  return id;
}

#define nbytes fuse_node_bytes

static int add_reader(planner *pl, int src, int c) {
  int *r, i;
  for (i = 0; i < pl->nreaders[src]; i++) if (pl->readers[src][i] == c) return 0;
  r = realloc(pl->readers[src], (size_t)(pl->nreaders[src] + 1) * sizeof *r);
  if (!r) return -1;
  r[pl->nreaders[src]++] = c;
  pl->readers[src] = r;
  return 0;
}

/* members of the group (or union of two groups) into out; returns count */
static int members(planner *pl, int ga, int gb, int *out) {
  int i, n = 0;
  for (i = 0; i < pl->g->n; i++) {
    int r;
    if (!pl->compute[i]) continue;
    r = find(pl, i);
    if (r == ga || r == gb) out[n++] = i;
  }
  return n;
}

/* Would merging groups ga and gb make a cycle?  True when a path leaves the
** union and comes back into it (through another group).  Each group's
** members are listed once up front and walked once, so a call is linear in
** the graph (it runs for every candidate merge). */
static int makes_cycle(planner *pl, int ga, int gb) {
  const ir_graph *g = pl->g;
  size_t n = (size_t)(g->n ? g->n : 1);
  char *seen = calloc(n, 1), *walked = calloc(n, 1);
  int *stack = malloc(n * sizeof *stack), *head = malloc(n * sizeof *head);
  int *next = malloc(n * sizeof *next), sp = 0, i, k, cyc = 0;
  if (!seen || !walked || !stack || !head || !next) {
    free(seen); free(walked); free(stack); free(head); free(next);
    return 1;
  }
  for (i = 0; i < g->n; i++) head[i] = -1;
  for (i = g->n - 1; i >= 0; i--) {
    int r;
    if (!pl->compute[i]) continue;
    r = find(pl, i);
    next[i] = head[r];
    head[r] = i;
  }
  /* start from every outside reader of a union member */
  for (i = 0; i < g->n; i++) {
    int r;
    if (!pl->compute[i]) continue;
    r = find(pl, i);
    if (r != ga && r != gb) continue;
    for (k = 0; k < pl->nreaders[i]; k++) {
      int c = pl->readers[i][k], rc = find(pl, c);
      if (rc != ga && rc != gb && !seen[c]) { seen[c] = 1; stack[sp++] = c; }
    }
  }
  while (sp > 0 && !cyc) {
    int rn = find(pl, stack[--sp]);
    /* a whole group runs at once: its members' readers are reachable too */
    if (walked[rn]) continue;
    walked[rn] = 1;
    for (i = head[rn]; i >= 0 && !cyc; i = next[i]) {
      for (k = 0; k < pl->nreaders[i]; k++) {
        int c = pl->readers[i][k], rc = find(pl, c);
        if (rc == ga || rc == gb) { cyc = 1; break; }
        if (!seen[c]) { seen[c] = 1; stack[sp++] = c; }
      }
    }
  }
  free(seen);
  free(walked);
  free(stack);
  free(head);
  free(next);
  return cyc;
}

/* does node `to` depend on node `from` (through any path)? */
static int depends(const ir_graph *g, int to, int from) {
  char *seen;
  int *stack, sp = 0, found = 0, i;
  if (to == from) return 1;
  if (to < from) return 0;
  seen = calloc((size_t)g->n, 1);
  stack = malloc((size_t)g->n * sizeof *stack);
  if (!seen || !stack) { free(seen); free(stack); return 1; }
  stack[sp++] = to;
  while (sp > 0 && !found) {
    const ir_node *nd = &g->nodes[stack[--sp]];
    if (nd->kind != IR_OP) continue;
    for (i = 0; i < nd->nin; i++) {
      int s = nd->in[i];
      if (s < 0 || seen[s] || s < from) continue;
      if (s == from) { found = 1; break; }
      seen[s] = 1;
      stack[sp++] = s;
    }
  }
  free(seen);
  free(stack);
  return found;
}

/* stored flags for a set of members: read outside it, an output, or the
** extern's result */
static void stored_for(planner *pl, const int *mem, int nm, int anchor, char *stored) {
  int i, k, j;
  memset(stored, 0, (size_t)pl->g->n);
  for (i = 0; i < nm; i++) {
    int id = mem[i], out = pl->is_out[id];
    for (k = 0; k < pl->nreaders[id] && !out; k++) {
      int in = 0;
      for (j = 0; j < nm; j++) in |= mem[j] == pl->readers[id][k];
      out = !in;
    }
    stored[id] = (char)out;
  }
  if (anchor >= 0) stored[anchor] = 1;
  /* views materialized by other kernels are buffers too */
  for (i = 0; i < pl->g->n; i++)
    if (pl->compute[i] && fk_is_view(pl->g, i) && !stored[i]) {
      int in = 0;
      for (j = 0; j < nm; j++) in |= mem[j] == i;
      if (!in) stored[i] = 1;
    }
}

static const char *rule_text(planner *pl, int a, int b, int horizontal, char *buf, size_t n) {
  const ir_graph *g = pl->g;
  op_kind ka = op_info_of(g->nodes[a].op)->kind, kb = op_info_of(g->nodes[b].op)->kind;
  if (horizontal) return "sibling reductions over the same input (horizontal)";
  if (is_extern_op(g->nodes[a].op)) {
    snprintf(buf, n, "elementwise epilogue of %s (runs on its result in the same kernel)",
             op_name(g->nodes[a].op));
    return buf;
  }
  if (ka == OPK_REDUCTION && kb == OPK_REDUCTION) return "reductions over the same rows, one after the other";
  if (ka == OPK_REDUCTION) return "elementwise consumer of a reduction (epilogue)";
  if (kb == OPK_REDUCTION) return "elementwise producer of a reduction (prologue)";
  if (pl->anchor[find(pl, b)] >= 0) {
    snprintf(buf, n, "elementwise chain in the epilogue of %s",
             op_name(g->nodes[pl->anchor[find(pl, b)]].op));
    return buf;
  }
  return "elementwise chain";
}

/* The first reduction among mem[0..nm), or -1. */
static int reduction_among(const ir_graph *g, const int *mem, int nm) {
  int i;
  for (i = 0; i < nm; i++)
    if (op_info_of(g->nodes[mem[i]].op)->kind == OPK_REDUCTION) return mem[i];
  return -1;
}

/* Try to merge the groups of a and b; 1 merged, 0 refused (why filled). */
static int try_merge(planner *pl, int a, int b, char *why, size_t nwhy) {
  const ir_graph *g = pl->g;
  int ga = find(pl, a), gb = find(pl, b), nm, anchor, i, nops = 0, ok;
  int *mem;
  char *stored, sub[200];
  fk_kernel k;
  if (ga == gb) { snprintf(why, nwhy, "already in one kernel"); return 1; }
  if (op_info_of(g->nodes[b].op)->kind == OPK_OPAQUE || op_info_of(g->nodes[a].op)->kind == OPK_OPAQUE) {
    int o = op_info_of(g->nodes[a].op)->kind == OPK_OPAQUE ? a : b;
    snprintf(why, nwhy, "%s is opaque (fuses with nothing)", op_name(g->nodes[o].op));
    return 0;
  }
  if (pl->anchor[gb] == b || (pl->anchor[ga] == a && is_extern_op(g->nodes[b].op))) {
    snprintf(why, nwhy, "%s is not an epilogue", op_name(g->nodes[b].op));
    return 0;
  }
  if (pl->anchor[ga] >= 0 && pl->anchor[gb] >= 0) {
    snprintf(why, nwhy, "%s and %s are both extern kernels", op_name(g->nodes[pl->anchor[ga]].op),
             op_name(g->nodes[pl->anchor[gb]].op));
    return 0;
  }
  for (i = 0; i < 2; i++) {
    int an = pl->anchor[i ? gb : ga];
    if (an >= 0 && op_info_of(g->nodes[an].op)->kind != OPK_OUTFUSABLE) {
      snprintf(why, nwhy, "%s has no generated lowering and takes no epilogue", op_name(g->nodes[an].op));
      return 0;
    }
  }
  mem = malloc((size_t)g->n * sizeof *mem);
  stored = malloc((size_t)g->n);
  if (!mem || !stored) { free(mem); free(stored); snprintf(why, nwhy, "out of memory"); return 0; }
  nm = members(pl, ga, gb, mem);
  anchor = pl->anchor[ga] >= 0 ? pl->anchor[ga] : pl->anchor[gb];
  for (i = 0; i < nm; i++) nops += !fk_is_view(g, mem[i]);
  ok = 0;
  if (nops > pl->o.max_nodes) {
    snprintf(why, nwhy, "the kernel would hold %d ops (max_nodes is %d)", nops, pl->o.max_nodes);
  } else if (makes_cycle(pl, ga, gb)) {
    snprintf(why, nwhy, "a path between them leaves the kernel and comes back (a cycle)");
  } else if (anchor >= 0 && reduction_among(g, mem, nm) >= 0) {
    /* an epilogue runs elementwise over the product; say which reduction
    ** is in the way: often not a or b but one joined to b before (a
    ** residual add already fused into the layer_norm after it) */
    int r = reduction_among(g, mem, nm);
    char dr[64];
    fk_describe(g, r, dr, sizeof dr);
    if (r == a || r == b)
      snprintf(why, nwhy, "%%%d (%s) is a reduction, and an epilogue of %s runs elementwise "
               "over its result", r, dr, op_name(g->nodes[anchor].op));
    else
      snprintf(why, nwhy, "%%%d (%s) already runs in one kernel with the reduction %%%d (%s), "
               "and an epilogue of %s runs elementwise over its result",
               find(pl, r) == gb ? b : a, op_name(g->nodes[find(pl, r) == gb ? b : a].op),
               r, dr, op_name(g->nodes[anchor].op));
  } else {
    int j, bad = 0;
    /* the extern runs first: no member may be one of its inputs */
    for (i = 0, j = 0; i < nm && anchor >= 0 && !bad; i++)
      if (mem[i] != anchor && depends(g, anchor, mem[i])) bad = 1;
    if (bad) {
      snprintf(why, nwhy, "%s would have to wait for its own epilogue", op_name(g->nodes[anchor].op));
    } else {
      /* members of the kernel proper (the anchor runs as its extern step) */
      for (i = 0, j = 0; i < nm; i++) if (mem[i] != anchor) mem[j++] = mem[i];
      stored_for(pl, mem, j, anchor, stored);
      if (fk_build(&k, g, mem, j, anchor, stored, sub, sizeof sub) == 0) {
        fk_kernel_clear(&k);
        ok = 1;
      } else {
        snprintf(why, nwhy, "%s", sub);
      }
    }
  }
  if (ok) {
    pl->grp[gb] = ga;
    if (pl->anchor[ga] < 0) pl->anchor[ga] = pl->anchor[gb];
  }
  free(mem);
  free(stored);
  return ok;
}

static fuse_decision *new_decision(planner *pl) {
  if (pl->ndec == pl->capdec) {
    int cap = pl->capdec ? pl->capdec * 2 : 32;
    fuse_decision *d = realloc(pl->dec, (size_t)cap * sizeof *d);
    if (!d) return NULL;
    pl->dec = d;
    pl->capdec = cap;
  }
  memset(&pl->dec[pl->ndec], 0, sizeof pl->dec[0]);
  return &pl->dec[pl->ndec++];
}

static int cmp_dec(const void *pa, const void *pb) {
  const fuse_decision *a = pa, *b = pb;
  if (a->bytes_saved != b->bytes_saved) return a->bytes_saved > b->bytes_saved ? -1 : 1;
  if (a->b != b->b) return a->b - b->b;
  return a->a - b->a;
}

/* Graph order: by consumer, then producer (a sibling pair by its second). */
static int cmp_graph_order(const void *pa, const void *pb) {
  const fuse_decision *a = pa, *b = pb;
  if (a->b != b->b) return a->b - b->b;
  return a->a - b->a;
}

/* Candidate pairs with their score: the bytes fusing them would save. */
static int candidates(planner *pl) {
  const ir_graph *g = pl->g;
  int c, i, j;
  for (c = 0; c < g->n; c++) {
    const ir_node *nd = &g->nodes[c];
    if (!pl->compute[c]) continue;
    for (i = 0; i < nd->nin; i++) {
      int s = source_of(pl, c, i), dup = 0;
      fuse_decision *d;
      if (s < 0 || !pl->compute[s]) continue;
      for (j = 0; j < i; j++) dup |= source_of(pl, c, j) == s;
      if (dup) continue;
      if (!(d = new_decision(pl))) return -1;
      d->a = s;
      d->b = c;
      /* the value no longer written nor read back; only the read when it
      ** is needed elsewhere too; an extern's result is written anyway */
      if (is_extern_op(g->nodes[s].op)) d->bytes_saved = 0;
      else if (pl->nreaders[s] == 1 && !pl->is_out[s]) d->bytes_saved = 2 * nbytes(g, s);
      else d->bytes_saved = nbytes(g, s);
    }
  }
  /* sibling reductions reading the same value: it is read once */
  for (c = 0; c < g->n; c++) {
    if (!pl->compute[c] || op_info_of(g->nodes[c].op)->kind != OPK_REDUCTION) continue;
    for (j = c + 1; j < g->n; j++) {
      fuse_decision *d;
      int s = source_of(pl, c, 0);
      if (!pl->compute[j] || op_info_of(g->nodes[j].op)->kind != OPK_REDUCTION) continue;
      if (source_of(pl, j, 0) != s || depends(g, j, c)) continue;
      if (!(d = new_decision(pl))) return -1;
      d->a = c;
      d->b = j;
      d->horizontal = 1;
      d->bytes_saved = nbytes(g, s);
    }
  }
  if (pl->ndec > 1) qsort(pl->dec, (size_t)pl->ndec, sizeof *pl->dec, cmp_dec);
  return 0;
}

/* Decide every candidate; refused ones are tried again after later merges
** (a cycle through a third node disappears once that node joins). */
static void decide(planner *pl) {
  const ir_graph *g = pl->g;
  char why[200], da[64], db[64], rt[96];
  int i, n, pass, changed = 1;
  char *done = calloc((size_t)(pl->ndec ? pl->ndec : 1), 1);
  if (!done) return;
  for (pass = 0; changed && pass < 8; pass++) {
    changed = 0;
    for (i = 0; i < pl->ndec; i++) {
      fuse_decision *d = &pl->dec[i];
      int already;
      if (done[i]) continue;
      fk_describe(g, d->a, da, sizeof da);
      fk_describe(g, d->b, db, sizeof db);
      if (!pl->o.fuse) {
        snprintf(d->reason, sizeof d->reason, "cannot fuse %%%d (%s) with %%%d (%s): "
                 "fusion is off", d->a, da, d->b, db);
        d->bytes_saved = 0;
        done[i] = 1;
        continue;
      }
      already = find(pl, d->a) == find(pl, d->b);
      if (already) {
        /* other merges put both in one kernel: nothing was decided here */
        done[i] = 2;
      } else if (try_merge(pl, d->a, d->b, why, sizeof why)) {
        d->fused = 1;
        done[i] = 1;
        changed = 1;
        snprintf(d->reason, sizeof d->reason, "fused %%%d (%s) with %%%d (%s): %s",
                 d->a, da, d->b, db, rule_text(pl, d->a, d->b, d->horizontal, rt, sizeof rt));
      } else {
        snprintf(d->reason, sizeof d->reason, "cannot fuse %%%d (%s) with %%%d (%s): %s",
                 d->a, da, d->b, db, why);
      }
    }
  }
  for (i = 0; i < pl->ndec; i++) if (!pl->dec[i].fused) pl->dec[i].bytes_saved = 0;
  /* keep the decisions made, listed in graph order (by consumer) */
  for (i = 0, n = 0; i < pl->ndec; i++)
    if (done[i] != 2) pl->dec[n++] = pl->dec[i];
  pl->ndec = n;
  if (pl->ndec > 1) qsort(pl->dec, (size_t)pl->ndec, sizeof *pl->dec, cmp_graph_order);
  free(done);
}

static void planner_free(planner *pl) {
  int i;
  if (pl->readers) for (i = 0; i < pl->g->n; i++) free(pl->readers[i]);
  free(pl->readers); free(pl->nreaders); free(pl->compute); free(pl->grp);
  free(pl->anchor); free(pl->is_out); free(pl->dec);
}

/* Group, order and build; on a group that cannot be built alone (a reshape
** of a view the kernel cannot index), the view under it is materialized
** and planning starts again.  0, or an error code with e filled. */
static int plan_once(fuse_plan *p, planner *pl, char *promote, fl_err *e) {
  const ir_graph *g = p->g;
  int n = g->n, i, c, k, nk = 0, *order = NULL, *indeg = NULL, *mem = NULL, rc = FL_OK;
  memset(pl, 0, sizeof *pl);
  pl->g = g;
  pl->o = p->opts;
  pl->compute = calloc((size_t)n, 1);
  pl->grp = malloc((size_t)n * sizeof(int));
  pl->anchor = malloc((size_t)n * sizeof(int));
  pl->readers = calloc((size_t)n, sizeof(int *));
  pl->nreaders = calloc((size_t)n, sizeof(int));
  pl->is_out = calloc((size_t)n, 1);
  order = malloc((size_t)n * sizeof(int));
  indeg = calloc((size_t)n, sizeof(int));
  mem = malloc((size_t)n * sizeof(int));
  if (!pl->compute || !pl->grp || !pl->anchor || !pl->readers || !pl->nreaders ||
      !pl->is_out || !order || !indeg || !mem)
    goto oom;
  for (i = 0; i < g->nout; i++) pl->is_out[g->outputs[i]] = 1;
  for (i = 0; i < n; i++) {
    const ir_node *nd = &g->nodes[i];
    pl->grp[i] = i;
    pl->anchor[i] = -1;
    if (nd->kind != IR_OP) continue;
    pl->compute[i] = !fk_is_view(g, i) || pl->is_out[i] || promote[i];
    if (pl->compute[i] && is_extern_op(nd->op)) pl->anchor[i] = i;
  }
  for (c = 0; c < n; c++) {
    if (!pl->compute[c]) continue;
    for (i = 0; i < g->nodes[c].nin; i++) {
      int s = source_of(pl, c, i);
      if (s >= 0 && add_reader(pl, s, c)) goto oom;
    }
  }
  if (candidates(pl)) goto oom;
  decide(pl);
  /* kernels in a topological order of groups (Kahn, smallest id first) */
  for (c = 0; c < n; c++) {
    int rc_ = pl->compute[c] ? find(pl, c) : -1;
    if (rc_ < 0) continue;
    for (k = 0; k < pl->nreaders[c]; k++) {
      int r = find(pl, pl->readers[c][k]);
      if (r != rc_) indeg[r]++;   /* counted once per edge; decremented alike */
    }
  }
  for (;;) {
    int pick = -1;
    for (c = 0; c < n && pick < 0; c++)
      if (pl->compute[c] && find(pl, c) == c && indeg[c] == 0) pick = c;
    if (pick < 0) break;
    indeg[pick] = -1;
    order[nk++] = pick;
    for (c = 0; c < n; c++) {
      if (!pl->compute[c] || find(pl, c) != pick) continue;
      for (k = 0; k < pl->nreaders[c]; k++) {
        int r = find(pl, pl->readers[c][k]);
        if (r != pick) indeg[r]--;
      }
    }
  }
  p->kernels = calloc((size_t)(nk ? nk : 1), sizeof *p->kernels);
  if (!p->kernels) goto oom;
  for (i = 0; i < n; i++) { p->kernel_of[i] = -1; p->stored[i] = 0; }
  for (k = 0; k < nk; k++) {
    int nm = members(pl, order[k], -1, mem), an = pl->anchor[order[k]], j, t;
    char why[240];
    for (i = 0, j = 0; i < nm; i++) if (mem[i] != an) mem[j++] = mem[i];
    stored_for(pl, mem, j, an, p->stored);
    /* stored_for clears the array: keep earlier kernels' flags */
    for (i = 0; i < k; i++)
      for (t = 0; t < p->kernels[i].nacc; t++)
        if (p->kernels[i].acc[t].store) p->stored[p->kernels[i].acc[t].node] = 1;
    for (i = 0; i < k; i++)
      if (p->kernels[i].kind == FK_EXTERN) p->stored[p->kernels[i].anchor] = 1;
    if (fk_build(&p->kernels[k], g, mem, j, an, p->stored, why, sizeof why)) {
      /* find a reshape reading a view and materialize that view */
      int found = 0;
      for (i = 0; i < n && !found; i++) {
        const ir_node *nd = &g->nodes[i];
        if (nd->kind == IR_OP && (nd->op == OP_RESHAPE || nd->op == OP_VIEW) &&
            nd->in[0] >= 0 && fk_is_view(g, nd->in[0]) && !pl->compute[nd->in[0]] &&
            !promote[nd->in[0]]) {
          promote[nd->in[0]] = 1;
          found = 1;
        }
      }
      rc = err_set(e, found ? FL_EUNSUPPORTED : FL_EINVAL,
                   "fuse: kernel for %%%d cannot be built: %s", mem[0], why);
      p->nkernels = k;
      goto done;
    }
    /* mem[0..j) now lacks the anchor; an extern kernel computes it too */
    for (i = 0; i < j; i++) p->kernel_of[mem[i]] = k;
    if (an >= 0) p->kernel_of[an] = k;
  }
  p->nkernels = nk;
  for (i = 0; i < n; i++) p->stored[i] = 0;
  for (k = 0; k < nk; k++) {
    for (i = 0; i < p->kernels[k].nacc; i++)
      if (p->kernels[k].acc[i].store) p->stored[p->kernels[k].acc[i].node] = 1;
    if (p->kernels[k].kind == FK_EXTERN) p->stored[p->kernels[k].anchor] = 1;
  }
  p->dec = pl->dec;
  p->ndec = pl->ndec;
  pl->dec = NULL;
  goto done;
oom:
  rc = err_set(e, FL_ENOMEM, "fuse: out of memory planning %d nodes", n);
done:
  free(order); free(indeg); free(mem);
  return rc;
}

static void plan_clear_kernels(fuse_plan *p) {
  int k;
  for (k = 0; k < p->nkernels; k++) fk_kernel_clear(&p->kernels[k]);
  free(p->kernels);
  free(p->dec);
  p->kernels = NULL;
  p->dec = NULL;
  p->nkernels = p->ndec = 0;
}

static fuse_plan *plan_new(const ir_graph *g, const fuse_opts *o, fl_err *e) {
  fuse_plan *p = calloc(1, sizeof *p);
  char *promote = NULL;
  planner pl;
  int n = g->n, rc = FL_EUNSUPPORTED, tries;
  if (!p) { err_set(e, FL_ENOMEM, "fuse: out of memory"); return NULL; }
  p->refs = 1;
  if (o) p->opts = *o; else fuse_opts_default(&p->opts);
  if (p->opts.max_nodes < 1) p->opts.max_nodes = 1;
  p->g = ir_clone(g);
  p->kernel_of = malloc((size_t)(n ? n : 1) * sizeof(int));
  p->stored = calloc((size_t)(n ? n : 1), 1);
  p->last_use = malloc((size_t)(n ? n : 1) * sizeof(int));
  p->slot = malloc((size_t)(n ? n : 1) * sizeof(int));
  promote = calloc((size_t)(n ? n : 1), 1);
  if (!p->g || !p->kernel_of || !p->stored || !p->last_use || !p->slot || !promote) {
    err_set(e, FL_ENOMEM, "fuse: out of memory");
    free(promote);
    fuse_plan_free(p);
    return NULL;
  }
  /* each failed try materializes one more view: at most one per node
  ** (a backward graph has a reshape of a transposed view per head) */
  for (tries = 0; tries <= n && rc == FL_EUNSUPPORTED; tries++) {
    plan_clear_kernels(p);
    rc = plan_once(p, &pl, promote, e);
    planner_free(&pl);
  }
  free(promote);
  if (rc != FL_OK) { fuse_plan_free(p); return NULL; }
  return p;
}

/* The node whose buffer id reads: id with its chain of views undone. */
static int view_base(const ir_graph *g, int id) {
  while (id >= 0 && g->nodes[id].kind == IR_OP && fk_is_view(g, id) && g->nodes[id].in[0] >= 0)
    id = g->nodes[id].in[0];
  return id;
}

/* Reinplacing (as Inductor does after functionalization): a captured
** in-place update `c:copy_(f(c, ...))` is a pure op S and a write-back of
** S into the leaf c, which costs a buffer for S and a copy of it into c.
** When S's kernel is pointwise, S has c's exact shape and dtype (so any
** read of c in that kernel is at the element it stores), nothing after
** that kernel reads c or a view of c, no result is c or a view of it, and
** c is written back once, the kernel may store S into c itself.  Whether
** it does is decided per call (exec_buffer: c's tensor must be there,
** contiguous); the write-back then finds nothing to copy.  A where whose
** condition is constant along a row and whose other operand is c itself
** then writes only the rows it selects (cpu/codegen.c): a KV cache's new
** row costs a row, not the cache. */
static int plan_inplace(fuse_plan *p, fl_err *e) {
  const ir_graph *g = p->g;
  int n = g->n, nres = ir_nresults(g), w, i, j, b, d;
  if (!(p->inplace = malloc((size_t)(n ? n : 1) * sizeof(int)))) return err_set(e, FL_ENOMEM, "fuse: out of memory");
  for (i = 0; i < n; i++) p->inplace[i] = -1;
  for (w = 0; w < g->nwb; w++) {
    int s = g->outputs[nres + w], c = g->wb[w], kk, ok = 1, stored = 0;
    const ir_node *ns = &g->nodes[s], *nc = &g->nodes[c];
    const fk_kernel *k;
    if (ns->kind != IR_OP || (kk = p->kernel_of[s]) < 0) continue;
    k = &p->kernels[kk];
    if (k->kind != FK_POINTWISE || ns->meta.dtype != nc->meta.dtype || !meta_same_shape(&ns->meta, &nc->meta))
      continue;
    for (d = 0; d < ns->meta.ndim; d++) ok = ok && !ns->sym[d] && !nc->sym[d];
    for (i = 0; i < g->nwb; i++) ok = ok && (i == w || (g->wb[i] != c && g->outputs[nres + i] != s));
    for (i = 0; i < nres; i++) ok = ok && g->outputs[i] != s && view_base(g, g->outputs[i]) != c;
    for (i = 0; i < k->nviews; i++) ok = ok && view_base(g, k->views[i]) != c;
    for (b = k->nin; b < k->nbufs; b++) stored |= k->bufs[b] == s;
    for (j = kk + 1; j < p->nkernels && ok; j++) {
      const fk_kernel *kj = &p->kernels[j];
      for (b = 0; b < kj->nbufs; b++) ok = ok && view_base(g, kj->bufs[b]) != c;
      for (b = 0; b < kj->nviews; b++) ok = ok && view_base(g, kj->views[b]) != c;
    }
    if (ok && stored) p->inplace[s] = c;
  }
  return FL_OK;
}

fuse_plan *fuse_plan_build(const ir_graph *g, const fuse_opts *o, fl_err *e) {
  fuse_plan *p;
  if (!g) { err_set(e, FL_EINVAL, "fuse: no graph"); return NULL; }
  if (!(p = plan_new(g, o, e))) return NULL;
  if (plan_inplace(p, e) != FL_OK) { fuse_plan_free(p); return NULL; }
  fuse_plan_measure(p);
  return p;
}

fuse_plan *fuse_plan_ref(fuse_plan *p) {
  if (p) p->refs++;
  return p;
}

void fuse_plan_free(fuse_plan *p) {
  if (!p || --p->refs > 0) return;
  plan_clear_kernels(p);
  ir_free(p->g);
  free(p->kernel_of); free(p->stored); free(p->last_use); free(p->slot);
  free(p->slot_bytes); free(p->inplace);
  free(p);
}

#define human(b, buf, n) fuse_bytes_str(b, buf, n)

char *fuse_plan_listing(const fuse_plan *p, int decisions) {
  strbuf b;
  char h1[32], h2[32];
  int k, i;
  static const char *kinds[] = {"pointwise", "reduce", "extern"};
  memset(&b, 0, sizeof b);
  strbuf_printf(&b, "FusionPlan: %d kernel%s for %d op%s (fuse %s, max_nodes %d)\n",
            p->nkernels, p->nkernels == 1 ? "" : "s", p->stats.nodes,
            p->stats.nodes == 1 ? "" : "s", p->opts.fuse ? "on" : "off", p->opts.max_nodes);
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kk = &p->kernels[k];
    human(kk->bytes, h1, sizeof h1);
    strbuf_printf(&b, "  k%d %s  [%s]  nodes", k, kk->name, kinds[kk->kind]);
    if (kk->kind == FK_EXTERN) strbuf_printf(&b, " %%%d", kk->anchor);
    for (i = 0; i < kk->nnodes; i++) strbuf_printf(&b, " %%%d", kk->nodes[i]);
    strbuf_printf(&b, "  reads");
    for (i = 0; i < kk->nin; i++) strbuf_printf(&b, " %%%d", kk->bufs[i]);
    strbuf_printf(&b, "  writes");
    for (i = kk->nin; i < kk->nbufs; i++) {
      strbuf_printf(&b, " %%%d", kk->bufs[i]);
      if (p->inplace && p->inplace[kk->bufs[i]] >= 0) strbuf_printf(&b, " (into %%%d in place)", p->inplace[kk->bufs[i]]);
    }
    strbuf_printf(&b, "  %s\n", h1);
  }
  if (decisions && p->ndec) {
    strbuf_printf(&b, "decisions:\n");
    for (i = 0; i < p->ndec; i++) {
      human(p->dec[i].bytes_saved, h1, sizeof h1);
      /* the reason says "fused ..." or "cannot fuse ..." itself */
      strbuf_printf(&b, "  %s", p->dec[i].reason);
      if (p->dec[i].fused && p->dec[i].bytes_saved) strbuf_printf(&b, " (saves %s)", h1);
      strbuf_printf(&b, "\n");
    }
  }
  human(p->stats.bytes_before, h1, sizeof h1);
  human(p->stats.bytes_after, h2, sizeof h2);
  strbuf_printf(&b, "stats (before: the captured graph op by op): kernels %d -> %d, ops %d, "
            "traffic %s -> %s, buffers %d -> %d, ",
            p->stats.kernels_before, p->stats.kernels, p->stats.nodes, h1, h2, p->stats.buffers_before,
            p->stats.buffers_after);
  human(p->stats.peak_bytes_before, h1, sizeof h1);
  human(p->stats.peak_bytes_after, h2, sizeof h2);
  strbuf_printf(&b, "peak %s -> %s", h1, h2);
  {
    char why[320];
    fuse_bytes_causes(&p->stats, why, sizeof why);
    if (why[0]) strbuf_printf(&b, "\nbytes saved, by cause: %s", why);
  }
  if (p->stats.note[0]) strbuf_printf(&b, "\nnote: this plan %s", p->stats.note);
  return strbuf_take(&b);
}
