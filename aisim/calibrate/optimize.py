"""A small deterministic least-squares solver (no SciPy): Levenberg-Marquardt.

Minimises ``sum(r(x)^2)`` for a residual function ``r`` of a few variables (Levenberg 1944,
Marquardt 1963; the damping scaled by the diagonal of ``J^T J``, as MINPACK's ``lmder``).  The
Jacobian is taken by forward differences (backward where the forward point is undefined), so
every step is a fixed sequence of evaluations: the same function and start give the same path,
bit for bit.  ``r`` returns non-finite values where it is undefined (a constant out of its range):
a step there is refused and the damping raised.
"""

from __future__ import annotations

import math

import numpy as np


def least_squares(residuals, x0, *, max_iter: int = 60, fd_step: float = 1e-2, xtol: float = 1e-7,
                  ftol: float = 1e-12, progress=None) -> tuple[np.ndarray, float, int]:
    """Minimise ``sum(residuals(x) ** 2)`` from ``x0``.

    Parameters
    ----------
    residuals : callable
        ``residuals(x) -> 1-d float array`` of a fixed length; non-finite where undefined.
    x0 : array_like
        The start (where ``residuals`` is defined).
    max_iter : int
        Jacobians taken at most.
    fd_step : float
        The finite-difference step on each variable.
    xtol, ftol : float
        Stop once a step moves no variable by more than ``xtol`` or lowers the cost by less than
        ``ftol`` relative to it.
    progress : callable, optional
        Called ``progress(iteration, x, cost)`` after each accepted step.

    Returns
    -------
    (numpy.ndarray, float, int)
        The solution, its cost ``sum(r ** 2)`` and the iterations made.

    Examples
    --------
    Fitting ``a exp(b t)`` to points of ``2 exp(-t)``:

    >>> t = np.linspace(0.0, 2.0, 5)
    >>> x, cost, _ = least_squares(lambda p: p[0] * np.exp(p[1] * t) - 2.0 * np.exp(-t), [1.0, 0.0])
    >>> [round(float(v), 6) for v in x]
    [2.0, -1.0]
    """
    x = np.asarray(x0, dtype=np.float64).copy()
    r = np.asarray(residuals(x), dtype=np.float64)
    if not np.all(np.isfinite(r)):
        raise ValueError("the residuals are not finite at the start")
    cost = float(r @ r)
    lam, n, it = 1e-3, x.size, 0
    while it < max_iter and cost > 0.0:
        it += 1
        jac = np.empty((r.size, n))
        for i in range(n):
            h = np.zeros(n)
            h[i] = fd_step
            ri = np.asarray(residuals(x + h), dtype=np.float64)
            if np.all(np.isfinite(ri)):
                jac[:, i] = (ri - r) / fd_step
            else:  # at the edge of the range: the backward difference
                jac[:, i] = (r - np.asarray(residuals(x - h), dtype=np.float64)) / fd_step
        a, g = jac.T @ jac, jac.T @ r
        scale = np.maximum(np.diag(a), 1e-12)
        while True:
            dx = np.linalg.solve(a + lam * np.diag(scale), -g)
            rn = np.asarray(residuals(x + dx), dtype=np.float64)
            cn = float(rn @ rn) if np.all(np.isfinite(rn)) else math.inf
            if cn < cost:
                break
            lam *= 10.0
            if lam > 1e12:
                return x, cost, it
        gain = cost - cn
        x, r, cost = x + dx, rn, cn
        lam = max(lam / 10.0, 1e-12)
        if progress is not None:
            progress(it, x, cost)
        if np.max(np.abs(dx)) <= xtol or gain <= ftol * cost:
            break
    return x, cost, it
