/*
** emu_mem.c -- device memory is host memory, with guards: each allocation
** has a redzone on both sides filled with 0xFF bytes (as is fresh memory:
** NaN in every float type), checked after every launch; with ASan the
** redzones are poisoned instead, and a kernel touching them is reported
** at the access.
** Invariant: `al` holds every live allocation, sorted by address.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "emu.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#define ASAN_POISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

#define FRONT 256                 /* before the block: keeps it 256-aligned, as cudaMalloc's */
#define BACK 64                   /* right after its last byte: an off-by-one is caught */
#define LIMIT ((size_t)8 << 30)   /* the device's memory */

typedef struct alloc { char *p; size_t n; } alloc;
static alloc *al;
static size_t nal, cap;
static int64_t in_use;

static size_t lower(const void *p) {
  size_t lo = 0, hi = nal;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (al[mid].p <= (const char *)p) lo = mid + 1;
    else hi = mid;
  }
  return lo;   /* first allocation starting after p */
}

int emu_mem_alloc(void **out, size_t n) {
  char *base, *p;
  size_t at;
  *out = NULL;
  if (n > LIMIT || (size_t)in_use + n > LIMIT) return cudaErrorMemoryAllocation;
  if (nal == cap) {
    alloc *a = realloc(al, (cap ? 2 * cap : 256) * sizeof *a);
    if (!a) return cudaErrorMemoryAllocation;
    al = a;
    cap = cap ? 2 * cap : 256;
  }
  if (!(base = aligned_alloc(256, FRONT + ((n + BACK + 255) & ~(size_t)255))))
    return cudaErrorMemoryAllocation;
  p = base + FRONT;
  memset(base, 0xff, FRONT + n + BACK);
  ASAN_POISON_MEMORY_REGION(base, FRONT);
  ASAN_POISON_MEMORY_REGION(p + n, BACK);
  at = lower(p);
  memmove(al + at + 1, al + at, (nal - at) * sizeof *al);
  al[at].p = p;
  al[at].n = n;
  nal++;
  in_use += (int64_t)n;
  *out = p;
  return cudaSuccess;
}

static int redzone_ok(const alloc *a, size_t *bad) {
  size_t i;
  if (EMU_ASAN) return 1;
  for (i = FRONT - BACK; i < FRONT; i++)
    if ((unsigned char)a->p[(ptrdiff_t)i - FRONT] != 0xff) { *bad = i; return 0; }
  for (i = 0; i < BACK; i++)
    if ((unsigned char)a->p[a->n + i] != 0xff) { *bad = FRONT + i; return 0; }
  return 1;
}

static void redzone_msg(const alloc *a, size_t bad, const char *who, char *msg, size_t mn) {
  if (bad < FRONT)
    snprintf(msg, mn, "%s wrote out of bounds of a %zu-byte allocation: %zu bytes before its start",
             who, a->n, FRONT - bad);
  else
    snprintf(msg, mn, "%s wrote out of bounds of a %zu-byte allocation: byte %zu past its end",
             who, a->n, bad - FRONT);
}

int emu_mem_free(void *p, char *msg, size_t mn) {
  size_t at = lower(p), bad;
  alloc a;
  if (at == 0 || al[at - 1].p != (char *)p) {
    snprintf(msg, mn, "cudaFree(%p): not the start of a live device allocation "
             "(freed twice, or never allocated)", p);
    return cudaErrorInvalidValue;
  }
  a = al[at - 1];
  memmove(al + at - 1, al + at, (nal - at) * sizeof *al);
  nal--;
  in_use -= (int64_t)a.n;
  if (!redzone_ok(&a, &bad)) {
    redzone_msg(&a, bad, "a kernel", msg, mn);
    fprintf(stderr, "fuselab emu: %s (found at cudaFree)\n", msg);
  }
  ASAN_UNPOISON_MEMORY_REGION(a.p - FRONT, FRONT + a.n + BACK);
  memset(a.p, 0xff, a.n);   /* a use after free reads NaN */
  free(a.p - FRONT);
  return cudaSuccess;
}

int emu_mem_find(const void *p, size_t n, char **start, size_t *size) {
  size_t at = lower(p);
  const alloc *a;
  if (at == 0) return -1;
  a = &al[at - 1];
  if ((const char *)p > a->p + a->n) return -1;
  if (n > (size_t)(a->p + a->n - (const char *)p)) return -1;
  if (start) *start = a->p;
  if (size) *size = a->n;
  return (int)(at - 1);
}

int emu_mem_check_redzones(const char *who, char *msg, size_t mn) {
  size_t i, bad;
  for (i = 0; i < nal; i++)
    if (!redzone_ok(&al[i], &bad)) {
      redzone_msg(&al[i], bad, who, msg, mn);
      /* repaint it: one bad write is reported once */
      memset(al[i].p - (FRONT - BACK), 0xff, FRONT - BACK);
      memset(al[i].p + al[i].n, 0xff, BACK);
      return -1;
    }
  return 0;
}

int emu_mem_touched(void **args, const unsigned long *info, char **start, size_t *size, int max) {
  unsigned long a, na = info[0];
  int k = 0, j;
  for (a = 0; a < na; a++) {
    const size_t sz = info[2 + a];
    size_t off;
    for (off = 0; off + sizeof(void *) <= sz; off += sizeof(void *)) {
      void *v;
      char *s;
      size_t n;
      memcpy(&v, (const char *)args[a] + off, sizeof v);
      if (!v || emu_mem_find(v, 0, &s, &n) < 0) continue;
      for (j = 0; j < k; j++)
        if (start[j] == s) break;
      if (j == k && k < max) { start[k] = s; size[k] = n; k++; }
    }
  }
  return k;
}

int64_t emu_mem_in_use(void) { return in_use; }

int emu_check_range(const void *p, size_t n, const char *what, char *msg, size_t mn) {
  char *s;
  size_t sz;
  if (emu_mem_find(p, n, &s, &sz) >= 0) return 0;
  if (emu_mem_find(p, 0, &s, &sz) >= 0)
    snprintf(msg, mn, "%s: %zu bytes at offset %zu run past the end of a %zu-byte device allocation",
             what, n, (size_t)((const char *)p - s), sz);
  else
    snprintf(msg, mn, "%s: %p is not in device memory", what, p);
  return -1;
}
