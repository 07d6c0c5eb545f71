"""A client that keeps at most N requests in flight (``vllm bench serve --max-concurrency``)."""

import json

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.engine import engine_config_from_dict
from aisim.errors import ConfigError, SpecError
from aisim.pipeline.run import run_pipeline
from aisim.pipeline.spec import spec_from_dict
from aisim.replay import replay, replay_stream
from aisim.traces import from_frame
from aisim.traces.load import describe_load

from test_deploy import _engine, _log, _timed

SCENARIOS = ["timed", "full_pressure", "full_pressure_async", "hybrid_mamba_pressure", "bench_full"]


def _trace(arrivals, max_tokens=3):
    n = len(arrivals)
    return from_frame(pa.table({"request_id": [f"r{i}" for i in range(n)], "prompt_len": [10] * n,
                                "max_tokens": [max_tokens] * n, "arrival_time": arrivals}))


def _clock(steps):
    """The engine clock after ``steps`` 10 ms steps, added one at a time as the core adds them."""
    t = 0.0
    for _ in range(steps):
        t += 0.01
    return t


def test_a_request_waits_for_a_finish_by_hand():
    # 10 ms per step (the linear default); every request takes 3 steps (prefill + first token, two decodes).
    # Cap 2: r0, r1 run from 0 and finish at 0.03; r2, r3 are sent then and finish at 0.06; r4, due at
    # 0.05 while two are in flight, is sent at 0.06 and finishes at 0.09.
    eng = engine_config_from_dict({"num_gpu_blocks": 100, "max_model_len": 64})
    trace = _trace([0.0, 0.0, 0.0, 0.0, 0.05])
    got = replay(trace, eng, max_concurrency=2).requests.to_pydict()
    assert got["arrival_s"] == [0.0, 0.0, _clock(3), _clock(3), _clock(6)]
    assert got["finish_s"] == [_clock(3), _clock(3), _clock(6), _clock(6), _clock(9)]
    assert got["ttft_s"] == [a - b for a, b in zip([_clock(1), _clock(1), _clock(4), _clock(4), _clock(7)],
                                                    got["arrival_s"])]
    free = replay(trace, eng).requests.to_pydict()
    assert free["arrival_s"] == [0.0, 0.0, 0.0, 0.0, 0.05] and free["finish_s"][:4] == [_clock(3)] * 4


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("cap", [1, 3, 16])
def test_a_capped_replay_is_the_replay_of_its_send_times(scenario, cap):
    """Capped, each request is sent at a clock the core reached (its arrival, or the end of the iteration
    that freed the cap), and picked up then; a plain replay of the trace re-timed to those send times makes
    every decision alike (same log, same rows).  Never more than ``cap`` in flight, sent in trace order,
    none before its trace arrival."""
    eng, trace = _engine(scenario), _timed(scenario)
    capped = replay(trace, eng, record_decisions=True, max_concurrency=cap)
    sent = capped.requests.column("arrival_s")
    again = replay(trace.set_column(trace.column_names.index("arrival_s"), "arrival_s", sent), eng,
                   record_decisions=True)
    assert _log(again) == _log(capped)
    assert again.requests.equals(capped.requests) and again.steps.equals(capped.steps)
    s = sent.to_numpy()
    f = capped.requests.column("finish_s").to_numpy()
    assert (np.diff(s) >= 0).all() and (s >= trace.column("arrival_s").to_numpy()).all()
    # In flight just after each send: sent by then and not finished by then.
    assert max(int(((s <= t) & (f > t)).sum()) for t in s) <= cap
    if cap < trace.num_rows:
        assert (s > trace.column("arrival_s").to_numpy()).any()  # the cap held someone back


def test_a_cap_above_the_trace_changes_nothing():
    eng, trace = _engine("timed"), _timed("timed")
    plain = replay(trace, eng, record_decisions=True)
    capped = replay(trace, eng, record_decisions=True, max_concurrency=trace.num_rows)
    assert _log(capped) == _log(plain) and capped.requests.equals(plain.requests)


def test_the_streaming_core_caps_alike():
    eng, trace = _engine("full_pressure"), _timed("full_pressure")
    whole = replay(trace, eng, max_concurrency=4)
    rows = [item[1] for item in replay_stream(trace.to_batches(max_chunksize=7), eng, timed=True,
                                               expected=trace.num_rows, out_rows=5, max_concurrency=4)
            if item[0] == "requests"]
    assert pa.concat_tables(rows).equals(whole.requests)


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "4"])
def test_a_bad_cap_is_named(value):
    eng, trace = _engine("timed"), _timed("timed")
    with pytest.raises(ConfigError, match=f"'max_concurrency' must be a positive integer, got {value!r}"):
        replay(trace, eng, max_concurrency=value)


def test_a_closed_loop_is_not_capped():
    eng, trace = _engine("timed"), _timed("timed")
    with pytest.raises(ConfigError, match="max_concurrency caps an open-loop client"):
        replay(trace, eng, closed_loop=True, max_concurrency=2)


def test_describe_load_says_the_cap():
    assert describe_load({"max_concurrency": 16}) == "as traced, at most 16 in flight"
    assert describe_load({"rate_scale": 2.0, "max_concurrency": 1}) == "rate x2, at most 1 in flight"


def _files(tmp_path):
    lines = [{"request_id": f"r{i}", "prompt_len": 10, "max_tokens": 3, "arrival_time": 0.0} for i in range(4)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "e.json").write_text(json.dumps({"num_gpu_blocks": 100, "max_model_len": 64}))


def test_the_replay_command_caps(tmp_path):
    import pyarrow.parquet as pq

    _files(tmp_path)
    args = ["replay", "--engine", str(tmp_path / "e.json"), "--trace", str(tmp_path / "t.jsonl")]
    r = CliRunner().invoke(main, args + ["--max-concurrency", "1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    got = pq.read_table(tmp_path / "o" / "requests.parquet").column("arrival_s").to_pylist()
    assert got == [0.0, _clock(3), _clock(6), _clock(9)]  # one at a time, three steps each
    r = CliRunner().invoke(main, args + ["--max-concurrency", "0"])
    assert r.exit_code == 2 and r.output == "error: --max-concurrency must be a positive integer, got 0\n"
    r = CliRunner().invoke(main, args + ["--max-concurrency", "2", "--closed-loop"])
    assert r.exit_code == 2 and "shape open-loop replays" in r.output


def _spec(tmp_path, replay_opts):
    return spec_from_dict({
        "name": "p", "database": str(tmp_path / "p.duckdb"),
        "sources": [{"paths": [str(tmp_path / "t.jsonl")], "format": "oracle", "model": "m"}],
        "deployments": [{"model": "m", "engines": {"e": {"num_gpu_blocks": 100, "max_model_len": 64}}}],
        "replay": replay_opts}, base_dir=str(tmp_path))


def test_the_pipeline_caps_each_shard(tmp_path):
    _files(tmp_path)
    report = run_pipeline(_spec(tmp_path, {"max_concurrency": 2}), scheduler="sync")
    with duckdb.connect(str(tmp_path / "p.duckdb"), read_only=True) as con:
        got = con.execute("SELECT arrival_s FROM requests WHERE run_id = ? ORDER BY request_id",
                          [report.run_id]).fetchall()
    assert [a for (a,) in got] == [0.0, 0.0, _clock(3), _clock(3)]
    with pytest.raises(SpecError, match=r"'replay.max_concurrency'.* shapes open-loop replays"):
        _spec(tmp_path, {"max_concurrency": 2, "closed_loop": True})
    with pytest.raises(SpecError, match=r"'replay.max_concurrency'.* must be a positive integer, got 0"):
        _spec(tmp_path, {"max_concurrency": 0})
    raw = {"name": "p", "database": str(tmp_path / "p.duckdb"),
           "sources": [{"paths": [str(tmp_path / "t.jsonl")], "format": "oracle", "model": "m"}],
           "deployments": [{"model": "m", "engines": {"e": {"engine": {"num_gpu_blocks": 100, "max_model_len": 64},
                                                             "deployment": {"replicas": 2}}}}],
           "replay": {"max_concurrency": 2}}
    from aisim.deploy import deploy
    from aisim.traces import read_trace

    report = run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync")
    with duckdb.connect(str(tmp_path / "p.duckdb"), read_only=True) as con:
        got = con.execute("SELECT arrival_s, replica FROM requests WHERE run_id = ? ORDER BY request_id",
                          [report.run_id]).fetchall()
    want = deploy(read_trace(str(tmp_path / "t.jsonl"), "oracle"), engine_config_from_dict(
        {"num_gpu_blocks": 100, "max_model_len": 64}), {"replicas": 2}, max_concurrency=2).requests
    assert got == list(zip(want.column("arrival_s").to_pylist(), want.column("replica").to_pylist()))
    assert [a for a, _ in got] == [0.0, 0.0, _clock(3), _clock(3)]


def test_a_sweep_over_concurrency(tmp_path):
    """Four requests due at once, 3 steps each: one at a time they take 12 steps, two at a time 6, the
    last response ending the run (vllm bench serve's duration: 12 or 6 steps).  Every request meets a
    TTFT SLO of 15 ms (10 ms: latencies count from the send), so goodput = 4 / duration: cap 2 first."""
    from aisim.sweep import load_sweep, run_sweep

    from test_sweep import _write

    trace = [{"request_id": f"r{i}", "prompt_len": 10, "max_tokens": 3, "arrival_time": 0.0} for i in range(4)]
    path = _write(tmp_path, {"num_gpu_blocks": 100, "max_model_len": 64}, {"max_num_seqs": [8]},
                  {"ttft_s": 0.015}, trace)
    with open(path, "a") as fh:
        fh.write("[load]\nmax_concurrency = [1, 2]\n")
    result = run_sweep(load_sweep(path), scheduler="sync")
    assert [c.knobs for c in result.candidates] == [{"max_num_seqs": 8, "max_concurrency": 1},
                                                    {"max_num_seqs": 8, "max_concurrency": 2}]
    assert [c.name for c in result.ranked] == ["c001", "c000"]
    assert [c.goodput_req_s for c in result.candidates] == [4 / _clock(12), 4 / _clock(6)]


# ------------------------------------------------------------------ deployments


@pytest.mark.parametrize("scenario", ["timed", "full_pressure_async", "hybrid_mamba_pressure"])
@pytest.mark.parametrize("router", ["round_robin", "kv_aware", "least_loaded"])
def test_one_capped_replica_is_the_capped_engine(scenario, router):
    from aisim.deploy import deploy

    eng, trace = _engine(scenario), _timed(scenario)
    single = replay(trace, eng, record_decisions=True, max_concurrency=3)
    dep = deploy(trace, eng, {"replicas": 1, "router": router}, record_decisions=True, max_concurrency=3)
    assert _log(dep.replicas[0]) == _log(single)
    assert dep.requests.drop_columns(["replica", "prefill_replica", "decode_replica", "routed_s",
                                      "transfer_s"]).equals(single.requests)
    assert dep.steps.drop_columns(["replica"]).equals(single.steps)


@pytest.mark.parametrize("scenario", ["timed", "full_pressure", "bench_full"])
@pytest.mark.parametrize("router, cap", [("round_robin", 2), ("kv_aware", 5), ("least_loaded", 8)])
def test_a_capped_deployment_is_the_deployment_of_its_send_times(scenario, router, cap):
    """As for one engine: re-timed to the send times, the uncapped deployment routes and replays alike;
    never more than ``cap`` routed and unfinished, sent in trace order."""
    from aisim.deploy import deploy

    eng, trace = _engine(scenario), _timed(scenario)
    capped = deploy(trace, eng, {"replicas": 3, "router": router}, max_concurrency=cap)
    sent = capped.requests.column("routed_s")
    again = deploy(trace.set_column(trace.column_names.index("arrival_s"), "arrival_s", sent), eng,
                   {"replicas": 3, "router": router})
    assert again.requests.equals(capped.requests) and again.steps.equals(capped.steps)
    s = sent.to_numpy()
    f = capped.requests.column("finish_s").to_numpy()
    assert (np.diff(s) >= 0).all() and (s >= trace.column("arrival_s").to_numpy()).all()
    # In flight just after each send (a finish seen at t releases its place at t).
    assert max(int(((s <= t) & (f > t)).sum()) for t in s) <= cap
    assert (s > trace.column("arrival_s").to_numpy()).any()
    assert (capped.requests.column("arrival_s").to_numpy() >= s).all()  # a replica adds it at its next step


def test_a_disaggregated_client_waits_for_the_decode_finish():
    """P/D, one prefill and one decode replica, an instant link, 10 ms steps (base) + 0.1 ms a token:
    cap 1 sends the next request only when the previous one finished decoding."""
    from aisim.deploy import deploy

    from test_deploy_pd import _engine as pd_engine, _pd, _trace as pd_trace

    trace = pd_trace([0.0, 0.0, 0.0], prompt=100, max_tokens=3)
    dep = deploy(trace, pd_engine(), _pd(), max_concurrency=1)
    r = dep.requests.to_pydict()
    assert r["arrival_s"][1] == r["finish_s"][0] and r["arrival_s"][2] == r["finish_s"][1]
    free = deploy(trace, pd_engine(), _pd())
    assert free.requests.column("arrival_s").to_pylist() == [0.0] * 3
