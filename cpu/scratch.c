/*
** scratch.c -- each thread's scratch buffers, kept from one call to the
** next.
**
** Why: a loop's scratch (a depthwise convolution's zero-bordered planes,
** a pool's pixel-major copy, a 1x1's strips) allocated and freed on every
** call goes back to the system -- above glibc's mmap threshold at once,
** below it whenever the top of a thread's heap is trimmed -- and its pages
** fault in again on the next call: a depthwise 3x3 over 2 x 16 x 56 x 56
** took 14 us a call for its first 150 calls in a process and 70 us from
** then on.  Each thread keeps one buffer per slot, grown to the largest
** request up to CPU_SCRATCH_KEEP; a larger one is allocated for its call
** alone.  A thread's buffers are freed when it ends.
*/
#include <pthread.h>
#include <stdlib.h>

#include "scratch.h"

typedef struct {
  void *p[CPU_SCRATCH_SLOTS];
  size_t n[CPU_SCRATCH_SLOTS];
} held;

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int key_ok;

static void held_free(void *v) {
  held *h = v;
  int s;
  for (s = 0; s < CPU_SCRATCH_SLOTS; s++) free(h->p[s]);
  free(h);
}

static void key_make(void) {
  key_ok = pthread_key_create(&key, held_free) == 0;
}

static void *alloc64(size_t n) {
  return aligned_alloc(64, (n + 63) / 64 * 64);
}

void *cpu_scratch(int slot, size_t n) {
  held *h;
  if (n == 0) n = 1;
  pthread_once(&once, key_make);
  if (n > CPU_SCRATCH_KEEP || !key_ok) return alloc64(n);
  if (!(h = pthread_getspecific(key))) {
    if (!(h = calloc(1, sizeof *h))) return alloc64(n);
    if (pthread_setspecific(key, h) != 0) {
      free(h);
      return alloc64(n);
    }
  }
  if (h->n[slot] < n) {
    free(h->p[slot]);
    h->n[slot] = 0;
    if (!(h->p[slot] = alloc64(n))) return NULL;
    h->n[slot] = n;
  }
  return h->p[slot];
}

void cpu_scratch_done(int slot, void *p) {
  held *h = key_ok ? pthread_getspecific(key) : NULL;
  if (!h || p != h->p[slot]) free(p);
}
