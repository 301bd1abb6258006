/*
** hostpool.c -- big host buffers kept for reuse.
**
** A compiled call's outputs are fresh storage every call.  From malloc, a
** buffer of several MiB is a fresh mmap (or heap memory glibc trimmed away
** when the garbage collector freed a batch of outputs at once), so the
** kernel that fills it first takes one page fault per page and the kernel
** zeroes each page: measured on a compiled softmax of [4096, 1024], 27% of
** the call was the kernel's clear_page.  Here a freed buffer of HOSTPOOL_MIN or
** more is kept, and the next request of the same size class gets it back
** with its pages already mapped, as PyTorch's caching allocators do for
** device memory.
**
** Size classes are exact (a block is handed out only for its own class),
** so a free needs only the byte size the storage already records.  Blocks
** of 4 MiB and more are 2 MiB-aligned whole huge pages (one fault per
** 2 MiB on first use where transparent huge pages are on madvise).  What
** is kept is bounded (hostpool_limit): past it, the oldest kept block is
** unmapped.  Under AddressSanitizer, or with FUSELAB_HOST_POOL_MB=0, it
** is plain malloc and free, so an overflow or a use after free is still
** caught.  Measured against jemalloc (bench/RESULTS.md): jemalloc
** preloaded made that softmax slower than glibc's malloc, not faster.
*/
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "env.h"
#include "hostpool.h"

#define MIB ((size_t)1 << 20)
#define HUGE (2 * MIB)
#define SMALL_STEP ((size_t)64 << 10)
#define MAX_KEPT 256   /* a 16 MiB collection interval frees 64 blocks of 256 KiB at once */

#if defined(__SANITIZE_ADDRESS__)
#define KEEP 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KEEP 0
#endif
#endif
#ifndef KEEP
#define KEEP 1
#endif

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct { void *p; size_t cap; } kept[MAX_KEPT];   /* oldest first */
static int nkept;
static size_t kept_bytes;
static long long reuses, maps;

/* The bytes reserved for a request of n (n >= HOSTPOOL_MIN). */
static size_t class_of(size_t n) {
  size_t step = n >= 2 * HUGE ? HUGE : SMALL_STEP;
  return (n + step - 1) / step * step;
}

/* min(1 GiB, RAM / 8), or FUSELAB_HOST_POOL_MB; read once (pthread_once:
** allocation and free must agree on it from the first call).  0, and the
** sanitized build, is no pool at all: malloc and free, as before it. */
static size_t the_limit;
static pthread_once_t limit_once = PTHREAD_ONCE_INIT;

static void read_limit(void) {
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  size_t limit = 1024 * MIB;
  if (pages > 0 && psz > 0 && (size_t)pages / 8 < limit / (size_t)psz)
    limit = (size_t)pages / 8 * (size_t)psz;
  /* (MIB is a power of 2: the default goes through the double exactly) */
  limit = (size_t)(env_number("FUSELAB_HOST_POOL_MB", (double)limit / (double)MIB, 1 << 24, 0,
                              "megabytes") * (double)MIB);
  the_limit = KEEP ? limit : 0;
}

size_t hostpool_limit(void) {
  pthread_once(&limit_once, read_limit);
  return the_limit;
}

/* A fresh buffer is first touched by the kernel that fills it; with 4 KiB
** pages that is one page fault per 4 KiB, which costs a memory-bound op
** two to three times its own time (measured: a 16M-float add, 25 ms into
** fresh pages, 9 ms with huge pages, 6 ms into warm memory).  Asking for
** transparent huge pages over the 2 MiB-aligned inside of a big buffer
** makes it one fault per 2 MiB, as PyTorch's THP_MEM_ALLOC_ENABLE does.
** Every big host buffer gets it (the pool's own blocks when they are
** mapped, malloc's with the pool off and eager scratch), eager or
** compiled, so their comparison is fair.  Advice only: where it is not
** honoured nothing changes. */
void hostpool_advise_huge(void *p, size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t huge = (uintptr_t)2 << 20;
  uintptr_t b = ((uintptr_t)p + huge - 1) & ~(huge - 1);
  uintptr_t e = ((uintptr_t)p + n) & ~(huge - 1);
  if (p && n >= 2 * huge && e > b) madvise((void *)b, e - b, MADV_HUGEPAGE);
#else
  (void)p; (void)n;
#endif
}

/* cap bytes from the kernel; huge-page-aligned when cap is a whole number
** of huge pages.  Fresh anonymous memory reads as zero.  Any other block
** (those are below 4 MiB) is populated by the mmap itself: the kernel
** that fills it writes every page anyway, and one call mapping them all
** costs half of a fault per 4 KiB (512 KiB: 110-160 us against 230-410). */
static void *map_fresh(size_t cap) {
  size_t extra = cap % HUGE == 0 ? HUGE : 0;
  int populate = 0;
  char *p;
  char *a;
#ifdef MAP_POPULATE
  if (!extra) populate = MAP_POPULATE;
#endif
  p = mmap(NULL, cap + extra, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | populate, -1, 0);
  if (p == MAP_FAILED) return NULL;
  if (!extra) return p;
  a = (char *)(((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
  if (a > p) munmap(p, (size_t)(a - p));
  if (p + extra > a) munmap(a + cap, (size_t)(p + extra - a));
  hostpool_advise_huge(a, cap);
  return a;
}

/* Unmap every kept block (under the lock). */
static void drop_all(void) {
  while (nkept > 0) {
    nkept--;
    munmap(kept[nkept].p, kept[nkept].cap);
  }
  kept_bytes = 0;
}

void *hostpool_alloc(size_t n, int zero) {
  size_t cap = class_of(n);
  void *p = NULL;
  int i;
  if (!hostpool_limit()) {
    p = zero ? calloc(1, n) : malloc(n);
    hostpool_advise_huge(p, n);
    return p;
  }
  pthread_mutex_lock(&lock);
  for (i = nkept - 1; i >= 0; i--)           /* the newest of the class */
    if (kept[i].cap == cap) {
      p = kept[i].p;
      kept_bytes -= cap;
      memmove(&kept[i], &kept[i + 1], (size_t)(nkept - i - 1) * sizeof kept[0]);
      nkept--;
      reuses++;
      break;
    }
  if (!p) maps++;
  pthread_mutex_unlock(&lock);
  if (p) {
    if (zero) memset(p, 0, n);
    return p;
  }
  if (!(p = map_fresh(cap))) {              /* what is kept may be what is missing */
    pthread_mutex_lock(&lock);
    drop_all();
    pthread_mutex_unlock(&lock);
    p = map_fresh(cap);
  }
  return p;
}

void hostpool_free(void *p, size_t n) {
  size_t cap = class_of(n), limit;
  if (!p) return;
  if (!(limit = hostpool_limit())) { free(p); return; }
  pthread_mutex_lock(&lock);
  if (cap <= limit) {
    while (nkept > 0 && (nkept == MAX_KEPT || kept_bytes + cap > limit)) {
      munmap(kept[0].p, kept[0].cap);        /* the oldest goes */
      kept_bytes -= kept[0].cap;
      memmove(&kept[0], &kept[1], (size_t)(nkept - 1) * sizeof kept[0]);
      nkept--;
    }
    kept[nkept].p = p;
    kept[nkept].cap = cap;
    nkept++;
    kept_bytes += cap;
    p = NULL;
  }
  pthread_mutex_unlock(&lock);
  if (p) munmap(p, cap);
}

void hostpool_get_info(hostpool_info *h) {
  pthread_mutex_lock(&lock);
  h->kept = kept_bytes;
  h->limit = hostpool_limit();
  h->reuses = reuses;
  h->maps = maps;
  pthread_mutex_unlock(&lock);
}
