"""aisim: replay LLM request traces through a faithful model of vLLM's v1 scheduler.

The public entry point is :func:`aisim.replay`; engine configurations come
from :mod:`aisim.config` and traces from :mod:`aisim.traces`.
"""

__version__ = "0.1.0"


def replay(trace, engine, **kwargs):
    """Replay ``trace`` on ``engine``; see :func:`aisim.replay.replay`."""
    from aisim.replay import replay as _replay

    return _replay(trace, engine, **kwargs)


__all__ = ["replay", "__version__"]
