/*
** rng.h -- the random stream behind fl.rand/fl.randn/dropout.  Philox4x32-10,
** counter based: the same seed gives the same numbers on every backend
** and every machine.  Element i of a draw that starts at block `start`
** is a pure function of (key, start, i), so an eager fill, the reference
** interpreter and a fused generated kernel (which computes element i
** alone, from the seed and the start block it is passed at launch) all
** agree bit for bit.
*/
#ifndef FL_RNG_H
#define FL_RNG_H

#include <stdint.h>
#include "op.h"
#include "tensor.h"

void rng_seed(uint64_t seed);
/* The whole state of the global stream: its key and the next block. */
void rng_get_state(uint64_t *key, uint64_t *block);
void rng_set_state(uint64_t key, uint64_t block);
/* The Philox key of the global stream (the last seed). */
uint64_t rng_key(void);
/* Reserve the blocks for n values: returns the first block of the draw
** and advances the global stream by (n + 3) / 4 whole blocks, as a fill
** of n values does.  A compiled program reserves for each random node in
** node order, which is the order eager code draws in. */
uint64_t rng_reserve(int64_t n);

/* Significand bits a uniform value of dtype t keeps (24, 11, 8): k/2^bits
** is exact in t and never rounds up to 1. */
int rng_mantissa_bits(fl_dtype t);
/* The four words of block `block` under key. */
void rng_block(uint64_t key, uint64_t block, uint32_t w[4]);
/* Element i of the draw at (key, start): word i%4 of block start + i/4. */
uint32_t rng_word(uint64_t key, uint64_t start, int64_t i);
/* U[0,1) with `bits` significand bits: (word >> (32 - bits)) / 2^bits. */
double rng_uniform_at(uint64_t key, uint64_t start, int64_t i, int bits);
/* N(0,1) by Box-Muller on the word pair of element i (words 0,1 or 2,3
** of its block: cos for the even element, sin for the odd one), computed
** in double and rounded to float32, as every backend rounds it. */
double rng_normal_at(uint64_t key, uint64_t start, int64_t i);

/* Fill t (any float dtype, on the CPU) with U[0,1) or N(0,1) values,
** advancing the global stream. */
void rng_uniform(fl_tensor *t);
void rng_normal(fl_tensor *t);
/* The same values from a draw already reserved at (key, start). */
void rng_fill(fl_tensor *t, int normal, uint64_t key, uint64_t start);

/* 1 when op draws from the stream (OPF_RANDOM): passes neither fold,
** merge nor drop it, and programs reserve its draw at every run. */
static inline int rng_op(fl_op op) { return (op_info_of(op)->flags & OPF_RANDOM) != 0; }
/* Values op's node draws: the numel of its result. */
int64_t rng_draws(const fl_meta *out);
/* (float)(1 / (1 - p)): what dropout scales kept elements by. */
float rng_dropout_scale(double p);

#endif
