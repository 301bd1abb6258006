/*
** env.h -- numbers from environment variables (FUSELAB_CACHE_MAX_MB and
** its siblings), read strictly.  A value is a plain decimal number
** ("64", "0.5", " 2 "); one that is not, or is out of range, is never
** read as some other number in silence (atof("0.1") through strtoll was
** 0, and 0 meant the default, 2048): one warning on stderr names the
** variable, its value (escaped) and the number used instead.
*/
#ifndef FL_ENV_H
#define FL_ENV_H

enum {
  ENV_WHOLE = 1,        /* whole numbers only (no fraction) */
  ENV_ABOVE_ZERO = 2    /* 0 is not a value (it is one otherwise) */
};

/* The number in $name: def when unset or empty; the value when it is a
** decimal number that flags allow, and max when it is larger than max
** (with a warning); def with a warning for anything else.  unit names
** what the number counts, for the warning ("megabytes").  Each variable
** and value is warned about once per process.  Thread-safe. */
double env_number(const char *name, double def, double max, int flags, const char *unit);

#endif
