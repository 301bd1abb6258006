/*
** strbuf.c -- growable strings.  Invariant: when p is non-NULL,
** p[n] == '\0' and n < cap.
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "strbuf.h"

void strbuf_printf(strbuf *b, const char *fmt, ...) {
  va_list ap;
  int need;
  if (b->oom) return;
  va_start(ap, fmt);
  need = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
  va_end(ap);
  if (need < 0) { b->oom = 1; return; }
  if (!b->p || b->n + (size_t)need + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    char *np;
    while (cap < b->n + (size_t)need + 1) cap *= 2;
    np = realloc(b->p, cap);
    if (!np) { b->oom = 1; return; }
    b->p = np;
    b->cap = cap;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
  }
  b->n += (size_t)need;
}

char *strbuf_take(strbuf *b) {
  char *p = b->oom ? NULL : b->p;
  if (b->oom) free(b->p);
  else if (!p) p = calloc(1, 1);
  b->p = NULL;
  b->n = b->cap = 0;
  b->oom = 0;
  return p;
}

void strbuf_free(strbuf *b) {
  free(b->p);
  b->p = NULL;
  b->n = b->cap = 0;
}
