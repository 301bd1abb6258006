/*
** hostpool.h -- big host buffers kept for reuse (see hostpool.c).
*/
#ifndef FL_HOSTPOOL_H
#define FL_HOSTPOOL_H

#include <stddef.h>

/* Requests below this go to malloc's heap.  From about this size up glibc
** hands a freed batch back to the kernel (its trim and mmap thresholds),
** and the next outputs take a page fault per 4 KiB: a compiled MLP's
** 512 KiB output took 128 a call, about 0.5 ms of 7.5 at 2.3 us a fault
** on this kind of VM (bench/output_reuse.lua, bench/RESULTS.md).  Smaller
** outputs fault only until the first collection: malloc's heap grows
** until then, and reuses what it frees (64 KiB: 16 pages a call for the
** first 200 calls, none after). */
#define HOSTPOOL_MIN ((size_t)256 << 10)

/* n >= HOSTPOOL_MIN bytes, zero-filled when zero is set; NULL when the
** system has no memory left even after the kept blocks were given back. */
void *hostpool_alloc(size_t n, int zero);
/* Give back p of n bytes (the n it was allocated with); NULL is ignored. */
void hostpool_free(void *p, size_t n);
/* Ask the kernel for transparent huge pages over a large buffer from
** malloc (one page fault per 2 MiB instead of per 4 KiB); advice only. */
void hostpool_advise_huge(void *p, size_t n);
/* The most bytes kept for reuse. */
size_t hostpool_limit(void);

typedef struct hostpool_info {
  size_t kept;           /* bytes kept for reuse now */
  size_t limit;          /* hostpool_limit() */
  long long reuses;      /* requests served from kept blocks */
  long long maps;        /* requests that mapped fresh memory */
} hostpool_info;
void hostpool_get_info(hostpool_info *h);

#endif
