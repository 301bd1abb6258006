/*
** rng.c -- Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
** as 1, 2, 3", SC'11), counter based, and the ops that draw from it
** (rand, randn, dropout): their shape rules and reference kernels.
** Invariant: element i of a draw is a pure function of (seed, the stream
** position when the draw began, i): it comes from block (start + i/4),
** word i%4, and each draw advances the stream by whole blocks.  No hidden
** buffer carries over between draws, so any backend that knows the seed
** and the start block reproduces every value without replaying the stream
** (the generated kernels compute element i alone, cpu/codegen.c and
** gpu/cuda_preamble.c, with the same arithmetic as here).
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "rng.h"

/* The stream at startup: a fixed seed, so unseeded runs repeat too. */
#define DEFAULT_SEED 0x5eed5eedULL

static uint64_t seed_key = DEFAULT_SEED;  /* the Philox key, 2 x 32 bits */
static uint64_t next_block;               /* counter of the next 4 words */

void rng_seed(uint64_t seed) {
  seed_key = seed;
  next_block = 0;
}

uint64_t rng_key(void) { return seed_key; }

void rng_get_state(uint64_t *key, uint64_t *block) {
  *key = seed_key;
  *block = next_block;
}

void rng_set_state(uint64_t key, uint64_t block) {
  seed_key = key;
  next_block = block;
}

uint64_t rng_reserve(int64_t n) {
  uint64_t start = next_block;
  if (n > 0) next_block += (uint64_t)(n + 3) / 4;
  return start;
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

int rng_mantissa_bits(fl_dtype t) {
  switch (t) {
  case FL_F16: return 11;
  case FL_BF16: return 8;
  default: return 24;
  }
}

void rng_block(uint64_t key, uint64_t block, uint32_t w[4]) {
  philox_block(block, key, w);
}

uint32_t rng_word(uint64_t key, uint64_t start, int64_t i) {
  uint32_t w[4];
  philox_block(start + (uint64_t)(i / 4), key, w);
  return w[i % 4];
}

static double uniform_of(uint32_t w, int bits) {
  return ldexp((double)(w >> (32 - bits)), -bits);
}

/* u1 in (0, 1] keeps the log finite; u2 in [0, 1).  The generated kernels
** spell this same double arithmetic (fl_rand_normal). */
static double normal_of(uint32_t w0, uint32_t w1, int odd) {
  double u1 = ((double)w0 + 1.0) * 0x1p-32;
  double u2 = (double)w1 * 0x1p-32;
  double rad = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
  return (double)(float)(odd ? rad * sin(th) : rad * cos(th));
}

double rng_uniform_at(uint64_t key, uint64_t start, int64_t i, int bits) {
  return uniform_of(rng_word(key, start, i), bits);
}

double rng_normal_at(uint64_t key, uint64_t start, int64_t i) {
  uint32_t w[4];
  int j = (int)(i % 4) & 2;
  philox_block(start + (uint64_t)(i / 4), key, w);
  return normal_of(w[j], w[j + 1], (int)(i & 1));
}

static void put(fl_tensor *t, int contiguous, size_t esize, int64_t i,
                double v) {
  if (contiguous) dtype_store(t->m.dtype, (char *)ten_data(t) + i * esize, v);
  else ten_set(t, i, v);
}

void rng_fill(fl_tensor *t, int normal, uint64_t key, uint64_t start) {
  int64_t n = meta_numel(&t->m), i;
  int contiguous, bits = rng_mantissa_bits(t->m.dtype), j;
  size_t esize = dtype_size(t->m.dtype);
  /* values are made on the host: a device tensor is filled through a CPU
  ** one by its caller, never written here */
  if (n <= 0 || !t->st || t->st->device != FL_DEV_CPU) return;
  contiguous = ten_is_contiguous(t);
  for (i = 0; i < n; i += 4) {
    uint32_t w[4];
    double v[4];
    philox_block(start + (uint64_t)(i / 4), key, w);
    for (j = 0; j < 4; j++)
      v[j] = normal ? normal_of(w[j & 2], w[(j & 2) + 1], j & 1) : uniform_of(w[j], bits);
    for (j = 0; j < 4 && i + j < n; j++) put(t, contiguous, esize, i + j, v[j]);
  }
}

static void fill(fl_tensor *t, int normal) {
  int64_t n = meta_numel(&t->m);
  uint64_t start;
  if (n <= 0 || !t->st || t->st->device != FL_DEV_CPU) return;
  start = rng_reserve(n);
  rng_fill(t, normal, seed_key, start);
}

void rng_uniform(fl_tensor *t) { fill(t, 0); }
void rng_normal(fl_tensor *t) { fill(t, 1); }

int64_t rng_draws(const fl_meta *out) { return meta_numel(out); }

float rng_dropout_scale(double p) { return (float)(1.0 / (1.0 - p)); }

/* --- the random ops --------------------------------------------------- */

/* rand, randn: no inputs; the shape is dims[ndims], the dtype a float. */
int infer_random(fl_op op, const fl_meta *const *in, int nin,
                 const op_attrs *a, fl_meta *out, fl_err *e) {
  int d;
  (void)in; (void)nin;
  if (a->ndims < 0 || a->ndims > FL_MAX_DIMS)
    return err_set(e, FL_EINVAL, "%s: %d dims (at most %d)", op_name(op),
                   a->ndims, FL_MAX_DIMS);
  if (a->dtype < 0 || a->dtype >= FL_NDTYPES || !dtype_is_float(a->dtype))
    return err_set(e, FL_EINVAL, "%s: dtype %s is not a floating dtype "
                   "(expected float32, float16 or bfloat16)", op_name(op),
                   a->dtype >= 0 && a->dtype < FL_NDTYPES ? dtype_name(a->dtype) : "?");
  memset(out, 0, sizeof *out);
  out->dtype = a->dtype;
  out->device = FL_DEV_CPU;
  out->ndim = a->ndims;
  for (d = 0; d < a->ndims; d++) {
    if (a->dims[d] < 0)
      return err_set(e, FL_EINVAL, "%s: size %lld of dim %d is negative",
                     op_name(op), (long long)a->dims[d], d + 1);
    out->shape[d] = a->dims[d];
  }
  return FL_OK;
}

/* dropout(x): f0 = p in [0, 1]; the result has x's shape and dtype. */
int infer_dropout(fl_op op, const fl_meta *const *in, int nin,
                  const op_attrs *a, fl_meta *out, fl_err *e) {
  (void)nin;
  if (!dtype_is_float(in[0]->dtype))
    return err_set(e, FL_EINVAL, "%s: dtype %s is not a floating dtype "
                   "(expected float32, float16 or bfloat16)", op_name(op),
                   dtype_name(in[0]->dtype));
  if (!(a->f[0] >= 0.0 && a->f[0] <= 1.0))
    return err_set(e, FL_EINVAL, "%s: p must be a probability in [0, 1], got %g",
                   op_name(op), a->f[0]);
  memset(out, 0, sizeof *out);
  out->dtype = in[0]->dtype;
  out->device = in[0]->device;
  out->ndim = in[0]->ndim;
  memcpy(out->shape, in[0]->shape, sizeof out->shape);
  return FL_OK;
}

/* The oracle: one element at a time from the stream position reserved
** now.  Dropout keeps an element when its U[0,1) value (24 bits) is not
** below p, and scales it by 1/(1-p), all in float32 as PyTorch does
** (in double for float64). */
int ref_random(fl_op op, const fl_tensor *const *in, int nin,
               const op_attrs *a, fl_tensor *out, fl_err *e) {
  int64_t n = meta_numel(&out->m), i;
  uint64_t key = rng_key(), start = rng_reserve(n);
  int bits = rng_mantissa_bits(out->m.dtype);
  float p = (float)a->f[0], scale = rng_dropout_scale(a->f[0]);
  (void)nin; (void)e;
  for (i = 0; i < n; i++) {
    double v;
    if (op == OP_RAND) v = rng_uniform_at(key, start, i, bits);
    else if (op == OP_RANDN) v = rng_normal_at(key, start, i);
    else {
      float u = (float)rng_uniform_at(key, start, i, 24);
      if (out->m.dtype == FL_F64)   /* the same mask, the scaling in double */
        v = u < p ? 0.0 : ten_get(in[0], i) * (1.0 / (1.0 - a->f[0]));
      else
        v = u < p ? 0.0f : (float)ten_get(in[0], i) * scale;
    }
    ten_set(out, i, v);
  }
  return FL_OK;
}
