"""Over-long prompts rejected as vLLM's server rejects them: replay, stream, command and pipeline option."""

import json

import pyarrow as pa
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.engine import engine_config_from_dict
from aisim.errors import ConfigError, SpecError, TraceError
from aisim.pipeline.runkey import resolve_inputs, run_key
from aisim.pipeline.spec import spec_from_dict
from aisim.replay import check_trace, replay, replay_stream
from aisim.traces import from_frame

from test_pipeline_common import PIPELINES, demo_dict

ENGINE = engine_config_from_dict({"num_gpu_blocks": 100, "max_model_len": 64, "block_size": 16})
PROMPTS = [70, 10, 64, 20, 30, 100]  # 70, 64 and 100 are not below max_model_len 64


def _trace(timed):
    arrival = "arrival_time" if timed else "arrival_step"
    return from_frame(pa.table({"request_id": [f"r{i}" for i in range(6)], "prompt_len": PROMPTS,
                                "max_tokens": [2] * 6, arrival: [0, 0, 1, 1, 2, 3]}))


def _rows(table):
    """Rows as text: NaN equals NaN here (Arrow's equals says it does not)."""
    return str(table.to_pylist())


def test_without_the_option_a_long_prompt_refuses_the_trace():
    with pytest.raises(TraceError, match=r"^request 'r0': prompt_tokens \(70\) must be below max_model_len \(64\); "
                                         r"vLLM rejects such a prompt$"):
        replay(_trace(False), ENGINE)


@pytest.mark.parametrize("timed", [False, True])
def test_rejected_requests_keep_their_rows_and_the_rest_replays_as_without_them(timed):
    trace = _trace(timed)
    r = replay(trace, ENGINE, reject_too_long=True)
    rq = r.requests
    assert rq.column("status").to_pylist() == ["rejected", "finished", "rejected", "finished", "finished", "rejected"]
    assert rq.column("output_tokens").to_pylist() == [0, 2, 0, 2, 2, 0]
    arrival = rq.column("arrival_s").to_pylist()
    # A rejected request has its arrival only on a clock in seconds; never a time of the engine.
    if timed:
        assert [arrival[i] for i in (0, 2, 5)] == [0.0, 1.0, 3.0]
    else:
        assert all(arrival[i] != arrival[i] for i in (0, 2, 5))  # NaN
    for col in ("first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s"):
        assert all(v != v for v in (rq.column(col)[i].as_py() for i in (0, 2, 5))), col
    s = r.summary
    assert (s["requests"], s["finished"], s["unfinished"], s["rejected"]) == (6, 3, 0, 3)
    # The engine never saw them: the others run exactly as in a trace without them.
    kept = replay(trace.take([1, 3, 4]), ENGINE)
    assert _rows(rq.take([1, 3, 4])) == _rows(kept.requests)
    assert r.steps.equals(kept.steps)


@pytest.mark.parametrize("timed", [False, True])
@pytest.mark.parametrize("chunk", [1, 2, 4, 6])
def test_a_streamed_replay_rejects_the_same_rows_in_trace_order(timed, chunk):
    trace = _trace(timed)
    whole = replay(trace, ENGINE, reject_too_long=True)
    pieces = [trace.slice(i, chunk) for i in range(0, 6, chunk)]
    got = list(replay_stream(iter(pieces), ENGINE, timed=timed, expected=6, out_rows=1, reject_too_long=True))
    parts = [g for g in got if g[0] == "requests"]
    for _, requests, rows in parts:
        assert rows.column("request_id").equals(requests.column("request_id"))
    assert _rows(pa.concat_tables([p[1] for p in parts])) == _rows(whole.requests)
    assert json.dumps(got[-1][1]) == json.dumps(whole.summary)


def test_only_rejected_requests():
    trace = _trace(False).take([0, 2, 5])
    r = replay(trace, ENGINE, reject_too_long=True)
    assert r.requests.column("status").to_pylist() == ["rejected"] * 3 and r.steps.num_rows == 0
    got = list(replay_stream([trace], ENGINE, timed=False, expected=3, reject_too_long=True))
    assert [g[0] for g in got] == ["requests", "summary"]
    assert got[1][1]["rejected"] == 3 and got[1][1]["requests"] == 3


def test_the_pool_need_not_hold_a_rejected_request():
    # 3 blocks leave 2 usable: enough for r3 (20 + 2 tokens, 2 blocks of 16) and for one request of
    # max_model_len 32 (vLLM's start-up check).  r5's 100-token prompt is not below max_model_len: an
    # error without the option; with it, it is rejected and the pool need not hold it.
    small = engine_config_from_dict({"num_gpu_blocks": 3, "max_model_len": 32, "block_size": 16})
    trace = _trace(False).take([3, 5])  # prompts 20 and 100
    assert check_trace(trace, small) == ("request 'r5': prompt_tokens (100) must be below max_model_len (32); "
                                         "vLLM rejects such a prompt")
    assert check_trace(trace, small, reject_too_long=True) is None
    # Not so for a request that is kept: 20 + 2 tokens need 2 blocks, 3 blocks leave 2 usable; 2 leave 1
    # (a pool vLLM's start-up check would refuse already; without it, the trace check names the request).
    tiny = engine_config_from_dict({"num_gpu_blocks": 2, "max_model_len": 64, "block_size": 16,
                                    "startup_check": False})
    assert check_trace(trace, tiny, reject_too_long=True) == (
        "request 'r3' needs 2 KV-cache blocks for 22 tokens but the pool has only 1 usable blocks (num_gpu_blocks=2)")


def test_not_with_a_closed_loop():
    with pytest.raises(ConfigError, match="reject_too_long does not apply to closed-loop replays"):
        replay(_trace(True), ENGINE, reject_too_long=True, closed_loop=True)


def test_the_replay_command_rejects_when_told(tmp_path):
    lines = [{"request_id": f"r{i}", "prompt_len": p, "max_tokens": 2, "arrival_step": i} for i, p in enumerate(PROMPTS)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "e.json").write_text(json.dumps({"num_gpu_blocks": 100, "max_model_len": 64}))
    args = ["replay", "--engine", str(tmp_path / "e.json"), "--trace", str(tmp_path / "t.jsonl")]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "t.jsonl:1: field 'prompt_len' (70) must be below max_model_len (64)" in r.output
    r = CliRunner().invoke(main, args + ["--reject-too-long", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["requests"], doc["finished"], doc["rejected"]) == (6, 3, 3)
    r = CliRunner().invoke(main, args + ["--reject-too-long", "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "requests rejected" in r.stdout and "3 (prompt of max_model_len tokens or more)" in r.stdout
    import pyarrow.parquet as pq
    assert pq.read_table(tmp_path / "out" / "requests.parquet").column("status").to_pylist().count("rejected") == 3


def test_the_pipeline_option(tmp_path):
    raw = demo_dict(tmp_path / "a.duckdb")
    spec = spec_from_dict(raw, base_dir=PIPELINES)
    key = run_key(spec, resolve_inputs(spec))
    assert spec.replay == {"closed_loop": False, "think_time_s": None}
    # false is the default: the same run; true: another.
    same = spec_from_dict(demo_dict(tmp_path / "a.duckdb", replay={"reject_too_long": False}), base_dir=PIPELINES)
    assert run_key(same, resolve_inputs(same)) == key
    other = spec_from_dict(demo_dict(tmp_path / "a.duckdb", replay={"reject_too_long": True}), base_dir=PIPELINES)
    assert other.replay["reject_too_long"] is True and run_key(other, resolve_inputs(other)) != key
    with pytest.raises(SpecError, match="'replay.reject_too_long'.* must be true or false"):
        spec_from_dict(demo_dict(tmp_path / "a.duckdb", replay={"reject_too_long": 1}), base_dir=PIPELINES)
    with pytest.raises(SpecError, match="'replay.reject_too_long'.* does not apply to closed-loop replays"):
        spec_from_dict(demo_dict(tmp_path / "a.duckdb", replay={"reject_too_long": True, "closed_loop": True}),
                       base_dir=PIPELINES)


def test_not_with_a_deployment(tmp_path):
    (tmp_path / "e.json").write_text(json.dumps({"num_gpu_blocks": 100, "max_model_len": 64}))
    (tmp_path / "t.jsonl").write_text(json.dumps({"request_id": "a", "prompt_len": 10, "max_tokens": 2,
                                                  "arrival_time": 0.0}) + "\n")
    r = CliRunner().invoke(main, ["replay", "--engine", str(tmp_path / "e.json"), "--trace", str(tmp_path / "t.jsonl"),
                                  "--deployment", str(tmp_path / "d.toml"), "--reject-too-long"])
    assert r.exit_code == 2
    assert r.output == "error: --reject-too-long applies to a single engine's replay, not to a deployment\n"
