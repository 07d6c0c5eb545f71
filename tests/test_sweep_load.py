"""Load as an axis: arrivals scaled or re-timed as a Poisson process, in replay, pipeline and sweep."""

import json

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.errors import ConfigError, SpecError, SweepError
from aisim.pipeline.run import run_pipeline
from aisim.pipeline.runkey import resolve_inputs, run_key
from aisim.pipeline.spec import spec_from_dict
from aisim.sweep import load_sweep, run_sweep
from aisim.sweep.runner import sweep_from_dict
from aisim.traces import from_frame
from aisim.traces.load import Retimer, check_load, describe_load, retime

from test_sweep import _write


def _steps(arrivals):
    n = len(arrivals)
    return from_frame(pa.table({"request_id": [f"r{i}" for i in range(n)], "prompt_len": [10] * n,
                                "max_tokens": [2] * n, "arrival_step": arrivals}))


def _timed(arrivals):
    n = len(arrivals)
    return from_frame(pa.table({"request_id": [f"r{i}" for i in range(n)], "prompt_len": [10] * n,
                                "max_tokens": [2] * n, "arrival_time": arrivals}))


def _poisson(n, rate, seed):
    """By hand: the first request at 0 s, then one exponential gap (mean 1/rate) per request, summed in order."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    out, t = [0.0], 0.0
    for g in gaps[1:]:
        t = t + float(g)
        out.append(t)
    return out


def test_rate_scale_divides_arrivals():
    assert retime(_steps([0, 3, 4, 7, 9]), rate_scale=2).column("arrival_step").to_pylist() == [0, 1, 2, 3, 4]
    assert retime(_steps([0, 3, 4, 7, 9]), rate_scale=0.5).column("arrival_step").to_pylist() == [0, 6, 8, 14, 18]
    t = retime(_timed([0.0, 0.3, 0.9]), rate_scale=3)
    assert t.column("arrival_s").to_pylist() == [0.0, 0.3 / 3, 0.9 / 3]
    assert t.schema.metadata[b"clock"] == b"time"


def test_poisson_retiming_is_seeded_and_the_same_in_pieces():
    t = retime(_steps([0, 3, 4, 7, 9, 9, 20]), poisson_rate=4, seed=1)
    assert t.schema.metadata[b"clock"] == b"time"
    assert t.column("arrival_s").to_pylist() == _poisson(7, 4, 1)
    assert t.column("arrival_step").null_count == 7
    assert t.column("request_id").to_pylist() == [f"r{i}" for i in range(7)]  # trace order kept
    assert retime(_steps([0] * 7), poisson_rate=4, seed=1).column("arrival_s").equals(t.column("arrival_s"))
    assert retime(_steps([0] * 7), poisson_rate=4, seed=2).column("arrival_s") != t.column("arrival_s")
    assert retime(_steps([0] * 7), poisson_rate=4).column("arrival_s").to_pylist() == _poisson(7, 4, 0)
    trace = _steps(list(range(1000)))
    whole = retime(trace, poisson_rate=50, seed=3).column("arrival_s")
    r = Retimer({"poisson_rate": 50.0, "seed": 3}, timed=False)
    pieces = [r(trace.slice(i, k)) for i, k in ((0, 1), (1, 6), (7, 400), (407, 593))]
    assert r.timed and pa.concat_tables(pieces).column("arrival_s").equals(whole)


@pytest.mark.parametrize("load, message", [
    ({"rate_scale": 2, "poisson_rate": 1}, "'rate_scale' and 'poisson_rate' are alternatives; give one"),
    ({"rate_scale": 0}, "'rate_scale' must be a finite positive number, got 0"),
    ({"poisson_rate": float("nan")}, "'poisson_rate' must be a finite positive number, got nan"),
    ({"rate_scale": 2, "seed": 1}, "'seed' seeds a Poisson re-timing; set 'poisson_rate'"),
    ({"poisson_rate": 2, "seed": -1}, "'seed' must be a non-negative integer, got -1"),
    ({"rate": 2}, "unknown key 'rate'; known keys: rate_scale, poisson_rate, seed, max_concurrency"),
])
def test_bad_load_is_named(load, message):
    with pytest.raises(ConfigError) as exc:
        check_load(load)
    assert str(exc.value) == message


def test_describe_load():
    assert describe_load({}) == "as traced" and describe_load({"rate_scale": 2.0}) == "rate x2"
    assert describe_load({"poisson_rate": 5.0}) == "Poisson 5 req/s (seed 0)"


def _oracle(tmp_path, lines):
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "e.json").write_text(json.dumps({"num_gpu_blocks": 100, "max_model_len": 64}))


def test_the_replay_command_scales_and_retimes(tmp_path):
    # Two requests one second apart; twice the rate sends the second at 0.5 s.
    _oracle(tmp_path, [{"request_id": "a", "prompt_len": 10, "max_tokens": 2, "arrival_time": 0.0},
                       {"request_id": "b", "prompt_len": 10, "max_tokens": 2, "arrival_time": 1.0}])
    args = ["replay", "--engine", str(tmp_path / "e.json"), "--trace", str(tmp_path / "t.jsonl")]
    r = CliRunner().invoke(main, args + ["--rate-scale", "2", "--out", str(tmp_path / "x2")])
    assert r.exit_code == 0, r.output
    assert pq.read_table(tmp_path / "x2" / "requests.parquet").column("arrival_s").to_pylist() == [0.0, 0.5]
    r = CliRunner().invoke(main, args + ["--poisson-rate", "4", "--seed", "1", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    assert pq.read_table(tmp_path / "p" / "requests.parquet").column("arrival_s").to_pylist() == _poisson(2, 4, 1)
    r = CliRunner().invoke(main, args + ["--rate-scale", "2", "--poisson-rate", "4"])
    assert r.output == "error: --rate-scale and --poisson-rate are alternatives; give one\n"
    r = CliRunner().invoke(main, args + ["--rate-scale", "2", "--closed-loop"])
    assert r.exit_code == 2 and "shape open-loop replays" in r.output


def _pipeline(tmp_path, replay):
    return spec_from_dict({
        "name": "p", "database": str(tmp_path / "p.duckdb"),
        "sources": [{"paths": [str(tmp_path / "t.jsonl")], "format": "oracle", "model": "m"}],
        "deployments": [{"model": "m", "engines": {"e": {"num_gpu_blocks": 100, "max_model_len": 64}}}],
        "replay": replay}, base_dir=str(tmp_path))


def test_the_pipeline_retimes_each_model_s_trace(tmp_path):
    _oracle(tmp_path, [{"request_id": f"r{i}", "prompt_len": 10, "max_tokens": 2, "arrival_time": float(i)}
                       for i in range(4)])
    plain = _pipeline(tmp_path, {})
    key = run_key(plain, resolve_inputs(plain))
    assert run_key(_pipeline(tmp_path, {"rate_scale": 2}), resolve_inputs(plain)) != key
    report = run_pipeline(_pipeline(tmp_path, {"rate_scale": 2}), scheduler="sync")
    poisson = run_pipeline(_pipeline(tmp_path, {"poisson_rate": 4, "seed": 1}), scheduler="sync")
    with duckdb.connect(str(tmp_path / "p.duckdb"), read_only=True) as con:
        # 0, 1, 2 and 3 s at twice the rate.
        got = con.execute("SELECT r.arrival_s FROM requests r WHERE r.run_id = ? ORDER BY r.request_id",
                          [report.run_id]).fetchall()
        assert [a for (a,) in got] == [0.0, 0.5, 1.0, 1.5]
        got = con.execute("SELECT r.arrival_s FROM requests r WHERE r.run_id = ? ORDER BY r.request_id",
                          [poisson.run_id]).fetchall()
        assert [a for (a,) in got] == _poisson(4, 4, 1)
        assert con.execute("SELECT clock FROM shards WHERE run_id = ?", [poisson.run_id]).fetchone() == ("time",)
    with pytest.raises(SpecError, match=r"'replay.rate_scale' and 'replay.poisson_rate' are alternatives"):
        _pipeline(tmp_path, {"rate_scale": 2, "poisson_rate": 1})
    with pytest.raises(SpecError, match=r"'replay.rate_scale'.* shapes open-loop replays"):
        _pipeline(tmp_path, {"rate_scale": 2, "closed_loop": True})


def test_a_sweep_with_load_levels(tmp_path):
    # Four requests one second apart, each served alone in a few 10 ms steps: at twice the rate
    # the last arrives 1.5 s earlier and the run is 1.5 s shorter, with the same four requests
    # meeting the SLO: each level's goodput is 4 / its duration, and twice the rate ranks first.
    # The two engines replay alike, so grid order settles their ties.
    trace = [{"request_id": f"r{i}", "prompt_len": 10, "max_tokens": 2, "arrival_time": float(i)} for i in range(4)]
    base = {"num_gpu_blocks": 100, "max_model_len": 64}
    path = _write(tmp_path, base, {"max_num_seqs": [4, 8]}, {"ttft_s": 1}, trace)
    with open(path, "a") as fh:
        fh.write("[load]\nrate_scale = [1.0, 2.0]\n")
    result = run_sweep(load_sweep(path), scheduler="sync")
    assert [c.knobs for c in result.candidates] == [{"max_num_seqs": 4, "rate_scale": 1.0},
                                                    {"max_num_seqs": 8, "rate_scale": 1.0},
                                                    {"max_num_seqs": 4, "rate_scale": 2.0},
                                                    {"max_num_seqs": 8, "rate_scale": 2.0}]
    assert len(result.run_ids) == 2 and result.candidates[0].run_id == result.run_ids[0]
    assert result.candidates[3].run_id == result.run_ids[1]
    assert [c.name for c in result.ranked] == ["c002", "c003", "c000", "c001"]
    with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as con:
        durations = dict(con.execute("SELECT run_id, max(duration_s) FROM summaries GROUP BY run_id").fetchall())
        landed = con.execute("SELECT candidate, run_id, rank FROM sweep_candidates ORDER BY candidate").fetchall()
    for c in result.candidates:
        assert c.goodput_req_s == 4 / durations[c.run_id]
    assert round(durations[result.run_ids[0]] - durations[result.run_ids[1]], 9) == 1.5
    assert landed == [("c000", result.run_ids[0], 3), ("c001", result.run_ids[0], 4),
                      ("c002", result.run_ids[1], 1), ("c003", result.run_ids[1], 2)]
    assert "at load rate x2 (a transform of the trace, not of the engine)" in (tmp_path / "best.toml").read_text()


@pytest.mark.parametrize("load, message", [
    ({"rate_scale": [1.0], "poisson_rate": [2.0]}, "'load' must give one of rate_scale, poisson_rate"),
    ({"rate_scale": [1.0, 1.0]}, "'load.rate_scale' repeats a value"),
    ({"rate_scale": []}, "'load.rate_scale' must be a non-empty list of levels"),
    ({"rate_scale": [2.0], "seed": 1}, "'load.seed' seeds a Poisson re-timing; set 'load.poisson_rate'"),
    ({"poisson_rate": [-1.0]}, "'load.poisson_rate' must be a finite positive number, got -1.0"),
    ({"rate": [1.0]}, "unknown key 'load.rate'; known keys: rate_scale, poisson_rate, max_concurrency, seed"),
])
def test_bad_load_axis_is_named(tmp_path, load, message):
    (tmp_path / "b.json").write_text('{"num_gpu_blocks": 10}')
    raw = {"name": "s", "database": "s.duckdb", "model": "m", "base": "b.json", "trace": {"paths": ["t.jsonl"]},
           "grid": {"max_num_seqs": [1]}, "slo": {"ttft_s": 1.0}, "load": load}
    with pytest.raises(SweepError) as exc:
        sweep_from_dict(raw, base_dir=str(tmp_path))
    assert str(exc.value).startswith(message)
