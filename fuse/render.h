/*
** render.h -- what the C and CUDA generators print the same way: the op
** table's scalar expressions and float literals.  Each generator keeps
** only what differs (types, loops, launches).
*/
#ifndef FL_RENDER_H
#define FL_RENDER_H

#include <stddef.h>

#include "kernel.h"
#include "../graph/strbuf.h"

/* A float literal for generated code: "1.5f" (or "1.5" when dbl), NAN,
** INFINITY, and negatives parenthesized so "a - -1.0f" stays valid. */
void fk_float_literal(char *buf, size_t n, double v, int dbl);
/* Append step in's op-table expression: $0..$2 become the names v<arg>,
** $f0 $f1 literals from its attributes; with dbl the float math
** functions become their double forms (expf -> exp). */
void fk_render_expr(strbuf *b, const fk_instr *in, int dbl);

/* A kernel's text without comments and with its own symbol sym as "@":
** two kernels with equal keys compile to the same code, so a batch
** compiles one and aliases the other.  malloc'd (the caller frees), NULL
** when out of memory. */
char *fk_kernel_key(const char *text, const char *sym);

#endif
