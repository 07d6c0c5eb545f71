"""Step-time models: how long one engine step takes, in seconds.

``linear`` (coefficients), ``roofline`` (each operator of a step priced by
its own roofline from GPU and model specs, :mod:`aisim.perf.roofline`; vLLM's
CUDA-graph sizes, :mod:`aisim.perf.graphs`; the routed experts' kernel,
:mod:`aisim.perf.moe_kernel`; the block-FP8 products' kernel, :mod:`aisim.perf.block_fp8`) and ``table`` (a profile of measured forward
passes).  :func:`step_time_args` turns an engine configuration's
``time_model`` into the plain arguments the compiled core evaluates.
"""

from aisim.perf.model import step_time_args

__all__ = ["step_time_args"]
