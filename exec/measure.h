/*
** measure.h -- the one way fuselab turns repeated timings into a number
** shown to a person (DESIGN §4b): the median with its interquartile range,
** a "noisy" flag when that range is wide or other processes took CPU time
** while the runs were timed, and a verdict between two measurements that
** needs a margin above the noise, else says there is no clear difference.
*/
#ifndef FL_MEASURE_H
#define FL_MEASURE_H

#include <stddef.h>

/* A short window where some task waited for a CPU this share of the time
** is busy (the kernel's pressure stall information). */
#define MEAS_BUSY_STALL 0.25
/* A relative spread ((q3 - q1) / median) above this is noisy. */
#define MEAS_NOISY_SPREAD 0.10
/* Other processes using at least this many cores (on average, over the
** timed window) make the machine busy, hence the measurement noisy. */
#define MEAS_BUSY_CORES 0.5
/* The smallest difference a verdict calls a difference: 5 %. */
#define MEAS_MIN_MARGIN 0.05

/* What the machine was doing over a timed window: a snapshot taken
** before it, read again after it. */
typedef struct meas_window {
  double wall;                  /* monotonic seconds at the start */
  double self_cpu;              /* this process's CPU seconds (all threads) */
  long long sys_busy;           /* non-idle clock ticks of all CPUs (/proc/stat), -1 unknown */
  long long stall_us;           /* µs some task waited for a CPU (/proc/pressure/cpu), -1 unknown */
} meas_window;

typedef struct meas_summary {
  int n;                        /* timed runs */
  double median, q1, q3;        /* the caller's unit (ms, s) */
  double min, max;
  double spread;                /* (q3 - q1) / median; 0 when median is 0 */
  double others;                /* cores other processes used on average, < 0 unknown */
  double stall;                 /* share of a short window some task waited for a CPU, < 0 unknown */
  int from_load;                /* others is the load average's estimate (a short window) */
  int cores;                    /* CPUs online */
  int busy;                     /* others >= MEAS_BUSY_CORES */
  int noisy;                    /* spread > MEAS_NOISY_SPREAD, or busy */
} meas_summary;

/* Monotonic seconds (a clock read, nothing else). */
double meas_now(void);
/* The calls after which compiling has paid for itself: n compiled calls
** (the cold one, then n - 1 steady ones) cost what n eager calls do when
** n = (cold - steady) / (eager - steady), rounded up, at least 1; -1 when
** steady is no faster than eager.  The one definition: the checklist,
** the report and the lessons all print this number. */
double meas_break_even(double cold_ms, double eager_ms, double steady_ms);

/* Starts a window (what meas_summarize compares the machine against). */
void meas_begin(meas_window *w);

/* Cores other processes use now: this process sleeps window_s seconds
** (at least 2 clock ticks) and counts the machine's non-idle ticks
** meanwhile; -1 where /proc/stat is unreadable. */
double meas_others_now(double window_s);

/* The summary of the n samples t[0..n-1] (sorted in place) timed inside
** window w (NULL: the machine's load is unknown and only the spread can
** make it noisy).  n may be 0: every number 0, not noisy. */
void meas_summarize(double *t, int n, const meas_window *w, meas_summary *s);

/* Which of a and b is faster, with a margin above their noise:
** 1 a is faster, -1 b is faster, 0 no clear difference.  *ratio gets
** b.median / a.median (how many times faster a is), *margin the relative
** difference that was needed; either may be NULL. */
int meas_verdict(const meas_summary *a, const meas_summary *b, double *ratio, double *margin);

/* "0.123 ms (IQR 0.120-0.130, 20 runs)" with ", noisy: ..." appended
** when it is; unit is the samples' unit's name ("ms").  Returns buf. */
char *meas_format(const meas_summary *s, const char *unit, char *buf, size_t n);

/* Why s is noisy, in a few words ("spread 23%", "machine busy: other
** processes used 1.0 of 2 cores"), or "" when it is not.  Returns buf. */
char *meas_noise_reason(const meas_summary *s, char *buf, size_t n);

#endif
