"""A pipeline spec's ``[capacity]`` section: a capacity search per shard, landed with the run.

Two models, each with its own trace, on the hand model of ``test_capacity.py`` (every step
10 ms, a request holds its slot 100 ms, ``max_num_seqs`` 1).  Model ``a``: 21 requests 1 s
apart; every TTFT within 215 ms needs gaps above 89.75 ms (``test_capacity``).  Model ``b``: 11
requests 0.5 s apart; request k's TTFT, counted from its send, is T + k (S - g), so k = 10 binds:
gaps above 79.5 ms, a rate below 1 / 0.0795 requests/s.
"""

import json
import os

import duckdb
import pytest
from click.testing import CliRunner

from aisim.capacity import highest_rate, slo_from_dict, smallest_deployment
from aisim.capacity.search import TAGS
from aisim.cli import main
from aisim.columns import CAPACITY_POINTS
from aisim.config.engine import engine_config_from_dict
from aisim.errors import LandingFailed
from aisim.pipeline import load_spec
from aisim.pipeline.run import run_pipeline
from aisim.traces import read_trace

from test_capacity import ENGINE
from test_pipeline_common import dump

GAPS = {"a": (1.0, 21), "b": (0.5, 11)}
HAND_GAP = {"a": 0.08975, "b": 0.0795}
RATE = "[capacity.rate]\nby = 'rate_scale'\nrel_tol = 0.01\n"
SLO = "[capacity.slo]\nttft_s = 0.215\nattainment = 1.0\n"
# The columns a search fills whoever runs it (the others name the search and the run).
SAME = [c for c in CAPACITY_POINTS.names if c not in ("search_id", "search") + TAGS]


def _write(tmp_path, capacity=SLO + RATE, replay="", name="p"):
    for m, (gap, n) in GAPS.items():
        lines = [{"request_id": f"{m}{i}", "prompt_len": 16, "max_tokens": 10, "arrival_time": i * gap}
                 for i in range(n)]
        (tmp_path / f"{m}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "engine.json").write_text(json.dumps(ENGINE))
    sources = "".join(f'[[sources]]\nname = "{m}"\npaths = ["{m}.jsonl"]\nformat = "oracle"\nmodel = "{m}"\n'
                      for m in GAPS)
    deployments = "".join(f'[[deployments]]\nmodel = "{m}"\nengines = {{ one = "engine.json" }}\n' for m in GAPS)
    (tmp_path / "p.toml").write_text(f'name = "{name}"\ndatabase = "p.duckdb"\n{replay}\n{sources}{deployments}'
                                     f'[capacity]\n{capacity}')
    return str(tmp_path / "p.toml")


def _points(db, run_id):
    with duckdb.connect(str(db), read_only=True) as con:
        cur = con.execute("SELECT * FROM capacity_points WHERE run_id = ? ORDER BY shard_id, point", [run_id])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]


def _direct(tmp_path, model, question="rate", **params):
    trace = read_trace(str(tmp_path / f"{model}.jsonl"), "oracle")
    slo = slo_from_dict({"ttft_s": 0.215, "attainment": 1.0})
    if question == "rate":
        result = highest_rate(trace, engine_config_from_dict(ENGINE), slo, by="rate_scale", rel_tol=0.01)
    else:
        result = smallest_deployment(trace, engine_config_from_dict(ENGINE), slo, **params)
    return [dict(zip(CAPACITY_POINTS.names, r)) for r in result.rows()]


def test_each_shard_is_searched_and_its_points_land_with_the_run(tmp_path):
    spec = _write(tmp_path)
    report = run_pipeline(spec, scheduler="sync")
    db = tmp_path / "p.duckdb"
    points = _points(db, report.run_id)
    assert report.rows["capacity_points"] == len(points)
    for shard_id, model in enumerate(GAPS):
        mine = [p for p in points if p["model"] == model]
        assert {(p["run_id"], p["shard_id"], p["search"]) for p in mine} == {(report.run_id, shard_id,
                                                                               f"{model}/one")}
        assert len({p["search_id"] for p in mine}) == 1
        # What aisim.capacity gives on the model's trace, point for point.
        direct = _direct(tmp_path, model)
        assert [[p[c] for c in SAME] for p in mine] == [[p[c] for c in SAME] for p in direct]
        (answer,) = [p for p in mine if p["answer"]]
        hand = 1 / HAND_GAP[model]
        assert hand * 0.99 <= answer["rate_req_s"] <= hand and answer["verdict"] == "meets"
    # The shards were replayed as usual too.
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT s.model, count(*) FROM requests r JOIN shards s USING (run_id, shard_id) "
                           "GROUP BY s.model ORDER BY s.model").fetchall() == \
            [("a", 21), ("b", 11)]
        # "The highest rate per model" is one query.
        best = con.execute("SELECT model, max(rate_req_s) FROM capacity_points WHERE run_id = ? AND answer "
                           "GROUP BY model ORDER BY model", [report.run_id]).fetchall()
    assert best == [(m, next(p["rate_req_s"] for p in points if p["model"] == m and p["answer"])) for m in GAPS]
    # Running it again lands nothing; --force replaces the run's points, once.
    assert not run_pipeline(spec, scheduler="sync").landed
    again = run_pipeline(spec, scheduler="sync", force=True)
    assert again.replaced and _points(db, report.run_id) == points
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM capacity_points").fetchone()[0] == len(points)


def test_the_fleet_question_per_shard(tmp_path):
    # 1 s and 0.5 s apart, TTFT <= 215 ms: one replica serves each model (the first point).
    spec = _write(tmp_path, SLO + "[capacity.fleet]\nmax_replicas = 4\n[capacity.fleet.grid]\nmax_num_seqs = [1, 2]\n")
    report = run_pipeline(spec, scheduler="sync")
    points = _points(tmp_path / "p.duckdb", report.run_id)
    for model in GAPS:
        mine = [p for p in points if p["model"] == model]
        direct = _direct(tmp_path, model, "deployment", max_replicas=4, grid={"max_num_seqs": [1, 2]})
        assert [[p[c] for c in SAME] for p in mine] == [[p[c] for c in SAME] for p in direct]
        assert [(p["candidate"], p["replicas"], p["verdict"], p["answer"]) for p in mine] == \
            [("g000", 1, "meets", True), ("g001", 1, "meets", False)]


def test_the_run_key_hashes_the_section(tmp_path):
    from aisim.pipeline.runkey import resolve_inputs, run_key

    spec = load_spec(_write(tmp_path))
    other = load_spec(_write(tmp_path, SLO + RATE.replace("0.01", "0.02")))
    assert run_key(spec, resolve_inputs(spec)) != run_key(other, resolve_inputs(other))
    assert spec.canonical()["sections"]["capacity"]["params"] == {"by": "rate_scale", "rel_tol": 0.01}


@pytest.mark.parametrize("capacity, replay, message", [
    (SLO + RATE + "colour = 1\n", "", "unknown key 'capacity.rate.colour' in "),
    ("colour = 1\n" + SLO + RATE, "", "unknown key 'capacity.colour' in "),
    (SLO.replace("1.0", "2.0") + RATE, "", "'capacity.slo.attainment' in "),
    (SLO + "[capacity.rate]\nrel_tol = 1.5\n", "", "'capacity.rate.rel_tol' in "),
    (SLO, "", "give '[capacity.rate]' (the highest rate"),
    (RATE, "", "missing required key 'capacity.slo' in "),
    (SLO + "[capacity.fleet]\nmax_replicas = 2\n[capacity.fleet.grid]\nmax_num_seq = [1]\n", "",
     "unknown knob 'capacity.fleet.grid.max_num_seq' in "),
    (SLO + "[capacity.fleet]\nmax_replicas = 2\nsplits = [[1, 1]]\n", "", "'capacity.fleet.splits' in "),
    ("price_per_gpu_hour = -1.0\n" + SLO + RATE, "", "'capacity.price_per_gpu_hour' in "),
    (SLO + RATE, "[replay]\nclosed_loop = true\n", "'capacity' in "),
])
def test_a_bad_key_exits_2_naming_it_and_the_file(tmp_path, capacity, replay, message):
    spec = _write(tmp_path, capacity, replay)
    for command in (["pipeline", "run", spec, "--scheduler", "sync"], ["pipeline", "check", spec]):
        r = CliRunner().invoke(main, command)
        assert r.exit_code == 2, r.output
        assert message in r.output and "p.toml" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl", "engine.json", "p.toml"]


def test_a_failed_landing_leaves_the_database_as_it_was(tmp_path):
    db = tmp_path / "p.duckdb"
    first = run_pipeline(_write(tmp_path, name="first"), scheduler="sync")
    # A capacity_points table another tool remade, with a column the run cannot fill.
    with duckdb.connect(str(db)) as con:
        con.execute("ALTER TABLE capacity_points RENAME TO old_points")
        con.execute("CREATE TABLE capacity_points AS SELECT *, 'red' AS colour FROM old_points")
        con.execute("ALTER TABLE capacity_points ALTER COLUMN colour SET NOT NULL")
        con.execute("DROP TABLE old_points")
    before = dump(db)
    with duckdb.connect(str(db), read_only=True) as con:
        points = con.execute("SELECT * FROM capacity_points ORDER BY shard_id, point").fetchall()
    with pytest.raises(LandingFailed, match="colour"):
        run_pipeline(_write(tmp_path, name="second"), scheduler="sync")
    assert dump(db) == before
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT * FROM capacity_points ORDER BY shard_id, point").fetchall() == points
        assert con.execute("SELECT run_id FROM runs").fetchall() == [(first.run_id,)]


def test_one_and_two_workers_land_byte_identical_points(tmp_path):
    tables = []
    for workers in (1, 2):
        d = tmp_path / f"w{workers}"
        d.mkdir()
        report = run_pipeline(_write(d), scheduler="local", workers=workers)
        out = d / "points.csv"
        with duckdb.connect(str(d / "p.duckdb"), read_only=True) as con:
            con.execute(f"COPY (SELECT * FROM capacity_points) TO '{out}' (HEADER)")
        tables.append((report.run_id, out.read_bytes()))
    assert tables[0] == tables[1]
    assert tables[0][1].count(b"\n") == 1 + len(_points(tmp_path / "w1" / "p.duckdb", tables[0][0]))
