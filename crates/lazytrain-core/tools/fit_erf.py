"""Fit the polynomial coefficients of `erf_f32` (src/kernels/numeric.rs).

Two pieces, each a near-minimax polynomial found by Lawson's iteratively
reweighted least squares on Chebyshev nodes, against mpmath's erf/erfc:

  |x| < 1:  erf(x) / x            = A(x^2),             degree 6
  |x| >= 1: erfc(x) * exp(x^2)    = B(1 / x - 0.625),   degree 9 on [1, 4]

Run with any Python that has numpy and mpmath (both come with torch):
    python3 tools/fit_erf.py
It prints the coefficients, highest degree first, as the Rust code lists them.
"""

import mpmath
import numpy as np

mpmath.mp.dps = 40
NODES = 4000


def lawson(xs, ys, basis, degree, iterations=60):
    """Coefficients (lowest degree first) minimising the max relative error."""
    v = np.stack([basis(xs) ** k for k in range(degree + 1)], axis=1)
    weights = np.ones_like(xs)
    for _ in range(iterations):
        w = np.sqrt(weights)
        c, *_ = np.linalg.lstsq(v * (w / ys)[:, None], w, rcond=None)
        err = np.abs(v @ c - ys) / np.abs(ys)
        weights = weights * err
        weights /= weights.sum()
    return c, err.max()


def chebyshev(lo, hi):
    return np.cos(np.linspace(0, np.pi, NODES)) * (hi - lo) / 2 + (hi + lo) / 2



if __name__ == "__main__":
    xs = np.clip(chebyshev(0.0, 1.0), 1e-6, 1.0)
    ys = np.array([float(mpmath.erf(mpmath.mpf(x)) / x) for x in xs])
    a, err_a = lawson(xs, ys, lambda x: x * x, 6)
    print(f"A (max relative error {err_a:.2e}):", [float(np.float32(c)) for c in reversed(a)])

    xs = chebyshev(1.0, 4.0)
    ys = np.array([float(mpmath.erfc(mpmath.mpf(x)) * mpmath.exp(mpmath.mpf(x) ** 2)) for x in xs])
    b, err_b = lawson(xs, ys, lambda x: 1 / x - 0.625, 9)
    print(f"B (max relative error {err_b:.2e}):", [float(np.float32(c)) for c in reversed(b)])
