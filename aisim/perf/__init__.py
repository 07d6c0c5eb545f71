"""Step-time models: how long one engine step takes, in seconds.

``linear`` (coefficients), ``roofline`` (GPU and model specs from
:mod:`aisim.config.catalog`) and ``table`` (a profile of measured forward
passes).  :func:`step_time_args` turns an engine configuration's
``time_model`` into the plain arguments the compiled core evaluates.
"""

from aisim.perf.model import step_time_args

__all__ = ["step_time_args"]
