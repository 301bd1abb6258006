#!/usr/bin/env python3
"""erff_fit.py -- where cpu/erff.h's coefficients come from.

Two Chebyshev fits against mpmath's erf (30 digits), converted to the
monomial coefficients the header evaluates by Horner:
  below |x| = 1.1: erf(x) / x - 1 as a polynomial of degree 7 in x^2;
  1.1 to 3.9375:   erf(x) as a polynomial of degree 15 in
                   t = (|x| - 2.51875) / 1.41875, t in [-1, 1].
tests/unit/test_erff.c measures the result in float32 ulps.

    $VENV/bin/python bench/erff_fit.py      (numpy, mpmath)
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 30
SEAM, ONE = 1.1, 3.9375
NODES = 800


def fit(f, lo, hi, deg):
    """f on [lo, hi] at Chebyshev nodes, as monomials in u = [-1, 1]"""
    u = np.cos(np.pi * (np.arange(NODES) + 0.5) / NODES)
    x = u * (hi - lo) / 2 + (lo + hi) / 2
    y = np.array([float(f(mp.mpf(v))) for v in x])
    c = np.polynomial.chebyshev.Chebyshev.fit(u, y, deg, domain=[-1, 1])
    return c.convert(kind=np.polynomial.Polynomial)


def main():
    def small(s):
        return mp.erf(mp.sqrt(s)) / mp.sqrt(s) - 1 if s > 0 else 2 / mp.sqrt(mp.pi) - 1

    # the small fit is in u = 2 s / SEAM^2 - 1; the header evaluates it in s
    p = fit(small, 0.0, SEAM * SEAM, 7)(np.polynomial.Polynomial([-1, 2 / (SEAM * SEAM)]))
    q = fit(mp.erf, SEAM, ONE, 15)
    print("x + x P(x^2) below %g, P from x^0 up:" % SEAM)
    print("  " + ", ".join("%.9e" % c for c in p.coef))
    print("Q(t), t = (|x| - %g) * %.9f, from t^0 up:" % ((SEAM + ONE) / 2, 2 / (ONE - SEAM)))
    print("  " + ", ".join("%.9e" % c for c in q.coef))


if __name__ == "__main__":
    main()
