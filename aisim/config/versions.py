"""The vLLM releases whose rules aisim models, written once.

Everything that names a release (configuration validation, the grouped-prefix
rule, plans, the ``--vllm-version`` option, the README) reads it from here.
The differences between the releases are listed in ``docs/vllm-version-rules.md``.
"""

from __future__ import annotations

# The releases, oldest first.
SUPPORTED_VLLM_VERSIONS = ("0.31.0", "0.32.0", "0.33.0")
# What a configuration without ``vllm_version`` follows: the newest release.
DEFAULT_VLLM_VERSION = "0.33.0"
# Releases that need the prefill-checkpoint geometry of every prefix-cacheable
# state group (vLLM 0.32.0 and later checkpoint Mamba state inside long prefills).
CHECKPOINT_GEOMETRY_VERSIONS = frozenset({"0.32.0", "0.33.0"})


# What ``vllm serve`` of each release starts with where aisim's engine keys default otherwise
# (``aisim plan`` writes them; the batch limits by GPU are aisim.plan.serve_batch_defaults):
# - async_scheduling: ``SchedulerConfig.async_scheduling`` is None until ``VllmConfig.__post_init__``
#   (vllm/config/vllm.py) turns it on, unless a pooling model, a speculative method or executor that
#   cannot run it, or pipeline parallelism on the V1 runner turns it off (0.31.0, 0.32.0, 0.33.0 alike);
# - block_size: ``CacheConfig.DEFAULT_BLOCK_SIZE`` (vllm/config/cache.py), raised for hybrid models
#   (aisim.config.geometry.kv_cache_groups);
# - gpu_memory_utilization: the ``CacheConfig`` field's default (vllm/config/cache.py), which
#   ``EngineArgs`` takes (vllm/engine/arg_utils.py).
SERVE_DEFAULTS = {
    "0.31.0": {"async_scheduling": True, "block_size": 16, "gpu_memory_utilization": 0.92},
    "0.32.0": {"async_scheduling": True, "block_size": 16, "gpu_memory_utilization": 0.92},
    "0.33.0": {"async_scheduling": True, "block_size": 16, "gpu_memory_utilization": 0.92},
}


def is_supported(version) -> bool:
    """Whether aisim models the rules of vLLM ``version``."""
    return version in SUPPORTED_VLLM_VERSIONS


def version_code(version: str) -> int:
    """The code the replay core compares releases by: the minor number (31, 32, 33).

    The core's rules are written as ``version >= 32`` and the like.
    """
    return int(version.split(".")[1])


def supported_text(sep: str = " and ") -> str:
    """The supported releases as prose, e.g. ``"0.31.0, 0.32.0 and 0.33.0"``."""
    if len(SUPPORTED_VLLM_VERSIONS) < 3 or sep != " and ":
        return sep.join(SUPPORTED_VLLM_VERSIONS)
    return ", ".join(SUPPORTED_VLLM_VERSIONS[:-1]) + " and " + SUPPORTED_VLLM_VERSIONS[-1]
