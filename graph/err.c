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

/* Length of the UTF-8 sequence at p (at most left bytes) when it is well
** formed and not a C1 control (U+0080..U+009F, which terminals may obey
** as commands); 0 otherwise. */
static size_t utf8_ok(const unsigned char *p, size_t left) {
  size_t len, i;
  unsigned cp;
  if (p[0] >= 0xc2 && p[0] <= 0xdf) { len = 2; cp = p[0] & 0x1fu; }
  else if (p[0] >= 0xe0 && p[0] <= 0xef) { len = 3; cp = p[0] & 0x0fu; }
  else if (p[0] >= 0xf0 && p[0] <= 0xf4) { len = 4; cp = p[0] & 0x07u; }
  else return 0;
  if (len > left) return 0;
  for (i = 1; i < len; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (p[i] & 0x3fu);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp <= 0x9f))
    return 0;
  return len;
}

const char *err_quote(const char *s, char *buf, size_t n) {
  return err_quote_n(s ? s : "", s ? strlen(s) : 0, buf, n);
}

const char *err_quote_n(const char *s, size_t len, char *buf, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  size_t o = 0, left = len;
  if (n == 0) return buf;
  while (left > 0) {
    char piece[8];
    size_t k, u = 0;
    if (*p >= 0x20 && *p < 0x7f && *p != '\\') { piece[0] = (char)*p; k = 1; }
    else if (*p == '\\') { memcpy(piece, "\\\\", 2); k = 2; }
    else if ((u = utf8_ok(p, left)) > 0) { memcpy(piece, p, u); k = u; }
    else k = (size_t)snprintf(piece, sizeof piece, "\\x%02x", *p);
    /* keep room for "..." unless this piece ends the string */
    if (o + k + (left > (u ? u : 1) ? 3 : 0) >= n) {
      if (o + 3 < n) { memcpy(buf + o, "...", 3); o += 3; }
      break;
    }
    memcpy(buf + o, piece, k);
    o += k;
    p += u ? u : 1;
    left -= u ? u : 1;
  }
  buf[o] = '\0';
  return buf;
}
