"""The report of a capacity search: the answer, latency against the request rate or goodput per GPU
against p99 TTFT, attainment curves, and every evaluated point in a sortable table."""

import html as htmlmod
import re

import pytest
from click.testing import CliRunner

from aisim.capacity import land_points, slo_from_dict, smallest_deployment
from aisim.cli import main
from aisim.report.capacity import goodput_per_gpu, load_search, render_capacity

from test_capacity import _engine, _spec, _trace
from test_report import parse


def _chart(page: str, chart_id: str) -> str:
    m = re.search(rf'<svg class="chart"[^>]*id="{chart_id}".*?</svg>', page, re.S)
    assert m, chart_id
    return m.group(0)


def _rows(page: str) -> list:
    body = re.search(r'<table class="summary sortable" id="capacity-points">.*?<tbody>(.*?)</tbody>', page, re.S)
    return [{k: htmlmod.unescape(v) for k, v in re.findall(r'data-key="(\w+)"[^>]*>(.*?)</td>', row)}
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body.group(1), re.S)]


@pytest.fixture(scope="module")
def rate_search(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("capacity-rate")
    path = _spec(tmp_path, "[rate]\nby = 'rate_scale'\nrel_tol = 0.01")
    r = CliRunner().invoke(main, ["capacity", path])
    assert r.exit_code == 0, r.output
    return str(tmp_path / "cap.duckdb")


def test_a_rate_search(rate_search, tmp_path):
    out = tmp_path / "c.html"
    r = CliRunner().invoke(main, ["report", "--db", rate_search, "--capacity", "c", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("report of capacity search c (") and " points written to " in r.output
    page = out.read_text()
    data = load_search(rate_search, "c")
    points = data["points"]
    assert [row["point"] for row in _rows(page)] == [str(p["point"]) for p in points]
    assert [row["verdict"] for row in _rows(page)] == [p["verdict"] for p in points]
    answer = next(p for p in points if p["answer"])
    assert "Highest rate within the SLO: " in page and f"(point {answer['point']})" in page
    # Latency against load: p50 and p99 TTFT, one vertex per evaluated rate, the SLO's 215 ms drawn.
    ttft = _chart(page, "capacity-ttft")
    paths = re.findall(r'<path class="ln hv" d="([^"]+)" fill="none" stroke="[^"]+" stroke-width="[\d.]+" '
                       r'data-name="(p50 TTFT|p99 TTFT)"', ttft)
    assert [name for _, name in paths] == ["p50 TTFT", "p99 TTFT"]
    rates = {p["rate_req_s"] for p in points}
    assert all(d.count("L") + 1 <= len(points) for d, _ in paths) and len(rates) >= 5
    assert "SLO 215 ms" in ttft
    # Attainment against the rate: a point per evaluated rate, meeting or failing, and the share required.
    att = _chart(page, "capacity-attainment")
    meets = sum(p["verdict"] == "meets" for p in points)
    assert att.count('fill="#009e73">') == meets and att.count('fill="#d55e00">') == len(points) - meets
    assert "required 100%" in att
    assert {c["id"] for c in parse(page).charts} == {"capacity-ttft", "capacity-tpot", "capacity-e2e",
                                                     "capacity-attainment"}


def test_a_deployment_search(tmp_path):
    # The hand case of test_capacity: g000 needs 4 replicas, g001 2 (the answer).
    slo = slo_from_dict({"ttft_s": 0.025, "attainment": 1.0})
    result = smallest_deployment(_trace(0.03), _engine(), slo, max_replicas=8, grid={"max_num_seqs": [1, 2]},
                                 name="fleet")
    db = str(tmp_path / "f.duckdb")
    land_points(db, result)
    data = load_search(db, "fleet")
    page = render_capacity(data)
    assert 'Smallest deployment: g001 {"layout": "aggregated", "max_num_seqs": 2}, 2 replicas, 2 GPUs' in htmlmod.unescape(page)
    pareto = _chart(page, "capacity-pareto")
    assert pareto.count('<circle class="pt"') == len(result.points) == 6
    assert "SLO TTFT 25 ms" in pareto
    # Goodput per GPU: the requests meeting the SLO per second of the replay, per GPU.
    a = next(p for p in data["points"] if p["answer"])
    assert goodput_per_gpu(a) == a["slo_met"] / a["duration_s"] / 2
    # Attainment against the replicas: one line per grid point, a vertex per replica count tried.
    reps = _chart(page, "capacity-replicas")
    lines = re.findall(r'<path class="ln hv" d="([^"]+)"[^>]*data-name="(g00\d)', reps)
    assert [(name, d.count("L") + 1) for d, name in lines] == [("g000", 4), ("g001", 2)]


def test_bad_selections_are_named(rate_search, tmp_path):
    out = str(tmp_path / "x.html")
    r = CliRunner().invoke(main, ["report", "--db", rate_search, "--capacity", "nope", "--out", out])
    assert r.exit_code == 2 and "no capacity search 'nope' in " in r.output and "it holds: c (" in r.output
    r = CliRunner().invoke(main, ["report", "--db", rate_search, "--capacity", "c", "--run", "x", "--out", out])
    assert r.exit_code == 2 and "--capacity reports a capacity search" in r.output
    empty = tmp_path / "e.duckdb"
    import duckdb

    duckdb.connect(str(empty)).close()
    r = CliRunner().invoke(main, ["report", "--db", str(empty), "--capacity", "c", "--out", out])
    assert r.exit_code == 2 and "holds no capacity search" in r.output


def test_browser_loads_a_capacity_report(rate_search, tmp_path):
    from test_report import _browser_cmd, _chromium, _console_errors, _PROBE, _run_browsers

    exe = _chromium()
    page = render_capacity(load_search(rate_search, "c"))
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("<head>", "<head>" + _PROBE, 1), encoding="utf-8")
    [(rc, dom, err)] = _run_browsers([_browser_cmd(exe, probed.as_uri(), tmp_path / "profile", "--dump-dom")])
    assert rc == 0, err[-2000:]
    assert _console_errors(err) == []
    assert re.search(r'data-probe-errors="([^"]*)"', dom).group(1) == "[]"
    assert re.search(r'data-report-ready="(\d+)"', dom).group(1) == "4"


def test_the_answer_carries_its_band_and_calibration(tmp_path):
    # test_capacity.test_rate_band_by_hand's search: answer 11.17/s, band 8.74-14.37/s (calibration 'hand').
    from aisim.capacity import highest_rate

    from test_capacity import _calibrated

    slo = slo_from_dict({"ttft_s": 0.215, "attainment": 1.0})
    result = highest_rate(_trace(1.0), _calibrated([-0.2, 0.0, 0.25]), slo, by="rate_scale", rel_tol=0.001, name="b")
    land_points(str(tmp_path / "b.duckdb"), result)
    page = htmlmod.unescape(render_capacity(load_search(str(tmp_path / "b.duckdb"), "b")))
    a, band = result.answer, result.band
    from aisim.report.svg import fmt_count

    assert (f"Highest rate within the SLO: {fmt_count(a['rate_req_s'])} requests/s, "
            f"{fmt_count(band['low_req_s'])}-{fmt_count(band['high_req_s'])} with every step time at the ends of "
            "the held-out errors of calibration 'hand' (point") in page


def test_a_shards_step_times_name_their_calibration():
    from aisim.report.html import _time_model_text

    # A roofline without a record of its own: the defaults' (their held-out TPOT errors, rounded).
    from aisim.config.calibration import DEFAULT_CALIBRATION

    lo, hi = DEFAULT_CALIBRATION["held_out"]["tpot"][0], DEFAULT_CALIBRATION["held_out"]["tpot"][-1]
    assert _time_model_text({"kind": "roofline", "model": "qwen3-8b", "tp": 1, "gpu": "H100", "calibration": None,
                             "time_scale": 1.0}) == (
        f"step times: roofline of qwen3-8b on 1 × H100, calibration 'aisim defaults' (held-out TPOT errors "
        f"{100 * lo:+.0f}% to {100 * hi:+.0f}% at quantiles 0.1-0.9)")
    cal = {"name": "mine", "quantiles": [0.1, 0.5, 0.9], "held_out": {"itl": [-0.05, 0.0, 0.12]}}
    assert _time_model_text({"kind": "roofline", "model": "m", "tp": 2, "gpu": "A100-80GB", "calibration": cal,
                             "time_scale": 1.25}) == (
        "step times: roofline of m on 2 × A100-80GB, calibration 'mine' (held-out ITL errors -5% to +12% at "
        "quantiles 0.1-0.9), every step × 1.25")
    assert _time_model_text({"kind": "linear"}) == "step times: linear model (no calibration)"


def test_the_defaults_calibration_record_is_what_the_published_rows_give():
    # The record capacity bands and reports quote is computed, not copied: the defaults replayed on
    # every held-out row of benchmarks/data/published_vllm.csv (benchmarks/default_calibration.py).
    import importlib.util
    import os
    import sys

    from aisim.config.calibration import DEFAULT_CALIBRATION

    bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
    sys.path.insert(0, bench)
    try:
        spec = importlib.util.spec_from_file_location("default_calibration", os.path.join(bench, "default_calibration.py"))
        dc = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(dc)
        held, rel = dc.held_out_errors()
    finally:
        sys.path.remove(bench)
    assert DEFAULT_CALIBRATION["points"] == len(held)
    assert DEFAULT_CALIBRATION["held_out"] == {m: dc.record_quantiles(rel[m]) for m in DEFAULT_CALIBRATION["held_out"]}, \
        "python benchmarks/default_calibration.py, and write what it prints into aisim/config/calibration.py"


def test_a_capacity_database_reported_as_a_run_points_to_capacity(rate_search, tmp_path):
    out = str(tmp_path / "x.html")
    r = CliRunner().invoke(main, ["report", "--db", rate_search, "--out", out])
    assert r.exit_code == 2
    assert r.output == (f"error: {rate_search} is not an aisim run database (no table(s) replicas, requests, runs, "
                        "shards, steps, summaries); run a pipeline into it first (aisim pipeline run SPEC --db FILE); "
                        f"it holds capacity searches: aisim report --db {rate_search} --capacity SEARCH (the search "
                        "id or name aisim capacity printed)\n")
