"""Report charts that can be read: every series of a chart in its own colour, none in the colours of the
percentile guides or the SLO; the SLO's percentile limits drawn on a capacity search's latency charts."""

from __future__ import annotations

import re

import numpy as np

from aisim.capacity import highest_rate, land_points, slo_from_dict
from aisim.report.capacity import load_search, render_capacity
from aisim.report.data import RunData, ShardData
from aisim.report.html import render
from aisim.report.svg import COLORS, SERIES_CYCLE, SLO_COLOR

from test_capacity import _engine, _trace
from test_report_capacity import _chart


def _strokes(chart: str) -> tuple:
    """(series colours in order, colours of the straight reference lines) of one chart's SVG."""
    series = re.findall(r'<path class="ln hv" d="[^"]+" fill="none" stroke="([^"]+)"', chart)
    # reference lines: dashed across the plot (a legend's swatch is a short line of the same colour)
    lines = set(re.findall(r'<line x1="[\d.]+" y1="[\d.]+" x2="[\d.]+" y2="[\d.]+" stroke="([^"]+)" '
                           r'stroke-dasharray="5 4"', chart))
    return series, lines


def _shard(i: int, ttft) -> ShardData:
    n = len(ttft)
    steps = {k: np.zeros(1) for k in ("step", "clock_s", "duration_s", "num_reqs", "prefill_tokens", "decode_tokens",
                                     "num_preempted", "num_resumed", "num_finished", "running", "waiting",
                                     "active_blocks", "cached_blocks", "kv_usage", "physical_usage",
                                     "kv_cache_active_bytes", "kv_cache_cached_bytes", "prefix_queries",
                                     "prefix_hits", "spec_tokens", "spec_accepted")}
    v = np.asarray(ttft, dtype=float)
    requests = {"arrival_s": np.zeros(n), "ttft_s": v, "tpot_s": v / 10, "e2e_s": v * 2,
                "prompt_tokens": np.ones(n), "output_tokens": np.ones(n), "cached_tokens": np.zeros(n),
                "preemptions": np.zeros(n), "spec_drafts": np.zeros(n), "spec_accepted": np.zeros(n)}
    return ShardData(shard={"shard_id": i, "model": "m", "engine": f"e{i}", "config": {}}, summary={"ttft_p50_s": 0.1},
                     steps=steps, requests=requests, status={"finished": n})


def test_every_cdf_line_has_its_own_colour_apart_from_the_guides_and_the_slo():
    shards = [_shard(i, np.linspace(0.01, 0.5 + i, 50)) for i in range(len(SERIES_CYCLE))]
    rd = RunData(database="x", run={"name": "r", "run_id": "id", "run_seq": 1}, shards=shards, runs_in_db=1,
                 same_name=1, slo={"ttft_s": 0.3})
    page = render(rd)
    series, lines = _strokes(_chart(page, "cdf-all-ttft"))
    assert len(series) == len(SERIES_CYCLE) == len(set(series))  # eight shards, eight colours
    assert COLORS[SLO_COLOR] in lines  # the SLO's threshold
    assert not set(series) & lines, "a CDF line shares its colour with a guide or the SLO"
    # One shard's own CDF: its line apart from the p50/p90/p99 guides too.
    series, lines = _strokes(_chart(page, "cdf-ttft-0"))
    assert len(series) == 1 and series[0] not in lines and len(lines) == 4  # three guides and the SLO


def test_a_percentile_limit_is_drawn_on_the_capacity_latency_chart(tmp_path):
    slo = slo_from_dict({"ttft_p99_s": 0.215})  # percentile-only: no attainment
    result = highest_rate(_trace(1.0), _engine(), slo, by="rate_scale", rel_tol=0.05, name="p99")
    db = str(tmp_path / "c.duckdb")
    land_points(db, result)
    page = render_capacity(load_search(db, "p99"))
    ttft = _chart(page, "capacity-ttft")
    assert "SLO p99 215 ms" in ttft
    series, lines = _strokes(ttft)
    assert COLORS[SLO_COLOR] in lines and not set(series) & lines
    assert "SLO" not in _chart(page, "capacity-tpot")  # no TPOT limit in this SLO
