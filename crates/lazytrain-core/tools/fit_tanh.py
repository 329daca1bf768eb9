"""Fit the polynomial coefficients of `tanh_f32` (src/kernels/numeric.rs).

For |x| < 0.625, tanh(x) = x + x^3 U(x^2), with U a near-minimax
polynomial (degree 5) found by Lawson's iteratively reweighted least squares
on Chebyshev nodes against mpmath's tanh; above, tanh(x) = 1 - 2 / (e^{2x} + 1)
needs no fit.

Run with any Python that has numpy and mpmath (both come with torch):
    python3 tools/fit_tanh.py
It prints the coefficients, highest degree first, as the Rust code lists them.
"""

import mpmath
import numpy as np

from fit_erf import chebyshev, lawson

xs = np.clip(chebyshev(0.0, 0.625), 1e-4, 0.625)
ys = np.array([float((mpmath.tanh(mpmath.mpf(x)) - x) / mpmath.mpf(x) ** 3) for x in xs])
u, err_u = lawson(xs, ys, lambda x: x * x, 5)
print(f"U (max relative error {err_u:.2e}):", [float(np.float32(c)) for c in reversed(u)])
