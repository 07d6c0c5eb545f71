"""The step-time model of an engine configuration, as core arguments."""

from __future__ import annotations


def step_time_args(tm, engine=None) -> dict | None:
    """``CoreConfig.step_time`` (aisim.core_input): roofline and table models; None for linear.

    Parameters
    ----------
    tm : aisim.config.engine.TimeModel
    engine : aisim.config.engine.EngineConfig, optional
        The engine ``tm`` belongs to: the roofline reads its ``async_scheduling`` (the CPU's time
        overlapped with the GPU's) and the CUDA-graph sizes its limits give
        (:func:`aisim.perf.graphs.capture_sizes`).  None: synchronous, no graphs.
    """
    if tm.kind == "linear":
        return None
    if tm.kind == "roofline":
        from aisim.config.catalog import get_gpu
        from aisim.perf.graphs import capture_sizes
        from aisim.perf.roofline import roofline_args

        if engine is None:
            return roofline_args(tm)
        spec = engine.speculative
        sizes = capture_sizes(int(engine.max_num_seqs), int(engine.max_num_batched_tokens),
                              get_gpu(tm.gpu).capability, int(spec.num_speculative_tokens) if spec else 0)
        return roofline_args(tm, bool(engine.async_scheduling), sizes)
    from aisim.perf.table import table_args

    return table_args(tm.path)
