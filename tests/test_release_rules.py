"""The release table (aisim/config/versions.py) and the rules vLLM 0.34.0 added.

Every supported release is one row; the core reads its switches as ``RulesC``
and never a version number; the generated switch table is what
docs/vllm-version-rules.md holds.
"""

import os
import re

import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.config.versions import CORE_RULES, RELEASES, SUPPORTED_VLLM_VERSIONS, Rules, core_rules, rules_table
from aisim.errors import ConfigError

from helpers import run_log

FULL = {"num_gpu_blocks": 100, "max_model_len": 1584, "kv_cache_groups": [{"type": "full"}]}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_one_row_per_release_oldest_first():
    assert SUPPORTED_VLLM_VERSIONS == tuple(r.version for r in RELEASES)
    keys = [tuple(int(x) for x in v.split(".")) for v in SUPPORTED_VLLM_VERSIONS]
    assert keys == sorted(keys) and all(len(k) == 3 for k in keys)


def test_core_struct_has_exactly_the_core_switches():
    # ext/types.pxd RulesC: one bint per CORE_RULES entry, in that order.
    with open(os.path.join(ROOT, "ext", "types.pxd")) as fh:
        text = fh.read()
    body = text[text.index("ctypedef struct RulesC:"):]
    names = re.findall(r"^    bint (\w+)", body, flags=re.M)
    assert tuple(names) == CORE_RULES
    assert set(CORE_RULES) <= {f for f in Rules.__dataclass_fields__}
    assert list(core_rules("0.31.0").values()) == [False] * len(CORE_RULES)


def test_core_compares_no_version():
    # The core reads named switches only: outside comments, no `version` anywhere in ext/
    # (the release reaches it as RulesC).
    for name in sorted(os.listdir(os.path.join(ROOT, "ext"))):
        if name.endswith((".pyx", ".pxd", ".pxi")):
            with open(os.path.join(ROOT, "ext", name)) as fh:
                code = "\n".join(line.split("#")[0] for line in fh)
            assert not re.search(r"\bversion\b", code), name


def test_rules_document_holds_the_generated_table():
    with open(os.path.join(ROOT, "docs", "vllm-version-rules.md")) as fh:
        assert rules_table() in fh.read()


def test_block_size_default_follows_the_release():
    # CacheConfig.DEFAULT_BLOCK_SIZE: 16 up to 0.33.0, 64 in 0.34.0 (vllm/config/cache.py).
    for version, bs in (("0.33.0", 16), ("0.34.0", 64)):
        assert engine_config_from_dict(dict(FULL, vllm_version=version)).block_size == bs
    assert engine_config_from_dict(dict(FULL, vllm_version="0.34.0", block_size=16)).block_size == 16


def test_cache_aware_window_needs_a_release_that_has_it():
    with pytest.raises(ConfigError, match="vLLM 0.33.0 has no cache-aware admission"):
        engine_config_from_dict(dict(FULL, vllm_version="0.33.0", cache_aware_admission_window=4))
    with pytest.raises(ConfigError, match="'cache_aware_admission_threshold'"):
        engine_config_from_dict({"num_gpu_blocks": 100, "cache_aware_admission_threshold": 1.5})
    with pytest.raises(ConfigError, match="unknown key 'scheduler_extra.x'"):
        engine_config_from_dict({"num_gpu_blocks": 100, "scheduler_extra": {"x": 1}})


@pytest.mark.parametrize("version,first", [("0.33.0", 32), ("0.34.0", 100)])
def test_long_prefill_cap_needs_chunked_prefill(version, first):
    # Scheduler.schedule: two eligible requests, threshold 32, chunked prefill off.  0.33.0
    # caps a's 100-token prompt at 32 (a chunk although chunked prefill is off); 0.34.0
    # ignores the threshold without chunked prefill and schedules all 100, then b's 10.
    eng = dict(num_gpu_blocks=1000, block_size=16, max_num_batched_tokens=256, max_model_len=256,
               enable_chunked_prefill=False, long_prefill_token_threshold=32, enable_prefix_caching=False,
               vllm_version=version, kv_cache_groups=[{"type": "full"}])
    reqs = [dict(id="a", prompt=100, max_tokens=2, at=0), dict(id="b", prompt=10, max_tokens=2, at=0)]
    steps, _, _ = run_log(eng, reqs)
    assert steps[0]["sched"] == {"a": first, "b": 10}


def _aware(window, threshold=0.0, policy="fcfs"):
    # 40 usable blocks of 16 tokens.  Step 0 admits w (prompt 64 = 4 blocks of group g) alone
    # (max_num_seqs 1); it finishes after 2 outputs, leaving g's first 4 blocks cached.  Then
    # c (cold, 64 tokens) and h (g's 64 tokens + 16 private) wait, c first.  With the window
    # the plain waiting requests are ordered by cached prefix: h (64 cached) before c (0).
    eng = dict(num_gpu_blocks=41, block_size=16, max_num_batched_tokens=256, max_num_seqs=1, max_model_len=256,
               vllm_version="0.34.0", policy=policy, kv_cache_groups=[{"type": "full"}],
               scheduler_extra={"cache_aware_admission_window": window,
                                "cache_aware_admission_threshold": threshold})
    reqs = [dict(id="w", prompt=64, max_tokens=2, at=0, segments=[("g", 0, 64)]),
            dict(id="c", prompt=64, max_tokens=2, at=1),
            dict(id="h", prompt=80, max_tokens=2, at=1, segments=[("g", 0, 64), ("h", 0, 16)])]
    return run_log(eng, reqs)[0]


def test_cache_aware_window_admits_the_cached_prefix_first():
    steps = _aware(4)
    admitted = [next(iter(s["new"])) for s in steps.values() if s["new"]]
    assert admitted == ["w", "h", "c"]
    assert next(s for s in steps.values() if "h" in s["new"])["new"] == {"h": 64}


@pytest.mark.parametrize("kw", [dict(window=0), dict(window=4, threshold=0.9), dict(window=4, policy="priority")])
def test_cache_aware_window_off(kw):
    # Window 0, KV usage under the threshold (at most 5 of 40 blocks held), or the priority
    # policy (Scheduler.__init__ resolves the window to 0): arrival order.
    steps = _aware(**kw)
    admitted = [next(iter(s["new"])) for s in steps.values() if s["new"]]
    assert admitted == ["w", "c", "h"]


def test_cache_aware_window_in_the_recorded_log():
    # cache_aware_window, step 5 of the 0.34.0 log: r6 (cold) arrived before r7 (400 tokens
    # cached), KV usage 0.68 >= 0.5: r7 is admitted first.
    from test_oracle import _step

    line = _step("cache_aware_window", "0.34.0", 5)
    assert list(line["new"]) == ["r7", "r6"] and line["new"] == {"r7": 400, "r6": 0}


@pytest.mark.parametrize("version,async_scheduling,caching,expected", [
    ("0.34.0", False, True, True), ("0.33.0", False, True, False),
    ("0.34.0", True, True, False), ("0.34.0", False, False, False)])
def test_mamba_output_caching_is_the_sync_engine_with_mamba_and_caching(version, async_scheduling, caching, expected):
    # Scheduler.update_from_output (0.34.0): has_mamba_layers, not async_scheduling, prefix caching.
    from aisim.core_input import core_config

    raw = {"num_gpu_blocks": 10000, "block_size": 64, "max_model_len": 4096, "vllm_version": version,
           "async_scheduling": async_scheduling, "enable_prefix_caching": caching,
           "kv_cache_groups": [{"type": "full", "prefix_cacheable": True, "page_size_bytes": 1},
                               {"type": "mamba", "prefix_cacheable": True, "page_size_bytes": 1,
                                "prefill_checkpoint_blocks": 0}]}
    if caching:
        raw["prefix_match_unit"] = 64
    assert core_config(engine_config_from_dict(raw)).mamba_output_caching is expected
    raw["kv_cache_groups"] = [{"type": "full"}]
    raw.pop("prefix_match_unit", None)
    assert core_config(engine_config_from_dict(raw)).mamba_output_caching is False
