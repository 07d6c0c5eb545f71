"""Percentiles as numpy computes them by default, without ``np.percentile``'s import of ``numpy.ma``.

``np.percentile`` pulls in ``numpy.ma`` (tens of milliseconds) on its first call, a visible part of a
short ``aisim replay``.  :func:`percentiles` gives the same numbers, bit for bit (a test compares them):
numpy's ``linear`` method, the virtual index ``(n - 1) * q / 100`` and its two-sided interpolation.
"""

from __future__ import annotations

import math

import numpy as np


def percentiles(values: np.ndarray, qs=(50, 90, 99)) -> list:
    """The ``qs`` percentiles of ``values`` (non-empty, no NaN) as floats, equal to ``np.percentile``'s.

    Parameters
    ----------
    values : numpy.ndarray
        One-dimensional numbers.
    qs : sequence of float
        Percentiles in [0, 100].

    Returns
    -------
    list of float
    """
    x = np.sort(np.asarray(values, dtype=np.float64))
    last = len(x) - 1
    out = []
    for q in qs:
        h = last * (q / 100)
        lo = math.floor(h)
        a, b, g = float(x[lo]), float(x[min(lo + 1, last)]), h - lo
        d = b - a
        # numpy's _lerp: from the nearer end, so an interpolation at g = 1 lands exactly on b.
        out.append(b - d * (1 - g) if g >= 0.5 else a + d * g)
    return out
