"""``aisim sweep`` finishes and says why: refused candidates, rejected prompts, ties, unset knobs, progress."""

import json

import duckdb
from click.testing import CliRunner

from aisim.cli import main
from aisim.sweep import load_sweep, run_sweep
from aisim.sweep.runner import Candidate, rank_key

from test_sweep import _write

BASE = {"num_gpu_blocks": 400, "block_size": 16, "max_model_len": 1024, "max_num_batched_tokens": 2048, "max_num_seqs": 8}


def _trace(n, prompt=100, out=10):
    return [{"request_id": f"r{i}", "prompt_len": prompt, "max_tokens": out, "arrival_step": 0} for i in range(n)]


def _landed(tmp_path, sql, params=()):
    with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def test_a_pool_too_small_for_the_longest_request_is_refused_and_the_sweep_goes_on(tmp_path):
    # 5 blocks leave 4 usable (block 0 is vLLM's null block): 64 tokens, while one request of max_model_len
    # 1024 needs 1024 / 16 = 64 blocks, so vLLM refuses to start the engine (before any request is tried).
    path = _write(tmp_path, BASE, {"num_gpu_blocks": [5, 200], "block_size": [0, 16]}, {"ttft_s": 1}, _trace(2))
    result = run_sweep(load_sweep(path), scheduler="sync")
    by = {c.name: c for c in result.candidates}
    # Grid order: (5, 0), (5, 16), (200, 0), (200, 16).
    assert by["c000"].reason == ("'block_size' in candidate c000 {\"block_size\": 0, \"num_gpu_blocks\": 5} "
                                 "must be at least 1, got 0")
    assert by["c001"].reason == ("'num_gpu_blocks' (5) in candidate c001 {\"block_size\": 16, \"num_gpu_blocks\": 5} "
                                 "leaves 4 usable blocks, but one request of max_model_len (1024) needs 64 blocks; "
                                 "the estimated maximum model length is 64; vLLM refuses to start such an engine")
    assert by["c002"].refused
    assert [c.name for c in result.ranked] == ["c003"] and by["c003"].slo_attainment == 1.0
    rows = _landed(tmp_path, "SELECT candidate, status, reason IS NOT NULL, rank FROM sweep_candidates "
                             "ORDER BY candidate")
    assert rows == [("c000", "refused", True, None), ("c001", "refused", True, None),
                    ("c002", "refused", True, None), ("c003", "ranked", False, 1)]
    assert _landed(tmp_path, "SELECT reason FROM sweep_candidates WHERE candidate = 'c001'")[0][0] == by["c001"].reason
    # Only the accepted candidate was replayed: one shard.
    assert _landed(tmp_path, "SELECT count(*) FROM shards WHERE run_id = ?", [result.run_id]) == [(1,)]


def test_every_candidate_refused_is_one_line_naming_the_first_reason(tmp_path):
    path = _write(tmp_path, BASE, {"num_gpu_blocks": [5, 6]}, {"ttft_s": 1}, _trace(2))
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync"])
    assert r.exit_code == 2
    assert r.output == ("error: every candidate of sweep s is refused; the first because: 'num_gpu_blocks' (5) in "
                        "candidate c000 {\"num_gpu_blocks\": 5} leaves 4 usable blocks, but one request of "
                        "max_model_len (1024) needs 64 blocks; the estimated maximum model length is 64; vLLM refuses "
                        "to start such an engine\n")


def test_a_prompt_over_max_model_len_is_rejected_where_max_model_len_is_a_knob(tmp_path):
    # Six 100-token prompts and one of 300, all at step 0, ten outputs each, 10 ms steps.
    # max_model_len 256 rejects the 300-token prompt (vLLM's server answers it with an error):
    # it counts and fails the SLO, so 6 of 7 meet it; 1024 serves all 7.  Both run the same ten
    # 10 ms steps to the last response (every request admitted at once), so the same duration.
    trace = _trace(6) + [{"request_id": "long", "prompt_len": 300, "max_tokens": 10, "arrival_step": 0}]
    path = _write(tmp_path, BASE, {"max_model_len": [256, 1024]}, {"ttft_s": 1}, trace)
    result = run_sweep(load_sweep(path), scheduler="sync")
    c256, c1024 = result.candidates
    assert not c256.refused and c256.rejected == 1 and c256.slo_attainment == 6 / 7
    assert c1024.rejected == 0 and c1024.slo_attainment == 1.0
    assert [c.name for c in result.ranked] == ["c001", "c000"]
    (d256,), (d1024,) = (_landed(tmp_path, "SELECT m.duration_s FROM summaries m JOIN shards s USING (run_id, shard_id) "
                                           "WHERE s.engine = ?", [c.name])[0] for c in (c256, c1024))
    assert d256 == d1024 and round(d256, 12) == 0.10
    assert c256.goodput_req_s == 6 / d256 and c1024.goodput_req_s == 7 / d1024
    status = _landed(tmp_path, "SELECT r.request_id, r.status, r.ttft_s FROM requests r JOIN shards s "
                               "USING (run_id, shard_id) WHERE s.engine = 'c000' AND r.status <> 'finished'")
    assert status == [("long", "rejected", None)]
    assert _landed(tmp_path, "SELECT candidate, rejected FROM sweep_candidates ORDER BY candidate") == \
        [("c000", 1), ("c001", 0)]


def test_a_prompt_over_max_model_len_refuses_the_candidate_where_it_is_no_knob(tmp_path):
    trace = _trace(2) + [{"request_id": "long", "prompt_len": 300, "max_tokens": 10, "arrival_step": 0}]
    base = dict(BASE, max_model_len=256)
    path = _write(tmp_path, base, {"max_num_seqs": [4, 8]}, {"ttft_s": 1}, trace)
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync"])
    assert r.exit_code == 2
    assert r.output.startswith("error: every candidate of sweep s is refused; the first because: trace.jsonl: "
                               "request 'long': prompt_tokens (300) must be below max_model_len (256)")


def test_ties_in_goodput_go_to_the_lower_p99_ttft(tmp_path):
    # A TTFT threshold no request can meet (every TTFT is at least one 10 ms step): goodput 0 for
    # both.  With max_num_seqs 4 the second four requests wait for the first four's ten steps
    # and a step of their own: p99 TTFT 0.11 s against 0.01 s with 8; the later candidate wins.
    path = _write(tmp_path, BASE, {"max_num_seqs": [4, 8]}, {"ttft_s": 0.001}, _trace(8))
    result = run_sweep(load_sweep(path), scheduler="sync")
    c4, c8 = result.candidates
    assert c4.goodput_req_s == c8.goodput_req_s == 0.0
    assert c8.ttft_p99_s == 0.01 and c4.ttft_p99_s > c8.ttft_p99_s
    assert [c.name for c in result.ranked] == ["c001", "c000"]


def test_ties_in_goodput_go_to_fewer_gpus(tmp_path):
    # The same linear step times on 2 and on 1 GPU: identical replays, and the single GPU wins
    # although it comes second in the grid.
    grid = {"time_model": [{"kind": "linear", "tp": 2}, {"kind": "linear", "tp": 1}]}
    path = _write(tmp_path, BASE, grid, {"ttft_s": 1}, _trace(4))
    result = run_sweep(load_sweep(path), scheduler="sync")
    c2, c1 = result.candidates
    assert (c2.gpus, c1.gpus) == (2, 1) and c2.goodput_req_s == c1.goodput_req_s
    assert c2.ttft_p99_s == c1.ttft_p99_s
    assert [c.name for c in result.ranked] == ["c001", "c000"]
    assert _landed(tmp_path, "SELECT candidate, gpus, rank FROM sweep_candidates ORDER BY candidate") == \
        [("c000", 2, 2), ("c001", 1, 1)]


def test_rank_key_orders_goodput_then_gpus_then_p99_ttft_then_grid_order():
    def cand(name, goodput, gpus, ttft):
        return Candidate(name=name, knobs={}, goodput_req_s=goodput, gpus=gpus, ttft_p99_s=ttft)

    cands = [cand("c000", 5.0, 2, 0.1), cand("c001", 5.0, 1, 0.3), cand("c002", 5.0, 1, 0.2),
             cand("c003", 6.0, 8, 9.0), cand("c004", 5.0, 1, None), cand("c005", 5.0, 1, 0.2)]
    assert [c.name for c in sorted(cands, key=rank_key)] == ["c003", "c002", "c005", "c001", "c004", "c000"]


def test_unset_removes_a_base_key(tmp_path):
    # The base caps max_num_seqs at 1; "unset" gives the engine's default, 256.
    path = _write(tmp_path, dict(BASE, max_num_seqs=1), {"max_num_seqs": ["unset", 2]}, {"ttft_s": 1}, _trace(2))
    result = run_sweep(load_sweep(path), scheduler="sync")
    unset, two = result.candidates
    assert unset.knobs == {"max_num_seqs": "unset"} and unset.engine.max_num_seqs == 256
    assert "max_num_seqs" not in unset.config and two.engine.max_num_seqs == 2
    assert _landed(tmp_path, "SELECT knobs FROM sweep_candidates ORDER BY candidate")[0] == ('{"max_num_seqs": "unset"}',)


def test_the_ranking_shows_latencies_and_whole_knobs_and_progress(tmp_path):
    tm = {"kind": "linear", "base_s": 0.01, "per_token_s": 0.0, "per_req_s": 0.0, "tp": 1}
    path = _write(tmp_path, BASE, {"time_model": [tm], "max_model_len": [1024]}, {"ttft_s": 1}, _trace(2))
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync", "--progress"])
    assert r.exit_code == 0, r.output
    knobs = 'time_model={"kind": "linear", "base_s": 0.01, "per_token_s": 0.0, "per_req_s": 0.0, "tp": 1} ' \
            'max_model_len=1024'
    assert knobs in r.stdout
    header = [line for line in r.stdout.splitlines() if "goodput" in line][0]
    for col in ("rejected", "TTFT p99", "TPOT p99", "GPUs", "KV tokens"):
        assert col in header
    row = [line for line in r.stdout.splitlines() if "c000" in line][0]
    assert "10.0 ms" in row  # p99 TTFT and TPOT: one 10 ms step each
    assert "ties in goodput go to fewer GPUs, then to the lower p99 TTFT" in r.stdout
    # Each phase ends with one line saying what it did; the replay logs a line per candidate.
    err = r.stderr.splitlines()
    assert err[0].startswith("reading trace.jsonl: 2 requests, ")
    assert err[1].startswith("checking 1 candidates: 0 of 1 refused, ")
    assert err[2].startswith("run s (") and err[2].endswith(": 1 shards, 1 input files, scheduler sync")
    assert err[3].startswith("[1/1] shard 0 m / c000: 2 requests in ")
    assert err[5].startswith("replaying 1 candidates: run ") and err[6].startswith("ranking: ")
    doc = json.loads(CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync", "--format", "json"]).stdout)
    assert doc["ranked"][0]["ttft_p99_s"] == 0.01 and doc["ranked"][0]["rejected"] == 0
    assert doc["ranked"][0]["knobs"] == {"time_model": tm, "max_model_len": 1024}


def test_a_candidate_whose_replay_fails_is_refused_with_the_replay_s_reason(tmp_path):
    # A step-time profile measured up to 100 prefill tokens: the 100-token prompts fit with a
    # budget of 100 tokens a step (chunks of at most 100), not with 2048 (two prompts, 200
    # tokens, in the first step).  aisim never extrapolates a profile: that replay fails, and the
    # sweep refuses its candidate and ranks the other.
    (tmp_path / "profile.csv").write_text("prefill_tokens,kv_tokens,latency_s\n0,0,0.01\n0,4000,0.02\n"
                                          "100,0,0.03\n100,4000,0.04\n")
    base = dict(BASE, max_num_seqs=2, time_model={"kind": "table", "path": str(tmp_path / "profile.csv")})
    path = _write(tmp_path, base, {"max_num_batched_tokens": [2048, 100]}, {"ttft_s": 1}, _trace(2))
    result = run_sweep(load_sweep(path), scheduler="sync")
    wide, narrow = result.candidates
    assert wide.reason.startswith("its replay failed: ") and "outside the step-time profile's measured range" \
        in wide.reason
    assert [c.name for c in result.ranked] == ["c001"] and narrow.slo_attainment == 1.0
    assert _landed(tmp_path, "SELECT candidate, status FROM sweep_candidates ORDER BY candidate") == \
        [("c000", "refused"), ("c001", "ranked")]
