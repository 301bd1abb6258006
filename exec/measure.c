/*
** measure.c -- timings as people are shown them (DESIGN §4b).
**
** Invariant: a number shown is a median; beside it its interquartile
** range (the middle half of the runs, which one descheduled run cannot
** move), and "noisy" whenever that range is wider than 10 % of the median
** or other processes took at least half a core while the runs were timed.
** A verdict between two measurements needs their medians to differ by
** more than the wider of their spreads (at least 5 %, 10 % when either is
** noisy) and their middle halves not to overlap; otherwise there is no
** clear difference, and the caller says so rather than pick a winner.
**
** "Other processes" is measured, not guessed: the non-idle ticks of all
** CPUs (/proc/stat) over the window, less this process's own CPU time.
** Ticks are 10 ms coarse, so a window under a quarter second asks the
** kernel's pressure stall information instead (how long some task waited
** for a CPU, in µs: /proc/pressure/cpu), and where that is missing the
** one-minute load average less this process's one runnable thread.
*/
#include "exec/measure.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SHORT_WINDOW_S 0.25

static double clock_s(clockid_t id) {
  struct timespec ts;
  if (clock_gettime(id, &ts) != 0) return 0;
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Non-idle ticks of all CPUs together, or -1 where /proc/stat is unreadable. */
static long long sys_busy_ticks(void) {
  unsigned long long v[8] = {0};
  FILE *f = fopen("/proc/stat", "r");
  int n;
  if (!f) return -1;
  n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
             &v[5], &v[6], &v[7]);
  fclose(f);
  if (n < 4) return -1;
  /* user nice system [idle iowait] irq softirq steal: steal is time the
  ** hypervisor gave to others, as good as another process here */
  return (long long)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
}

/* µs some task has waited for a CPU since boot, or -1. */
static long long stall_total_us(void) {
  long long v = -1;
  FILE *f = fopen("/proc/pressure/cpu", "r");
  if (!f) return -1;
  if (fscanf(f, "some avg10=%*f avg60=%*f avg300=%*f total=%lld", &v) != 1) v = -1;
  fclose(f);
  return v;
}

static int cores_online(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

double meas_now(void) { return clock_s(CLOCK_MONOTONIC); }

double meas_break_even(double cold_ms, double eager_ms, double steady_ms) {
  double gain = eager_ms - steady_ms, n;
  if (!(gain > 0)) return -1;
  n = ceil((cold_ms - steady_ms) / gain);
  return n < 1 ? 1 : n;
}

void meas_begin(meas_window *w) {
  w->wall = clock_s(CLOCK_MONOTONIC);
  w->self_cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID);
  w->sys_busy = sys_busy_ticks();
  w->stall_us = stall_total_us();
}

/* Cores other processes used on average since w began, or -1; *from_load
** is set when the estimate is the load average's. */
static double others_since(const meas_window *w, int *from_load, double *stall) {
  double wall = clock_s(CLOCK_MONOTONIC) - w->wall, load[1];
  long long st = stall_total_us();
  long long busy = sys_busy_ticks();
  long hz = sysconf(_SC_CLK_TCK);
  if (wall >= SHORT_WINDOW_S && w->sys_busy >= 0 && busy >= 0 && hz > 0) {
    double self = clock_s(CLOCK_PROCESS_CPUTIME_ID) - w->self_cpu;
    double all = (double)(busy - w->sys_busy) / (double)hz;
    double o = (all - self) / wall;
    return o > 0 ? o : 0;
  }
  if (wall > 0 && w->stall_us >= 0 && st >= 0) {
    *stall = (double)(st - w->stall_us) * 1e-6 / wall;
    if (*stall > 1) *stall = 1;
    return -1;
  }
  *from_load = 1;
  if (getloadavg(load, 1) == 1) return load[0] > 1 ? load[0] - 1 : 0;
  return -1;
}

double meas_others_now(double window_s) {
  long hz = sysconf(_SC_CLK_TCK);
  long long b0 = sys_busy_ticks(), b1;
  double t0 = clock_s(CLOCK_MONOTONIC), wall;
  struct timespec ts;
  if (b0 < 0 || hz <= 0) return -1;
  if (window_s < 2.0 / (double)hz) window_s = 2.0 / (double)hz;
  ts.tv_sec = (time_t)window_s;
  ts.tv_nsec = (long)((window_s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0) {}
  b1 = sys_busy_ticks();
  wall = clock_s(CLOCK_MONOTONIC) - t0;
  if (b1 < 0 || wall <= 0) return -1;
  return (double)(b1 - b0) / (double)hz / wall;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The q-quantile of sorted t[0..n-1], interpolated between neighbours. */
static double quantile(const double *t, int n, double q) {
  double at = q * (n - 1);
  int i = (int)floor(at);
  if (i >= n - 1) return t[n - 1];
  return t[i] + (at - i) * (t[i + 1] - t[i]);
}

void meas_summarize(double *t, int n, const meas_window *w, meas_summary *s) {
  memset(s, 0, sizeof *s);
  s->others = -1;
  s->stall = -1;
  s->cores = cores_online();
  if (w) s->others = others_since(w, &s->from_load, &s->stall);
  s->busy = s->others >= MEAS_BUSY_CORES || s->stall >= MEAS_BUSY_STALL;
  if (n <= 0) {
    s->noisy = s->busy;
    return;
  }
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  s->n = n;
  s->min = t[0];
  s->max = t[n - 1];
  s->median = quantile(t, n, 0.5);
  s->q1 = quantile(t, n, 0.25);
  s->q3 = quantile(t, n, 0.75);
  s->spread = s->median > 0 ? (s->q3 - s->q1) / s->median : 0;
  s->noisy = s->busy || s->spread > MEAS_NOISY_SPREAD;
}

int meas_verdict(const meas_summary *a, const meas_summary *b, double *ratio, double *margin) {
  double m = a->spread > b->spread ? a->spread : b->spread, r;
  if (m < MEAS_MIN_MARGIN) m = MEAS_MIN_MARGIN;
  if ((a->noisy || b->noisy) && m < 2 * MEAS_MIN_MARGIN) m = 2 * MEAS_MIN_MARGIN;
  r = a->median > 0 ? b->median / a->median : (b->median > 0 ? INFINITY : 1);
  if (ratio) *ratio = r;
  if (margin) *margin = m;
  if (a->n == 0 || b->n == 0) return 0;
  if (r > 1 + m && a->q3 < b->q1) return 1;
  if (r < 1 / (1 + m) && b->q3 < a->q1) return -1;
  return 0;
}

char *meas_noise_reason(const meas_summary *s, char *buf, size_t n) {
  size_t at = 0;
  buf[0] = 0;
  if (!s->noisy) return buf;
  if (s->spread > MEAS_NOISY_SPREAD)
    at += (size_t)snprintf(buf, n, "spread %.0f%%", s->spread * 100);
  if (s->busy && s->stall >= 0 && at < n)
    snprintf(buf + at, n - at, "%smachine busy: tasks waited for a CPU %.0f%% of the time",
             at ? ", " : "", s->stall * 100);
  else if (s->busy && s->from_load && at < n)
    snprintf(buf + at, n - at, "%smachine busy: load average %.1f on %d cores", at ? ", " : "",
             s->others + 1, s->cores);
  else if (s->busy && at < n)
    snprintf(buf + at, n - at, "%smachine busy: other processes used %.1f of %d cores",
             at ? ", " : "", s->others, s->cores);
  return buf;
}

/* Enough digits for the spread to show: 3 significant ones of the median. */
static const char *num_fmt(double v) {
  double a = fabs(v);
  return a >= 100 ? "%.0f" : a >= 10 ? "%.1f" : a >= 1 ? "%.2f" : a >= 0.1 ? "%.3f" : "%.4f";
}

char *meas_format(const meas_summary *s, const char *unit, char *buf, size_t n) {
  char med[32], lo[32], hi[32], why[128];
  size_t at;
  snprintf(med, sizeof med, num_fmt(s->median), s->median);
  snprintf(lo, sizeof lo, num_fmt(s->median), s->q1);
  snprintf(hi, sizeof hi, num_fmt(s->median), s->q3);
  at = (size_t)snprintf(buf, n, "%s %s (IQR %s-%s, %d run%s)", med, unit, lo, hi, s->n,
                        s->n == 1 ? "" : "s");
  if (s->noisy && at < n) snprintf(buf + at, n - at, " noisy: %s", meas_noise_reason(s, why, sizeof why));
  return buf;
}
