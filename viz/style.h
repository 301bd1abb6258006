/*
** style.h -- what every fuselab picture and report shares: the palette by
** op kind, shortened shapes, byte counts in binary units, and escaping of
** user-derived text for HTML (Graphviz HTML labels and the report alike).
** Internal to viz/.
*/
#ifndef FL_VIZ_STYLE_H
#define FL_VIZ_STYLE_H

#include <stddef.h>
#include <stdint.h>

#include "graph/ir.h"
#include "graph/strbuf.h"

/* Node classes with a colour; op kinds first, in op_kind order. */
typedef enum viz_class {
  VIZ_ELEMWISE, VIZ_BROADCAST, VIZ_INJECTIVE, VIZ_REDUCTION,
  VIZ_OUTFUSABLE, VIZ_OPAQUE,
  VIZ_INPUT, VIZ_PARAM, VIZ_CONST, VIZ_OUTPUT,
  VIZ_NCLASSES
} viz_class;

typedef struct viz_colors {
  const char *fill;    /* light: dark text stays readable on it */
  const char *pen;     /* border, the same hue darker */
  const char *name;    /* legend text */
} viz_colors;

const viz_colors *viz_class_colors(viz_class c);
/* The class by op kind alone. */
viz_class viz_class_of(const ir_node *nd);
/* The class a picture shows: a broadcast op that re-reads nothing big is
** drawn as elementwise (style.c says the rule). */
viz_class viz_class_in(const ir_graph *g, int id);

/* "[8,128]"; beyond 4 dims "[8,128,…,64]"; symbolic dims as s0. */
char *viz_shape_str(const ir_graph *g, int id, char *buf, size_t n);
/* "float32[8,128]" with the shape shortened as above. */
char *viz_type_str(const ir_graph *g, int id, char *buf, size_t n);
/* Bytes of node id's value (example sizes for symbolic dims). */
int64_t viz_node_bytes(const ir_graph *g, int id);
/* "512 B", "4 KiB", "1.5 MiB", "2.25 GiB". */
char *viz_bytes_str(int64_t bytes, char *buf, size_t n);

/* Appends s with & < > " ' replaced by entities; NULL appends nothing. */
void viz_esc(strbuf *b, const char *s);
/* Same, at most max bytes of s (cut at a UTF-8 boundary, then "…"). */
void viz_esc_max(strbuf *b, const char *s, size_t max);

#endif
