"""Honest searches: a rate search stops at the floor when no rate can meet the SLO, and warns when the trace is
too short for a steady state.

The hand model of ``test_capacity.py``: every step takes T = 10 ms, a request has a 16-token prompt (one
prefill step gives its first token) and 10 output tokens.  The floor replays the trace one request at a time
(``max_concurrency`` 1, each sent when the previous finishes), so every request meets an idle engine: TTFT is
one step, T, for every request, and p99 TTFT is T = 10 ms.
"""

import pytest
from click.testing import CliRunner

from aisim.capacity import Point, highest_rate, slo_from_dict
from aisim.capacity.search import STEADY_LIFETIMES, steady_state_note
from aisim.cli import main

from test_capacity import ENGINE, T, _engine, _trace


def test_an_slo_no_rate_meets_stops_at_the_floor_with_what_an_idle_engine_gives():
    slo = slo_from_dict({"ttft_p99_s": 0.005})
    result = highest_rate(_trace(1.0), _engine(), slo, by="rate_scale", max_points=40)
    # The first rate (x1) fails; the floor fails too: two replays, not forty.
    assert [p["phase"] for p in result.points] == ["bracket", "floor"]
    floor = result.points[1]
    assert floor["ttft_p99_s"] == pytest.approx(T) and floor["verdict"] == "fails"
    assert floor["attainment"] is None  # a percentile-only SLO has no share to meet
    assert floor["rate_req_s"] is None and floor["load"] == '{"max_concurrency": 1}'
    assert result.answer is None
    assert result.floor == ("even an idle engine (one request at a time, point 1) gives P99 TTFT 10 ms (SLO 5 ms) "
                            "on this trace: no rate meets the SLO")
    assert result.notes == [result.floor]


def test_the_floor_names_the_attainment_a_threshold_cannot_reach():
    slo = slo_from_dict({"ttft_s": 0.001, "attainment": 1.0})  # below one step: no request meets it
    result = highest_rate(_trace(1.0), _engine(), slo, by="rate_scale")
    assert len(result.points) == 2
    assert result.floor == ("even an idle engine (one request at a time, point 1) gives 0 of requests within "
                            "ttft_s <= 0.001 (SLO 1) on this trace: no rate meets the SLO")


def test_the_command_says_the_floor_as_its_answer(tmp_path):
    import json

    (tmp_path / "e.json").write_text(json.dumps(ENGINE))
    (tmp_path / "t.jsonl").write_text("".join(
        json.dumps({"request_id": f"r{i}", "prompt_len": 16, "max_tokens": 10, "arrival_time": float(i)}) + "\n"
        for i in range(5)))
    (tmp_path / "c.toml").write_text('name = "c"\ndatabase = "c.duckdb"\nengine = "e.json"\n[trace]\n'
                                     'path = "t.jsonl"\nformat = "oracle"\n[slo]\nttft_p99_s = 0.005\n[rate]\n')
    r = CliRunner().invoke(main, ["capacity", str(tmp_path / "c.toml")])
    assert r.exit_code == 0, r.output
    assert ("even an idle engine (one request at a time, point 1) gives P99 TTFT 10 ms (SLO 5 ms) on this trace: "
            "no rate meets the SLO\n") in r.output
    assert "note: even" not in r.output


def _answer(rate, e2e):
    return Point({"rate_req_s": rate, "e2e_p50_s": e2e})


def test_a_trace_too_short_for_a_steady_state_is_said():
    # At 10 requests/s, 5 requests arrive over 4 / 10 = 0.4 s: 4 median lifetimes of 0.1 s, fewer than 10.
    assert STEADY_LIFETIMES == 10
    assert steady_state_note(_answer(10.0, 0.1), 5) == (
        "the trace is too short for a steady state: at 10 requests/s its 5 requests arrive over 0.4 s, 4 median "
        "E2E latencies (0.1 s), fewer than 10; the answer comes from the start-up transient and may be optimistic: "
        "give a longer trace")
    # 11 requests: 1 s, exactly 10 lifetimes: steady enough.
    assert steady_state_note(_answer(10.0, 0.1), 11) is None
    assert steady_state_note(_answer(None, 0.1), 5) is None


def test_a_search_on_a_short_trace_warns():
    # Five requests: whatever rate answers, its arrivals span 4 / rate s, and the answer's median E2E is at
    # least one request's lifetime alone (10 steps, 100 ms).  ttft_s 0.5 is met up to a high rate.
    slo = slo_from_dict({"ttft_s": 0.5, "attainment": 1.0})
    result = highest_rate(_trace(1.0, n=5), _engine(), slo, by="rate_scale", rel_tol=0.05)
    assert result.answer is not None
    assert any(n.startswith("the trace is too short for a steady state: ") for n in result.notes)
