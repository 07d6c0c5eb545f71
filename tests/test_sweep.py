"""``aisim sweep``: ranking by SLO goodput, ties to the cheaper deployment, refusals with reasons."""

import json
import os

import duckdb
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.engine import load_engine_config
from aisim.sweep import load_sweep, run_sweep



def _toml(v) -> str:
    """A value as TOML: JSON's spelling, but tables inline."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return json.dumps(v)


def _write(tmp_path, base, grid, slo, trace_lines):
    (tmp_path / "trace.jsonl").write_text("\n".join(json.dumps(t) for t in trace_lines) + "\n")
    (tmp_path / "base.json").write_text(json.dumps(base))
    grid_toml = "\n".join(f"{k} = {_toml(v)}" for k, v in grid.items())
    slo_toml = "\n".join(f"{k} = {v}" for k, v in slo.items())
    (tmp_path / "sweep.toml").write_text(
        'name = "s"\ndatabase = "s.duckdb"\nmodel = "m"\nbase = "base.json"\nbest = "best.toml"\n'
        '[trace]\npaths = ["trace.jsonl"]\nformat = "oracle"\n'
        f"[grid]\n{grid_toml}\n[slo]\n{slo_toml}\n")
    return str(tmp_path / "sweep.toml")


def test_best_candidate_known_by_construction(tmp_path):
    # Eight 100-token requests at step 0, ten outputs each, 10 ms steps.  With
    # max_num_seqs 8 all start at once and every TTFT is 10 ms; with 1 they run
    # one after another (request k waits ~11 k steps) and only the first five
    # meet TTFT <= 0.5 s.  200 and 400 blocks both hold everything, so they tie
    # in goodput, GPUs and p99 TTFT, and grid order puts 200 first.
    trace = [{"request_id": f"r{i}", "prompt_len": 100, "max_tokens": 10, "arrival_step": 0} for i in range(8)]
    base = {"num_gpu_blocks": 400, "max_model_len": 1024, "max_num_batched_tokens": 2048, "max_num_seqs": 8}
    path = _write(tmp_path, base, {"max_num_seqs": [1, 8], "num_gpu_blocks": [200, 400]}, {"ttft_s": 0.5}, trace)
    result = run_sweep(load_sweep(path), scheduler="sync")
    best = result.best
    assert best.knobs == {"max_num_seqs": 8, "num_gpu_blocks": 200}
    assert best.slo_attainment == 1.0
    ranked = [(c.knobs["max_num_seqs"], c.knobs["num_gpu_blocks"]) for c in result.ranked]
    assert ranked == [(8, 200), (8, 400), (1, 200), (1, 400)]
    assert [c.slo_attainment for c in result.ranked][2:] == [5 / 8, 5 / 8]
    cfg = load_engine_config(tmp_path / "best.toml")
    assert cfg.max_num_seqs == 8 and cfg.num_gpu_blocks == 200
    with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT candidate, status, rank FROM sweep_candidates ORDER BY candidate").fetchall()
        # Every candidate's results are in the run's tables, one shard each.
        shards = con.execute("SELECT count(*) FROM shards WHERE run_id = ?", [result.run_id]).fetchone()[0]
    assert rows == [("c000", "ranked", 3), ("c001", "ranked", 4), ("c002", "ranked", 1), ("c003", "ranked", 2)]
    assert shards == 4
    # The same sweep through the command: its run is landed, so this ranks without replaying.
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["best"] == "c002" and [c["candidate"] for c in doc["ranked"]] == ["c002", "c003", "c000", "c001"]
    assert doc["ranked"][2]["slo_attainment"] == 5 / 8
    assert r.stderr.startswith("best configuration (c002) written to ")
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync", "--format", "csv"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == ("rank,candidate,knobs,goodput_req_s,slo_attainment,rejected,ttft_p99_s,"
                                          "tpot_p99_s,gpus,kv_tokens,calibration")
    assert r.stdout.splitlines()[1].startswith('1,c002,"{""max_num_seqs"": 8, ""num_gpu_blocks"": 200}",')


def test_refused_candidate_appears_with_its_reason(tmp_path):
    # A hybrid full + Mamba model: 60 blocks cannot hold one 4,096-token request
    # (64 attention blocks + 2 state blocks), so the grouped-prefix rule refuses it.
    with open(os.path.join(os.path.dirname(__file__), "..", "examples", "qwen3-next-80b.json")) as fh:
        base = json.load(fh)
    trace = [{"request_id": f"r{i}", "prompt_len": 200, "max_tokens": 5, "arrival_step": i} for i in range(4)]
    path = _write(tmp_path, base, {"num_gpu_blocks": [60, 400]}, {"e2e_s": 10}, trace)
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync"])
    assert r.exit_code == 0, r.output
    assert "refused c000" in r.output and "needs 66" in r.output
    with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as con:
        status, reason = con.execute("SELECT status, reason FROM sweep_candidates WHERE candidate = 'c000'").fetchone()
    assert status == "refused" and "'num_gpu_blocks' (60) leaves 59 usable blocks" in reason


def test_bad_sweep_spec_is_named(tmp_path):
    (tmp_path / "sweep.toml").write_text('name = "s"\ndatabase = "x.duckdb"\nmodel = "m"\nbase = "b.json"\n'
                                         '[trace]\npaths = ["t.jsonl"]\n[grid]\nmax_num_seq = [1]\n[slo]\nttft_s = 1\n')
    (tmp_path / "b.json").write_text('{"num_gpu_blocks": 10}')
    r = CliRunner().invoke(main, ["sweep", str(tmp_path / "sweep.toml")])
    assert r.exit_code == 2 and "unknown knob 'grid.max_num_seq'" in r.output and "sweep.toml" in r.output
