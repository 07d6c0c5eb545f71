"""``aisim report``: the HTML report of a pipeline run.

The demo pipeline (pipelines/demo.toml, synchronous scheduler) is run once
into a temporary database; the report of that run is checked against SQL over
the same database, for self-containment, and in a real headless Chromium (the
page loads without console errors, every chart draws, a screenshot is taken).
A synthetic million-step shard checks that long runs stay fast and small.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from aisim.errors import ReportError
from aisim.report import build_report, write_report
from aisim.report import downsample as ds
from aisim.report import svg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_SPEC = os.path.join(ROOT, "pipelines", "demo.toml")
MAX_POINTS = ds.MAX_POINTS


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    """The demo pipeline landed in a fresh database (synchronous scheduler)."""
    from aisim.pipeline.run import run_pipeline

    db = str(tmp_path_factory.mktemp("report") / "demo.duckdb")
    rep = run_pipeline(DEMO_SPEC, scheduler="sync", database=db)
    assert rep.landed
    return db


@pytest.fixture(scope="module")
def demo(demo_db):
    """(html, RunData) of the demo run."""
    return build_report(demo_db)


@pytest.fixture(scope="module")
def demo_file(demo_db, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("report-html") / "demo report.html")
    write_report(demo_db, out)
    return out


def _sql(db, query, params=()):
    import duckdb

    con = duckdb.connect(db, read_only=True)
    try:
        cur = con.execute(query, list(params))
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        con.close()


# ---------------------------------------------------------------------------- HTML parsing


class _Page(HTMLParser):
    """Sections, table cells, stat cards and charts of a report page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.sections = []  # (shard id, heading text)
        self.rows = {}  # shard id -> {key: value} from the summary table
        self.stats = {}  # shard id -> {key: value} from the stat cards
        self.charts = []  # dicts: id, shard, kind, paths (list of d), bars (widths), texts
        self._section = None
        self._row = None
        self._chart = None
        self._h2 = False
        self.resources = []  # (tag, attribute, value) of anything that could load something

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for attr in ("src", "href", "srcset", "poster", "data", "action"):
            if attr in a and not (attr == "href" and (a[attr] or "").startswith("#")):
                self.resources.append((tag, attr, a[attr]))
        if tag == "link":
            self.resources.append((tag, "rel", a.get("rel")))
        if tag == "section" and "shard" in (a.get("class") or ""):
            self._section = int(a["data-shard"])
            self.sections.append([self._section, ""])
        if tag == "h2" and self._section is not None and self.sections and not self.sections[-1][1]:
            self._h2 = True
        if tag == "tr" and "data-shard" in a:
            self._row = int(a["data-shard"])
            self.rows[self._row] = {}
        if "data-key" in a:
            target = self.rows.get(self._row) if tag == "td" and self._row is not None else None
            if tag == "div" and self._section is not None:
                target = self.stats.setdefault(self._section, {})
            if target is not None:
                v = a.get("data-value")
                target[a["data-key"]] = None if v is None else float(v)
        if tag == "svg":
            self._chart = {"id": a.get("id"), "shard": self._section, "class": a.get("class", ""), "paths": [],
                           "bars": [], "attrs": a}
            self.charts.append(self._chart)
        elif self._chart is not None:
            if tag == "path" and "ln" in (a.get("class") or "").split():
                self._chart["paths"].append(a.get("d") or "")
            if tag == "rect" and "bar" in (a.get("class") or "").split():
                self._chart["bars"].append(float(a.get("width") or 0))

    def handle_endtag(self, tag):
        if tag == "svg":
            self._chart = None
        if tag == "tr":
            self._row = None
        if tag == "section":
            self._section = None
        if tag == "h2":
            self._h2 = False

    def handle_data(self, data):
        if self._h2:
            self.sections[-1][1] += data


def parse(html: str) -> _Page:
    p = _Page()
    p.feed(html)
    p.close()
    return p


def _points(d: str) -> int:
    return 0 if not d else d.count("L") + 1


# ---------------------------------------------------------------------------- the demo report


def test_one_section_per_shard(demo, demo_db):
    html, rd = demo
    page = parse(html)
    shards = _sql(demo_db, "SELECT shard_id, model, engine FROM shards WHERE run_id = ? ORDER BY shard_id",
                  [rd.run_id])
    assert len(shards) == 3
    assert [s for s, _ in page.sections] == [r["shard_id"] for r in shards]
    for (sid, heading), row in zip(page.sections, shards):
        assert heading == f"Shard {sid}: {row['model']} / {row['engine']}"
    assert sorted(page.rows) == [r["shard_id"] for r in shards]
    # The latest run was chosen and named in the page.
    latest = _sql(demo_db, "SELECT run_id FROM runs ORDER BY run_seq DESC LIMIT 1")[0]["run_id"]
    assert rd.run_id == latest and latest in html


def test_summary_numbers_match_sql(demo, demo_db):
    """The summary table and the stat cards agree with SQL over the full requests and steps."""
    html, rd = demo
    page = parse(html)
    truth = _truth(demo_db, rd.run_id)
    assert [t["shard_id"] for t in truth] == sorted(page.rows)
    for t in truth:
        row, cards = page.rows[t["shard_id"]], page.stats[t["shard_id"]]
        for key in ("requests", "finished", "steps", "preemptions", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
                    "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "prefix_hit_rate", "kv_usage_max",
                    "kv_physical_usage_max", "throughput_tok_s", "throughput_req_s", "duration_s"):
            assert row[key] == pytest.approx(float(t[key]), rel=1e-9, abs=1e-12), (t["shard_id"], key)
        for key in ("finished", "steps", "preemptions", "ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "prefix_hit_rate",
                    "kv_usage_max", "running_max", "throughput_tok_s"):
            assert cards[key] == pytest.approx(float(t[key]), rel=1e-9, abs=1e-12), (t["shard_id"], key)
    # The shard with preemptions and the one without are both there (the demo has both kinds).
    assert {t["preemptions"] > 0 for t in truth} == {True, False}


def _truth(db, run_id):
    return _sql(db, """
        WITH rq AS (
            SELECT shard_id, count(*) AS requests,
                   count(*) FILTER (WHERE status = 'finished') AS finished,
                   quantile_cont(ttft_s, 0.5) AS ttft_p50_s, quantile_cont(ttft_s, 0.99) AS ttft_p99_s,
                   quantile_cont(tpot_s, 0.5) AS tpot_p50_s, quantile_cont(tpot_s, 0.99) AS tpot_p99_s,
                   quantile_cont(e2e_s, 0.5) AS e2e_p50_s, quantile_cont(e2e_s, 0.99) AS e2e_p99_s,
                   sum(output_tokens) FILTER (WHERE status = 'finished') AS done_tokens,
                   min(arrival_s) AS first_arrival, max(finish_s) AS last_finish
            FROM requests WHERE run_id = ? GROUP BY shard_id
        ), st AS (
            SELECT shard_id, count(*) FILTER (WHERE kind = 'step') AS steps,
                   sum(num_preempted) AS preemptions,
                   sum(prefix_hits) / nullif(sum(prefix_queries), 0) AS prefix_hit_rate,
                   max(kv_usage) AS kv_usage_max, max(physical_usage) AS kv_physical_usage_max,
                   max(clock_s + duration_s) AS clock_end, max(running) AS running_max
            FROM steps WHERE run_id = ? GROUP BY shard_id
        )
        SELECT *, done_tokens / (last_finish - first_arrival) AS throughput_tok_s,
               finished / (last_finish - first_arrival) AS throughput_req_s,
               last_finish - first_arrival AS duration_s
        FROM rq JOIN st USING (shard_id) ORDER BY shard_id""", [run_id, run_id])


CHARTS = ("kv-usage", "queues", "tokens", "throughput", "prefix", "preempt", "cdf-ttft", "cdf-tpot", "cdf-e2e")


def test_every_chart_present_and_drawn(demo):
    html, rd = demo
    page = parse(html)
    by_id = {c["id"]: c for c in page.charts}
    assert len(by_id) == len(page.charts), "chart ids must be unique"
    for sd in rd.shards:
        sid = sd.shard_id
        expected = [f"{k}-{sid}" for k in CHARTS]
        # bytes only for engines whose KV-cache groups give page sizes (the hybrid Qwen3-Next model)
        assert (f"kv-bytes-{sid}" in by_id) == (sd.shard["model"] == "qwen3-next-80b")
        for cid in expected + ([f"kv-bytes-{sid}"] if sd.has_bytes else []):
            chart = by_id.get(cid)
            assert chart is not None, f"chart {cid} missing"
            assert chart["shard"] == sid
            assert chart["paths"], f"chart {cid} draws no line"
            assert all(_points(d) >= 2 for d in chart["paths"]), f"chart {cid} has an empty path"
            # display series stay within the point budget (a step line doubles its points)
            assert max(_points(d) for d in chart["paths"]) <= 2 * MAX_POINTS + 2
    for cid in ("cmp-throughput", "cmp-ttft", "cmp-prefix", "cmp-kv"):
        assert by_id[cid]["bars"] and all(w >= 0 for w in by_id[cid]["bars"]) and max(by_id[cid]["bars"]) > 0
    # the three latency CDFs end at 100% of the requests that have the latency
    for sd in rd.shards:
        assert f"{sd.n_requests:,} requests" in html


def test_cdf_and_kv_series_use_full_data(demo):
    """Quantiles shown under each CDF are numpy percentiles of every request."""
    html, rd = demo
    for sd in rd.shards:
        v = sd.latencies("ttft_s")
        assert len(v) == sd.n_requests
        p99 = np.percentile(v, 99)
        assert f"p99 {svg.fmt_duration(p99)}" in html
    # The hybrid shard's bytes: active + cached never above the pool.
    qwen = next(sd for sd in rd.shards if sd.has_bytes)
    total = qwen.steps["kv_cache_active_bytes"] + qwen.steps["kv_cache_cached_bytes"]
    assert total.max() <= qwen.block_bytes * qwen.usable_blocks


def test_self_contained(demo):
    html, _ = demo
    page = parse(html)
    assert "http://" not in html and "https://" not in html
    assert page.resources == [], page.resources
    assert "@import" not in html and "@font-face" not in html
    assert set(re.findall(r"url\(([^)]*)\)", html)) <= {f"#clip-{c['id']}" for c in parse(html).charts}
    assert not re.search(r"\b(fetch|XMLHttpRequest|WebSocket|EventSource|importScripts)\b", html)
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert html.count("<script>") == 1


def test_write_report_atomic(demo_db, tmp_path):
    out = tmp_path / "sub" / "r.html"
    rd = write_report(demo_db, str(out))
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert rd.run_id in text
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["r.html"]  # no temporary files left


# ---------------------------------------------------------------------------- run selection


def test_run_selection(demo_db, tmp_path):
    from aisim.report.data import load_run

    rd = load_run(demo_db)
    assert load_run(demo_db, rd.run_id).run_id == rd.run_id
    assert load_run(demo_db, "demo").run_id == rd.run_id
    assert load_run(demo_db, rd.run_id[:6]).run_id == rd.run_id
    with pytest.raises(ReportError, match="no run 'nope'.*demo"):
        load_run(demo_db, "nope")
    with pytest.raises(ReportError, match="no database at"):
        load_run(str(tmp_path / "missing.duckdb"))


def test_ambiguous_empty_and_foreign_databases(tmp_path):
    from aisim.report.data import load_run

    db = str(tmp_path / "two.duckdb")
    _synthetic_db(db, [("feedface00000001", "a"), ("feedface00000002", "b"), ("0123456789abcdef", "a")], 200)
    with pytest.raises(ReportError, match="ambiguous.*feedface00000002.*feedface00000001"):
        load_run(db, "feedface")
    assert load_run(db, "feedface00000002").run["name"] == "b"
    assert load_run(db).run_id == "0123456789abcdef"  # the latest (highest run_seq)
    rd = load_run(db, "a")  # a name: its latest run
    assert rd.run_id == "0123456789abcdef" and "2 runs of that name" in rd.note

    empty = str(tmp_path / "empty.duckdb")
    _synthetic_db(empty, [], 0)
    with pytest.raises(ReportError, match="holds no runs"):
        load_run(empty)

    import duckdb

    foreign = str(tmp_path / "foreign.duckdb")
    duckdb.connect(foreign).execute("CREATE TABLE t (x INTEGER)").close()
    with pytest.raises(ReportError, match="not an aisim run database"):
        load_run(foreign)
    notdb = tmp_path / "text.duckdb"
    notdb.write_text("hello\n")
    with pytest.raises(ReportError, match="cannot open"):
        load_run(str(notdb))


# ---------------------------------------------------------------------------- the command line


def test_cli_writes_report(demo_db, tmp_path):
    from aisim.cli import main

    out = tmp_path / "report.html"
    res = CliRunner().invoke(main, ["report", "--db", demo_db, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "3 shards written to" in res.output and out.exists()
    res = CliRunner().invoke(main, ["report", "--db", demo_db, "--run", "demo", "--out", str(out),
                                    "--max-points", "200"])
    assert res.exit_code == 0, res.output
    page = parse(out.read_text(encoding="utf-8"))
    assert max(_points(d) for c in page.charts for d in c["paths"]) <= 2 * 200 + 2


def test_cli_errors(demo_db, tmp_path):
    from aisim.cli import main

    out = tmp_path / "r.html"
    missing = tmp_path / "nowhere.duckdb"
    res = CliRunner().invoke(main, ["report", "--db", str(missing), "--out", str(out)])
    assert res.exit_code == 2
    assert f"error: no database at {missing}" in res.stderr
    res = CliRunner().invoke(main, ["report", "--db", demo_db, "--run", "no-such-run", "--out", str(out)])
    assert res.exit_code == 2
    assert "error: no run 'no-such-run'" in res.stderr and "Traceback" not in res.output
    res = CliRunner(env={"AISIM_DB": None}).invoke(main, ["report", "--out", str(out)])
    assert res.exit_code == 2 and "--db FILE" in res.stderr
    res = CliRunner().invoke(main, ["report", "--db", demo_db])
    assert res.exit_code == 2 and "--out" in res.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------- downsampling


def test_m4_keeps_spikes():
    n = 1_000_000
    x = np.arange(n) * 0.01
    y = np.sin(np.arange(n) / 5e4) * 10
    y[654_321] = 1e4  # a one-step spike
    y[123_457] = -1e4  # and a dip
    xs, ys = ds.m4(x, y, MAX_POINTS)
    assert len(xs) <= MAX_POINTS
    assert ys.max() == 1e4 and xs[ys.argmax()] == x[654_321]
    assert ys.min() == -1e4 and xs[ys.argmin()] == x[123_457]
    assert xs[0] == x[0] and xs[-1] == x[-1]
    assert (np.diff(xs) > 0).all()
    # bands keep it too
    xc, lo, hi, mean = ds.band(x, y, MAX_POINTS)
    assert len(xc) <= MAX_POINTS // 2 and hi.max() == 1e4 and lo.min() == -1e4
    assert lo.max() < 1e4 and np.all(lo <= mean) and np.all(mean <= hi)
    # stacked series share points and keep both spikes
    xs2, (a, b) = ds.m4_shared(x, [y, -y], MAX_POINTS)
    assert len(xs2) <= MAX_POINTS and a.max() == 1e4 and b.max() == 1e4


def test_m4_edge_cases():
    x, y = np.arange(10.0), np.arange(10.0) ** 2
    xs, ys = ds.m4(x, y)
    assert np.array_equal(xs, x) and np.array_equal(ys, y)
    y[3] = np.nan
    xs, ys = ds.m4(x, y)
    assert len(xs) == 9 and np.isfinite(ys).all()
    # unsorted x: buckets by position, still within budget and keeps the extremes
    rng = np.random.default_rng(7)
    x = rng.random(100_000)
    y = rng.random(100_000)
    y[500] = 5.0
    xs, ys = ds.m4(x, y, 400)
    assert len(xs) <= 400 and ys.max() == 5.0
    # constant x (every step at the same instant)
    xs, ys = ds.m4(np.zeros(10_000), np.arange(10_000.0), 100)
    assert len(xs) <= 100 and ys.max() == 9_999
    assert ds.m4(np.array([]), np.array([]))[0].size == 0


def test_windows_and_cdf_are_exact():
    rng = np.random.default_rng(3)
    t = np.sort(rng.random(100_000) * 50)
    w = rng.integers(0, 100, 100_000).astype(float)
    edges, sums = ds.windows(t, w, 0.0, 50.0, 37)
    assert len(edges) == 38 and sums.sum() == pytest.approx(w.sum())
    v = rng.exponential(1.0, 250_000)
    x, p = ds.cdf(v, MAX_POINTS)
    assert len(x) <= MAX_POINTS and x[0] == v.min() and x[-1] == v.max() and p[-1] == 1.0
    assert (np.diff(x) >= 0).all() and (np.diff(p) > 0).all()
    # each drawn point is an exact rank of the full data
    i = len(x) // 2
    assert np.sum(v <= x[i]) == pytest.approx(p[i] * len(v))


def test_million_step_series_renders_fast():
    n = 1_000_000
    x = np.cumsum(np.full(n, 0.015))
    y = (np.arange(n) % 977) / 977.0
    y[777_777] = 3.0
    t0 = time.perf_counter()
    xs, ys = ds.m4(x, y, MAX_POINTS)
    xb, lo, hi, mean = ds.band(x, y * 100, MAX_POINTS)
    out = svg.line_chart([svg.Series("usage", xs, ys, "blue", "area"),
                          svg.Series("tokens", xb, mean / 100, "green", "band", lo=lo / 100, hi=hi / 100)],
                         title="a million steps", chart_id="big", yfmt="pct")
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"downsampling and drawing a 1,000,000-step series took {elapsed:.2f} s"
    assert len(out) < 200_000
    assert "300%" in out  # the spike sets the axis
    page = parse(out)
    assert all(_points(d) <= 2 * MAX_POINTS for d in page.charts[0]["paths"])


def test_axis_ticks_and_formats():
    ticks, label, step = svg.linear_ticks(0, 47.3, 5, "time")
    assert ticks[0] == 0 and step == 10 and label(20) == "20 s"
    ticks, label, step = svg.linear_ticks(0, 3 * 3600, 5, "time")
    assert step == 3600 and label(7200) == "2 h"
    ticks, label, _ = svg.linear_ticks(0, 400 * 2**20, 4, "bytes")
    assert label(ticks[1]) == "100 MiB"
    assert svg.log_ticks(0.009, 13) == [0.01, 0.1, 1.0, 10.0]
    assert svg.fmt_duration(0.0123) == "12.3 ms" and svg.fmt_duration(95) == "95 s"
    assert svg.fmt_count(5592.2) == "5,592" and svg.fmt_count(25_000) == "25k" and svg.fmt_pct(0.5443) == "54.4%"


# ---------------------------------------------------------------------------- a million-step shard


def _insert(con, table, values: dict, select: str | None = None, params=()):
    """INSERT with the given column values (SQL expressions when ``select``), other NOT NULL columns defaulted."""
    cols = con.execute("SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                       "WHERE table_name = ? ORDER BY ordinal_position", [table]).fetchall()
    names, exprs, args = [], [], []
    for name, dtype, nullable in cols:
        if name in values:
            names.append(name)
            if select is None:
                exprs.append("?")
                args.append(values[name])
            else:
                exprs.append(str(values[name]))
        elif nullable == "NO":
            names.append(name)
            exprs.append("''" if "CHAR" in dtype else "current_timestamp" if "TIME" in dtype else "0")
    cols_sql = ", ".join(f'"{n}"' for n in names)
    if select is None:
        con.execute(f"INSERT INTO {table} ({cols_sql}) VALUES ({', '.join(exprs)})", args)
    else:
        con.execute(f"INSERT INTO {table} ({cols_sql}) SELECT {', '.join(exprs)} {select}", list(params))


def _synthetic_db(path, runs, n_steps, empty_shard=False):
    """Runs of one shard each, ``n_steps`` steps and n_steps / 10 requests per shard, built in SQL.

    ``empty_shard`` adds a second shard without requests (a model without rows in the run's inputs).
    """
    import duckdb

    from aisim import sql

    con = duckdb.connect(path)
    sql.apply_schema(con)
    config = json.dumps({"num_gpu_blocks": 10001, "block_size": 16, "max_num_seqs": 256,
                         "max_num_batched_tokens": 8192, "enable_prefix_caching": True,
                         "kv_cache_groups": [{"type": "full", "page_size_bytes": 65536}]})
    m = n_steps // 10
    for seq, (run_id, name) in enumerate(runs, 1):
        _insert(con, "runs", {"run_id": run_id, "run_seq": seq, "name": name, "spec": "{}", "inputs": "[]",
                              "aisim_version": "0.1.0", "shards": 1, "requests": m, "steps": n_steps,
                              "rows_read": m, "rows_in_window": m, "rows_skipped": 0, "skipped_models": "{}"})
        _insert(con, "shards", {"run_id": run_id, "shard_id": 0, "model": "big-model", "engine": "base",
                                "engine_sha256": "0" * 64, "engine_config": config, "vllm_version": "0.32.0",
                                "clock": "time", "sources": "[]", "requests": m, "steps": n_steps})
        active = "(5000 + 2000 * sin(i / 80000.0) + CASE WHEN i = 654321 THEN 1999 ELSE 0 END)::INT"
        _insert(con, "steps", {
            "run_id": "$1", "shard_id": "0", "step": "i", "kind": "'step'", "updated_step": "i",
            "clock_s": "i * 0.02", "duration_s": "0.02", "num_reqs": "10",
            "prefill_tokens": "CASE WHEN i % 97 = 0 THEN 4000 ELSE (i % 13) * 20 END",
            "decode_tokens": "200 + i % 50", "num_new": "0", "num_resumed": "(i % 1000 = 1)::INT",
            "num_preempted": "(i % 1000 = 0)::INT", "num_finished": "(i % 10 = 0)::INT",
            "running": "120 + (30 * sin(i / 50000.0))::INT", "waiting": "greatest(0, (200 * sin(i / 170000.0))::INT)",
            "free_blocks": f"10000 - {active}", "cached_blocks": "1000", "prefix_queries": "3000",
            "prefix_hits": "1500", "active_blocks": active,
            "kv_usage": f"{active} / 10000.0", "physical_usage": f"({active} + 1000) / 10000.0",
            "kv_cache_active_bytes": f"{active}::BIGINT * 65536", "kv_cache_cached_bytes": "1000::BIGINT * 65536",
        }, select="FROM range($2) r(i)", params=[run_id, n_steps])
        _insert(con, "requests", {
            "run_id": "$1", "shard_id": "0", "request_index": "i", "request_id": "'r' || i", "arrival_s": "i * 0.2",
            "first_token_s": "i * 0.2 + 0.05 + (i % 100) / 100.0", "finish_s": "i * 0.2 + 3 + (i % 13) / 10.0",
            "ttft_s": "0.05 + (i % 100) / 100.0", "tpot_s": "0.01 + (i % 7) / 1000.0", "e2e_s": "3 + (i % 13) / 10.0",
            "prompt_tokens": "1000", "output_tokens": "200", "cached_tokens": "(i % 3) * 256",
            "cached_tokens_all_admissions": "(i % 3) * 256", "preemptions": "(i % 1000 = 0)::INT",
            "status": "'finished'",
        }, select="FROM range($2) r(i)", params=[run_id, m])
        _insert(con, "summaries", {"run_id": run_id, "shard_id": 0, "requests": m, "finished": m, "steps": n_steps})
        if empty_shard:
            _insert(con, "shards", {"run_id": run_id, "shard_id": 1, "model": "idle-model", "engine": "base",
                                    "engine_sha256": "0" * 64, "engine_config": config, "sources": "[]",
                                    "requests": 0, "steps": 0})
            _insert(con, "summaries", {"run_id": run_id, "shard_id": 1, "requests": 0, "finished": 0, "steps": 0})
    con.close()


def test_empty_shard(tmp_path):
    db = str(tmp_path / "idle.duckdb")
    _synthetic_db(db, [("abcdef0123456789", "idle")], 3000, empty_shard=True)
    html, rd = build_report(db)
    page = parse(html)
    assert [s for s, _ in page.sections] == [0, 1]
    assert "Shard 1: idle-model / base" in html and "replayed no requests" in html
    assert {c["shard"] for c in page.charts if c["shard"] is not None} == {0}
    assert page.rows[1]["requests"] == 0 and page.rows[1]["ttft_p50_s"] is None
    assert "cmp-ttft" in {c["id"] for c in page.charts}


def test_million_step_report(tmp_path):
    db = str(tmp_path / "big.duckdb")
    _synthetic_db(db, [("feedfacecafebeef", "big")], 1_000_000)
    t0 = time.perf_counter()
    html, rd = build_report(db)
    elapsed = time.perf_counter() - t0
    assert rd.shards[0].n_steps == 1_000_000
    assert elapsed < 15, f"the report of a million-step shard took {elapsed:.1f} s"
    assert len(html) < 1_500_000  # bounded by the point budget, not by the steps
    page = parse(html)
    assert len(page.charts) == len(CHARTS) + 1  # with bytes
    for c in page.charts:
        assert c["paths"] and all(2 <= _points(d) <= 2 * MAX_POINTS + 2 for d in c["paths"])
    kv = next(c for c in page.charts if c["id"] == "kv-usage-0")
    assert kv["attrs"]["data-y1"] == "1.0"  # usage charts span 0 to 100%
    # the one-step KV spike is drawn: some drawn point of the active line is at the spike's height
    sx = svg._Scale(0.0, 1.0, float(kv["attrs"]["data-py0"]), float(kv["attrs"]["data-py1"]))
    peak = rd.shards[0].steps["kv_usage"].max()
    top = min(float(p.split(",")[1]) for p in kv["paths"][0][1:].split("L"))
    assert top == pytest.approx(float(sx(peak)), abs=0.06)
    assert page.stats[0]["kv_usage_max"] == pytest.approx(rd.shards[0].steps["kv_usage"].max())
    assert page.stats[0]["preemptions"] == 1000


# ---------------------------------------------------------------------------- a real browser


def _chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        msg = ("no headless Chromium found (looked for 'chromium' and 'chromium-browser' on PATH); "
               "install Debian's package: apt-get install -y chromium")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


# Prepended to the page under test: records console errors and warnings, uncaught errors, failed
# resource loads and Content-Security-Policy violations in an attribute of <html>, so they show in
# the dumped DOM (Chromium logs console.error at INFO level, like console.log).
_PROBE = """<script>(function(){var d=document.documentElement,n=[];function k(t){n.push(String(t).slice(0,200));
d.setAttribute("data-probe-errors",JSON.stringify(n));}d.setAttribute("data-probe-errors","[]");
var e=console.error,w=console.warn;console.error=function(){k("console.error: "+[].join.call(arguments," "));
return e.apply(console,arguments);};console.warn=function(){k("console.warn: "+[].join.call(arguments," "));
return w.apply(console,arguments);};window.addEventListener("error",function(ev){k("error: "+(ev.message||
(ev.target&&(ev.target.src||ev.target.href))||ev.type));},true);window.addEventListener("unhandledrejection",
function(ev){k("unhandled rejection: "+ev.reason);});document.addEventListener("securitypolicyviolation",
function(ev){k("CSP: "+ev.blockedURI+" "+ev.violatedDirective);});})();</script>"""


# Appended to the page under test: hovers every line chart (the tooltip must show values) and
# toggles one legend entry, recording what happened in attributes of <html>.
_EXERCISE = """<script>(function(){var out={};document.querySelectorAll("svg.chart[data-px0]").forEach(function(svg){
var r=svg.getBoundingClientRect();svg.dispatchEvent(new MouseEvent("mousemove",{clientX:r.left+r.width*0.6,
clientY:r.top+r.height*0.6,bubbles:true}));var t=document.querySelector("div.tip");
out[svg.id]=t&&t.style.display!=="none"?t.textContent:"";svg.dispatchEvent(new MouseEvent("mouseleave"));});
var lg=document.querySelector("svg.chart g.lg"),s=lg.ownerSVGElement.querySelector('g.series[data-series="'+
lg.getAttribute("data-series")+'"]');lg.dispatchEvent(new MouseEvent("click",{bubbles:true}));
out["toggle"]=lg.classList.contains("off")&&s.style.display==="none";
document.documentElement.setAttribute("data-probe-hover",JSON.stringify(out));})();</script>"""


def _browser_cmd(exe, url, profile, *args) -> list:
    return [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
            f"--user-data-dir={profile}", "--no-first-run", "--disable-extensions", *args, url]


def _run_browsers(cmds: list, timeout: float = 120.0) -> list:
    """Run the Chromium commands side by side; (returncode, stdout, stderr) of each."""
    env = {**os.environ, "LANG": "C.UTF-8"}
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for c in cmds]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return results


def _console_errors(log: str) -> list:
    return [line for line in log.splitlines()
            if "CONSOLE" in line and ("ERROR" in line or "Uncaught" in line or "Refused" in line)]


def _png_size(path) -> tuple:
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    return struct.unpack(">II", head[16:24])


def test_browser_renders_report(demo_file, tmp_path):
    """Headless Chromium: the page loads without console errors, every chart draws, a screenshot is taken."""
    exe = _chromium()
    shot = tmp_path / "report.png"
    html = Path(demo_file).read_text(encoding="utf-8")
    probed = tmp_path / "probed.html"
    probed.write_text(html.replace("<head>", "<head>" + _PROBE, 1).replace("</body>", _EXERCISE + "</body>"),
                      encoding="utf-8")

    shot_cmd = _browser_cmd(exe, Path(demo_file).as_uri(), tmp_path / "profile-shot", f"--screenshot={shot}",
                            "--window-size=1400,3000", "--hide-scrollbars")
    dom_cmd = _browser_cmd(exe, probed.as_uri(), tmp_path / "profile-dom", "--dump-dom", "--window-size=1400,3000")
    t0 = time.perf_counter()
    (rc1, _, err1), (rc2, dom, err2) = _run_browsers([shot_cmd, dom_cmd])
    elapsed = time.perf_counter() - t0
    print(f"chromium (screenshot and DOM dump side by side): {elapsed:.1f} s\n{' '.join(shot_cmd)}")
    assert rc1 == 0, err1[-2000:]
    assert rc2 == 0, err2[-2000:]
    assert _console_errors(err1) == [] and _console_errors(err2) == []

    # The screenshot: a PNG of the window's size with real content.
    assert shot.exists(), err1[-2000:]
    assert _png_size(shot) == (1400, 3000)
    assert shot.stat().st_size > 60_000, "the screenshot is (nearly) blank"

    # The DOM after the page's script ran: no errors, the script finished, every chart drawn.
    m = re.search(r'data-probe-errors="([^"]*)"', dom)
    assert m, "the error probe did not run"
    import html as htmlmod

    assert json.loads(htmlmod.unescape(m.group(1))) == []
    page = parse(dom)
    line_charts = [c for c in page.charts if "bars" not in c["class"]]
    m = re.search(r'data-report-ready="(\d+)"', dom)
    assert m and int(m.group(1)) == len(line_charts) > 0, "the report's script did not finish"
    source = parse(html)
    assert [c["id"] for c in page.charts] == [c["id"] for c in source.charts]
    for c in page.charts:
        drawn = [d for d in c["paths"] if _points(d) >= 2] + [w for w in c["bars"] if w > 0]
        assert drawn, f"chart {c['id']} has nothing drawn in the browser"

    # Hovering shows values in every line chart; a legend click hides its series.
    m = re.search(r'data-probe-hover="([^"]*)"', dom)
    assert m, "the hover exercise did not run"
    hover = json.loads(htmlmod.unescape(m.group(1)))
    assert hover.pop("toggle") is True
    assert sorted(hover) == sorted(c["id"] for c in line_charts)
    for cid, text in hover.items():
        assert re.search(r": -?\d[\d.,]*", text), f"no values under the pointer in {cid}: {text!r}"


def test_browser_probe_catches_errors(tmp_path):
    """The browser check fails on a page that logs an error or throws (so a pass means something)."""
    exe = _chromium()
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><head>" + _PROBE + "</head><body><p>x</p><script>"
                    "console.error('custom failure'); null.foo();</script></body></html>", encoding="utf-8")
    [(_, dom, err)] = _run_browsers([_browser_cmd(exe, page.as_uri(), tmp_path / "profile", "--dump-dom")])
    assert any("Uncaught TypeError" in line for line in _console_errors(err))
    import html as htmlmod

    errors = json.loads(htmlmod.unescape(re.search(r'data-probe-errors="([^"]*)"', dom).group(1)))
    assert any("custom failure" in e for e in errors) and any("TypeError" in e for e in errors)


# ---------------------------------------------------------------------------- deployments


@pytest.fixture(scope="module")
def fleet_db(tmp_path_factory):
    """pipelines/fleet.toml landed in a fresh database: one engine, two deployments of four replicas."""
    from aisim.pipeline.run import run_pipeline

    db = str(tmp_path_factory.mktemp("report-fleet") / "fleet.duckdb")
    assert run_pipeline(os.path.join(ROOT, "pipelines", "fleet.toml"), scheduler="sync", database=db).landed
    return db


def _replica_table(html: str, sid: int) -> dict:
    """The deployment panel's table of shard ``sid``: row key -> {data-key: data-value}."""
    m = re.search(rf'<table class="summary replicas" id="replicas-{sid}">(.*?)</table>', html, re.S)
    assert m, f"shard {sid} has no replica table"
    rows = {}
    for key, body in re.findall(r'<tr[^>]* data-replica="(\w+)">(.*?)</tr>', m.group(1), re.S):
        rows[key] = {k: float(v) if v else None
                     for k, v in re.findall(r'data-key="(\w+)"(?: data-value="([^"]*)")?', body)}
    return rows


def test_deployment_shard_shows_its_replicas_beside_its_totals(fleet_db):
    html, rd = build_report(fleet_db)
    shards = {r["engine"]: r["shard_id"] for r in _sql(fleet_db, "SELECT engine, shard_id FROM shards")}
    for engine in ("kv4", "rr4"):
        sid = shards[engine]
        table = _replica_table(html, sid)
        reps = _sql(fleet_db, "SELECT * FROM replicas WHERE shard_id = ? ORDER BY replica", [sid])
        assert list(table) == ["0", "1", "2", "3", "all"]
        for r in reps:
            got = table[str(r["replica"])]
            assert got["requests"] == r["requests"] and got["share"] == r["requests"] / 600
            for k in ("prefix_hit_rate", "busy_s", "utilisation", "ttft_p50_s", "ttft_p99_s", "kv_usage_max"):
                assert got[k] == r[k], (engine, r["replica"], k)
        [s] = _sql(fleet_db, "SELECT * FROM summaries WHERE shard_id = ?", [sid])
        total = table["all"]
        assert total["requests"] == 600 and total["share"] == 1.0
        for k in ("prefix_hit_rate", "ttft_p50_s", "ttft_p99_s", "kv_usage_max"):
            assert total[k] == s[k], (engine, k)
        assert total["busy_s"] == pytest.approx(sum(r["busy_s"] for r in reps), rel=1e-15)
        assert total["utilisation"] == pytest.approx(np.mean([r["utilisation"] for r in reps]), rel=1e-15)
        # The imbalance shown is the load_balance query's (which keeps 4 decimals, the page 3).
        [q] = _sql(fleet_db, "SELECT DISTINCT request_imbalance, busy_imbalance FROM replica_balance "
                             "WHERE shard_id = ?", [sid])
        m = re.search(rf'id="shard-{sid}".*?data-request-imbalance="([\d.]+)" data-busy-imbalance="([\d.]+)"',
                      html, re.S)
        assert m.groups() == (f"{q['request_imbalance']:.3f}", f"{q['busy_imbalance']:.3f}")
        page = parse(html)
        bars = {c["id"]: c["bars"] for c in page.charts if c["shard"] == sid}
        assert len(bars[f"replica-requests-{sid}"]) == 4 and min(bars[f"replica-requests-{sid}"]) > 0
        assert len(bars[f"replica-util-{sid}"]) == 8 and min(bars[f"replica-util-{sid}"]) > 0
    # Round robin dealt 150 requests to each replica: the balance is perfect.
    assert re.search(rf'id="shard-{shards["rr4"]}".*?data-request-imbalance="1.000"', html, re.S)
    # The single engine's section has no deployment panel.
    single = re.search(rf'<section class="shard" id="shard-{shards["single"]}".*?</section>', html, re.S).group(0)
    assert "replicas-" not in single and "<h3>Replicas</h3>" not in single
    assert [len(sd.replicas) for sd in rd.shards] == [4 if sd.shard["engine"] != "single" else 0 for sd in rd.shards]


def test_deployment_steps_are_drawn_by_start_time(fleet_db):
    _, rd = build_report(fleet_db)
    for sd in rd.shards:
        t = sd.steps["clock_s"]
        assert sd.n_steps == _sql(fleet_db, "SELECT count(*) AS n FROM steps WHERE shard_id = ?",
                                  [sd.shard_id])[0]["n"]
        assert np.all(np.diff(t) >= 0), sd.shard["engine"]


def test_browser_renders_deployment_report(fleet_db, tmp_path):
    """Headless Chromium on the deployment example's report: no errors, every chart (the replica bars too) drawn."""
    exe = _chromium()
    out = tmp_path / "fleet.html"
    write_report(fleet_db, str(out))
    html = out.read_text(encoding="utf-8")
    probed = tmp_path / "probed.html"
    probed.write_text(html.replace("<head>", "<head>" + _PROBE, 1), encoding="utf-8")
    [(rc, dom, err)] = _run_browsers([_browser_cmd(exe, probed.as_uri(), tmp_path / "profile", "--dump-dom",
                                                   "--window-size=1400,3000")])
    assert rc == 0, err[-2000:]
    assert _console_errors(err) == []
    import html as htmlmod

    assert json.loads(htmlmod.unescape(re.search(r'data-probe-errors="([^"]*)"', dom).group(1))) == []
    page = parse(dom)
    ids = [c["id"] for c in page.charts]
    assert sum(1 for i in ids if i.startswith("replica-")) == 4
    for c in page.charts:
        assert [d for d in c["paths"] if _points(d) >= 2] + [w for w in c["bars"] if w > 0], c["id"]
