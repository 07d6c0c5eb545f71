"""Percentiles as numpy computes them by default, without ``np.percentile``'s import of ``numpy.ma``.

``np.percentile`` pulls in ``numpy.ma`` (tens of milliseconds) on its first call, a visible part of a
short ``aisim replay``.  :func:`percentiles` gives the same numbers, bit for bit (a test compares them):
numpy's ``linear`` method, the virtual index ``(n - 1) * q / 100`` and its two-sided interpolation.
:func:`weighted_stats` gives numpy's statistics of values each repeated a count of times, without
making the repeated array; :class:`Tally` keeps such (value, count) pairs merged as they arrive
(the gaps between a replay's streamed outputs, ``Engine.take_gaps``).
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
        out.append(_lerp(float(x[lo]), float(x[min(lo + 1, last)]), h - lo))
    return out


def _lerp(a: float, b: float, g: float) -> float:
    d = b - a
    # numpy's _lerp: from the nearer end, so an interpolation at g = 1 lands exactly on b.
    return b - d * (1 - g) if g >= 0.5 else a + d * g


def weighted_stats(values: np.ndarray, counts: np.ndarray, qs=(50, 90, 99)) -> tuple:
    """Mean, median, population standard deviation and ``qs`` percentiles of ``values`` each repeated
    ``counts`` times, as numpy gives them on the repeated array (without making it).

    Parameters
    ----------
    values : numpy.ndarray
        One-dimensional numbers (no NaN), any order, repeats allowed.
    counts : numpy.ndarray
        Positive integers, one per value; they sum to at least 1.
    qs : sequence of float
        Percentiles in [0, 100].

    Returns
    -------
    tuple
        ``(mean, median, std, [percentile of each q])``, floats.
    """
    values = np.asarray(values, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    if bool(np.all(values[1:] >= values[:-1])):
        x, w = values, counts  # ascending already (a tally's pairs): the stable sort keeps the order
    else:
        order = np.argsort(values, kind="stable")
        x, w = values[order], counts[order]
    cum = np.cumsum(w)
    n = int(cum[-1])

    def at(j: int) -> float:  # the j-th (0-based) value of the repeated, sorted array
        return float(x[np.searchsorted(cum, j, side="right")])

    mean = float((x * w).sum()) / n
    with np.errstate(over="ignore"):   # a calibration's trial constants may price steps past 1e154 s: inf
        std = math.sqrt(float((w * (x - mean) ** 2).sum()) / n)
    mid = n // 2
    median = at(mid) if n % 2 else (at(mid - 1) + at(mid)) / 2
    out = []
    for q in qs:
        h = (n - 1) * (q / 100)
        lo = math.floor(h)
        out.append(_lerp(at(lo), at(min(lo + 1, n - 1)), h - lo))
    return mean, median, std, out


class Tally:
    """(value, count) pairs given in pieces, kept merged: each distinct value once, with its count.

    Memory follows the distinct values, not the pairs given: pieces are merged (sorted, equal
    values' counts added) whenever the pieces waiting outgrow what is merged.  The counts add up
    exactly (int64).
    """

    def __init__(self):
        self._values = np.zeros(0, dtype=np.float64)
        self._counts = np.zeros(0, dtype=np.int64)
        self._parts = []
        self._waiting = 0

    def add(self, values, counts) -> None:
        """Count ``counts[i]`` more of each ``values[i]``."""
        values = np.asarray(values, dtype=np.float64)
        if values.size == 0:
            return
        if not self._values.size and not self._parts and bool(np.all(values[1:] > values[:-1])):
            # Merged already (each value once, ascending; a replay's merged gaps): kept as they are.
            self._values, self._counts = values, np.asarray(counts, dtype=np.int64)
            return
        self._parts.append((values, np.asarray(counts, dtype=np.int64)))
        self._waiting += values.size
        if self._waiting > max(65536, 2 * self._values.size):
            self._merge()

    def _merge(self) -> None:
        if not self._parts:
            return
        v = np.concatenate([self._values] + [p[0] for p in self._parts])
        c = np.concatenate([self._counts] + [p[1] for p in self._parts])
        v, c = _sorted_pairs(v, c) if v.size else (v, c)
        starts = np.flatnonzero(np.concatenate(([True], v[1:] != v[:-1]))) if v.size else np.zeros(0, np.int64)
        self._values, self._counts = v[starts], np.add.reduceat(c, starts) if v.size else c
        self._parts, self._waiting = [], 0

    def pairs(self) -> tuple:
        """``(values, counts)``: every distinct value, ascending, and its count."""
        self._merge()
        return self._values, self._counts

    @property
    def n(self) -> int:
        """The values counted (the counts' sum)."""
        return int(self._counts.sum()) + sum(int(p[1].sum()) for p in self._parts)


def _sorted_pairs(v: np.ndarray, c: np.ndarray) -> tuple:
    """``(v, c)`` (not empty) ordered by ``v`` as a stable sort orders them, up to the order of equal
    values' counts (added up after, their order among themselves does not matter).

    Equal values can be told apart only as 0.0 and -0.0 (the first of the run is kept) and NaNs
    (each its own run).  Without those, the pairs are sorted as one key each when they fit one
    (:func:`_packed_pairs`); else, as with them, by numpy's stable sort (which merges the ascending
    runs a replay's gaps come in: half the time of its default sort on them).
    """
    packed = _packed_pairs(v, c)
    if packed is not None:
        return packed
    order = np.argsort(v, kind="stable")
    return v[order], c[order]


# The bits of +inf: a float64 whose bits are at most these is +0.0, positive or +inf (no -0.0, no NaN).
_INF_BITS = np.uint64(0x7FF0000000000000)


def _packed_pairs(v: np.ndarray, c: np.ndarray):
    """:func:`_sorted_pairs` by one sort of 64-bit keys, or None where the pairs do not fit one.

    The bits of floats from +0.0 to +inf order as the floats do, and two such floats are equal
    exactly when their bits are: each pair is the key (bits - smallest bits) shifted left past the
    counts' bits, or'ed with its count (counts from 0, values a replay's gaps: a span of about 55
    bits and counts of a few bits).  One sort of the keys (much faster than an argsort) orders
    the pairs by value; the values and counts are read back from the sorted keys.
    """
    bits = v.view(np.uint64)
    lo, hi = bits.min(), bits.max()
    cmin, cmax = int(c.min()), int(c.max())
    if hi > _INF_BITS or cmin < 0:
        return None
    shift = max(cmax.bit_length(), 1)
    if shift + int(hi - lo).bit_length() > 64:
        return None
    keys = (bits - lo) << np.uint64(shift)
    keys |= c.astype(np.uint64)
    # A replay's gaps come in long ascending runs (a quiet stretch's steps each a little longer than
    # the last; merged pieces each sorted already): numpy's stable sort (a merge of runs) takes a
    # third of the time of its default one on them.  Equal keys are equal bits: either order is one.
    keys.sort(kind="stable")
    counts = (keys & np.uint64((1 << shift) - 1)).view(np.int64)
    keys >>= np.uint64(shift)
    keys += lo
    return keys.view(np.float64), counts
