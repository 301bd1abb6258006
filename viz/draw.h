/*
** draw.h -- pictures of any pipeline stage, built with Graphviz cgraph and
** laid out and rendered with gvc (never by running `dot`).
**
** Everything drawn is a scene: one or more stages (a graph, optionally with
** the kernels a fusion plan groups it into), shown either as the pieces of
** one function separated by graph breaks, or side by side for comparison.
** Drawing reads the stages and changes none of them.
**
** Conventions of every picture: nodes coloured by op kind with a legend;
** inputs, parameters, constants and outputs in their own shapes; node
** labels "op %id" over "dtype[shape]"; edges labelled "[shape] bytes";
** one cluster per kernel ("cluster_k<i>") labelled with its name, node
** count, bytes read/written and time when measured; edges whose producer
** fusion keeps in registers (a removed intermediate) drawn dashed.
*/
#ifndef FL_VIZ_DRAW_H
#define FL_VIZ_DRAW_H

#include <stddef.h>
#include <stdint.h>

#include "graph/ir.h"

/* What the caller can tune; viz_opts_init gives the defaults. */
typedef struct viz_opts {
  const char *rankdir;   /* "TB" (top to bottom, default) or "LR" */
  const char *title;     /* heading over the picture, or NULL */
  int legend;            /* 1: draw the colour legend (default) */
  int group_modules;     /* 1: nested clusters per node scope path, like
                            "blocks.3" > "blocks.3.attn" (plain graphs
                            only: kernel clusters take their place) */
  int max_nodes;         /* beyond this many nodes per stage, repeated
                            blocks and then the middle of the graph are
                            collapsed into summary nodes ("N nodes
                            collapsed"); 0: default (300), < 0: never */
  int edge_labels;       /* 1: "[shape] bytes" on edges (default) */
  double scale;          /* type and line size: 1 (default, a screen or
                            print); VIZ_SCALE_PROJECTOR for a room */
  /* a readable piece of a big graph (one stage only): the rest is drawn as
  ** labelled stubs "N ops before" / "N ops after" */
  const char *focus_kernel;  /* one kernel: "k15" or its whole name */
  int focus_around;      /* a node id and every node within focus_depth
                            edges of it; -1: none */
  int focus_depth;       /* for focus_around (default 2) */
  int focus_block;       /* one repeated block: the nodes whose module
                            scope's block number is this ("blocks.3");
                            -1: none */
  int weights_box;       /* 1 (default): ops that read weights alone (a
                            fused plan computes them once, kept between
                            calls) drawn as one box */
  int inline_leaves;     /* 1: weights and constants a shown op reads are
                            lines of that op's label, not boxes of their
                            own (a transformer block's dozen weights side
                            by side make it three screens wide); -1: the
                            default, on for a piece (kernel, around, block) */
  const char *partition; /* a joint graph (g:joint()): the policy whose saved
                            values and recomputed ops are marked ("mincut",
                            "save_all", "recompute_all"); NULL: every value
                            the backward reads crosses, as eager saves it */
} viz_opts;

/* Large enough to read from the back of a classroom. */
#define VIZ_SCALE_PROJECTOR 1.75

#define VIZ_DEFAULT_MAX_NODES 300

void viz_opts_init(viz_opts *o);

/* One fused kernel as a picture shows it (a fusion plan fills these). */
typedef struct viz_kernel {
  const char *name;        /* "k3_add_relu" */
  const int *nodes;        /* graph node ids it computes (IR_OP nodes) */
  int nnodes;
  const int *views;        /* view nodes folded into its indexing: drawn
                              inside it when no other kernel folds them */
  int nviews;
  int64_t bytes_read;      /* from buffers in memory */
  int64_t bytes_written;   /* to buffers in memory */
  double time_ms;          /* measured run time, < 0 when not measured */
  const char *layout;      /* the blocked layout it writes its result in
                              ("nChw8c"), or NULL: plain */
  int in_place;            /* a concatenation its inputs were stored into:
                              nothing for it to copy */
} viz_kernel;

/* A stage: a graph, and when it is a fusion plan, its kernels. */
typedef struct viz_stage {
  const ir_graph *g;
  const viz_kernel *kernels;  /* NULL for a plain graph (one kernel per op) */
  int nkernels;
  const char *label;          /* "captured", "fused"...; may be NULL */
  const char *const *layout;  /* per node: the blocked layout its value is
                                 kept in (a program's), or NULL: plain;
                                 the array NULL when none is known */
  const char *stored;         /* per node: 1 when its value lives in a
                                 buffer; NULL: an op inside a kernel whose
                                 value no other kernel reads is not stored */
  /* numbers for the compare title line; has_stats 0: computed from the
  ** graph (one kernel per op) or from the kernels above */
  int has_stats;
  int stat_kernels, stat_buffers;
  int64_t stat_bytes;         /* bytes moved to and from memory */
  const char *note;           /* why it moves more than the captured graph
                                 op by op (a plan's stats.note), or NULL */
  const char *partition;      /* a joint graph: this stage's partition
                                 policy (draw_compare's two sides), or NULL:
                                 viz_opts.partition */
} viz_stage;

/* Between two pieces of one function. */
typedef struct viz_break {
  const char *reason;         /* "item() needs a concrete value" */
  const char *where;          /* "model.lua:12", or NULL */
} viz_break;

typedef struct viz_scene {
  const viz_stage *stages;
  int nstages;
  const viz_break *breaks;    /* nstages - 1 entries, or NULL: pieces of one
                                 function cut by graph breaks */
  int compare;                /* 1: stages side by side, each titled with
                                 kernels, buffers and bytes moved */
} viz_scene;

/* Numbers for a title line: from the stage's stats when it has them,
** else computed.  A plain graph runs eagerly: one kernel and one buffer per
** op that is not a view, each reading its inputs and writing its result. */
void viz_stage_numbers(const viz_stage *st, int *kernels, int *buffers,
                       int64_t *bytes);

/* Draws the scene into path; the format comes from the extension (.dot
** .svg .png .pdf, any case).  An unknown extension is FL_EINVAL with a
** message listing the formats; a file that cannot be written is FL_EIO
** naming the path and the reason.  o may be NULL (defaults). */
int viz_render_file(const viz_scene *s, const char *path, const viz_opts *o,
                    fl_err *e);
/* Renders the scene in format ("dot", "svg", "png", "pdf") into a new
** buffer *out of *len bytes (NUL-terminated too) that the caller frees
** with free(). */
int viz_render_mem(const viz_scene *s, const char *format, const viz_opts *o,
                   char **out, size_t *len, fl_err *e);

/* Shorthands over viz_render_file. */
int viz_draw_graph(const ir_graph *g, const char *path, const viz_opts *o,
                   fl_err *e);
int viz_draw_stage(const viz_stage *st, const char *path, const viz_opts *o,
                   fl_err *e);
int viz_draw_compare(const viz_stage *before, const viz_stage *after,
                     const char *path, const viz_opts *o, fl_err *e);
/* n pieces of one function with n - 1 breaks between them. */
int viz_draw_pieces(const viz_stage *pieces, int n, const viz_break *breaks,
                    const char *path, const viz_opts *o, fl_err *e);

/* "svg" for "x.SVG", NULL when the extension is not a picture format. */
const char *viz_format_of(const char *path);

#endif
