"""The report of a sweep's run: its candidates, goodput per GPU against p99 TTFT, latency against load,
and every shard's CDFs overlaid with the SLO drawn; sections collapse in runs of many shards."""

import html as htmlmod
import json
import re

import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.report import build_report
from aisim.report import html as report_html
from aisim.report.sweep import load_curves, pareto_front
from aisim.sweep import load_sweep, run_sweep

from test_report import _browser_cmd, _chromium, _console_errors, _PROBE, _run_browsers, parse
from test_sweep import _write


def _c(name, ttft, good, gpus, knobs=None, status="ranked"):
    return {"candidate": name, "ttft_p99_s": ttft, "goodput_req_s": good, "gpus": gpus, "knobs": knobs or {},
            "status": status}


def test_pareto_front_by_hand():
    # Per GPU: a 10/s at 1 s, b 4/s at 0.5 s, c 3/s at 2 s (a beats it), d 12/s at 3 s, e 4/s at 0.5 s
    # (b's equal, b first), f without a p99.
    cands = [_c("a", 1.0, 20.0, 2), _c("b", 0.5, 4.0, 1), _c("c", 2.0, 3.0, 1), _c("d", 3.0, 48.0, 4),
             _c("e", 0.5, 8.0, 2), _c("f", None, 9.0, 1)]
    assert [c["candidate"] for c in pareto_front(cands)] == ["b", "a", "d"]


def test_load_curves_by_hand():
    cands = [_c("c000", 1, 1, 1, {"max_num_seqs": 4, "rate_scale": 1.0}),
             _c("c001", 1, 1, 1, {"max_num_seqs": 8, "rate_scale": 1.0}),
             _c("c002", 1, 1, 1, {"max_num_seqs": 4, "rate_scale": 2.0}),
             _c("c003", 1, 1, 1, {"max_num_seqs": 8, "rate_scale": 2.0}, status="refused")]
    key, lines = load_curves(cands)
    assert key == "rate_scale"
    assert {p: [(lv, c["candidate"]) for lv, c in pts] for p, pts in lines.items()} == {
        '{"max_num_seqs": 4}': [(1.0, "c000"), (2.0, "c002")], '{"max_num_seqs": 8}': [(1.0, "c001")]}
    assert load_curves(cands[:2]) == ("rate_scale", {})  # one level: no curve
    assert load_curves([_c("c000", 1, 1, 1, {"max_num_seqs": 4})]) == (None, {})


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A sweep of two engines (max_num_seqs 1 and 8) at two client caps (1 and 4 in flight): 4 candidates
    in two runs, of two shards each.  Four requests due at once, 3 steps each, TTFT SLO 15 ms."""
    tmp_path = tmp_path_factory.mktemp("report-sweep")
    trace = [{"request_id": f"r{i}", "prompt_len": 10, "max_tokens": 3, "arrival_time": 0.0} for i in range(4)]
    path = _write(tmp_path, {"num_gpu_blocks": 100, "max_model_len": 64}, {"max_num_seqs": [1, 8]},
                  {"ttft_s": 0.015}, trace)
    with open(path, "a") as fh:
        fh.write("[load]\nmax_concurrency = [1, 4]\n")
    result = run_sweep(load_sweep(path), scheduler="sync")
    return str(tmp_path / "s.duckdb"), result


def _table_rows(page_html: str, table_id: str) -> list:
    m = re.search(rf'<table class="summary sortable" id="{table_id}">.*?<tbody>(.*?)</tbody>', page_html, re.S)
    assert m, table_id
    return [[htmlmod.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", m.group(1), re.S)]


def test_the_sweep_section(swept):
    db, result = swept
    for run_id in result.run_ids:  # either level's run shows the whole sweep
        page_html, rd = build_report(db, run_id)
        assert [c["candidate"] for c in rd.sweep] == ["c000", "c001", "c002", "c003"]
        rows = _table_rows(page_html, "sweep-table")
        by_name = {c.name: c for c in result.candidates}
        assert [r[1] for r in rows] == ["c000", "c001", "c002", "c003"]
        for r in rows:
            c = by_name[r[1]]
            assert r[0] == str(c.rank) and json.loads(r[2]) == c.knobs
        assert rd.slo == {"ttft_s": 0.015}
        charts = {c["id"]: c for c in parse(page_html).charts}
        # One point per ranked candidate; the front joins the Pareto candidates.
        assert page_html.count('<circle class="pt"') == 4
        assert {"sweep-pareto", "sweep-load-ttft_p99_s", "sweep-load-tpot_p99_s", "sweep-load-goodput_req_s"} \
            <= set(charts)
        # Latency against load: one line per engine, a point per cap.
        load = re.search(r'<svg class="chart"[^>]*id="sweep-load-goodput_req_s".*?</svg>', page_html, re.S).group(0)
        assert len(re.findall(r'<path class="ln hv" d="M[\d.]+,[\d.]+L[\d.]+,[\d.]+"', load)) == 2
        # Every shard's CDFs overlaid, the SLO's TTFT threshold drawn as a vertical line.
        overlay = re.search(r'<svg class="chart"[^>]*id="cdf-all-ttft".*?</svg>', page_html, re.S).group(0)
        assert overlay.count('data-name="') == 2 and "SLO 15 ms" in overlay
        assert re.search(r'<line x1="([\d.]+)" y1="[\d.]+" x2="\1" y2="[\d.]+" stroke="#d55e00"', overlay)
        assert page_html.count('<details class="charts" open>') == 2


def test_many_shards_collapse(swept, monkeypatch):
    db, result = swept
    monkeypatch.setattr(report_html, "OPEN_SHARDS", 1)
    page_html, _ = build_report(db, result.run_ids[0])
    assert page_html.count('<details class="charts">') == 2 and '<details class="charts" open>' not in page_html


def test_the_slo_option(swept, tmp_path):
    db, result = swept
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["report", "--db", db, "--run", result.run_ids[0], "--out", str(out),
                                  "--slo", "e2e_s=0.05", "--slo", "tpot_s=0.02"])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert "SLO 50 ms" in page and "SLO 20 ms" in page and "SLO 15 ms" not in page.split('id="sweep"')[0]
    for bad, message in (("ttft=1", "give KEY=SECONDS with KEY one of ttft_s, tpot_s, e2e_s"),
                         ("ttft_s=-1", "the threshold must be a positive number of seconds"),
                         ("ttft_s=x", "the threshold must be a positive number of seconds")):
        r = CliRunner().invoke(main, ["report", "--db", db, "--out", str(out), "--slo", bad])
        assert r.exit_code == 2 and message in r.output and repr(bad) in r.output


# Sorts the sweep table by goodput (one click: ascending, two: descending) and records the candidates' order.
_SORT = """<script>(function(){var t=document.getElementById("sweep-table"),h=t.querySelectorAll("thead th")[3],o={};
function names(){return [].map.call(t.tBodies[0].rows,function(r){return r.cells[1].textContent;});}
h.dispatchEvent(new MouseEvent("click",{bubbles:true}));o.up=names();
h.dispatchEvent(new MouseEvent("click",{bubbles:true}));o.down=names();
document.documentElement.setAttribute("data-probe-sort",JSON.stringify(o));})();</script>"""


def test_browser_sorts_the_sweep_table(swept, tmp_path):
    exe = _chromium()
    db, result = swept
    page_html, _ = build_report(db, result.run_ids[0])
    probed = tmp_path / "probed.html"
    probed.write_text(page_html.replace("<head>", "<head>" + _PROBE, 1).replace("</body>", _SORT + "</body>"),
                      encoding="utf-8")
    [(rc, dom, err)] = _run_browsers([_browser_cmd(exe, probed.as_uri(), tmp_path / "profile", "--dump-dom")])
    assert rc == 0, err[-2000:]
    assert _console_errors(err) == []
    assert json.loads(htmlmod.unescape(re.search(r'data-probe-errors="([^"]*)"', dom).group(1))) == []
    got = json.loads(htmlmod.unescape(re.search(r'data-probe-sort="([^"]*)"', dom).group(1)))
    by_goodput = [c.name for c in sorted(result.candidates, key=lambda c: (c.goodput_req_s, c.name))]
    assert got["up"] == by_goodput
    assert got["down"] == sorted(by_goodput, key=lambda n: -next(c.goodput_req_s for c in result.candidates
                                                                  if c.name == n))
    m = re.search(r'data-report-ready="(\d+)"', dom)
    assert m and int(m.group(1)) > 0
