/*
** rng.c -- Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
** as 1, 2, 3", SC'11), counter based.
** Invariant: element i of a fill is a pure function of (seed, the stream
** position when the fill began, i): it comes from block (start + i/4),
** word i%4, and each fill advances the stream by whole blocks.  No hidden
** buffer carries over between fills, so any backend that knows the seed
** and the start block reproduces every value without replaying the stream.
*/
#include <math.h>

#include "rng.h"

/* The stream at startup: a fixed seed, so unseeded runs repeat too. */
#define DEFAULT_SEED 0x5eed5eedULL

static uint64_t seed_key = DEFAULT_SEED;  /* the Philox key, 2 x 32 bits */
static uint64_t next_block;               /* counter of the next 4 words */

void rng_seed(uint64_t seed) {
  seed_key = seed;
  next_block = 0;
}

/* Philox constants: Weyl key increments and round multipliers. */
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u

/* Ten rounds over the 128-bit counter {block, 0} under the 64-bit key. */
static void philox_block(uint64_t block, uint64_t key, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  int r;
  for (r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* Significand bits of t: a uniform value keeps only that many of the 32
** random bits, so k / 2^bits is exact in t and can never round up to 1. */
static int mantissa_bits(fl_dtype t) {
  switch (t) {
  case FL_F16: return 11;
  case FL_BF16: return 8;
  default: return 24;
  }
}

static void put(fl_tensor *t, int contiguous, size_t esize, int64_t i,
                double v) {
  if (contiguous) dtype_store(t->m.dtype, (char *)ten_data(t) + i * esize, v);
  else ten_set(t, i, v);
}

/* Fill t from the stream: uniform [0,1) or, by Box-Muller on word pairs,
** standard normal. */
static void fill(fl_tensor *t, int normal) {
  int64_t n = meta_numel(&t->m), i;
  uint64_t start = next_block;
  int contiguous, bits = mantissa_bits(t->m.dtype), j;
  size_t esize = dtype_size(t->m.dtype);
  /* values are made on the host: a device tensor is filled through a CPU
  ** one by its caller, never written here */
  if (n <= 0 || !t->st || t->st->device != FL_DEV_CPU) return;
  contiguous = ten_is_contiguous(t);
  next_block += (uint64_t)(n + 3) / 4;
  for (i = 0; i < n; i += 4) {
    uint32_t w[4];
    double v[4];
    philox_block(start + (uint64_t)(i / 4), seed_key, w);
    if (normal) {
      for (j = 0; j < 4; j += 2) {
        /* u1 in (0, 1] keeps the log finite; u2 in [0, 1) */
        double u1 = ((double)w[j] + 1.0) * 0x1p-32;
        double u2 = (double)w[j + 1] * 0x1p-32;
        double rad = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
        v[j] = rad * cos(th);
        v[j + 1] = rad * sin(th);
      }
    } else {
      for (j = 0; j < 4; j++)
        v[j] = ldexp((double)(w[j] >> (32 - bits)), -bits);
    }
    for (j = 0; j < 4 && i + j < n; j++) put(t, contiguous, esize, i + j, v[j]);
  }
}

void rng_uniform(fl_tensor *t) { fill(t, 0); }
void rng_normal(fl_tensor *t) { fill(t, 1); }
