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
#include "../graph/pass.h"
#include "../graph/rng.h"
#include "../graph/strbuf.h"

void fuse_opts_default(fuse_opts *o) {
  o->fuse = 1;
  o->max_nodes = 64;
  o->explain = 0;
  o->cat_in_place = 0;
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
  char *wonly;         /* per node: computed from params and constants alone */
  fuse_decision *dec;
  int ndec, capdec;
  const fuse_decision *refused;  /* pairs the memory objective took back */
  int nrefused;
} planner;

/* Ops the generator has no loop nest for: they run as an extern step
** (sgemm, conv, eager kernel); matmul-like ones take elementwise epilogues. */
static int is_extern_op(fl_op op) {
  op_kind k = op_info_of(op)->kind;
  return k == OPK_OUTFUSABLE || k == OPK_OPAQUE || op == OP_CAT || op == OP_EMBEDDING ||
         op == OP_PAD || op == OP_FLIP || op == OP_GATHER;
}

/* A node that reads or makes float64: the generated kernels compute in
** float32, so it runs alone as an extern step (the eager kernel, in
** double) and fuses with nothing. */
static int is_f64_node(const ir_graph *g, int id) {
  const ir_node *nd = &g->nodes[id];
  int i;
  if (nd->meta.dtype == FL_F64) return 1;
  for (i = 0; i < nd->nin; i++)
    if (nd->in[i] >= 0 && g->nodes[nd->in[i]].meta.dtype == FL_F64) return 1;
  return 0;
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

/* Does wm hold one value per channel (or one value) of a 4-d value of
** c channels, broadcast against it? */
static int chan_shaped(const fl_meta *wm, int64_t c) {
  int d;
  if (wm->ndim < 1 || wm->ndim > 4) return 0;
  for (d = 0; d < wm->ndim; d++)
    if (wm->shape[d] != 1 && (4 - wm->ndim + d != 1 || wm->shape[d] != c)) return 0;
  return 1;
}

/* Of a and b, the one computed from weights alone (not a view: views fold
** into indexing) as one value per channel of the other's [N, C, H, W]
** result, where the other reads activations; else -1. */
static int per_channel_weights(const planner *pl, int a, int b) {
  const ir_graph *g = pl->g;
  int w = pl->wonly[a] ? a : b, x = w == a ? b : a;
  const fl_meta *xm = &g->nodes[x].meta;
  if (pl->wonly[a] == pl->wonly[b] || g->nodes[w].kind != IR_OP || fk_is_view(g, w) || xm->ndim != 4 ||
      !chan_shaped(&g->nodes[w].meta, xm->shape[1]))
    return -1;
  return w;
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
  if (is_f64_node(g, a) || is_f64_node(g, b)) {
    snprintf(why, nwhy, "%s works in float64, which runs op by op in double (the "
             "generated kernels compute in float32)", op_name(g->nodes[is_f64_node(g, a) ? a : b].op));
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
  } else if (per_channel_weights(pl, a, b) >= 0) {
    /* a batch norm's scale would be computed again for every element of
    ** every call, where it is one value per channel, once: in its own
    ** kernel it is kept between calls (exec/program.c), and a conv reads
    ** it as a per-channel post-op inside its own call (cpu/backend.c) */
    int w = per_channel_weights(pl, a, b);
    snprintf(why, nwhy, "%%%d (%s) is one value per channel from weights alone: it runs once in a "
             "kernel of its own, not for every element of %%%d", w, op_name(g->nodes[w].op),
             w == a ? b : a);
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

/* Is b a step of a per-channel affine chain (a mul or add by one value
** per channel of a 4-d value, from weights alone) whose other input a is a
** convolution or such a step after one?  A batch norm left unfolded (its
** folded weights too large to keep) is that chain. */
static int conv_affine(const planner *pl, int a, int b) {
  const ir_graph *g = pl->g;
  const ir_node *nb = &g->nodes[b];
  int i, other = -1, from = -1;
  if (nb->kind != IR_OP || (nb->op != OP_MUL && nb->op != OP_ADD) || nb->nin != 2 || nb->meta.ndim != 4)
    return 0;
  for (i = 0; i < 2; i++) {
    int s = source_of(pl, b, i);
    if (s == a) from = a;
    else other = nb->in[i];
  }
  if (from < 0 || other < 0 || !pl->wonly[other] || pl->wonly[a] ||
      !chan_shaped(&g->nodes[other].meta, nb->meta.shape[1]))
    return 0;
  if (g->nodes[a].kind == IR_OP && g->nodes[a].op == OP_CONV2D) return 1;
  for (i = 0; i < g->nodes[a].nin; i++) {
    int s = source_of(pl, a, i);
    if (s >= 0 && conv_affine(pl, s, a)) return 1;
  }
  return 0;
}

/* Candidate pairs with their score: the bytes fusing them would save.  A
** convolution's per-channel affine chain (conv_affine) is decided first:
** it becomes the convolution's own epilogue (post-ops inside its call)
** before an elementwise chain joins it to something else.  ResNet's
** downsampling blocks add two batch-normed convolutions; decided by bytes
** alone, one batch norm went into the other convolution's epilogue, which
** then was no library call, and the values around both stayed plain. */
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
  if (pl->ndec > 1) {   /* the convolutions' affine chains to the front, in order */
    fuse_decision *to = malloc((size_t)pl->ndec * sizeof *to);
    char *first = calloc((size_t)pl->ndec, 1);
    int n = 0, k, pass;
    if (!to || !first) { free(to); free(first); return -1; }
    for (k = 0; k < pl->ndec; k++)
      first[k] = !pl->dec[k].horizontal && conv_affine(pl, pl->dec[k].a, pl->dec[k].b);
    for (pass = 1; pass >= 0; pass--)
      for (k = 0; k < pl->ndec; k++) if (first[k] == pass) to[n++] = pl->dec[k];
    free(pl->dec);
    free(first);
    pl->dec = to;
    pl->capdec = pl->ndec;
  }
  return 0;
}

/* A pair the memory objective took back: d gets its reason. */
static int refused_pair(const planner *pl, fuse_decision *d) {
  int i;
  for (i = 0; i < pl->nrefused; i++)
    if (pl->refused[i].a == d->a && pl->refused[i].b == d->b) {
      snprintf(d->reason, sizeof d->reason, "%s", pl->refused[i].reason);
      d->memory = pl->refused[i].memory;
      return 1;
    }
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
      if (!already && refused_pair(pl, d)) {
        done[i] = 1;
      } else if (already) {
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
  free(pl->anchor); free(pl->is_out); free(pl->dec); free(pl->wonly);
}

/* The view (not a buffer) that a reshape reads in the chain from node c
** down its input i: c itself when it is a reshape, else the views its
** input reads through; the first from c, or -1. */
static int reshaped_view(const planner *pl, int c, int i) {
  const ir_graph *g = pl->g;
  int s = c;
  if (g->nodes[c].op != OP_RESHAPE && g->nodes[c].op != OP_VIEW) s = g->nodes[c].in[i];
  while (s >= 0 && (s == c || (fk_is_view(g, s) && !pl->compute[s]))) {
    const ir_node *nd = &g->nodes[s];
    if ((nd->op == OP_RESHAPE || nd->op == OP_VIEW) && nd->in[0] >= 0 && fk_is_view(g, nd->in[0]) &&
        !pl->compute[nd->in[0]])
      return nd->in[0];
    s = nd->in[0];
  }
  return -1;
}

/* Group, order and build; on a group that cannot be built alone (a reshape
** of a view the kernel cannot index), the view under it is materialized
** and planning starts again.  0, or an error code with e filled. */
static int plan_once(fuse_plan *p, planner *pl, char *promote, fl_err *e) {
  const ir_graph *g = p->g;
  int n = g->n, i, c, k, nk = 0, *order = NULL, *indeg = NULL, *mem = NULL, rc = FL_OK, failed = 0;
  memset(pl, 0, sizeof *pl);
  pl->g = g;
  pl->o = p->opts;
  pl->refused = p->refused;
  pl->nrefused = p->nrefused;
  pl->compute = calloc((size_t)n, 1);
  pl->grp = malloc((size_t)n * sizeof(int));
  pl->anchor = malloc((size_t)n * sizeof(int));
  pl->readers = calloc((size_t)n, sizeof(int *));
  pl->nreaders = calloc((size_t)n, sizeof(int));
  pl->is_out = calloc((size_t)n, 1);
  pl->wonly = calloc((size_t)n, 1);
  order = malloc((size_t)n * sizeof(int));
  indeg = calloc((size_t)n, sizeof(int));
  mem = malloc((size_t)n * sizeof(int));
  if (!pl->compute || !pl->grp || !pl->anchor || !pl->readers || !pl->nreaders ||
      !pl->is_out || !pl->wonly || !order || !indeg || !mem)
    goto oom;
  for (i = 0; i < g->nout; i++) pl->is_out[g->outputs[i]] = 1;
  for (i = 0; i < n; i++) {
    const ir_node *nd = &g->nodes[i];
    int j;
    pl->wonly[i] = nd->kind == IR_PARAM || nd->kind == IR_CONST ||
                   (nd->kind == IR_OP && !rng_op(nd->op));
    for (j = 0; j < nd->nin && pl->wonly[i]; j++)
      if (nd->in[j] >= 0) pl->wonly[i] = pl->wonly[nd->in[j]];
    pl->grp[i] = i;
    pl->anchor[i] = -1;
    if (nd->kind != IR_OP) continue;
    pl->compute[i] = !fk_is_view(g, i) || pl->is_out[i] || promote[i];
    if (pl->compute[i] && (is_extern_op(nd->op) || is_f64_node(g, i))) pl->anchor[i] = i;
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
      /* materialize the views the reshapes of this kernel read, and go
      ** on to find the other kernels that need it (the next try plans the
      ** whole graph again: a backward graph has one such view per head);
      ** else the first such view anywhere */
      int found = 0, v;
      for (i = 0; i < j; i++)
        for (t = 0; t < g->nodes[mem[i]].nin; t++)
          while ((v = reshaped_view(pl, mem[i], t)) >= 0 && !promote[v]) {
            promote[v] = 1;
            found = 1;
          }
      if (found) {
        if (!failed) err_set(e, FL_EUNSUPPORTED, "fuse: kernel for %%%d cannot be built: %s", mem[0], why);
        failed = 1;
        continue;
      }
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
  if (failed) {
    rc = FL_EUNSUPPORTED;
    goto done;
  }
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

/* g:decompose()'s linear, matmul(x, transpose(w)) + b, is planned as the
** linear it was: one library call that adds the bias while it writes its
** product, where the matmul and an add in its epilogue write the product
** and read it back.  optimize() re-forms it too; fuse does it whatever
** the pass order, so a decomposed graph never moves more than the
** captured one for it.  NULL with *log unset when there is nothing to
** re-form (or on an error: then the plan is of g as given). */
static ir_graph *reform_linear(const ir_graph *g, char **log) {
  unsigned rules = (1u << PASS_FOLD_LINEAR) | (1u << PASS_DCE);
  ir_graph *r;
  ir_opcost ref;
  fl_err e;
  int i, j, found = 0;
  for (i = 0; i < g->n && !found; i++) {
    const ir_node *nd = &g->nodes[i];
    if (nd->kind != IR_OP || nd->op != OP_ADD) continue;
    for (j = 0; j < nd->nin && !found; j++) {
      const ir_node *m = nd->in[j] >= 0 ? &g->nodes[nd->in[j]] : NULL;
      found = m && m->kind == IR_OP && m->op == OP_MATMUL && m->in[1] >= 0 &&
              g->nodes[m->in[1]].kind == IR_OP && g->nodes[m->in[1]].op == OP_TRANSPOSE;
    }
  }
  if (!found) return NULL;
  err_clear(&e);
  if (!(r = pass_optimize_rules(g, rules, log, &e))) return NULL;
  if (!strstr(*log, "= linear(")) {
    ir_free(r);
    free(*log);
    *log = NULL;
    return NULL;
  }
  fuse_reference_cost(g, &ref);
  r->origin = ref;          /* "before" stays the graph the caller captured */
  return r;
}

static fuse_plan *plan_new(const ir_graph *g, const fuse_opts *o, const fuse_decision *refused,
                           int nrefused, fl_err *e) {
  fuse_plan *p = calloc(1, sizeof *p);
  char *promote = NULL;
  planner pl;
  int n = g->n, rc = FL_EUNSUPPORTED, tries;
  if (!p) { err_set(e, FL_ENOMEM, "fuse: out of memory"); return NULL; }
  p->refs = 1;
  if (o) p->opts = *o; else fuse_opts_default(&p->opts);
  if (p->opts.max_nodes < 1) p->opts.max_nodes = 1;
  if (nrefused > 0) {
    if (!(p->refused = malloc((size_t)nrefused * sizeof *p->refused))) {
      err_set(e, FL_ENOMEM, "fuse: out of memory");
      free(p);
      return NULL;
    }
    memcpy(p->refused, refused, (size_t)nrefused * sizeof *refused);
    p->nrefused = nrefused;
  }
  if (p->opts.fuse) p->g = reform_linear(g, &p->rewrites);   /* off: one kernel per op */
  if (!p->g) p->g = ir_clone(g);
  n = p->g ? p->g->n : n;
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

static int is_graph_out(const ir_graph *g, int id) {
  int i;
  for (i = 0; i < g->nout; i++) if (g->outputs[i] == id) return 1;
  return 0;
}

/* The node whose buffer id reads: id with its chain of views undone. */
static int view_base(const ir_graph *g, int id) {
  while (id >= 0 && g->nodes[id].kind == IR_OP && fk_is_view(g, id) && g->nodes[id].in[0] >= 0)
    id = g->nodes[id].in[0];
  return id;
}

/* 1 when a graph output is v or a view of it. */
static int out_over(const ir_graph *g, int v) {
  int i;
  for (i = 0; i < g->nout; i++) if (view_base(g, g->outputs[i]) == v) return 1;
  return 0;
}

/* 1 when kernel j reads v's buffer, itself or through a view. */
static int kernel_reads(const fuse_plan *p, int j, int v) {
  const fk_kernel *kj = &p->kernels[j];
  int i;
  for (i = 0; i < kj->nbufs; i++) if (view_base(p->g, kj->bufs[i]) == v) return 1;
  for (i = 0; i < kj->nviews; i++) if (view_base(p->g, kj->views[i]) == v) return 1;
  return 0;
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
    for (j = kk + 1; j < p->nkernels && ok; j++) ok = !kernel_reads(p, j, c);
    if (ok && stored) p->inplace[s] = c;
  }
  return FL_OK;
}

/* Kernels whose every value comes from params, consts and sizes alone (a
** batch norm's scale folded into its convolution's weights, a mask from
** fl.arange): exec/program.c runs them once and keeps their values between
** calls, so the memory plan holds them from the start.  Never kept: random
** ops, and a value some graph output is or views (the caller would hold,
** and could write, the kept memory). */
static int plan_keep(fuse_plan *p, fl_err *e) {
  const ir_graph *g = p->g;
  char *pure = calloc((size_t)(g->n ? g->n : 1), 1);
  int i, j, k;
  p->keep = calloc((size_t)(p->nkernels ? p->nkernels : 1), 1);
  if (!pure || !p->keep) { free(pure); return err_set(e, FL_ENOMEM, "fuse: out of memory"); }
  for (i = 0; i < g->n; i++) {
    const ir_node *nd = &g->nodes[i];
    pure[i] = nd->kind == IR_PARAM || nd->kind == IR_CONST ||
              (nd->kind == IR_OP && !(op_info_of(nd->op)->flags & OPF_RANDOM));
    for (j = 0; nd->kind == IR_OP && j < nd->nin && pure[i]; j++)
      if (nd->in[j] >= 0 && !pure[nd->in[j]]) pure[i] = 0;
  }
  for (i = 0; i < g->nout; i++)
    for (j = g->outputs[i]; j >= 0;) {
      pure[j] = 0;
      j = g->nodes[j].kind == IR_OP && fk_is_view(g, j) ? g->nodes[j].in[0] : -1;
    }
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kr = &p->kernels[k];
    int ok = !kr->nrng && (kr->nnodes > 0 || kr->anchor >= 0);
    for (j = 0; j < kr->nnodes && ok; j++) ok = pure[kr->nodes[j]];
    if (ok && kr->anchor >= 0) ok = pure[kr->anchor];
    p->keep[k] = (char)ok;
  }
  free(pure);
  return FL_OK;
}

/* An extern's epilogue stored over its product (Inductor's in-place
** buffer reuse): the product P is read by this kernel alone and is not a
** graph output, nothing is kept, and the one value O the kernel stores has P's
** shape and dtype and is computed element for element from it: every op
** of the epilogue is elementwise at P's shape, P is read directly (no
** view) and no view in the kernel reaches P or the epilogue.  Each
** element of P is then read before the same element of O is written, in
** the same iteration, so the two share one buffer (the memory walk and
** the slots count one) and the epilogue needs no memory of its own.  When
** O is a graph output, P is written into O's memory (exec/program.c).
**
** A convolution whose epilogue first adds a residual R (ResNet's last 1x1
** of a block) stores O over R instead, where R is read by nothing after
** this kernel and by nothing in it but that add (residual_over): oneDNN's
** sum then adds into the memory the residual is already in, where it
** copied the residual into O's buffer first on every call (3.2 MB at
** ResNet-50's 56 x 56), and a generated epilogue reads each element of R
** before it writes the same element of O.  P then has a buffer of its
** own, which only a product run without its epilogue in the call writes:
** the peak is the same (P and R were both alive at this kernel before). */

/* The residual that kernel k's epilogue (elementwise from its product P,
** stored as O) adds to P first, when O may be stored over it; else -1. */
static int residual_over(const fuse_plan *p, int k, int O) {
  const ir_graph *g = p->g;
  const fk_kernel *kk = &p->kernels[k];
  const ir_node *add = NULL;
  int P = kk->anchor, R, i, j, uses = 0;
  /* not over a 1x1 map (squeeze-and-excitation's): a copy of nothing to
  ** save, and its products of rows (cpu/mm_rows.c) store before they add */
  if (g->nodes[P].op != OP_CONV2D || (p->inplace && p->inplace[O] >= 0) || g->nodes[P].meta.ndim != 4 ||
      g->nodes[P].meta.shape[2] * g->nodes[P].meta.shape[3] <= 1)
    return -1;
  for (i = 0; i < kk->nnodes && !add; i++) {      /* the first op on P */
    const ir_node *nd = &g->nodes[kk->nodes[i]];
    for (j = 0; j < nd->nin; j++) if (nd->in[j] == P) add = nd;
  }
  if (!add || add->op != OP_ADD || add->nin != 2) return -1;
  R = add->in[0] == P ? add->in[1] : add->in[0];
  if (R < 0 || R == P || g->nodes[R].kind != IR_OP || fk_is_view(g, R) || !p->stored[R] ||
      p->kernel_of[R] < 0 || p->kernel_of[R] >= k || (p->keep && p->keep[p->kernel_of[R]]) ||
      g->nodes[R].meta.dtype != g->nodes[O].meta.dtype || !meta_same_shape(&g->nodes[R].meta, &g->nodes[O].meta))
    return -1;
  if (out_over(g, R)) return -1;
  for (i = 0; i < g->nodes[P].nin; i++)            /* not the convolution's own operand */
    if (g->nodes[P].in[i] >= 0 && view_base(g, g->nodes[P].in[i]) == R) return -1;
  for (i = 0; i < kk->nnodes; i++)                 /* read by the add alone in this kernel */
    for (j = 0; j < g->nodes[kk->nodes[i]].nin; j++) {
      int s = g->nodes[kk->nodes[i]].in[j];
      if (s >= 0 && view_base(g, s) == R && (s != R || ++uses > 1)) return -1;
    }
  for (j = k + 1; j < p->nkernels; j++)            /* and by no kernel after it */
    if (kernel_reads(p, j, R)) return -1;
  return R;
}

static int plan_alias(fuse_plan *p, fl_err *e) {
  const ir_graph *g = p->g;
  int i, j, k, v;
  char *dep = malloc((size_t)(g->n ? g->n : 1));  /* reads P, within the kernel */
  if (!dep || !(p->alias = malloc((size_t)(g->n ? g->n : 1) * sizeof(int)))) {
    free(dep);
    return err_set(e, FL_ENOMEM, "fuse: out of memory");
  }
  for (i = 0; i < g->n; i++) p->alias[i] = -1;
  for (k = 0; k < p->nkernels; k++) {
    const fk_kernel *kk = &p->kernels[k];
    int P = kk->anchor, O = -1, ok = kk->kind == FK_EXTERN && kk->nnodes > 0 && !p->keep[k];
    for (i = 0; ok && i < kk->nacc; i++) {
      const fk_access *a = &kk->acc[i];
      if (a->store) { ok = O < 0; O = a->node; }
      else if (a->node == P) ok = !a->rng && a->via_node >= 0 && g->nodes[a->via_node].in[a->via_in] == P;
    }
    ok = ok && O >= 0 && !is_graph_out(g, P) &&
         g->nodes[O].meta.dtype == g->nodes[P].meta.dtype && meta_same_shape(&g->nodes[O].meta, &g->nodes[P].meta);
    ok = ok && !out_over(g, P);
    /* the ops on the way from P to O: elementwise at P's shape, no view
    ** (ops of the kernel that do not read P, per-channel statistics of
    ** a batch norm, may have any shape) */
    for (i = 0; ok && i < g->n; i++) dep[i] = i == P;
    for (i = 0; ok && i < kk->nnodes; i++) {
      int m = kk->nodes[i];
      const ir_node *nd = &g->nodes[m];
      op_kind kind = op_info_of(nd->op)->kind;
      for (j = 0; ok && j < nd->nin; j++) {
        int s = nd->in[j];
        if (s < 0) continue;
        if (g->nodes[s].kind == IR_OP && fk_is_view(g, s) && s != P) ok = !dep[view_base(g, s)];
        else dep[m] |= dep[s];
      }
      if (ok && dep[m])
        ok = !fk_is_view(g, m) && (kind == OPK_ELEMWISE || kind == OPK_BROADCAST) &&
             meta_same_shape(&nd->meta, &g->nodes[P].meta);
    }
    /* no other kernel reads P, not even through a view */
    for (j = 0; ok && j < p->nkernels; j++) ok = j == k || !kernel_reads(p, j, P);
    if (ok) p->alias[O] = (v = residual_over(p, k, O)) >= 0 ? v : P;
  }
  free(dep);
  return FL_OK;
}

/* Concatenation c copies its inputs again (p->into of those stored in it
** cleared; c itself stays where it is stored). */
static void into_take_back(fuse_plan *p, int c) {
  int v;
  for (v = 0; v < p->g->n; v++) if (p->into[v] == c) p->into[v] = -1;
}

/* A concatenation's memory in place is alive from its first input's store,
** so a large value computed between two of its inputs could raise the
** peak above the plan with the copies (which hold only the inputs stored
** so far).  The budget is the larger of that plan's peak and the captured
** graph's op by op (kept values have the same: plan_keep_budget); while
** the peak is above it, each concatenation in turn goes back to copying
** where that lowers the peak, then all of them if it is still above.
** Returns whether any stays in place. */
static int into_within_peak(fuse_plan *p) {
  const ir_graph *g = p->g;
  int *all = malloc((size_t)(g->n ? g->n : 1) * sizeof *all);
  int64_t budget, peak, without;
  int c, v, left = 0;
  ir_opcost ref;
  if (!all) return 0;
  memcpy(all, p->into, (size_t)g->n * sizeof *all);
  for (v = 0; v < g->n; v++) p->into[v] = -1;
  budget = fuse_plan_peak(p);
  fuse_reference_cost(g, &ref);
  if (budget >= 0 && ref.peak_bytes > budget) budget = ref.peak_bytes;
  memcpy(p->into, all, (size_t)g->n * sizeof *all);
  peak = fuse_plan_peak(p);
  for (c = 0; c < g->n && peak > budget; c++) {
    /* in place: all its inputs are stored in it (plan_into) */
    const ir_node *nd = &g->nodes[c];
    if (nd->kind != IR_OP || nd->op != OP_CAT || nd->nin < 1 || nd->in[0] < 0 || all[nd->in[0]] != c) continue;
    into_take_back(p, c);
    if ((without = fuse_plan_peak(p)) < peak) peak = without;
    else for (v = 0; v < g->n; v++) if (all[v] == c) p->into[v] = c;
  }
  if (peak > budget || budget < 0)
    for (v = 0; v < g->n; v++) p->into[v] = -1;
  for (v = 0; v < g->n; v++) left |= p->into[v] >= 0;
  free(all);
  return left;
}

/* Concatenations written in place (onnxruntime's and TensorRT's
** "concat elimination"): where every input of a bare concatenation C is
** stored by a kernel before C's, read by no write-back and kept by
** nothing, and C's dims before its axis are all 1 (so each input is one
** contiguous run of C: batch 1 along channels, DenseNet's and
** Inception's), each input's kernel stores it straight into its place in
** C's memory (into, into_off) and C's kernel has nothing to copy.  An
** input that is itself such a concatenation nests (DenseNet's chain of
** them, one buffer per dense block); a product an epilogue is stored over
** (plan_alias) goes where that epilogue's value goes.  C's memory is then
** alive from its first input's store to the last reader of it or of any
** input (fuse/memplan.c).  The CPU's programs only (fuse_opts.cat_in_place):
** a layout written in blocks is the run's to reconcile (cpu/backend.c).
** within: held to the memory budget (into_within_peak); the first plan
** takes every one, and plan_keep_budget plans them again within it once
** the kept values fit. */
static int plan_into(fuse_plan *p, int within, fl_err *e) {
  const ir_graph *g = p->g;
  int c, i, j, n = g->n ? g->n : 1, any = 0;
  if (!p->opts.cat_in_place) return FL_OK;
  if (!(p->into = malloc((size_t)n * sizeof *p->into)) ||
      !(p->into_off = calloc((size_t)n, sizeof *p->into_off)))
    return err_set(e, FL_ENOMEM, "fuse: out of memory");
  for (i = 0; i < g->n; i++) p->into[i] = -1;
  for (c = 0; c < g->n; c++) {
    const ir_node *nd = &g->nodes[c];
    int kc = p->kernel_of[c], ax, ok;
    int64_t off = 0, inner = 1;
    if (nd->kind != IR_OP || nd->op != OP_CAT || kc < 0 || p->kernels[kc].kind != FK_EXTERN ||
        p->kernels[kc].anchor != c || p->kernels[kc].nnodes != 0 || !p->stored[c] ||
        (p->keep && p->keep[kc]) || (p->inplace && p->inplace[c] >= 0) || nd->nin < 1)
      continue;
    ax = (int)nd->attrs.i[0];
    if (ax < 0) ax += nd->meta.ndim;
    ok = ax >= 0 && ax < nd->meta.ndim;
    for (j = 0; ok && j < nd->meta.ndim; j++) {
      ok = !nd->sym[j] && (j >= ax || nd->meta.shape[j] == 1);
      if (j > ax) inner *= nd->meta.shape[j];
    }
    ok = ok && !out_over(g, c);
    for (i = 0; ok && i < nd->nin; i++) {
      int v = nd->in[i], kv = v >= 0 ? p->kernel_of[v] : -1;
      const ir_node *x = v >= 0 ? &g->nodes[v] : NULL;
      ok = x && x->kind == IR_OP && !fk_is_view(g, v) && p->stored[v] && kv >= 0 && kv < kc &&
           !(p->keep && p->keep[kv]) && (!p->inplace || p->inplace[v] < 0) && p->into[v] < 0 &&
           x->meta.dtype == nd->meta.dtype && x->meta.ndim == nd->meta.ndim;
      for (j = 0; ok && j < i; j++) ok = nd->in[j] != v;
      for (j = 0; ok && j < g->n; j++) ok = !p->alias || p->alias[j] != v;
      for (j = 0; ok && j < x->meta.ndim; j++) ok = !x->sym[j];
      for (j = 0; ok && j < g->nout; j++) ok = view_base(g, g->outputs[j]) != v;
    }
    if (!ok) continue;
    for (i = 0; i < nd->nin; i++) {
      int v = nd->in[i];
      p->into[v] = c;
      p->into_off[v] = off;
      if (p->alias && p->alias[v] >= 0 && p->alias[v] == p->kernels[p->kernel_of[v]].anchor) {
        /* its product, stored over by it (not a residual: that one keeps its slot) */
        p->into[p->alias[v]] = c;
        p->into_off[p->alias[v]] = off;
      }
      off += g->nodes[v].meta.shape[ax] * inner;
    }
    any = 1;
  }
  if (any && within) any = into_within_peak(p);
  if (!any) {
    free(p->into); free(p->into_off);
    p->into = NULL;
    p->into_off = NULL;
  }
  return FL_OK;
}

/* Kept values are memory held between calls: each is kept only while the
** plan's peak stays within the larger of the peak with nothing kept and
** the captured graph's op by op; past that the largest are computed
** again each call instead (their kernel runs every call, its memory
** freed after its last reader).  The per-channel vectors of a folded
** batch norm and fl.arange's masks are small and stay kept. */
static void plan_keep_budget(fuse_plan *p, fl_err *e) {
  int64_t with, none, budget;
  int k, at, nk = p->nkernels;
  char *want = malloc((size_t)(nk ? nk : 1));
  ir_opcost ref;
  if (!want) return;
  memcpy(want, p->keep, (size_t)nk);
  with = p->stats.peak_bytes_after;
  memset(p->keep, 0, (size_t)nk);
  none = fuse_plan_walk(p, NULL, NULL, -1, &at);
  fuse_reference_cost(p->g, &ref);
  budget = none > ref.peak_bytes ? none : ref.peak_bytes;
  memcpy(p->keep, want, (size_t)nk);
  while (with > budget) {
    int64_t most = -1;
    int drop = -1, i;
    for (k = 0; k < nk; k++) {
      int64_t b = 0;
      if (!p->keep[k]) continue;
      for (i = p->kernels[k].nin; i < p->kernels[k].nbufs; i++) b += fuse_node_bytes(p->g, p->kernels[k].bufs[i]);
      if (b > most) { most = b; drop = k; }
    }
    if (drop < 0) break;
    p->keep[drop] = 0;
    with = fuse_plan_walk(p, NULL, NULL, -1, &at);
  }
  free(want);
  free(p->alias); free(p->into); free(p->into_off);
  p->alias = p->into = NULL;
  p->into_off = NULL;
  if (plan_alias(p, e) == FL_OK && plan_into(p, 1, e) == FL_OK) fuse_plan_measure(p);
}

/* What depends on the kernel order, from scratch: write-backs in place,
** kept kernels, epilogues over their products, concatenations in place,
** the measure. */
static int plan_finish(fuse_plan *p, fl_err *e) {
  free(p->inplace); free(p->keep); free(p->alias); free(p->into); free(p->into_off);
  p->inplace = p->alias = p->into = NULL;
  p->into_off = NULL;
  p->keep = NULL;
  if (plan_inplace(p, e) != FL_OK || plan_keep(p, e) != FL_OK || plan_alias(p, e) != FL_OK ||
      plan_into(p, 0, e) != FL_OK)
    return e->code;
  fuse_plan_measure(p);
  plan_keep_budget(p, e);
  return FL_OK;
}

/* The kernels in another order that keeps every dependence (Inductor's
** reorder for peak memory): of the kernels whose inputs are all computed,
** greedy: the one that frees the most bytes less what it writes runs
** first; either way one whose values no reader can take yet runs last
** (else the planned order).  Random kernels keep
** their order among themselves (each draws from the stream where the last
** one stopped).  Fills order[]; 0, or -1 when out of memory. */
static int order_for_peak(const fuse_plan *p, int greedy, int *order) {
  const ir_graph *g = p->g;
  int nk = p->nkernels, n = g->n, k, i, j, done = 0, last_rng = -1, nedge = 0, rc = -1;
  size_t ck = (size_t)(nk ? nk : 1), cn = (size_t)(n ? n : 1);
  int *indeg = calloc(ck, sizeof *indeg), *left = calloc(cn, sizeof *left);
  int *first = malloc((ck + 1) * sizeof *first), *succ = NULL, *fill = calloc(ck, sizeof *fill);
  char *ran = calloc(ck, 1), *out = calloc(cn, 1);
  if (!indeg || !left || !first || !fill || !ran || !out) goto done;
  /* successors as lists (a kernel's readers, and the next random kernel);
  ** a pair twice is two edges, counted alike both ways */
  for (i = 0; i < g->nout; i++) out[g->outputs[i]] = 1;
  for (k = 0; k < nk; k++) {
    const fk_kernel *kk = &p->kernels[k];
    for (i = 0; i < kk->nin; i++) {
      int a = p->kernel_of[kk->bufs[i]];
      left[kk->bufs[i]]++;
      if (a >= 0 && a != k) { fill[a]++; indeg[k]++; nedge++; }
    }
    if (kk->nrng) {
      if (last_rng >= 0) { fill[last_rng]++; indeg[k]++; nedge++; }
      last_rng = k;
    }
  }
  if (!(succ = malloc((size_t)(nedge ? nedge : 1) * sizeof *succ))) goto done;
  for (k = 0, first[0] = 0; k < nk; k++) { first[k + 1] = first[k] + fill[k]; fill[k] = first[k]; }
  for (k = 0, last_rng = -1; k < nk; k++) {
    const fk_kernel *kk = &p->kernels[k];
    for (i = 0; i < kk->nin; i++) {
      int a = p->kernel_of[kk->bufs[i]];
      if (a >= 0 && a != k) succ[fill[a]++] = k;
    }
    if (kk->nrng) {
      if (last_rng >= 0) succ[fill[last_rng]++] = k;
      last_rng = k;
    }
  }
  while (done < nk) {
    int64_t best = 0;
    int pick = -1, tier = 3;
    for (k = 0; k < nk; k++) {
      const fk_kernel *kk = &p->kernels[k];
      int64_t net, frees = 0;
      int t;
      if (ran[k] || indeg[k]) continue;
      for (i = 0; i < kk->nin; i++) {
        int s = kk->bufs[i];
        if (left[s] == 1 && !out[s] && p->stored[s] && g->nodes[s].kind == IR_OP) frees += fuse_node_bytes(g, s);
      }
      net = frees;
      for (i = kk->nin; i < kk->nbufs; i++) net -= fuse_node_bytes(g, kk->bufs[i]);
      /* tier 0 frees at least what it writes (most first); tier 1 frees
      ** something or lets a reader run next; tier 2 would only hold memory
      ** until its readers' other inputs exist (weights flipped for a
      ** backward convolution): it waits.  Tiers 1 and 2 go in the planned
      ** order. */
      t = net >= 0 ? 0 : frees > 0 ? 1 : 2;
      for (j = first[k]; j < first[k + 1] && t == 2; j++)
        if (indeg[succ[j]] == 1) t = 1;
      if (!greedy) t = t == 2;   /* only the waiting: else the planned order */
      if (t < tier || (t == tier && t == 0 && net > best)) { pick = k; best = net; tier = t; }
    }
    if (pick < 0) goto done;      /* a cycle: cannot happen in a plan */
    ran[pick] = 1;
    order[done++] = pick;
    for (i = 0; i < p->kernels[pick].nin; i++) left[p->kernels[pick].bufs[i]]--;
    for (j = first[pick]; j < first[pick + 1]; j++) indeg[succ[j]]--;
  }
  rc = 0;
done:
  free(indeg); free(left); free(first); free(succ); free(fill); free(ran); free(out);
  return rc;
}

/* Runs the kernels in the order of the two of order_for_peak that peaks
** lowest, when that is lower than the planned order. */
static void plan_reorder(fuse_plan *p, fl_err *e) {
  int nk = p->nkernels, k, i, v, best = -1;
  int *order = malloc((size_t)(nk ? nk : 1) * 2 * sizeof *order), *inv = malloc((size_t)(nk ? nk : 1) * sizeof *inv);
  fk_kernel *was = malloc((size_t)(nk ? nk : 1) * sizeof *was);
  int64_t low = p->stats.peak_bytes_after;
  if (!order || !inv || !was || nk < 3) goto done;
  memcpy(was, p->kernels, (size_t)nk * sizeof *was);
  for (v = 0; v < 2; v++) {
    int *o = order + v * nk, same = 1;
    if (order_for_peak(p, v, o) != 0) continue;
    for (k = 0; k < nk; k++) same &= o[k] == k;
    if (same) continue;
    /* this order, measured */
    for (k = 0; k < nk; k++) { p->kernels[k] = was[o[k]]; inv[o[k]] = k; }
    for (i = 0; i < p->g->n; i++) if (p->kernel_of[i] >= 0) p->kernel_of[i] = inv[p->kernel_of[i]];
    if (plan_finish(p, e) == FL_OK && p->stats.peak_bytes_after < low) { low = p->stats.peak_bytes_after; best = v; }
    /* and back */
    memcpy(p->kernels, was, (size_t)nk * sizeof *was);
    for (i = 0; i < p->g->n; i++) if (p->kernel_of[i] >= 0) p->kernel_of[i] = o[p->kernel_of[i]];
  }
  if (best >= 0) {
    int *o = order + best * nk;
    for (k = 0; k < nk; k++) { p->kernels[k] = was[o[k]]; inv[o[k]] = k; }
    for (i = 0; i < p->g->n; i++) if (p->kernel_of[i] >= 0) p->kernel_of[i] = inv[p->kernel_of[i]];
  }
  plan_finish(p, e);
done:
  free(order);
  free(was);
  free(inv);
}

/* Plan g with the pairs in refused[0..nrefused) taken back, and measure. */
static fuse_plan *plan_measured(const ir_graph *g, const fuse_opts *o, const fuse_decision *refused,
                                int nrefused, fl_err *e) {
  fuse_plan *p = plan_new(g, o, refused, nrefused, e);
  if (!p) return NULL;
  if (plan_finish(p, e) != FL_OK) {
    fuse_plan_free(p);
    return NULL;
  }
  if (p->opts.fuse) plan_reorder(p, e);
  return p;
}

/* p planned again with its fused decisions pick[0..n) taken back too;
** each says why, with both peaks.  NULL when that cannot be planned. */
static fuse_plan *plan_without(const fuse_plan *p, const ir_graph *g, const fuse_opts *o,
                               const int *pick, int n, int at) {
  fuse_decision *ref = malloc((size_t)(p->nrefused + n + 1) * sizeof *ref);
  fuse_plan *q;
  fl_err e;
  int i, j;
  if (!ref) return NULL;
  if (p->nrefused) memcpy(ref, p->refused, (size_t)p->nrefused * sizeof *ref);
  for (i = 0; i < n; i++) ref[p->nrefused + i] = p->dec[pick[i]];
  err_clear(&e);
  q = plan_measured(g, o, ref, p->nrefused + n, &e);
  free(ref);
  if (!q) return NULL;
  for (i = p->nrefused; i < q->nrefused; i++) {
    fuse_decision *r = &q->refused[i];
    char da[64], db[64], h1[32], h2[32], hb[32];
    if (!r->fused) continue;     /* refused already, for its own reason */
    fk_describe(q->g, r->a, da, sizeof da);
    fk_describe(q->g, r->b, db, sizeof db);
    fuse_bytes_str(p->stats.peak_bytes_after, h1, sizeof h1);
    fuse_bytes_str(q->stats.peak_bytes_after, h2, sizeof h2);
    fuse_bytes_str(p->stats.peak_bytes_before, hb, sizeof hb);
    snprintf(r->reason, sizeof r->reason, "cannot fuse %%%d (%s) with %%%d (%s): the plan with it "
             "needs %s at its peak (while k%d %s runs), above the captured graph's %s; without "
             "it, %s", r->a, da, r->b, db, h1, at, p->kernels[at].name, hb, h2);
    r->fused = 0;
    r->bytes_saved = 0;
    r->memory = 1;
    for (j = 0; j < q->ndec; j++)
      if (q->dec[j].a == r->a && q->dec[j].b == r->b) q->dec[j] = *r;
  }
  return q;
}

/* q peaks lower than p and moves no more than the captured graph. */
static int lower(const fuse_plan *q, const fuse_plan *p) {
  return q && q->stats.peak_bytes_after < p->stats.peak_bytes_after &&
         q->stats.bytes_after <= q->stats.bytes_before;
}

/* *best becomes q when q is lower than it (than p while there is none);
** the plan not kept is freed. */
static void keep_lower(fuse_plan **best, fuse_plan *q, const fuse_plan *p) {
  if (lower(q, *best ? *best : p)) {
    fuse_plan_free(*best);
    *best = q;
  } else {
    fuse_plan_free(q);
  }
}

/* The memory objective: a plan needing more memory at its peak than the
** captured graph op by op takes fusions back, for as long as that lowers
** the peak (Inductor refuses fusions that raise the peak the same way).
** Each round tries, and keeps the lowest of: for each value alive at the
** peak that a fused kernel computed early (a mask for a backward computed
** with the forward that reads the same input), every fusion that joined
** it; each fusion of the kernel at the peak alone.  Last, when still
** above, none of the fusions, if that is lower.  Every pair taken back
** says why in p:decisions(), with both peaks.  A plan above the captured
** graph's peak is rare: the rounds cost nothing otherwise. */
static fuse_plan *plan_within_peak(fuse_plan *p, const ir_graph *g, const fuse_opts *o) {
  int round, i, j;
  int *pick = malloc((size_t)(p->ndec + 1) * sizeof *pick);
  for (round = 0; pick && round < 8 && p->stats.peak_bytes_after > p->stats.peak_bytes_before; round++) {
    fuse_plan *best = NULL;
    int64_t *alive = calloc((size_t)(p->g->n ? p->g->n : 1), sizeof *alive);
    int at, tried = 0, v, n, fused;
    if (!alive) break;
    fuse_plan_walk(p, NULL, NULL, -1, &at);
    if (at >= 0) fuse_plan_walk(p, NULL, alive, at, &i);
    for (v = 0; at >= 0 && v < p->g->n && tried < 16; v++) {
      if (!alive[v] || p->kernel_of[v] == at) continue;
      /* v alone: every pair with it, fused or not (one taken back would
      ** let v join the kernel of another) */
      for (j = 0, n = 0, fused = 0; j < p->ndec; j++)
        if (p->dec[j].a == v || p->dec[j].b == v) { fused |= p->dec[j].fused; pick[n++] = j; }
      if (!fused) continue;
      tried++;
      keep_lower(&best, plan_without(p, g, o, pick, n, at), p);
    }
    for (j = 0; at >= 0 && j < p->ndec && tried < 32; j++) {
      if (!p->dec[j].fused || p->kernel_of[p->dec[j].b] != at) continue;
      tried++;
      keep_lower(&best, plan_without(p, g, o, &j, 1, at), p);
    }
    free(alive);
    if (!best) break;
    fuse_plan_free(p);
    p = best;
  }
  if (pick && p->stats.peak_bytes_after > p->stats.peak_bytes_before) {
    /* pairs that others had joined come up again once those are taken
    ** back: take back until none is fused */
    fuse_plan *q = NULL, *r, *best_none = NULL;
    int n, at, tries;
    fuse_plan_walk(p, NULL, NULL, -1, &at);
    for (tries = 0; at >= 0 && tries < 4; tries++) {
      const fuse_plan *from = q ? q : p;
      int *more = malloc((size_t)(from->ndec + 1) * sizeof *more);
      if (!more) break;
      for (j = 0, n = 0; j < from->ndec; j++) if (from->dec[j].fused) more[n++] = j;
      r = n ? plan_without(from, g, o, more, n, at) : NULL;
      free(more);
      if (!r) break;
      fuse_plan_free(q);
      q = r;
    }
    keep_lower(&best_none, q, p);
    if (best_none) {
      fuse_plan_free(p);
      p = best_none;
    }
  }
  free(pick);
  return p;
}

fuse_plan *fuse_plan_build(const ir_graph *g, const fuse_opts *o, fl_err *e) {
  fuse_plan *p;
  if (!g) { err_set(e, FL_EINVAL, "fuse: no graph"); return NULL; }
  if (!(p = plan_measured(g, o, NULL, 0, e))) return NULL;
  if (p->opts.fuse) p = plan_within_peak(p, g, o);
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
  free(p->slot_bytes); free(p->inplace); free(p->alias); free(p->into); free(p->into_off);
  free(p->keep); free(p->rewrites);
  free(p->refused);
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
  if (p->rewrites)   /* the pass's log: one line per rewrite, ids of the graph given */
    strbuf_printf(&b, "planned as linear (ids of the graph given):\n%s", p->rewrites);
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
