/*
** err.c -- error records.  Messages are truncated, never overflowed.
*/
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "err.h"

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
  char pre[256], old[FL_ERR_MSG];
  va_list ap;
  if (!e) return FL_EINVAL;
  va_start(ap, fmt);
  vsnprintf(pre, sizeof pre, fmt, ap);
  va_end(ap);
  memcpy(old, e->msg, sizeof old);
  snprintf(e->msg, sizeof e->msg, "%s: %s", pre, old);
  return e->code;
}

void err_clear(fl_err *e) {
  if (e) { e->code = FL_OK; e->msg[0] = '\0'; }
}
