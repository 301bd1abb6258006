/*
** draw_impl.h -- what the parts of the picture builder share (internal to
** viz/): a view of one stage (which node is drawn as itself, which is
** folded into a summary), and the builder state of one picture.
*/
#ifndef FL_VIZ_DRAW_IMPL_H
#define FL_VIZ_DRAW_IMPL_H

#include <graphviz/cgraph.h>

#include "viz/draw.h"
#include "viz/style.h"

/* A node standing for graph nodes the picture leaves out. */
typedef struct viz_summary {
  int count;              /* graph nodes folded into it (0: not drawn) */
  char note[200];         /* what they were, e.g. "blocks.1 … blocks.11" */
  char title[96];         /* its heading instead of "N nodes collapsed"
                             (a focus stub, the weights box), or "" */
  int no_edges_out;       /* its values' edges to their readers are not
                             drawn (the weights box: it feeds everything) */
  Agnode_t *an;
} viz_summary;

/* One stage as drawn; every array is indexed by node id and owned here. */
typedef struct viz_view {
  const viz_stage *st;
  const ir_graph *g;
  char pfx[16];           /* name prefix keeping stages apart: "" or "s1_" */
  int *kern;              /* kernel of each node or -1; NULL: no kernels */
  int *removed;           /* 1: intermediate kept inside its kernel */
  int *first_use;         /* first op reading the node, or -1 */
  int *show;              /* -1: drawn as itself; k: folded into sums[k] */
  unsigned char *inl;     /* 1: a leaf drawn in its readers' labels, or NULL */
  viz_summary *sums;
  int nsums, capsums;
  int collapsed;          /* nodes folded into summaries */
  Agnode_t **an;          /* picture node of each shown graph node */
  Agnode_t **outn;        /* picture node of each output */
  Agraph_t **kclus;       /* cluster of each kernel */
  Agraph_t *root;         /* the (sub)graph this stage is drawn in */
  /* a joint graph: each node's half (1 forward, 2 backward, 0 a leaf),
  ** the forward values saved for the backward and those it recomputes;
  ** NULL for any other graph */
  char *jside, *jsaved, *jrec;
  const char *jpol;       /* the partition policy drawn, or NULL */
  int64_t jbytes;         /* its saved bytes */
  int jnrec;              /* forward ops its backward recomputes */
} viz_view;

typedef struct viz_builder {
  Agraph_t *G;
  const viz_opts *o;
  int max_nodes;          /* the effective limit (defaults applied) */
  int used[VIZ_NCLASSES]; /* classes drawn: the legend lists only those */
  int any_dashed, any_summary, any_break, any_kernel;
  int any_summary_edge;   /* an edge into or out of a summary was drawn */
  int any_blocked;            /* edges carrying a value in a blocked layout */
  int any_joint, any_saved;  /* a joint graph's halves, its saved values */
  strbuf tmp;             /* label under construction */
  fl_err *e;
} viz_builder;

/* Prepares v for st: checks kernel node ids, decides what is collapsed to
** keep at most max_nodes nodes (max_nodes <= 0: no limit), the piece o
** focuses on and the weights box (o may be NULL: the defaults).  The view
** borrows st; viz_view_free releases what it allocated. */
int viz_view_init(viz_view *v, const viz_stage *st, int index, int multi,
                  int max_nodes, const viz_opts *o, fl_err *e);
void viz_view_free(viz_view *v);

int viz_build_scene(viz_builder *b, const viz_scene *s, viz_view *views);

void viz_kernel_map(const viz_stage *st, int *kern);
void viz_external_uses(const ir_graph *g, const int *kern, int *ext);

#endif
