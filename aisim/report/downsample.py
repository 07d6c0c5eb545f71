"""Reducing long series to what a chart can show, without hiding what matters.

Everything here is for *display* only: the report computes its numbers
(summaries, percentiles, totals) on the full data and draws reduced series.

``m4``
    For line and step charts of smooth series (KV-cache usage, queues): each
    of at most ``max_points / 4`` buckets of equal width along x keeps its
    first, last, lowest and highest point (the M4 algorithm), so a spike of a
    single step survives and the drawn line is the one the full series would
    draw at the chart's resolution.
``band``
    For noisy per-step series (scheduled tokens): per bucket the mean, the
    minimum and the maximum, drawn as a line over a min-max band.
``windows``
    Exact sums of a per-step quantity over equal time windows (throughput,
    hit rate per window): an aggregation, not a sample.
``cdf``
    An empirical CDF sampled at evenly spaced ranks (always keeping the
    smallest and largest value).
"""

from __future__ import annotations

import numpy as np

MAX_POINTS = 1500


def _finite(x: np.ndarray, y: np.ndarray):
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length ({len(x)} and {len(y)})")
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.all():
        x, y = x[ok], y[ok]
    return x, y


def _buckets(x: np.ndarray, nb: int) -> np.ndarray:
    """Bucket index of every point: equal widths along x when x is sorted, else equal counts."""
    n = len(x)
    if n > 1 and x[-1] > x[0] and not (np.diff(x) < 0).any():
        edges = np.linspace(x[0], x[-1], nb + 1)
        return np.searchsorted(edges[1:-1], x, side="right")
    return (np.arange(n, dtype=np.int64) * nb) // max(n, 1)


def _segments(bid: np.ndarray):
    """Start index of each run of equal bucket ids, and each point's run number."""
    n = len(bid)
    starts = np.flatnonzero(np.r_[True, bid[1:] != bid[:-1]])
    seg = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))
    return starts, seg


def _first_where(mask: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Per segment, the first index where ``mask`` holds (every segment has one)."""
    idx = np.flatnonzero(mask)
    s = seg[idx]
    return idx[np.r_[True, s[1:] != s[:-1]]]


def m4_index(x, y, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most ``max_points`` points of (x, y) that draw like the whole series.

    ``x`` and ``y`` must be finite.  Per bucket of equal width along x (equal
    counts when x is not sorted): the first, last, lowest and highest point.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = len(x)
    if n <= max_points:
        return np.arange(n)
    nb = max(1, max_points // 4)
    bid = _buckets(x, nb)
    starts, seg = _segments(bid)
    ends = np.r_[starts[1:], n] - 1
    lo = np.minimum.reduceat(y, starts)
    hi = np.maximum.reduceat(y, starts)
    imin = _first_where(y == lo[seg], seg)
    imax = _first_where(y == hi[seg], seg)
    return np.unique(np.concatenate([starts, ends, imin, imax]))


def m4(x, y, max_points: int = MAX_POINTS):
    """At most ``max_points`` points of (x, y) that draw like the whole series.

    Non-finite points are dropped.  Series of at most ``max_points`` points
    come back whole.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        x and y of the kept points, in their original order.
    """
    x, y = _finite(x, y)
    keep = m4_index(x, y, max_points)
    return x[keep], y[keep]


def m4_shared(x, ys: list, max_points: int = MAX_POINTS):
    """One set of points for several series over the same x (stacked areas).

    Each series keeps its M4 points of ``max_points / len(ys)`` budget; all
    series are sampled at the union of those points, so at most
    ``max_points`` points come back.  Points where x or any y is not finite
    are dropped.

    Returns
    -------
    (x, [y, ...])
    """
    x = np.asarray(x, dtype=np.float64)
    ys = [np.asarray(y, dtype=np.float64) for y in ys]
    ok = np.isfinite(x)
    for y in ys:
        ok &= np.isfinite(y)
    if not ok.all():
        x, ys = x[ok], [y[ok] for y in ys]
    if len(x) <= max_points:
        return x, ys
    per = max(4, max_points // max(len(ys), 1))
    keep = np.unique(np.concatenate([m4_index(x, y, per) for y in ys]))
    return x[keep], [y[keep] for y in ys]


def band(x, y, max_points: int = MAX_POINTS):
    """Per bucket: position, minimum, maximum and mean of y (at most ``max_points / 2`` buckets).

    Series of at most ``max_points`` points come back as they are (minimum =
    maximum = mean = y).

    Returns
    -------
    (x, lo, hi, mean) : tuple of numpy.ndarray
    """
    x, y = _finite(x, y)
    n = len(x)
    if n <= max_points:
        return x, y, y, y
    nb = max(1, max_points // 2)
    bid = _buckets(x, nb)
    starts, _ = _segments(bid)
    counts = np.diff(np.r_[starts, n])
    ends = np.r_[starts[1:], n] - 1
    lo = np.minimum.reduceat(y, starts)
    hi = np.maximum.reduceat(y, starts)
    mean = np.add.reduceat(y, starts) / counts
    xc = (x[starts] + x[ends]) / 2.0
    return xc, lo, hi, mean


def windows(x, weights, x0: float, x1: float, n: int):
    """Sums of ``weights`` over ``n`` equal windows of [x0, x1] (points outside go to the ends).

    Returns
    -------
    (edges, sums) : numpy.ndarray of n + 1 and n values
    """
    n = max(1, int(n))
    if not x1 > x0:
        x1 = x0 + 1.0
    edges = np.linspace(x0, x1, n + 1)
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(w)
    if not ok.all():
        x, w = x[ok], w[ok]
    idx = np.clip(((x - x0) / (x1 - x0) * n).astype(np.int64), 0, n - 1)
    return edges, np.bincount(idx, weights=w, minlength=n)[:n]


def window_count(n_points: int, lo: int = 10, hi: int = 200, per: int = 40) -> int:
    """A number of time windows for a series of ``n_points`` points: ``per`` points each, within [lo, hi]."""
    return int(min(hi, max(lo, n_points // per)))


def cdf(values, max_points: int = MAX_POINTS):
    """An empirical CDF: sorted values and the fraction of values at or below each.

    NaN values are dropped.  With more than ``max_points`` values the CDF is
    sampled at evenly spaced ranks, keeping the smallest and largest value.

    Returns
    -------
    (x, p) : numpy.ndarray
        ``x[i]`` is the value of rank ``r`` (0-based) in sorted order and
        ``p[i] = (r + 1) / n``, so a step plot of (x, p) is the empirical CDF.
    """
    v = np.asarray(values, dtype=np.float64)
    v = np.sort(v[np.isfinite(v)])
    n = len(v)
    if n == 0:
        return v, v.copy()
    ranks = np.arange(n) if n <= max_points else np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
    return v[ranks], (ranks + 1) / n


__all__ = ["MAX_POINTS", "band", "cdf", "m4", "m4_index", "m4_shared", "window_count", "windows"]
