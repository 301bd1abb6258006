/*
** env.c -- numbers from environment variables (env.h).  The number is
** parsed here, digit by digit, not by strtod: strtod also takes "inf",
** "nan", hex and exponents, and reads "0,5" or "0.5" by the locale a
** script may have set.
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env.h"
#include "err.h"

#define MAX_WARNED 32

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct { const char *name; char value[64]; } warned[MAX_WARNED];
static int nwarned;

/* 1 when name=value was not warned about yet (and is now recorded). */
static int first_time(const char *name, const char *value) {
  int i, fresh = 1;
  pthread_mutex_lock(&lock);
  for (i = 0; i < nwarned && fresh; i++)
    if (strcmp(warned[i].name, name) == 0 && strncmp(warned[i].value, value, sizeof warned[i].value - 1) == 0)
      fresh = 0;
  if (fresh && nwarned < MAX_WARNED) {
    warned[nwarned].name = name;
    snprintf(warned[nwarned].value, sizeof warned[nwarned].value, "%s", value);
    nwarned++;
  }
  pthread_mutex_unlock(&lock);
  return fresh;
}

/* s as a decimal number: digits, at most one '.', blanks around; 0 and
** *out, or -1 (not a number), or -2 (a fraction where ENV_WHOLE). */
static int parse(const char *s, int flags, double *out) {
  double v = 0, scale = 1;
  int digits = 0, dot = 0, fraction = 0;
  while (*s == ' ' || *s == '\t') s++;
  for (; (*s >= '0' && *s <= '9') || *s == '.'; s++) {
    if (*s == '.') {
      if (dot++) return -1;
    } else if (dot) {
      scale /= 10;
      v += (*s - '0') * scale;
      fraction |= *s != '0';
      digits++;
    } else {
      v = v * 10 + (*s - '0');
      digits++;
    }
  }
  while (*s == ' ' || *s == '\t') s++;
  if (*s || !digits) return -1;
  if (fraction && (flags & ENV_WHOLE)) return -2;
  *out = v;
  return 0;
}

double env_number(const char *name, double def, double max, int flags, const char *unit) {
  const char *s = getenv(name);
  char q[128], why[160];
  double v;
  int rc;
  if (!s || !*s) return def;
  rc = parse(s, flags, &v);
  if (rc == 0 && !(v == 0 && (flags & ENV_ABOVE_ZERO)) && v <= max) return v;
  if (rc == 0 && v > max) {
    if (first_time(name, s))
      fprintf(stderr, "fuselab: warning: %s=\"%s\" is more than the most it can be; using %.15g %s\n",
              name, err_quote(s, q, sizeof q), max, unit);
    return max;
  }
  snprintf(why, sizeof why, "%s number of %s%s", flags & ENV_WHOLE ? "a whole" : "a",
           unit, flags & ENV_ABOVE_ZERO ? " above 0" : "");
  if (first_time(name, s))
    fprintf(stderr, "fuselab: warning: %s=\"%s\" is not %s; using %.15g %s\n", name,
            err_quote(s, q, sizeof q), why, def, unit);
  return def;
}
