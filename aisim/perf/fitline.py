"""The straight line through a kernel's published runs, shared by the tables that price kernels from them
(:mod:`aisim.perf.moe_kernel`, :mod:`aisim.perf.block_fp8`)."""

from __future__ import annotations


def least_squares_line(xs, ys) -> tuple[float, float]:
    """Ordinary least squares of ``ys`` on ``xs``: ``(intercept, slope)``."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope
