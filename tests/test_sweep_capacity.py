"""A sweep spec's ``[capacity]`` section: each candidate's highest rate within an SLO, and the ranking by it.

The hand model of ``test_capacity.py``: every step 10 ms (T), a request (16-token prompt, 10
outputs) holds a sequence slot 100 ms (S); 21 requests 1 s apart.  Within TTFT <= 215 ms for
every request, searched along ``rate_scale`` (gaps g = 1 s / f) with ``rel_tol`` 0.01:

- ``max_num_seqs`` 1, a single server: TTFT_k = T + k (S - g), counted from the send of request k
  (sent at k g, started at k S); k = 20 binds, gaps above 89.75 ms, rates below 11.142/s
  (``test_capacity``).  The bisection's bracket from 1, 2, 4, 8 (meet), 16 (fails) closes on
  [11.125, 11.1875]: the answer is 11.125.
- ``max_num_seqs`` 2: requests alternate between two slots, request 2j starting at jS, so
  TTFT_20 = T + 10 S - 20 g <= 0.215 needs gaps above 39.75 ms, rates below 25.157/s (the odd
  requests start one step later: TTFT_19 = 2 T + 9 S - 19 g binds only above 37.1 ms).  Bracket
  16 (meets), 32 (fails), closed on [25.0, 25.25]: the answer is 25.0.

The KV pool (1024 or 2048 blocks) holds everything either way: it changes nothing, so those
candidates tie on rate, GPUs and p99 TTFT and go in grid order.  At the trace's own rate every
candidate meets every SLO with the same goodput: without ``[capacity]`` the ranking is grid order.
"""

import json
import os

import duckdb
import pytest
from click.testing import CliRunner

import aisim.capacity  # noqa: F401  (plugs [capacity] into pipeline specs)
from aisim.capacity import highest_rate, slo_from_dict
from aisim.capacity.search import TAGS
from aisim.cli import main
from aisim.columns import CAPACITY_POINTS
from aisim.config.engine import engine_config_from_dict, load_engine_config
from aisim.errors import SweepError
from aisim.sweep import load_sweep, run_sweep
from aisim.traces import read_trace

from test_capacity import ENGINE

GRID = "[grid]\nmax_num_seqs = [1, 2]\nnum_gpu_blocks = [1024, 2048]\n"
CAPACITY = "[capacity]\n[capacity.slo]\nttft_s = 0.215\nattainment = 1.0\n" \
           "[capacity.rate]\nby = 'rate_scale'\nrel_tol = 0.01\n"
HAND = {1: 11.125, 2: 25.0}        # the answers the bisection reaches (module docstring)
BOUND = {1: 1 / 0.08975, 2: 1 / 0.03975}  # the hand thresholds they sit within 1 % below
# The columns a search fills whoever runs it (the others name the search and the run).
SAME = [c for c in CAPACITY_POINTS.names if c not in ("search_id", "search") + TAGS]
FILES = ["base.json", "sweep.toml", "trace.jsonl"]


def _write(tmp_path, capacity=CAPACITY, grid=GRID, extra="", step_clock=False):
    at = "arrival_step" if step_clock else "arrival_time"
    lines = [{"request_id": f"r{i}", "prompt_len": 16, "max_tokens": 10, at: i * (100 if step_clock else 1.0)}
             for i in range(21)]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "base.json").write_text(json.dumps(ENGINE))
    (tmp_path / "sweep.toml").write_text(
        'name = "s"\ndatabase = "s.duckdb"\nmodel = "m"\nbase = "base.json"\nbest = "best.toml"\n'
        f'{extra}[trace]\npaths = ["trace.jsonl"]\nformat = "oracle"\n{grid}[slo]\nttft_s = 0.215\n{capacity}')
    return str(tmp_path / "sweep.toml")


def _direct(tmp_path, max_num_seqs, blocks):
    """aisim.capacity's answer for one candidate, its points as rows."""
    trace = read_trace(str(tmp_path / "trace.jsonl"), "oracle")
    engine = engine_config_from_dict({**ENGINE, "max_num_seqs": max_num_seqs, "num_gpu_blocks": blocks})
    result = highest_rate(trace, engine, slo_from_dict({"ttft_s": 0.215, "attainment": 1.0}), by="rate_scale",
                          rel_tol=0.01)
    return [dict(zip(CAPACITY_POINTS.names, r)) for r in result.rows()]


def _rows(db, sql, params=()):
    with duckdb.connect(str(db), read_only=True) as con:
        cur = con.execute(sql, list(params))
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]


def test_each_candidate_is_searched_and_the_ranking_goes_by_its_highest_rate(tmp_path):
    result = run_sweep(load_sweep(_write(tmp_path)), scheduler="sync")
    by = {c.name: c for c in result.candidates}
    # Grid order: (1, 1024), (1, 2048), (2, 1024), (2, 2048).
    assert [by[n].capacity_rate_req_s for n in ("c000", "c001", "c002", "c003")] == [HAND[1]] * 2 + [HAND[2]] * 2
    for seqs in HAND:
        assert BOUND[seqs] * 0.99 <= HAND[seqs] <= BOUND[seqs]
    assert [c.name for c in result.ranked] == ["c002", "c003", "c000", "c001"]
    assert load_engine_config(tmp_path / "best.toml").max_num_seqs == 2
    assert "ranked by the highest rate within the [capacity] SLO: 25.000 requests/s" in \
        (tmp_path / "best.toml").read_text()
    db = tmp_path / "s.duckdb"
    assert _rows(db, "SELECT candidate, rank, capacity_rate_req_s FROM sweep_candidates ORDER BY candidate") == [
        {"candidate": "c000", "rank": 3, "capacity_rate_req_s": HAND[1]},
        {"candidate": "c001", "rank": 4, "capacity_rate_req_s": HAND[1]},
        {"candidate": "c002", "rank": 1, "capacity_rate_req_s": HAND[2]},
        {"candidate": "c003", "rank": 2, "capacity_rate_req_s": HAND[2]}]
    # Each candidate's points, tagged with the sweep's run and its shard, are aisim.capacity's own.
    points = _rows(db, "SELECT p.*, s.engine FROM capacity_points p JOIN shards s USING (run_id, shard_id) "
                       "ORDER BY shard_id, point")
    assert {p["run_id"] for p in points} == {result.run_id}
    for shard_id, (name, seqs, blocks) in enumerate([("c000", 1, 1024), ("c001", 1, 2048), ("c002", 2, 1024),
                                                     ("c003", 2, 2048)]):
        mine = [p for p in points if p["shard_id"] == shard_id]
        assert {(p["engine"], p["model"], p["search"]) for p in mine} == {(name, "m", f"m/{name}")}
        assert [[p[c] for c in SAME] for p in mine] == [[p[c] for c in SAME] for p in _direct(tmp_path, seqs, blocks)]
        assert [p["rate_req_s"] for p in mine if p["answer"]] == [HAND[seqs]]
    assert len(points) == 4 * 12  # twelve replays each (module docstring: 5 or 6 bracketing, the rest bisecting)


def test_without_capacity_the_same_grid_ranks_by_goodput(tmp_path):
    result = run_sweep(load_sweep(_write(tmp_path, capacity="")), scheduler="sync")
    # Every candidate meets the SLO at the trace's own rate: a four-way tie on goodput, GPUs and p99 TTFT.
    assert [c.name for c in result.ranked] == ["c000", "c001", "c002", "c003"]
    assert len({(c.goodput_req_s, c.gpus, c.ttft_p99_s, c.capacity_rate_req_s) for c in result.ranked}) == 1
    assert (result.best.gpus, result.best.ttft_p99_s, result.best.capacity_rate_req_s) == (1, pytest.approx(0.01), None)
    assert _rows(tmp_path / "s.duckdb", "SELECT count(*) AS n FROM information_schema.tables "
                                        "WHERE table_name = 'capacity_points'") == [{"n": 0}]


def test_the_command_shows_the_rate_and_says_what_ranks(tmp_path):
    path = _write(tmp_path)
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [(c["candidate"], c["capacity_rate_req_s"]) for c in doc["ranked"]] == \
        [("c002", HAND[2]), ("c003", HAND[2]), ("c000", HAND[1]), ("c001", HAND[1])]
    assert r.stderr.rstrip().endswith("table sweep_candidates; each search in capacity_points)")
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync", "--format", "csv"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0].endswith(",gpus,kv_tokens,capacity_rate_req_s,capacity_band_low_req_s,"
                                             "capacity_band_high_req_s,calibration")
    # Each row's band is its search's (the defaults' calibration: the engine has none of its own).
    answer = next(row for row in _direct(tmp_path, 2, 1024) if row["answer"])
    assert [(c["capacity_band_low_req_s"], c["capacity_band_high_req_s"], c["calibration"])
            for c in doc["ranked"]][0] == (answer["band_low_req_s"], answer["band_high_req_s"], "aisim defaults")
    assert answer["band_low_req_s"] < HAND[2] < answer["band_high_req_s"]
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync"])
    assert r.exit_code == 0, r.output
    assert "capacity req/s" in r.output and "25.000" in r.output
    assert "ranked by the highest rate within the [capacity] SLO" in " ".join(r.output.split())


def test_each_load_level_searches_its_candidates_in_its_run(tmp_path):
    # The search sets the rate itself (on the trace as traced): every level finds the same answers.
    path = _write(tmp_path, grid="[grid]\nmax_num_seqs = [1, 2]\n", extra="[load]\nrate_scale = [1.0, 2.0]\n")
    result = run_sweep(load_sweep(path), scheduler="sync")
    assert len(result.run_ids) == 2
    by = {c.name: c for c in result.candidates}
    assert [(by[n].run_id, by[n].capacity_rate_req_s) for n in ("c000", "c001", "c002", "c003")] == \
        [(result.run_ids[0], HAND[1]), (result.run_ids[0], HAND[2]),
         (result.run_ids[1], HAND[1]), (result.run_ids[1], HAND[2])]
    got = _rows(tmp_path / "s.duckdb", "SELECT run_id, shard_id, rate_req_s FROM capacity_points WHERE answer "
                                       "ORDER BY run_id = ?, shard_id", [result.run_ids[1]])
    assert [tuple(g.values()) for g in got] == [(result.run_ids[0], 0, HAND[1]), (result.run_ids[0], 1, HAND[2]),
                                                (result.run_ids[1], 0, HAND[1]), (result.run_ids[1], 1, HAND[2])]
    # The rate ranks first, whatever the level (at gaps of 1 s and 0.5 s every TTFT is one step, so
    # the p99 TTFT after it differs between the levels in the clock's last bits only).
    assert [c.ttft_p99_s for c in result.ranked] == [pytest.approx(0.01)] * 4
    assert [sorted(c.name for c in result.ranked[i:i + 2]) for i in (0, 2)] == [["c001", "c003"], ["c000", "c002"]]


def _failing_search(desc, question, trace):
    """The capacity section's task, failing for candidate c001 as a search past a profile's range would."""
    from aisim.capacity.pipeline import search_shard
    from aisim.errors import ConfigError

    if desc["engine"] == "c001":
        raise ConfigError("a step of 2 sequences is outside the profile's measured range")
    return search_shard(desc, question, trace)


def test_a_candidate_whose_search_fails_is_refused_with_the_reason_and_the_others_ranked(tmp_path, monkeypatch):
    from dataclasses import replace

    from aisim.pipeline import sections

    monkeypatch.setitem(sections._SECTIONS, "capacity", replace(sections.section("capacity"), task=_failing_search))
    result = run_sweep(load_sweep(_write(tmp_path, grid="[grid]\nmax_num_seqs = [1, 2]\n")), scheduler="sync")
    by = {c.name: c for c in result.candidates}
    assert by["c001"].reason == "its capacity search failed: a step of 2 sequences is outside the profile's measured range"
    assert [(c.name, c.rank, c.capacity_rate_req_s) for c in result.ranked] == [("c000", 1, HAND[1])]
    assert _rows(tmp_path / "s.duckdb", "SELECT candidate, status, capacity_rate_req_s FROM sweep_candidates "
                                        "ORDER BY candidate") == [
        {"candidate": "c000", "status": "ranked", "capacity_rate_req_s": HAND[1]},
        {"candidate": "c001", "status": "refused", "capacity_rate_req_s": None}]
    assert _rows(tmp_path / "s.duckdb", "SELECT DISTINCT shard_id, search FROM capacity_points") == \
        [{"shard_id": 0, "search": "m/c000"}]


@pytest.mark.parametrize("capacity, message", [
    (CAPACITY.replace("[capacity.rate]", "[capacity.fleet]\nmax_replicas = 2\n[capacity.rate]"),
     "'capacity.fleet' in "),
    ("[capacity]\n[capacity.slo]\nttft_s = 0.215\n[capacity.fleet]\nmax_replicas = 2\n",
     "'capacity.fleet' in "),
    (CAPACITY + "colour = 1\n", "unknown key 'capacity.rate.colour' in "),
    (CAPACITY.replace("[capacity]\n", "[capacity]\ncolour = 1\n"), "unknown key 'capacity.colour' in "),
    (CAPACITY.replace("attainment = 1.0", "attainment = 2.0"), "'capacity.slo.attainment' in "),
    (CAPACITY.replace("rel_tol = 0.01", "rel_tol = 1.5"), "'capacity.rate.rel_tol' in "),
    (CAPACITY.split("[capacity.rate]")[0], "give '[capacity.rate]' (the highest rate"),
    ("[capacity]\n[capacity.rate]\nby = 'rate_scale'\n", "missing required key 'capacity.slo' in "),
    ("capacity = 3\n", "'capacity' in "),
])
def test_a_bad_capacity_key_exits_2_naming_it_and_the_file(tmp_path, capacity, message):
    if capacity.startswith("capacity ="):  # a top-level key, before any table
        path = _write(tmp_path, capacity="", extra=capacity)
    else:
        path = _write(tmp_path, capacity)
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync"])
    assert r.exit_code == 2, r.output
    assert message in r.output and "sweep.toml" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == FILES


def test_rate_scale_on_a_trace_timed_in_steps_is_refused_before_anything_runs(tmp_path):
    path = _write(tmp_path, step_clock=True)
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync"])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [
        f"error: 'capacity.rate.by' in {path} is 'rate_scale', which scales the trace's own rate, and trace.jsonl "
        "arrives by engine step: give by = 'poisson_rate'"]
    assert sorted(os.listdir(tmp_path)) == FILES


def test_a_sweep_with_capacity_needs_the_capacity_room(tmp_path, monkeypatch):
    from aisim.pipeline import sections

    monkeypatch.setattr(sections, "_SECTIONS", {})
    with pytest.raises(SweepError, match=r"^'capacity' in .*sweep.toml is read by aisim.capacity: import it"):
        load_sweep(_write(tmp_path))


def test_one_and_two_workers_land_byte_identical_rankings_and_points(tmp_path):
    path = _write(tmp_path, grid="[grid]\nmax_num_seqs = [1, 2]\n")
    out = []
    for workers in (1, 2):  # the same spec in the same place (its paths are in the run key), a new database
        result = run_sweep(load_sweep(path), scheduler="local", workers=workers)
        files = []
        with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as con:
            for table, order in (("capacity_points", "search_id, point"), ("sweep_candidates", "candidate")):
                f = tmp_path / f"{table}.csv"
                con.execute(f"COPY (SELECT * FROM {table} ORDER BY {order}) TO '{f}' (HEADER)")
                files.append(f.read_bytes())
                f.unlink()
        out.append((result.run_ids, files, (tmp_path / "best.toml").read_bytes()))
        for f in ("s.duckdb", "best.toml"):
            (tmp_path / f).unlink()
    assert out[0] == out[1]
    assert out[0][1][0].count(b"\n") == 1 + 2 * 12


def test_the_report_shows_the_rate_the_candidates_are_ranked_by(tmp_path):
    import html as htmlmod
    import re

    from aisim.report import build_report

    result = run_sweep(load_sweep(_write(tmp_path, grid="[grid]\nmax_num_seqs = [1, 2]\n")), scheduler="sync")
    page, rd = build_report(str(tmp_path / "s.duckdb"), result.run_id)
    assert [(c["candidate"], c["rank"], c["capacity_rate_req_s"]) for c in rd.sweep] == \
        [("c000", 2, HAND[1]), ("c001", 1, HAND[2])]
    table = re.search(r'<table class="summary sortable" id="sweep-table">(.*?)</table>', page, re.S).group(1)
    head = [htmlmod.unescape(h) for h in re.findall(r'<th scope="col">(.*?)</th>', table)]
    assert head[:5] == ["rank", "candidate", "knobs", "capacity", "goodput"]
    rows = [[htmlmod.unescape(re.sub(r"<[^>]+>", "", x)) for x in re.findall(r"<td[^>]*>(.*?)</td>", r)]
            for r in re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1], re.S)]
    from aisim.report.svg import fmt_count

    # Each rate with its band (the defaults' calibration: the engine has none of its own).
    bands = [f"({fmt_count(c['capacity_band_low_req_s'])}-{fmt_count(c['capacity_band_high_req_s'])})"
             for c in rd.sweep]
    assert [r[:2] + r[3:4] for r in rows] == [["2", "c000", f"11.1/s {bands[0]}"], ["1", "c001", f"25/s {bands[1]}"]]
    assert "held-out errors of calibration 'aisim defaults'" in htmlmod.unescape(page)
    assert "Ranked by the highest rate within the [capacity] SLO (capacity)." in page
