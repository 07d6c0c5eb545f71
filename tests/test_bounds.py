"""Bounds where the core would suffer: every number a configuration carries is finite and within the range the
replay core and memory can hold (the catalogue's ``high``, aisim/config/keys.py), refused with the key and the
range by the one validator every command goes through; no result is given with an inf or NaN time."""

import json
import math

import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.deployment import parse_deployment
from aisim.config.engine import engine_config_from_dict
from aisim.config.keys import (DEPLOYMENT_KEYS, DRAFTER_COST_KEYS, ENGINE_KEYS, GROUP_KEYS, LINK_KEYS, MAX_GROUPS,
                               MAX_SPEC_LEN, MAX_STEP_S, ROUTER_KEYS, SPECULATIVE_KEYS, TIME_MODEL_KEYS)
from aisim.errors import ConfigError, ReplayError
from aisim.traces.load import check_load

ENGINE = {"num_gpu_blocks": 64, "block_size": 16, "max_model_len": 512, "max_num_batched_tokens": 512}
TRACE = '{"request_id": "a", "prompt_len": 10, "max_tokens": 2, "arrival_time": 0.5}\n'


def _over(key):
    """A value just past ``key.high``: the next integer, or twice the float bound."""
    return key.high + 1 if isinstance(key.high, int) else key.high * 2


def _range(key, prefix=""):
    low = key.low if key.low is not None else 0
    if isinstance(key.high, float):
        return f"'{prefix}{key.name}' in e.json must be from {low:g} to {key.high:g}, got {_over(key)!r}"
    return f"'{prefix}{key.name}' in e.json must be from {low} to {key.high}, got {_over(key)!r}"


def _refused(raw, message):
    with pytest.raises(ConfigError) as err:
        engine_config_from_dict(raw, source="e.json")
    assert str(err.value) == message


# ------------------------------------------------------------- every bounded key of every catalogue


@pytest.mark.parametrize("key", [k for k in ENGINE_KEYS if k.high is not None], ids=lambda k: k.name)
def test_every_bounded_engine_key_is_refused_past_its_bound(key):
    raw = {**ENGINE, key.name: _over(key)}
    if key.name == "kv_cache_bytes":
        raw.pop("num_gpu_blocks")
    _refused(raw, _range(key))


@pytest.mark.parametrize("key", [k for k in TIME_MODEL_KEYS if k.high is not None], ids=lambda k: k.name)
def test_every_bounded_time_model_constant_is_refused_past_its_bound(key):
    kind = key.kinds[0] if key.kinds else "linear"
    extra = {"gpu": "H100", "model": "llama-3.1-8b"} if kind == "roofline" else {}
    _refused({**ENGINE, "time_model": {"kind": kind, **extra, key.name: _over(key)}}, _range(key, "time_model."))


@pytest.mark.parametrize("key", [k for k in GROUP_KEYS if k.high is not None], ids=lambda k: k.name)
def test_every_bounded_group_key_is_refused_past_its_bound(key):
    kind = key.kinds[0] if key.kinds else "sliding_window"
    group = {"type": kind, key.name: _over(key)}
    if kind == "sliding_window" and key.name != "sliding_window":
        group["sliding_window"] = 64
    _refused({**ENGINE, "kv_cache_groups": [group]}, _range(key, "kv_cache_groups[0]."))


def test_speculative_keys_are_bounded():
    (k,) = [x for x in SPECULATIVE_KEYS if x.high is not None]
    assert (k.name, k.high) == ("num_speculative_tokens", MAX_SPEC_LEN) and MAX_SPEC_LEN == 128
    _refused({**ENGINE, "speculative": {"num_speculative_tokens": 129}},
             "'speculative.num_speculative_tokens' in e.json must be from 1 to 128, got 129")
    assert engine_config_from_dict({**ENGINE, "speculative": {"num_speculative_tokens": 128}})
    for key in DRAFTER_COST_KEYS:
        _refused({**ENGINE, "speculative": {"num_speculative_tokens": 2, "drafter_cost": {key.name: _over(key)}}},
                 f"'speculative.drafter_cost.{key.name}' in e.json must be from 0 to 3600, got 7200.0")


@pytest.mark.parametrize("key", [k for k in ROUTER_KEYS if k.high is not None], ids=lambda k: k.name)
def test_every_bounded_router_option_is_refused_past_its_bound(key):
    kind = key.kinds[0]
    with pytest.raises(ConfigError) as err:
        parse_deployment({"replicas": 2, "router": {"kind": kind, key.name: _over(key)}}, source="e.json")
    assert str(err.value) == _range(key, "deployment.router.")


def test_link_and_replicas_are_bounded():
    (lat,) = [k for k in LINK_KEYS if k.high is not None]
    with pytest.raises(ConfigError) as err:
        parse_deployment({"prefill": {}, "decode": {}, "link": {"bandwidth_gb_s": 1, "latency_s": _over(lat)}},
                         source="e.json")
    assert str(err.value) == _range(lat, "deployment.link.")
    (replicas,) = [k for k in DEPLOYMENT_KEYS if k.high is not None]
    with pytest.raises(ConfigError, match=r"'deployment.replicas' in e.json must be an integer from 1 to 64, got 65"):
        parse_deployment({"replicas": _over(replicas)}, source="e.json")


# ------------------------------------------------------------- the cases that blew up


def test_a_group_count_in_the_hundreds_of_millions_is_refused_before_it_is_expanded():
    _refused({**ENGINE, "kv_cache_groups": [{"type": "full", "count": 300_000_000}]},
             "'kv_cache_groups[0].count' in e.json must be from 1 to 64, got 300000000")
    # Counts are added up: 40 + 25 groups are more than the core holds.
    _refused({**ENGINE, "kv_cache_groups": [{"type": "full", "count": 40}, {"type": "sliding_window",
                                                                               "sliding_window": 64, "count": 25}]},
             "'kv_cache_groups' in e.json give 65 groups (counts added up); the replay core holds from 1 to 64")


def test_the_group_bound_is_the_core_s():
    from aisim._core.constants import MAX_GROUPS as CORE_MAX_GROUPS

    assert MAX_GROUPS == CORE_MAX_GROUPS


def test_a_time_model_constant_near_the_largest_float_is_refused():
    _refused({**ENGINE, "time_model": {"base_s": 1.7e308}},
             "'time_model.base_s' in e.json must be from 0 to 3600, got 1.7e+308")
    assert MAX_STEP_S == 3600.0


@pytest.mark.parametrize("raw, message", [
    ({"rate_scale": 1e-300}, "'rate_scale' must be from 1e-06 to 1e+06, got 1e-300"),
    ({"poisson_rate": 1e-300}, "'poisson_rate' must be from 1e-06 to 1e+09, got 1e-300"),
    ({"max_concurrency": 2**31}, "'max_concurrency' must be from 1 to 2147483647, got 2147483648"),
])
def test_load_levels_are_bounded(raw, message):
    with pytest.raises(ConfigError) as err:
        check_load(raw)
    assert str(err.value) == message


def test_a_profile_whose_steps_overflow_is_refused(tmp_path):
    (tmp_path / "p.csv").write_text("batch_size,latency_s\n1,0.01\n2,1e308\n")
    _files(tmp_path, {**ENGINE, "time_model": {"kind": "table", "path": "p.csv"}})
    r = CliRunner().invoke(main, ["replay", "--engine", str(tmp_path / "e.json"), "--trace", str(tmp_path / "t.jsonl")])
    assert r.exit_code == 2
    assert r.output == (f"error: step-time profile {tmp_path / 'p.csv'}: 'latency_s' must be from 0 to 3600, "
                        "got 1e+308\n")


def test_no_summary_is_given_with_a_time_that_is_not_a_number():
    from aisim.summary import _refuse_non_finite

    engine = engine_config_from_dict(ENGINE)
    ok = {"clock_end_s": 1.0, **{n: {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": None}
                                 for n in ("ttft_s", "tpot_s", "e2e_s", "itl_s")}}
    _refuse_non_finite(ok, engine)
    with pytest.raises(ReplayError) as err:
        _refuse_non_finite({**ok, "e2e_s": {**ok["e2e_s"], "mean": math.inf}}, engine)
    assert str(err.value) == ("the replay's e2e_s mean is inf: the step times of the linear-default time model "
                              "overflow; no result is given")
    with pytest.raises(ReplayError, match="the replay's itl_s p99 is nan"):
        _refuse_non_finite({**ok, "itl_s": {**ok["itl_s"], "p99": math.nan}}, engine)


# ------------------------------------------------------------- one validator behind every command


def _files(tmp_path, engine):
    (tmp_path / "e.json").write_text(json.dumps(engine))
    (tmp_path / "t.jsonl").write_text(TRACE)
    (tmp_path / "s.toml").write_text('name = "s"\ndatabase = "s.duckdb"\nmodel = "m"\nbase = "e.json"\n'
                                     '[trace]\npath = "t.jsonl"\n[grid]\nmax_num_seqs = [1, 2]\n[slo]\nttft_s = 1\n')
    (tmp_path / "c.toml").write_text('name = "c"\ndatabase = "c.duckdb"\nengine = "e.json"\n[trace]\n'
                                     'path = "t.jsonl"\n[slo]\nttft_p99_s = 1\n[rate]\n')
    (tmp_path / "p.toml").write_text('name = "p"\ndatabase = "p.duckdb"\n[[sources]]\npaths = ["t.jsonl"]\n'
                                     'model = "m"\n[[deployments]]\nmodel = "m"\nengines = { e = "e.json" }\n')


def test_every_command_refuses_the_same_number_in_one_line(tmp_path):
    _files(tmp_path, {**ENGINE, "time_model": {"base_s": 1e308}})
    e = tmp_path / "e.json"
    line = f"'time_model.base_s' in {e} must be from 0 to 3600, got 1e+308"
    for args in (["config", "validate", e], ["replay", "--engine", e, "--trace", tmp_path / "t.jsonl"],
                 ["capacity", tmp_path / "c.toml"], ["pipeline", "check", tmp_path / "p.toml"]):
        r = CliRunner().invoke(main, [str(a) for a in args])
        assert r.exit_code == 2, (args, r.output)
        assert r.output.count("\n") == 1 and line in r.output, (args, r.output)
    # A sweep validates each candidate (a knob may replace the time model): each is refused by the same rule.
    r = CliRunner().invoke(main, ["sweep", str(tmp_path / "s.toml")])
    assert r.exit_code == 2
    assert r.output == ("error: every candidate of sweep s is refused; the first because: 'time_model.base_s' in "
                        'candidate c000 {"max_num_seqs": 1} must be from 0 to 3600, got 1e+308\n')


def test_query_slo_refuses_a_nan_threshold(tmp_path):
    import duckdb

    duckdb.connect(str(tmp_path / "q.duckdb")).close()
    r = CliRunner().invoke(main, ["query", "slo", "--db", str(tmp_path / "q.duckdb"), "--param", "ttft_s=nan"])
    assert r.exit_code == 2
    assert r.output == "error: parameter 'ttft_s' of query 'slo' must be a finite number, got 'nan'\n"


def test_a_rate_search_starts_and_stays_within_the_load_range(tmp_path):
    from aisim.capacity.spec import capacity_from_dict

    (tmp_path / "e.json").write_text(json.dumps(ENGINE))
    raw = {"name": "c", "database": "c.duckdb", "engine": "e.json", "trace": {"path": "t.jsonl"},
           "slo": {"ttft_p99_s": 1.0}, "rate": {"start": 1e-300}}
    with pytest.raises(ConfigError) as err:
        capacity_from_dict(raw, source="c.toml", base_dir=str(tmp_path))
    assert str(err.value) == "'rate.start' in c.toml must be from 1e-06 to 1e+09 (poisson_rate), got 1e-300"
