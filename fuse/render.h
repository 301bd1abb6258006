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

/* How a backend spells rounding a float32 value to a 16-bit float and
** back (the C one casts through _Float16, CUDA calls its intrinsics). */
typedef struct fk_dialect {
  const char *f16_open, *f16_close;
  const char *bf16_open, *bf16_close;
  const char *exp_fn;     /* what the op table's expf becomes; NULL: expf */
  const char *erf_fn;     /* and its erff; NULL: erff */
  const char *exp_shifted_fn; /* exp of a value minus its row's max
                                 (fk_exp_shifted); NULL: exp_fn */
} fk_dialect;

/* True when step in of k is exp(a - m), m the max of a over the reduced
** dims (a softmax's): its argument is at most 0, or NaN. */
int fk_exp_shifted(const fk_kernel *k, const fk_instr *in);

/* True when FULL division step in of reduce kernel k divides by a row
** value: generators multiply by its reciprocal, computed once per row
** (softmax's 1 / sum). */
int fk_by_recip(const fk_kernel *k, const fk_instr *in);
/* Append the value of FKI_ELEM step in, rounded where the graph would
** store it: bool to 0/1, a float to int64 by fl_f2i (an integer step is
** exact and needs nothing), float16/bfloat16 losing their
** low bits (spelled by d).  A division by a row value reads "(vA * rB)". */
void fk_render_value(strbuf *b, const fk_dialect *d, const fk_kernel *k,
                     const fk_instr *in, int dbl);

/* 1 when FKI_ELEM step in of k computes in int64 (op_int_compute over
** its operands' dtypes): rendered with the op's iexpr. */
int fk_step_int(const fk_kernel *k, const fk_instr *in);
/* The int64 helpers iexpr text calls (fl_f2i, fl_ipow, fl_iclamp) and the
** FL_I64_MIN / FL_I64_MAX literals, each function declared with fn
** ("static inline", "__device__ __forceinline__"); the preamble defines
** fl_i64 and fl_u64 before. */
void fk_render_int_helpers(strbuf *b, const char *fn);

/* The Philox4x32-10 helpers the random ops' expressions call
** (fl_rand_uniform, fl_rand_normal: graph/rng.c's arithmetic, element i
** computed alone), each function declared with fn. */
void fk_render_rng_helpers(strbuf *b, const char *fn);

/* The value type generated code computes in: fl_i64 (exact) for int64
** values, float for every other dtype. */
const char *fk_value_type(fl_dtype t);
/* "const float v7 = ...;" for a step whose text both generators share (a
** constant, the reduced count, an elementwise value): 1 when step i of k
** was one and is rendered, 0 for loads and reductions (the generator's). */
int fk_render_step(strbuf *b, const fk_dialect *d, const fk_kernel *k, int i);

/* "**   %5 = add(%3, %4) : float32[8,128]" and the node's description when
** it says more than the op's name: one line of a kernel's header comment. */
void fk_render_node_line(strbuf *b, const ir_graph *g, int id);

/* A kernel's text without comments and with its own symbol sym as "@":
** two kernels with equal keys compile to the same code, so a batch
** compiles one and aliases the other.  malloc'd (the caller frees), NULL
** when out of memory. */
char *fk_kernel_key(const char *text, const char *sym);

#endif
