"""One SLO shape and one [trace] shape: a sweep spec and a capacity spec take the same keys, validated by the
same code (aisim.sweep.slo, aisim.sweep.runner.trace_table), and refuse what they cannot act on with the reason."""

import json

import pytest

from aisim.capacity.spec import capacity_from_dict
from aisim.errors import ConfigError, SweepError
from aisim.sweep.runner import sweep_from_dict
from aisim.sweep.slo import KEYS, slo_from_dict

ENGINE = {"num_gpu_blocks": 64, "block_size": 16, "max_model_len": 512, "max_num_batched_tokens": 512}


def _sweep(tmp_path, slo, trace=None):
    (tmp_path / "e.json").write_text(json.dumps(ENGINE))
    raw = {"name": "s", "database": "s.duckdb", "model": "m", "base": "e.json", "grid": {"max_num_seqs": [1, 2]},
           "trace": trace or {"paths": ["t.jsonl"]}, "slo": slo}
    return sweep_from_dict(raw, source="s.toml", base_dir=str(tmp_path))


def _capacity(tmp_path, slo, trace=None):
    (tmp_path / "e.json").write_text(json.dumps(ENGINE))
    raw = {"name": "c", "database": "c.duckdb", "engine": "e.json", "trace": trace or {"path": "t.jsonl"},
           "slo": slo, "rate": {}}
    return capacity_from_dict(raw, source="c.toml", base_dir=str(tmp_path))


def test_the_thresholds_are_the_latency_columns():
    from aisim.columns import LATENCIES
    from aisim.sweep.slo import SLO_KEYS

    assert SLO_KEYS == LATENCIES


def test_a_percentile_only_slo_needs_no_attainment(tmp_path):
    spec = _capacity(tmp_path, {"ttft_p99_s": 0.5})
    assert spec.slo.attainment is None and spec.slo.to_dict() == {"ttft_p99_s": 0.5}
    assert spec.slo.describe() == "ttft_p99_s <= 0.5"
    with pytest.raises(ConfigError) as err:
        _capacity(tmp_path, {"ttft_p99_s": 0.5, "attainment": 0.9})
    assert str(err.value) == ("'slo.attainment' in c.toml is the share of requests within the thresholds (ttft_s, "
                              "tpot_s, e2e_s), and none is given: a percentile-only SLO needs none")


def test_thresholds_in_a_capacity_search_need_the_share():
    slo = {"ttft_s": 0.5, "attainment": 0.95, "ttft_p99_s": 1.0}
    assert slo_from_dict(slo).describe() == "0.95 of requests within ttft_s <= 0.5; ttft_p99_s <= 1"


def test_the_capacity_spec_names_the_missing_share(tmp_path):
    with pytest.raises(ConfigError) as err:
        _capacity(tmp_path, {"ttft_s": 0.5})
    assert str(err.value) == ("missing key 'slo.attainment' in c.toml: the share of requests that must meet the "
                              "thresholds (ttft_s), 0 < share <= 1 (a percentile-only SLO needs none)")


@pytest.mark.parametrize("slo, message", [
    ({"ttft": 1.0}, f"unknown key 'slo.ttft' in {{}}; known keys: {', '.join(KEYS)}"),
    ({"ttft_s": float("nan")}, "'slo.ttft_s' in {} must be a finite positive number of seconds, got nan"),
    ({"tpot_s": 0}, "'slo.tpot_s' in {} must be a finite positive number of seconds, got 0"),
])
def test_sweep_and_capacity_refuse_a_bad_slo_alike(tmp_path, slo, message):
    with pytest.raises(SweepError) as s:
        _sweep(tmp_path, slo)
    with pytest.raises(ConfigError) as c:
        _capacity(tmp_path, {**slo, "attainment": 0.9})
    assert str(s.value) == message.format("s.toml")
    assert str(c.value) == message.format("c.toml")


@pytest.mark.parametrize("key", ["attainment", "ttft_p99_s"])
def test_a_sweep_refuses_what_it_does_not_rank_by(tmp_path, key):
    with pytest.raises(SweepError) as err:
        _sweep(tmp_path, {"ttft_s": 1.0, key: 0.9})
    assert str(err.value) == (f"'slo.{key}' in s.toml: a sweep ranks its candidates by goodput, the requests within "
                              "the thresholds (ttft_s, tpot_s, e2e_s) per second; an attainment or a percentile limit "
                              "is a capacity question: give it in '[capacity.slo]'")


def test_sweep_and_capacity_take_the_same_trace_keys(tmp_path):
    for trace in ({"path": "t.jsonl"}, {"paths": ["t.jsonl"]}):
        assert _sweep(tmp_path, {"ttft_s": 1.0}, trace).trace["paths"] == [str(tmp_path / "t.jsonl")]
        assert _capacity(tmp_path, {"ttft_p99_s": 1.0}, trace).trace["path"] == str(tmp_path / "t.jsonl")
    with pytest.raises(ConfigError) as err:
        _capacity(tmp_path, {"ttft_p99_s": 1.0}, {"paths": ["a.jsonl", "b.jsonl"]})
    assert str(err.value).startswith("'trace.paths' in c.toml names 2 files; a capacity search replays one trace")
    with pytest.raises(SweepError) as err:
        _sweep(tmp_path, {"ttft_s": 1.0}, {"path": "a.jsonl", "paths": ["b.jsonl"]})
    assert str(err.value) == "'trace' in s.toml must give 'path' (a trace file) or 'paths' (a list of them), not both"
