"""Small builders shared by the tests."""

from aisim.config.engine import engine_config_from_dict
from aisim.decisionlog import decision_lines
from aisim.replay import replay
from aisim.traces.schema import canonical_segments, stream_id, trace_table


def make_trace(requests, clock="step"):
    """``requests``: dicts with id, prompt, max_tokens, at, and optional segments/priority.

    ``segments`` defaults to one private stream; give ``[("name", first, length), ...]``
    to share tokens by stream name.
    """
    rows = {k: [] for k in ("request_id", "arrival_step", "arrival_s", "prompt_tokens",
                            "output_tokens", "priority", "segments")}
    for r in requests:
        segs = r.get("segments") or [("private-" + r["id"], 0, r["prompt"])]
        rows["request_id"].append(r["id"])
        rows["arrival_step"].append(r["at"] if clock == "step" else None)
        rows["arrival_s"].append(float(r["at"]) if clock == "time" else None)
        rows["prompt_tokens"].append(r["prompt"])
        rows["output_tokens"].append(r["max_tokens"])
        rows["priority"].append(r.get("priority", 0))
        rows["segments"].append(canonical_segments([(stream_id("t", s), f, n) for s, f, n in segs]))
    return trace_table(rows, clock)


def run_log(engine, requests, clock="step"):
    """Replay and return (step lines by step index, summary line, result)."""
    cfg = engine_config_from_dict(engine)
    result = replay(make_trace(requests, clock), cfg, record_decisions=True)
    lines = list(decision_lines(result))
    steps = {}
    for line in lines[1:-1]:
        if line["type"] == "step":
            steps[line["step"]] = line
    return steps, lines[-1], result
