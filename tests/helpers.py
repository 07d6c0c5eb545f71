"""Small builders shared by the tests."""

import pyarrow as pa

from aisim.config.engine import engine_config_from_dict
from aisim.decisionlog import decision_lines, log_line_json
from aisim.replay import replay
from aisim.traces.schema import canonical_segments, stream_id, trace_table


def oracle_engine_dict(scenario_dir, version):
    """An oracle scenario's config.json with the evidence its recorded log header holds.

    ``startup_check`` is false: the recorder built the scheduler without
    vLLM's engine start-up.  The header is what vLLM's live scheduler reported (hash block size, groups);
    grouped prefix caching needs that geometry declared (aisim.config.rule), so
    it is written into the configuration the way a probe import would.
    """
    import json
    import os

    with open(os.path.join(scenario_dir, "config.json")) as fh:
        raw = json.load(fh)
    raw["vllm_version"] = version
    # The logs were recorded on a Scheduler built without the engine's start-up check
    # (the oracle README), which would refuse full_small (200 blocks, max_model_len 4096).
    raw["startup_check"] = False
    with open(os.path.join(scenario_dir, f"vllm-{version}.jsonl")) as fh:
        header = json.loads(fh.readline())
    groups = [dict(g) for g in raw.get("kv_cache_groups", [])]
    if len(groups) > 1 and raw.get("enable_prefix_caching", True):
        raw.setdefault("cache_extra", {})
        raw["cache_extra"] = dict(raw["cache_extra"], prefix_match_unit=header["hash_block_size"])
        for g in groups:
            g["prefix_cacheable"] = True
            g["page_size_bytes"] = 1  # hand-built test specs: equal pages by construction
            if g["type"] == "mamba":
                g["prefill_checkpoint_blocks"] = 0
        raw["kv_cache_groups"] = groups
    return raw


def make_trace(requests, clock="step"):
    """``requests``: dicts with id, prompt, max_tokens, at, and optional segments/priority/accept.

    ``segments`` defaults to one private stream; give ``[("name", first, length), ...]``
    to share tokens by stream name.
    """
    rows = {k: [] for k in ("request_id", "arrival_step", "arrival_s", "prompt_tokens",
                            "output_tokens", "priority", "segments", "accept")}
    for r in requests:
        segs = r.get("segments") or [("private-" + r["id"], 0, r["prompt"])]
        rows["request_id"].append(r["id"])
        rows["arrival_step"].append(r["at"] if clock == "step" else None)
        rows["arrival_s"].append(float(r["at"]) if clock == "time" else None)
        rows["prompt_tokens"].append(r["prompt"])
        rows["output_tokens"].append(r["max_tokens"])
        rows["priority"].append(r.get("priority", 0))
        rows["segments"].append(canonical_segments([(stream_id("t", s), f, n) for s, f, n in segs]))
        rows["accept"].append(r.get("accept"))
    return trace_table(rows, clock)


def drawn_rows(reqs, max_prompt, shared_stream=lambda r: "common", at=lambda r: r["at"], **extra):
    """:func:`make_trace` rows from a property test's drawn requests (``prompt``, ``shared``,
    ``max_tokens``, ``at``): each prompt capped at ``max_prompt``, its first ``shared`` tokens from
    ``shared_stream(r)``, the rest its own; ``extra``: a function of (index, request) per further field."""
    rows = []
    for i, r in enumerate(reqs):
        prompt = min(r["prompt"], max_prompt)
        shared = min(r["shared"], prompt)
        segs = ([(shared_stream(r), 0, shared)] if shared else []) + [(f"own{i}", shared, prompt - shared)]
        rows.append(dict(id=f"r{i:02d}", prompt=prompt, max_tokens=r["max_tokens"], at=at(r),
                         segments=[s for s in segs if s[2] > 0], **{k: f(i, r) for k, f in extra.items()}))
    return rows


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


def ipc_bytes(table):
    """The table as Arrow IPC bytes: byte-identical tables, NaN times included."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def assert_same_replay(got, ref):
    """Two replay results byte-identical: steps, requests, summary and decision log."""
    import json

    assert ipc_bytes(got.steps) == ipc_bytes(ref.steps)
    assert ipc_bytes(got.requests) == ipc_bytes(ref.requests)
    assert json.dumps(got.summary) == json.dumps(ref.summary)
    assert [log_line_json(x) for x in decision_lines(got)] == [log_line_json(x) for x in decision_lines(ref)]


def copy_oracle_config(scenario_dir, dest):
    """Write an oracle scenario's config.json to ``dest`` with ``startup_check`` false, as recorded."""
    import json
    import os

    with open(os.path.join(scenario_dir, "config.json")) as fh:
        raw = json.load(fh)
    raw["startup_check"] = False  # the recorder built the scheduler without vLLM's engine start-up
    with open(dest, "w") as fh:
        json.dump(raw, fh, indent=1)


def oracle_hash_id_trace(path):
    """An offload scenario's trace.jsonl (prompts as ``hash_ids`` of ``hash_block`` tokens): every id is a
    token stream, the id at list position i covers prompt positions i*hash_block onwards with the
    first tokens of its stream; positions past the ids are the request's own."""
    import json

    requests = []
    with open(path) as fh:
        for line in fh:
            o = json.loads(line)
            unit, n = o["hash_block"], o["prompt_len"]
            segs = []
            for i, h in enumerate(o["hash_ids"]):
                if i * unit >= n:
                    break
                segs.append((f"id-{h}", 0, min(unit, n - i * unit)))
            covered = sum(s[2] for s in segs)
            if covered < n:
                segs.append(("private-" + o["request_id"], covered, n - covered))
            requests.append({"id": o["request_id"], "prompt": n, "max_tokens": o["max_tokens"],
                             "at": o["arrival_step"], "segments": segs})
    return make_trace(requests)


def offload_requests(max_prompt, max_shared, max_size):
    """A hypothesis strategy of drawn requests (for :func:`drawn_rows`) sharing one of three prefixes:
    the random traces the KV offload tier's properties replay."""
    import hypothesis.strategies as st

    return st.lists(st.fixed_dictionaries({
        "prompt": st.integers(1, max_prompt), "max_tokens": st.integers(1, 50), "at": st.integers(0, 60),
        "shared": st.integers(0, max_shared), "prefix": st.integers(0, 2),
    }), min_size=1, max_size=max_size)


def drawn_offload_case(reqs, blocks, seqs, budget, asynchronous, offload):
    """A drawn property case of the offload tier: the trace of ``reqs`` (:func:`offload_requests`,
    up to 150 prompt tokens, sharing one of three prefixes) and the engine of
    :func:`offload_engine_dict`; None when the configuration refuses the engine or the replay
    refuses the trace (a request that can never fit), so there is nothing to compare."""
    from aisim.config.engine import engine_config_from_dict
    from aisim.replay import replay

    try:
        eng = engine_config_from_dict(offload_engine_dict(blocks, seqs, budget, asynchronous, offload))
    except Exception:
        return None
    trace = make_trace(drawn_rows(reqs, 150, shared_stream=lambda r: f"p{r['prefix']}"))
    try:
        replay(trace, eng)
    except Exception:
        return None
    return trace, eng


def offload_engine_dict(blocks, seqs, budget, asynchronous, offload):
    """A small 0.34.0 engine (16-token blocks, 160 tokens a request, a linear time model) with the
    ``kv_offload`` section ``offload``: the engines of the offload tier's properties."""
    return {"num_gpu_blocks": blocks, "block_size": 16, "max_model_len": 160, "max_num_seqs": seqs,
            "max_num_batched_tokens": budget, "startup_check": False, "vllm_version": "0.34.0",
            "kv_cache_groups": [{"type": "full"}], "async_scheduling": asynchronous,
            "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 0.0001}, "kv_offload": offload}
