"""The step-time model of an engine configuration, as core arguments."""

from __future__ import annotations


def step_time_args(tm) -> dict | None:
    """``CoreConfig.step_time`` (aisim.core_input): roofline and table models; None for linear."""
    if tm.kind == "linear":
        return None
    if tm.kind == "roofline":
        from aisim.perf.roofline import roofline_args

        return roofline_args(tm)
    from aisim.perf.table import table_args

    return table_args(tm.path)
