"""Every knob of every spec kind is applied: a grid of one knob resolves to a configuration other than
the base's, through the spec a user writes (sweep, capacity, a pipeline's [capacity] section).

The walk is generated from the knob catalogue (:data:`aisim.sweep.knobs.KNOBS`): a knob the
catalogue gains without a value here fails ``test_every_knob_has_a_value``, and a spec kind must
take each knob or refuse it with a reason (:data:`~aisim.sweep.knobs.REFUSED`).
"""

import json

import pytest

from aisim.capacity.search import grid_points
from aisim.capacity.spec import capacity_from_dict
from aisim.config.deployment import parse_deployment
from aisim.config.versions import DEFAULT_VLLM_VERSION, SUPPORTED_VLLM_VERSIONS
from aisim.errors import ConfigError
from aisim.pipeline.spec import spec_from_dict
from aisim.sweep.knobs import KNOBS, POOL_KNOBS, REFUSED, SPEC_KNOBS, resolve
from aisim.sweep.runner import candidates, sweep_from_dict

BASE = {"model": "m", "block_size": 16, "num_gpu_blocks": 1024, "max_model_len": 4096,
        "max_num_batched_tokens": 8192, "kv_cache_groups": [{"type": "full", "page_size_bytes": 4096}],
        "time_model": {"kind": "linear", "base_s": 0.01}}
# One value per knob, each other than the base's resolved value (and accepted by the rules).
VALUES = {
    "num_gpu_blocks": 2048, "block_size": 32, "max_num_seqs": 8, "max_num_batched_tokens": 4096,
    "max_num_scheduled_tokens": 1024, "max_num_active_seqs": 4, "max_model_len": 2048,
    "enable_chunked_prefill": False, "enable_prefix_caching": False, "long_prefill_token_threshold": 512,
    "long_prefill_token_threshold_adaptive": True, "policy": "priority", "scheduler_reserve_full_isl": False,
    "watermark": 0.01, "async_scheduling": True, "cache_aware_admission_window": 8,
    "cache_aware_admission_threshold": 0.25, "scheduler_extra": {"cache_aware_admission_window": 4},
    "kv_cache_groups": [{"type": "full", "page_size_bytes": 8192}],
    "mamba_cache_mode": "align", "prefix_match_unit": 16, "prefix_cache_retention_interval": 4,
    "cache_extra": {"prefix_cache_retention_interval": 2},
    "vllm_version": next(v for v in SUPPORTED_VLLM_VERSIONS if v != DEFAULT_VLLM_VERSION),
    "time_model": {"kind": "linear", "base_s": 0.02}, "speculative": {"num_speculative_tokens": 2},
    "kv_offload": {"cpu_blocks": 4096}, "kv_offloading_size": 0.5,
    "model": "other", "kv_cache_bytes": 4096 * 4096, "startup_check": False,
    "replicas": 2, "router": "kv_aware", "prefill_replicas": 2, "decode_replicas": 2,
    "prefill_router": "kv_aware", "decode_router": {"kind": "least_loaded", "by": "tokens"},
    "rate_scale": 2.0, "poisson_rate": 5.0, "max_concurrency": 4,
}
AGGREGATED = {"replicas": 1, "router": "round_robin"}
DISAGGREGATED = {"prefill": {"replicas": 1}, "decode": {"replicas": 1}, "link": {"bandwidth_gb_s": 100.0}}
SLO = {"ttft_s": 1.0, "attainment": 0.9}


def test_every_knob_has_a_value():
    assert set(VALUES) == set(KNOBS)


@pytest.mark.parametrize("kind", ["sweep", "capacity"])
def test_every_kind_takes_or_refuses_every_knob(kind):
    taken = set(SPEC_KNOBS[kind]) | (set(SPEC_KNOBS["sweep_load"]) if kind == "sweep" else set())
    assert taken | set(REFUSED.get(kind, {})) == set(KNOBS)
    assert not taken & set(REFUSED.get(kind, {}))


def _base_deployment(knob):
    if KNOBS[knob] != "deployment":
        return None
    return DISAGGREGATED if knob in POOL_KNOBS else AGGREGATED


def _changed(point, base):
    """The knob's point resolves to another configuration than the base (engine, deployment, load)."""
    assert point.to_dict() != base.to_dict()


@pytest.mark.parametrize("knob", SPEC_KNOBS["sweep"] + SPEC_KNOBS["sweep_load"])
def test_a_sweep_applies_every_knob(tmp_path, knob):
    (tmp_path / "base.json").write_text(json.dumps(BASE))
    raw = {"name": "s", "database": "s.duckdb", "model": "m", "base": "base.json",
           "trace": {"paths": ["t.jsonl"]}, "slo": {"ttft_s": 1.0}}
    if KNOBS[knob] == "load":  # a load level: the grid varies something else (one value: the base's)
        raw["grid"], raw["load"] = {"max_num_seqs": [256]}, {knob: [VALUES[knob]]}
    else:
        raw["grid"] = {knob: [VALUES[knob]]}
    dep = _base_deployment(knob)
    if dep is not None:
        raw["deployment"] = dep
    spec = sweep_from_dict(raw, source="s.toml", base_dir=str(tmp_path))
    (cand,) = candidates(spec)
    assert cand.reason is None
    # What the candidate replays, against the base resolved without knobs.
    replayed = {"engine": cand.engine.to_dict(), "load": cand.load,
                "deployment": cand.deployment.to_dict() if cand.deployment is not None else None}
    assert replayed != resolve(BASE, spec.deployment, {}, "base").to_dict()


def _capacity_points(kind, tmp_path, knob):
    """The grid points of ``kind``'s smallest-deployment search with a grid of ``knob`` alone."""
    (tmp_path / "engine.json").write_text(json.dumps(BASE))
    fleet = {"max_replicas": 4, "grid": {knob: [VALUES[knob]]}}
    dep = _base_deployment(knob)
    if knob in POOL_KNOBS:
        fleet.update(splits=[[1, 1]], aggregated=False)
    if kind == "capacity":
        raw = {"name": "c", "database": "c.duckdb", "engine": "engine.json", "trace": {"path": "t.jsonl"},
               "slo": SLO, "fleet": fleet}
        if dep is not None:
            raw["deployment"] = dep
        spec = capacity_from_dict(raw, source="c.toml", base_dir=str(tmp_path))
        engine, params, deployment = spec.engine, spec.params, spec.deployment
    else:  # a pipeline spec's [capacity] section: the same grid on every shard's engine
        entry = "engine.json" if dep is None else {"engine": "engine.json", "deployment": dep}
        raw = {"name": "p", "database": "p.duckdb", "sources": [{"paths": ["t.jsonl"], "model": "m"}],
               "deployments": [{"model": "m", "engines": {"e": entry}}], "capacity": {"slo": SLO, "fleet": fleet}}
        spec = spec_from_dict(raw, source="p.toml", base_dir=str(tmp_path))
        e = spec.deployments[0].engines[0]
        engine, params, deployment = e.engine, spec.sections["capacity"].params, e.deployment
    base = deployment if deployment is not None else parse_deployment({})
    layouts = ([None] if params["aggregated"] else []) + params["splits"]
    return engine, base, list(grid_points(engine, base, params["grid"], layouts))


@pytest.mark.parametrize("kind", ["capacity", "pipeline"])
@pytest.mark.parametrize("knob", SPEC_KNOBS["capacity"])
def test_a_capacity_search_applies_every_knob(tmp_path, kind, knob):
    engine, base, points = _capacity_points(kind, tmp_path, knob)
    (name, layout, knobs, point), = points
    assert not isinstance(point, ConfigError), point
    assert knobs == {knob: VALUES[knob]}
    dep = base if layout is not None else grid_points.__globals__["_layout_deployment"](base, None, 1)
    _changed(point, resolve(engine.raw, dep, {}, "base", engine=engine))


def test_the_router_knob_changes_the_capacity_answer(tmp_path):
    # The same search on kv_aware and round_robin replicas: the deployments differ, so the points do.
    engine, base, points = _capacity_points("capacity", tmp_path, "router")
    assert points[0][3].deployment.router == "kv_aware"


@pytest.mark.parametrize("knob", sorted(REFUSED["capacity"]))
def test_a_capacity_grid_refuses_what_the_search_sets_itself(tmp_path, knob):
    (tmp_path / "engine.json").write_text(json.dumps(BASE))
    raw = {"name": "c", "database": "c.duckdb", "engine": "engine.json", "trace": {"path": "t.jsonl"},
           "slo": SLO, "fleet": {"max_replicas": 4, "grid": {knob: [VALUES[knob]]}}}
    with pytest.raises(ConfigError) as err:
        capacity_from_dict(raw, source="c.toml", base_dir=str(tmp_path))
    assert str(err.value).startswith(f"knob 'fleet.grid.{knob}' in c.toml is not taken here: ")


@pytest.mark.parametrize("grid, fleet, message", [
    ({"router": ["kv_aware"]}, {"aggregated": False, "splits": [[1, 1]]},
     "'fleet.grid.router' in c.toml sets the router of aggregated replicas, and 'fleet.aggregated' is false"),
    ({"prefill_router": ["kv_aware"]}, {},
     "'fleet.grid.prefill_router' in c.toml sets a pool of a prefill/decode split, and no 'fleet.splits' are given"),
])
def test_a_router_knob_of_a_layout_not_tried_is_refused(tmp_path, grid, fleet, message):
    (tmp_path / "engine.json").write_text(json.dumps(BASE))
    raw = {"name": "c", "database": "c.duckdb", "engine": "engine.json", "trace": {"path": "t.jsonl"},
           "slo": SLO, "fleet": {"max_replicas": 4, "grid": grid, **fleet}}
    with pytest.raises(ConfigError) as err:
        capacity_from_dict(raw, source="c.toml", base_dir=str(tmp_path))
    assert str(err.value).startswith(message)
