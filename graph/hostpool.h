/*
** hostpool.h -- big host buffers kept for reuse (see hostpool.c).
*/
#ifndef FL_HOSTPOOL_H
#define FL_HOSTPOOL_H

#include <stddef.h>

/* Requests below this go to malloc: its heap reuses small blocks well. */
#define HOSTPOOL_MIN ((size_t)1 << 20)

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
