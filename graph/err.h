/*
** err.h -- the error record every core function fills.
** Core code never raises, longjmps or exits: it returns a status and leaves
** a human-readable message here; only the binding layer turns it into a
** Lua error.
*/
#ifndef FL_ERR_H
#define FL_ERR_H

#include <signal.h>
#include <stddef.h>

/* status codes returned by core functions (0 is success) */
enum {
  FL_OK = 0,
  FL_EINVAL = -1,     /* bad argument: shape, dtype, dim, value */
  FL_ENOMEM = -2,     /* allocation failed (message names the size) */
  FL_EIO = -3,        /* file could not be read or written */
  FL_EFORMAT = -4,    /* malformed file contents */
  FL_EUNSUPPORTED = -5, /* valid request this build cannot do */
  FL_ENODEV = -6,     /* no CUDA device */
  FL_ECOMPILE = -7,   /* C compiler / NVRTC failed (log kept elsewhere) */
  FL_EINTR = -8       /* interrupted by the user */
};

#define FL_ERR_MSG 1024

typedef struct fl_err {
  int code;               /* last status, FL_OK when clear */
  char msg[FL_ERR_MSG];   /* "op: what: why", no trailing newline */
} fl_err;

/* Fill e (which may be NULL) and return code, so callers can write
** `return err_set(e, FL_EINVAL, "...")`. */
int err_set(fl_err *e, int code, const char *fmt, ...)
#ifdef __GNUC__
  __attribute__((format(printf, 3, 4)))
#endif
  ;

/* Prefix the message already in e with "prefix: " (context as it unwinds). */
int err_prefix(fl_err *e, const char *fmt, ...)
#ifdef __GNUC__
  __attribute__((format(printf, 2, 3)))
#endif
  ;

void err_clear(fl_err *e);

/* Nonzero once the user pressed Ctrl-C: the program's SIGINT handler sets
** it and clears it as a new top-level call starts.  Core code that waits on
** something outside the process (a compiler run) polls it, stops what it
** started and returns FL_EINTR. */
extern volatile sig_atomic_t fl_interrupt;

/* Copy s into buf (n bytes, NUL-terminated; "..." ends it when cut) with
** control characters, DEL, the C1 controls, bytes that are not UTF-8 and
** the backslash escaped (\x1b, \\): names and paths from files and users
** reach terminals and messages as text, never as terminal commands.
** Printable ASCII and other UTF-8 text pass unchanged.  Returns buf. */
const char *err_quote(const char *s, char *buf, size_t n);
/* The same for the len bytes at s (NULs included, escaped). */
const char *err_quote_n(const char *s, size_t len, char *buf, size_t n);

#endif
