/*
** size.h -- the limits on sizes and the checked arithmetic every size,
** element count, stride and byte count is computed with.
** Invariant kept with tensor.c and op.c: every tensor's sizes multiply
** (counting a 0 as 1) to at most FL_MAX_EXTENT, so element counts,
** contiguous strides and offsets of any tensor fit in int64 with room to
** spare; an op that reads or writes its elements never sees more than
** FL_MAX_NUMEL of them; no byte count above FL_MAX_ALLOC reaches malloc.
*/
#ifndef FL_SIZE_H
#define FL_SIZE_H

#include <stdint.h>
#include <stddef.h>

/* Refuse single allocations above this many bytes (the machine has 24 GiB;
** anything larger is a typo, and overflowing size arithmetic must not
** reach malloc). */
#define FL_MAX_ALLOC ((int64_t)1 << 40)
/* The most elements an op (anything but a view) may touch: an expanded
** view may name more, but visiting 2^40 elements already takes minutes. */
#define FL_MAX_NUMEL ((int64_t)1 << 40)
/* The largest product of a shape's sizes (a size 0 counting as 1): views
** up to it print and index (PyTorch allows them), and size + 1, 2 * size
** and contiguous strides stay far from int64 overflow. */
#define FL_MAX_EXTENT ((int64_t)1 << 62)

/* *r = a * b (or a + b); 0 when the exact result does not fit in int64,
** and then *r is unspecified. */
static inline int sz_mul(int64_t a, int64_t b, int64_t *r) {
  return !__builtin_mul_overflow(a, b, r);
}
static inline int sz_add(int64_t a, int64_t b, int64_t *r) {
  return !__builtin_add_overflow(a, b, r);
}

/* *r = n elements of esize bytes; 0 when n is negative or the product is
** above FL_MAX_ALLOC. */
static inline int sz_bytes(int64_t n, size_t esize, size_t *r) {
  int64_t b;
  if (n < 0 || !sz_mul(n, (int64_t)esize, &b) || b > FL_MAX_ALLOC) return 0;
  *r = (size_t)b;
  return 1;
}

#endif
