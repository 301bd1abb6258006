/*
** tap.h -- a minimal TAP producer for the C unit tests (one header, no
** library).  ok() records a result with the file and line of a failure.
*/
#ifndef FL_TAP_H
#define FL_TAP_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int tap_n, tap_failed;

#define ok(cond, ...) tap_ok_(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
#define is_int(got, want, ...) do { long long g_ = (got), w_ = (want); \
    if (!ok(g_ == w_, __VA_ARGS__)) printf("#   got %lld, want %lld\n", g_, w_); } while (0)
#define is_str(got, want, ...) do { const char *g_ = (got), *w_ = (want); \
    if (!ok(g_ && strcmp(g_, w_) == 0, __VA_ARGS__)) printf("#   got \"%s\"\n#  want \"%s\"\n", g_ ? g_ : "(null)", w_); } while (0)
#define is_near(got, want, tol, ...) do { double g_ = (got), w_ = (want); \
    if (!ok(fabs(g_ - w_) <= (tol) || (isnan(g_) && isnan(w_)), __VA_ARGS__)) \
      printf("#   got %.9g, want %.9g (tol %g)\n", g_, w_, (double)(tol)); } while (0)

static int tap_ok_(int pass, const char *file, int line, const char *fmt, ...)
  __attribute__((format(printf, 4, 5)));
#include <stdarg.h>
static int tap_ok_(int pass, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  tap_n++;
  printf("%s %d - ", pass ? "ok" : "not ok", tap_n);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  if (!pass) { tap_failed++; printf("#   at %s:%d\n", file, line); }
  fflush(stdout);
  return pass;
}

/* Print the plan last (TAP allows it) and return the exit status. */
static int tap_done(void) {
  printf("1..%d\n", tap_n);
  return tap_failed ? 1 : 0;
}

#endif
