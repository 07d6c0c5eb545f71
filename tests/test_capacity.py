"""``aisim capacity``: capacities known by hand from a constant step time, refusals, landing, determinism.

The hand model: every step takes T = 10 ms whatever it runs (a linear time model with only
``base_s``), a request has a 16-token prompt (one prefill step, which gives its first token) and
10 output tokens, so it holds a sequence slot for S = 10 steps = 100 ms.  With ``max_num_seqs``
1 an engine is a single server.  A request that arrives while the engine is busy is added before
the first step whose clock has reached its arrival (ext/engine.pyx, as vLLM's EngineCore adds
requests between steps) and its TTFT counts from then; steps run back to back from 0 s while the
engine is busy.  So with arrivals g apart (g < S), request k is added at T * ceil(k g / T), starts
at k S and has

    TTFT_k = T + k S - T ceil(k g / T).
"""

import json

import duckdb
import pytest
from click.testing import CliRunner

from aisim.capacity import (Point, capacity_from_dict, highest_rate, land_points, monotone_notes, slo_from_dict,
                            smallest_deployment)
from aisim.capacity.search import POINT_COLUMNS
from aisim.capacity.slo import KEYS
from aisim.cli import main
from aisim.columns import CAPACITY_POINTS
from aisim.config.deployment import parse_deployment
from aisim.config.engine import engine_config_from_dict
from aisim.errors import ConfigError, PipelineError
from helpers import make_trace

T, S, N = 0.01, 0.1, 21
ENGINE = {"model": "m", "block_size": 16, "num_gpu_blocks": 1024, "max_model_len": 4096, "max_num_seqs": 1,
          "max_num_batched_tokens": 2048, "enable_prefix_caching": False,
          "time_model": {"kind": "linear", "base_s": T, "per_token_s": 0.0, "per_req_s": 0.0}}


def _engine(**kw):
    return engine_config_from_dict({**ENGINE, **kw})


def _trace(gap: float, n: int = N):
    return make_trace([{"id": f"r{i}", "prompt": 16, "max_tokens": 10, "at": i * gap} for i in range(n)],
                      clock="time")


def _hand_ttft(k: int, g: float) -> float:
    # Sent k g apart (g < S), each waits for the one before: picked up at k S, first token T later;
    # TTFT counts from the client's send, k g.
    return T + k * (S - g)


# ---------------------------------------------------------------- known answers


@pytest.mark.parametrize("share, hand_gap", [
    # Every request within 215 ms: the last (k = 20) is the worst; TTFT_20 = T + 20 (S - g) <= 0.215
    # needs g >= S - 0.205 / 20 = 0.08975 s.
    (1.0, 0.08975),
    # Half of them (11 of 21): k = 0..10 need T + 10 (S - g) <= 0.215, g >= 0.0795 s.
    (0.5, 0.0795),
])
def test_highest_rate_lands_within_the_tolerance_of_the_hand_answer(share, hand_gap):
    slo = slo_from_dict({"ttft_s": 0.215, "attainment": share})
    # The trace's own rate is 1 request/s (1 s apart), so rate_scale f sends them 1/f apart.
    result = highest_rate(_trace(1.0), _engine(), slo, by="rate_scale", rel_tol=0.001)
    hand = 1 / hand_gap
    answer = result.answer
    assert answer.meets and answer["answer"] and answer["rate_req_s"] == answer.axis
    assert hand * (1 - 0.001) <= answer.axis <= hand
    # Every point on the right side of the hand answer, and the hand formula's attainment.
    for p in result.points:
        g = 1 / p.axis
        met = sum(_hand_ttft(k, g) <= 0.215 + 1e-12 for k in range(N)) if g < S else N
        assert p["slo_met"] == met, p.axis
        assert p.meets == (p.axis < hand)
    assert [p["phase"] for p in result.points][:5] == ["bracket"] * 5  # 1, 2, 4, 8, 16 (fails)
    assert [p.axis for p in result.points][:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    # 21 requests at ~11 requests/s arrive over under 2 s, fewer than 10 lifetimes (test_capacity_floor.py).
    assert [n for n in result.notes if not n.startswith("the trace is too short for a steady state")] == []
    assert sum(p["answer"] for p in result.points) == 1


def test_smallest_deployment_by_hand():
    # 21 requests 30 ms apart, TTFT <= 25 ms for all.  Round robin gives each of c replicas a request
    # every 30c ms.  max_num_seqs 1: c = 3 queues (90 ms < S: the 7th request of a replica waits
    # 60 ms), c = 4 does not (120 ms >= S).  max_num_seqs 2: two slots per replica, one request
    # every 60 c ms into each slot every 120 c ms: c = 2 never waits for a slot, c = 1 does.  A request
    # that waits for no slot waits at most for the next iteration to start (T) and its first token
    # comes T later: TTFT, counted from its send, is within [T, 2 T] < 25 ms.
    slo = slo_from_dict({"ttft_s": 0.025, "attainment": 1.0})
    result = smallest_deployment(_trace(0.03), _engine(), slo, max_replicas=8, grid={"max_num_seqs": [1, 2]},
                                 price_per_gpu_hour=3.0, band=False)
    seen = [(p["candidate"], p["replicas"], p["phase"], p["verdict"]) for p in result.points]
    assert seen == [("g000", 1, "bracket", "fails"), ("g000", 2, "bracket", "fails"), ("g000", 4, "bracket", "meets"),
                    ("g000", 3, "bisect", "fails"),
                    ("g001", 1, "bracket", "fails"), ("g001", 2, "bracket", "meets")]
    a = result.answer
    assert (a["candidate"], a["replicas"], a["gpus"]) == ("g001", 2, 2)
    assert json.loads(a["knobs"]) == {"layout": "aggregated", "max_num_seqs": 2}
    assert T <= a["ttft_p99_s"] <= 2 * T and a["attainment"] == 1.0
    # Cost: GPUs x the replay's duration, and per million of its 210 output tokens.
    assert a["output_tokens"] == 210
    assert a["gpu_hours"] == 2 * a["duration_s"] / 3600
    assert a["cost"] == a["gpu_hours"] * 3.0
    assert a["cost_per_mtok"] == a["cost"] / 210 * 1e6
    assert result.notes == []
    assert set(a.row) == set(POINT_COLUMNS)
    assert [c for c in POINT_COLUMNS if a[c] is None] == ["prefill_replicas", "decode_replicas", "reason",
                                                          "band_low_req_s", "band_high_req_s", "band_low_gpus",
                                                          "band_high_gpus", "calibration"]


def test_a_refused_grid_point_is_kept_with_its_reason():
    slo = slo_from_dict({"ttft_s": 0.015, "attainment": 1.0})
    result = smallest_deployment(_trace(1.0), _engine(), slo, max_replicas=2, grid={"max_num_seqs": [0, 1]})
    refused, met = result.points
    assert (refused["candidate"], refused["verdict"], refused["phase"], refused["gpus"]) == \
        ("g000", "refused", "refused", None)
    assert "max_num_seqs" in refused["reason"]
    assert (met["candidate"], met["replicas"], met["verdict"]) == ("g001", 1, "meets")
    assert result.answer is met


def test_a_split_counts_both_pools_and_can_win():
    # TTFT is the prefill replica's: one prefill step of 10 ms every 30 ms never waits, so a [1, 1] split
    # meets TTFT <= 15 ms with 2 replicas where aggregated replicas need 4 (above); tp 2: 4 GPUs against 8.
    slo = slo_from_dict({"ttft_s": 0.015, "attainment": 1.0})
    tm = {**ENGINE["time_model"], "tp": 2}
    base = parse_deployment({"prefill": {"replicas": 1}, "decode": {"replicas": 1}, "link": {"bandwidth_gb_s": "inf"}})
    result = smallest_deployment(_trace(0.03), _engine(time_model=tm), slo, max_replicas=8, splits=[(1, 1)],
                                 deployment=base)
    split = [p for p in result.points if p["candidate"] == "g001"]
    assert [(p["prefill_replicas"], p["decode_replicas"], p["replicas"], p["gpus"], p["verdict"]) for p in split] == \
        [(1, 1, 2, 4, "meets")]
    agg = [p for p in result.points if p["candidate"] == "g000" and p.meets]
    assert [(p["replicas"], p["gpus"]) for p in agg] == [(4, 8)]
    assert result.answer is split[0]
    assert result.answer["cost"] is None and result.answer["cost_per_mtok"] is None  # no price given


def test_nothing_meets_and_an_unbounded_bracket_are_said():
    # The floor (one request at a time: TTFT T = 10 ms) meets ttft_s 15 ms, so the search halves from
    # x1000 until its budget: x1000 fails, the floor meets, x500 fails.
    slo = slo_from_dict({"ttft_s": 0.015, "attainment": 1.0})
    result = highest_rate(_trace(1.0), _engine(), slo, by="rate_scale", start=1000.0, max_points=3)
    assert result.answer is None and [p["phase"] for p in result.points] == ["bracket", "floor", "bracket"]
    assert result.notes == ["no rate down to 500 x the trace's rate meets the SLO (budget of 3 points)"]
    loose = slo_from_dict({"ttft_s": 100.0, "attainment": 1.0})
    result = highest_rate(_trace(1.0), _engine(), loose, by="rate_scale", max_points=3, band=False)
    assert result.answer.axis == 4.0
    assert result.notes == ["every rate up to 4 x the trace's rate meets the SLO: the answer is a lower bound "
                            "(budget of 3 points)"]


def test_percentile_limits_judge_the_summary():
    # At rate x12 (83 ms apart) TTFT_k = 10 + 20 k ms or so: p50 well above 15 ms, so a p50 limit fails it
    # while a generous one passes; the reason names the limit.
    tight = slo_from_dict({"ttft_p50_s": 0.015})  # percentile-only: no attainment
    result = highest_rate(_trace(1.0), _engine(), tight, by="rate_scale", start=12.0, max_points=2)
    first = result.points[0]
    assert first["verdict"] == "fails" and first["reason"].startswith("ttft_p50_s ")
    assert first["reason"].endswith(" > 0.015")


def test_monotone_notes():
    def pt(axis, verdict, att):
        return Point({"verdict": verdict, "attainment": att}, axis)

    rate = [pt(1, "meets", 1.0), pt(2, "fails", 0.8), pt(3, "meets", 0.96)]
    assert monotone_notes(rate, rising=False) == ["not monotone: 3 meets the SLO but 2 fails it"]
    rate = [pt(1, "meets", 1.0), pt(2, "fails", 0.5), pt(3, "fails", 0.7)]
    assert monotone_notes(rate, rising=False) == ["attainment not monotone: 0.7 at 3 but 0.5 at 2"]
    assert monotone_notes([pt(1, "meets", 1.0), pt(2, "fails", 0.5), pt(4, "fails", 0.4)], rising=False) == []
    # Replicas: the verdict should improve with more of them.
    reps = [pt(1, "fails", 0.5), pt(2, "fails", 0.4), pt(3, "meets", 1.0)]
    assert monotone_notes(reps, rising=True) == ["attainment not monotone: 0.5 at 1 but 0.4 at 2"]


# ---------------------------------------------------------------- determinism


def test_same_inputs_same_points_and_id():
    slo = slo_from_dict({"ttft_s": 0.05, "tpot_s": 0.02, "attainment": 0.9})
    runs = [highest_rate(_trace(1.0), _engine(), slo, seed=7, rel_tol=0.05) for _ in range(2)]
    assert runs[0].rows() == runs[1].rows()
    assert runs[0].search_id == runs[1].search_id
    other = highest_rate(_trace(1.0), _engine(), slo, seed=8, rel_tol=0.05)
    assert other.search_id != runs[0].search_id
    loads = [json.loads(p["load"]) for p in runs[0].points]
    assert all(ld["seed"] == 7 and set(ld) == {"poisson_rate", "seed"} for ld in loads)
    # Poisson by default, from the trace's own rate (20 gaps over 20 s: 1 request/s).
    assert runs[0].points[0].axis == 1.0


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("raw, message", [
    ({"ttft": 1.0, "attainment": 0.9}, "unknown key 'slo.ttft'"),
    ({"ttft_p99_s": 1.0, "attainment": 0.9}, "'slo.attainment' in c.toml is the share of requests within the "
                                              "thresholds (ttft_s, tpot_s, e2e_s), and none is given"),
    ({"ttft_s": 1.0, "attainment": 1.5}, "'slo.attainment' in c.toml must be a share in (0, 1], got 1.5"),
    ({"ttft_s": 1.0, "attainment": True}, "'slo.attainment' in c.toml must be a share"),
    ({"ttft_s": -1.0, "attainment": 0.9}, "'slo.ttft_s' in c.toml must be a finite positive number of seconds, got -1.0"),
    ({"ttft_p95_s": 1.0, "attainment": 0.9}, "unknown key 'slo.ttft_p95_s'"),
    ({"e2e_p99_s": float("nan"), "attainment": 0.9}, "'slo.e2e_p99_s' in c.toml must be a finite positive"),
    ({"attainment": 0.9}, "must give a threshold"),
])
def test_bad_slo_is_named(raw, message):
    with pytest.raises(ConfigError) as e:
        slo_from_dict(raw, " in c.toml")
    assert message in str(e.value) and "c.toml" in str(e.value)


def _spec(tmp_path, question: str, slo="ttft_s = 0.215\nattainment = 1.0", extra=""):
    lines = [{"request_id": f"r{i}", "prompt_len": 16, "max_tokens": 10, "arrival_time": float(i)} for i in range(N)]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "engine.json").write_text(json.dumps(ENGINE))
    (tmp_path / "cap.toml").write_text(
        f'name = "c"\ndatabase = "cap.duckdb"\nengine = "engine.json"\n{extra}\n'
        f'[trace]\npath = "trace.jsonl"\nformat = "oracle"\n[slo]\n{slo}\n{question}\n')
    return str(tmp_path / "cap.toml")


@pytest.mark.parametrize("question, extra, message", [
    ("[rate]\nrel_tol = 0", "", "'rate.rel_tol' in "),
    ("[rate]\nby = 'qps'", "", "'rate.by' in "),
    ("[rate]\nby = 'rate_scale'\nseed = 1", "", "'rate.seed' in "),
    ("[rate]\nstep = 2", "", "unknown key 'rate.step' in "),
    ("[rate]\n[fleet]\nmax_replicas = 2", "", "asks one question"),
    ("", "", "asks one question"),
    ("[fleet]\nmax_replicas = 65", "", "'fleet.max_replicas' in "),
    ("[fleet]\nmax_replicas = 2\nsplits = [[1, 0]]", "", "'fleet.splits' in "),
    ("[fleet]\nmax_replicas = 2\n[fleet.grid]\nmax_num_seq = [1]", "", "unknown knob 'fleet.grid.max_num_seq' in "),
    ("[fleet]\nmax_replicas = 2\nrate_scale = 2.0\npoisson_rate = 1.0", "", "'fleet.rate_scale' and "),
    ("[rate]", "price_per_gpu_hour = -1", "'price_per_gpu_hour' in "),
    ("[rate]", "colour = 1", "unknown key 'colour' in "),
])
def test_bad_spec_exits_2_naming_the_key_and_file(tmp_path, question, extra, message):
    path = _spec(tmp_path, question, extra=extra)
    r = CliRunner().invoke(main, ["capacity", path])
    assert r.exit_code == 2, r.output
    assert message in r.output and "cap.toml" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "cap.duckdb").exists()


def test_splits_need_a_disaggregated_deployment(tmp_path):
    _spec(tmp_path, "")  # the engine and trace files
    spec = capacity_from_dict({"name": "c", "database": "x.duckdb", "engine": "engine.json",
                               "trace": {"path": "trace.jsonl"}, "slo": {"ttft_s": 1.0, "attainment": 1.0},
                               "fleet": {"max_replicas": 4, "splits": [[1, 1]]}}, base_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="'fleet.splits' need a disaggregated base deployment"):
        smallest_deployment(_trace(1.0), spec.engine, spec.slo, **spec.params)


# ---------------------------------------------------------------- landing


def test_every_point_lands_once_with_its_verdict(tmp_path):
    path = _spec(tmp_path, "[rate]\nby = 'rate_scale'\nrel_tol = 0.01", extra="price_per_gpu_hour = 2.0")
    r = CliRunner().invoke(main, ["capacity", path, "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["question"] == "rate" and out["slo"] == {"ttft_s": 0.215, "attainment": 1.0}
    answer = out["points"][out["answer"]]
    assert 1 / 0.0895 * 0.99 <= answer["rate_req_s"] <= 1 / 0.0895
    db = str(tmp_path / "cap.duckdb")
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute("SELECT * FROM capacity_points ORDER BY point").fetchall()
        cols = [d[0] for d in con.description]
    assert cols == CAPACITY_POINTS.names
    assert [list(row) for row in rows] == [[p[c] for c in cols] for p in out["points"]]
    assert sum(row[cols.index("answer")] for row in rows) == 1
    assert {row[cols.index("verdict")] for row in rows} == {"meets", "fails"}
    # The same search again replaces its rows: the same points, once.
    r = CliRunner().invoke(main, ["capacity", path, "--format", "csv"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == ",".join(CAPACITY_POINTS.names)
    with duckdb.connect(db, read_only=True) as con:
        again = con.execute("SELECT * FROM capacity_points ORDER BY point").fetchall()
    assert again == rows
    # The table output names the answer.
    r = CliRunner().invoke(main, ["capacity", path])
    assert r.exit_code == 0, r.output
    assert f"highest rate within the SLO: {answer['rate_req_s']:.4f} requests/s, " in r.output
    # ... with its band and the calibration that gave it (the defaults': TPOT's held-out errors at the
    # outer quantiles, -0.239 and +0.299, give step times x 1 / 1.299 = 0.77 to x 1 / 0.761 = 1.31).
    assert f"{answer['band_low_req_s']:.4f}-{answer['band_high_req_s']:.4f} (step times x0.77-x1.31, the " \
           "held-out errors of calibration 'aisim defaults') (rate x" in r.output


def test_the_fleet_question_through_the_command(tmp_path):
    # Requests 1 s apart never wait on one engine: one replica, one GPU, the first point.
    path = _spec(tmp_path, "[fleet]\nmax_replicas = 4\n[fleet.grid]\nmax_num_seqs = [1, 2]")
    r = CliRunner().invoke(main, ["capacity", path, "--progress"])
    assert r.exit_code == 0, r.output
    assert 'smallest deployment: g000 {"layout": "aggregated", "max_num_seqs": 1}, 1 replica, 1 GPU, ' in r.output
    assert "point 0 (bracket): as traced on 1 replica: meets, attainment 1, " in r.output
    with duckdb.connect(str(tmp_path / "cap.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT candidate, replicas, verdict, answer FROM capacity_points ORDER BY point").fetchall()
    assert rows == [("g000", 1, "meets", True), ("g001", 1, "meets", False)]


def test_a_failed_landing_writes_nothing(tmp_path):
    db = str(tmp_path / "cap.duckdb")
    with duckdb.connect(db) as con:
        con.execute("CREATE TABLE capacity_points (search_id VARCHAR, point INTEGER)")
        con.execute("INSERT INTO capacity_points VALUES ('old', 0)")
    result = highest_rate(_trace(1.0), _engine(), slo_from_dict({"ttft_s": 100.0, "attainment": 1.0}),
                          by="rate_scale", max_points=2)
    with pytest.raises(PipelineError, match="cannot land capacity points in .*cap.duckdb"):
        land_points(db, result)
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT * FROM capacity_points").fetchall() == [("old", 0)]


def test_capacity_page_names_every_slo_key_and_column():
    import os

    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "capacity.md"),
              encoding="utf-8") as fh:
        section = fh.read()
    for k in KEYS:
        assert f"`{k}`" in section, k
    for c in CAPACITY_POINTS.names:
        assert f"`{c}`" in section, c


# ---------------------------------------------------------------- the band


def _calibrated(tpot_errors):
    cal = {"name": "hand", "method": "by hand", "quantiles": [0.1, 0.5, 0.9], "held_out": {"tpot": tpot_errors}}
    return _engine(time_model={**ENGINE["time_model"], "calibration": cal})


def test_rate_band_by_hand():
    # Held-out TPOT errors of -20 % and +25 %: every step x 1/1.25 = 0.8 and x 1/0.8 = 1.25.  With
    # T' = s T and S' = 10 T', TTFT_20 = T' + 20 (S' - g) <= 0.215 (_hand_ttft, counted from the send):
    # s = 0.8:  g >= 0.08 - (0.215 - 0.008) / 20 = 0.06965 s (< S');
    # s = 1.25: g >= 0.125 - (0.215 - 0.0125) / 20 = 0.114875 s (< S').
    slo = slo_from_dict({"ttft_s": 0.215, "attainment": 1.0})
    result = highest_rate(_trace(1.0), _calibrated([-0.2, 0.0, 0.25]), slo, by="rate_scale", rel_tol=0.001)
    band = result.band
    assert band["calibration"] == "hand" and band["scale"] == [0.8, 1.25] and band["notes"] == []
    assert 1 / 0.114875 * (1 - 0.001) <= band["low_req_s"] <= 1 / 0.114875
    assert 1 / 0.06965 * (1 - 0.001) <= band["high_req_s"] <= 1 / 0.06965
    a = result.answer
    assert (a["band_low_req_s"], a["band_high_req_s"], a["calibration"]) == (band["low_req_s"], band["high_req_s"],
                                                                            "hand")
    assert 1 / 0.08975 * (1 - 0.001) <= a.axis <= 1 / 0.08975  # the answer itself, as without a band
    # The band's searches keep their points to themselves: the same points as a search without a band.
    alone = highest_rate(_trace(1.0), _calibrated([-0.2, 0.0, 0.25]), slo, by="rate_scale", rel_tol=0.001,
                         band=False)
    assert [p.axis for p in result.points] == [p.axis for p in alone.points] and alone.band is None


def test_fleet_band_by_hand():
    # Errors of -75 % and +100 %: steps x 0.5 and x 4.  Requests 30 ms apart, TTFT <= 25 ms for all
    # (as test_smallest_deployment_by_hand).
    # x 0.5: T' = 5 ms, S' = 50 ms: max_num_seqs 2 on one replica (each slot every 60 ms >= 50) never
    # waits for a slot, and its TTFT, counted from the send, is within [T', 2 T'] = [5, 10] ms: it meets.
    # x 4: T' = 40 ms > 25 ms: every TTFT is at least one step, no deployment meets.
    slo = slo_from_dict({"ttft_s": 0.025, "attainment": 1.0})
    result = smallest_deployment(_trace(0.03), _calibrated([-0.75, 0.0, 1.0]), slo, max_replicas=8,
                                 grid={"max_num_seqs": [1, 2]})
    assert result.answer["gpus"] == 2  # as without a calibration (test_smallest_deployment_by_hand)
    assert result.band == {"calibration": "hand", "scale": [0.5, 4.0], "notes": [], "low_gpus": 1,
                           "high_gpus": None}
    assert (result.answer["band_low_gpus"], result.answer["band_high_gpus"]) == (1, None)


def test_band_false_skips_the_band(tmp_path):
    path = _spec(tmp_path, "[rate]\nby = 'rate_scale'\nmax_points = 3\nband = false")
    r = CliRunner().invoke(main, ["capacity", path, "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["band"] is None
    assert all(p["calibration"] is None for p in doc["points"])
    bad = _spec(tmp_path, "[fleet]\nmax_replicas = 2\nband = 'no'")
    r = CliRunner().invoke(main, ["capacity", bad])
    assert r.exit_code == 2 and "'fleet.band'" in r.output and "must be true or false, got 'no'" in r.output
