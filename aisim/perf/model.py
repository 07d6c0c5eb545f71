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
        and its release's padding rule (:func:`aisim.perf.graphs.graph_sizes`).  None: synchronous, no graphs.
    """
    if tm.kind == "linear":
        return None
    if tm.kind == "roofline":
        from aisim.config.catalog import get_gpu
        from aisim.config.versions import release
        from aisim.perf.graphs import graph_sizes
        from aisim.perf.roofline import roofline_args

        if engine is None:
            return roofline_args(tm)
        spec = engine.speculative
        g = graph_sizes(release(engine.version).cudagraph_rule, int(engine.max_num_seqs),
                        int(engine.max_num_batched_tokens), get_gpu(tm.gpu).capability,
                        int(spec.num_speculative_tokens) if spec else 0)
        return roofline_args(tm, bool(engine.async_scheduling), g.tokens, g.decode, g.decode_q)
    from aisim.perf.table import table_args

    return table_args(tm.path)
