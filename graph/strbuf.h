/*
** strbuf.h -- a growable string for listings, logs and generated source.
** Once an allocation fails the buffer stays marked and further appends are
** ignored, so callers check `oom` once at the end.
*/
#ifndef FL_STRBUF_H
#define FL_STRBUF_H

#include <stddef.h>

typedef struct strbuf {
  char *p;        /* NUL-terminated text, owned; NULL while empty */
  size_t n, cap;  /* bytes used (without the NUL), bytes allocated */
  int oom;        /* an allocation failed */
} strbuf;

void strbuf_printf(strbuf *b, const char *fmt, ...)
#ifdef __GNUC__
  __attribute__((format(printf, 2, 3)))
#endif
  ;
/* Hands the text to the caller (who frees it) and resets b; returns NULL
** after an allocation failure. */
char *strbuf_take(strbuf *b);
void strbuf_free(strbuf *b);

#endif
