/*
** test_measure.c -- exec/measure.c: medians and quartiles of known times,
** the noisy flag from the spread, the verdict's margin (5 %, 10 % when
** noisy, never across overlapping middle halves), the printed form.
** Nothing here times anything: no result depends on the machine.
*/
#include <string.h>

#include "exec/measure.h"
#include "tap.h"

int main(void) {
  meas_summary a, b, c, n;
  double t1[] = {5, 1, 4, 2, 3}, t2[] = {1.00, 1.01, 0.99, 1.00}, t3[] = {2.0, 2.02, 1.98, 2.0};
  double t4[] = {1.07, 1.07, 1.07, 1.07}, t5[] = {1.03, 1.03, 1.03, 1.03}, t6[] = {4, 1, 3, 2};
  double ratio, margin;
  char buf[256];

  meas_summarize(t1, 5, NULL, &a);
  is_int(a.n, 5, "five samples");
  is_near(a.median, 3, 1e-12, "median");
  is_near(a.q1, 2, 1e-12, "first quartile");
  is_near(a.q3, 4, 1e-12, "third quartile");
  is_near(a.min, 1, 1e-12, "min");
  is_near(a.max, 5, 1e-12, "max");
  is_near(a.spread, 2.0 / 3, 1e-12, "spread = IQR / median");
  ok(a.noisy && !a.busy, "a wide spread is noisy; no window, so not busy");
  ok(strstr(meas_noise_reason(&a, buf, sizeof buf), "spread 67%") != NULL, "why: %s", buf);
  is_str(meas_format(&a, "ms", buf, sizeof buf), "3.00 ms (IQR 2.00-4.00, 5 runs) noisy: spread 67%",
         "the printed form");

  meas_summarize(t6, 4, NULL, &c);
  is_near(c.median, 2.5, 1e-12, "an even count interpolates the median");
  is_near(c.q1, 1.75, 1e-12, "and the quartiles");

  meas_summarize(t2, 4, NULL, &a);
  meas_summarize(t3, 4, NULL, &b);
  ok(!a.noisy, "a 1%% spread is not noisy");
  is_int(meas_verdict(&a, &b, &ratio, &margin), 1, "2x apart: a is faster");
  is_near(ratio, 2, 1e-9, "ratio b/a");
  is_near(margin, MEAS_MIN_MARGIN, 1e-12, "the minimum margin");
  is_int(meas_verdict(&b, &a, NULL, NULL), -1, "the other way round");

  meas_summarize(t5, 4, NULL, &c);
  is_int(meas_verdict(&a, &c, NULL, NULL), 0, "3%% apart: no clear difference");
  meas_summarize(t4, 4, NULL, &c);
  is_int(meas_verdict(&a, &c, NULL, NULL), 1, "7%% apart, quiet: a verdict");
  n = a;
  n.busy = n.noisy = 1;
  is_int(meas_verdict(&n, &c, NULL, &margin), 0, "7%% apart on a busy machine: none");
  is_near(margin, 2 * MEAS_MIN_MARGIN, 1e-12, "the margin doubles when noisy");

  /* overlapping middle halves: no verdict whatever the medians say */
  a.median = 1.0; a.q1 = 0.5; a.q3 = 1.9; a.spread = 0.2;
  b.median = 1.5; b.q1 = 1.4; b.q3 = 1.6; b.spread = 0.13;
  is_int(meas_verdict(&a, &b, NULL, NULL), 0, "IQRs overlap: no verdict");

  meas_summarize(t1, 0, NULL, &c);
  ok(c.n == 0 && !c.noisy, "no samples: zeros, not noisy");
  is_int(meas_verdict(&c, &b, NULL, NULL), 0, "no samples: no verdict");
  return tap_done();
}
