/*
** err.c -- error records.  Messages are truncated, never overflowed.
*/
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "err.h"

volatile sig_atomic_t fl_interrupt;

int err_set(fl_err *e, int code, const char *fmt, ...) {
  if (e) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->code = code;
  }
  return code;
}

int err_prefix(fl_err *e, const char *fmt, ...) {
  char old[FL_ERR_MSG];
  size_t n;
  va_list ap;
  if (!e) return FL_EINVAL;
  memcpy(old, e->msg, sizeof old);
  old[sizeof old - 1] = '\0';
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  /* append ": old", truncating the old message if it no longer fits */
  n = strlen(e->msg);
  if (n + 2 < sizeof e->msg) {
    memcpy(e->msg + n, ": ", 2);
    n += 2;
    size_t k = strlen(old);
    if (k > sizeof e->msg - n - 1) k = sizeof e->msg - n - 1;
    memcpy(e->msg + n, old, k);
    e->msg[n + k] = '\0';
  }
  return e->code;
}

void err_clear(fl_err *e) {
  if (e) { e->code = FL_OK; e->msg[0] = '\0'; }
}
