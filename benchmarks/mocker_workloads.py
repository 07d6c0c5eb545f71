"""aisim against Dynamo's mocker on the same work, in the same run: the workloads and the table.

Each workload is an engine, a way to load its trace and the mocker's job for the same requests.
aisim is timed over loading the trace (reading the file) and ``replay(trace, engine)``,
macro-steps on, as the mocker's call reads its file and replays it; the replay alone is printed
beside it.  The synthetic shape's table is built once in memory, as the mocker builds its
requests.  The two sides take turns, ``repeat`` rounds each after a warm-up, and the medians are
compared (``mocker / aisim``: how many times faster aisim is).

The workloads (:func:`target_workloads`), besides the synthetic shapes that replay_speed.py builds:

- ``conversation_3000``: the first 3,000 requests of Mooncake's conversation trace, 128
  sequences, an 8,192-token budget, a 32,768-block pool;
- ``conversation``: the whole conversation trace (12,031 requests) on the same engine;
- ``azure_code``: Azure's 2023 code trace (8,819 requests at their recorded times), written as
  Mooncake JSONL with one private hash id per 512-token block (the trace has no prefix
  information), on a 2,048-block pool, so every prompt evicts cached blocks of earlier ones.

The conversation trace is not in the repository (3 MB): it is read from ``--conversation PATH``,
else ``benchmarks/data/mooncake/conversation_trace.jsonl`` (ignored by git), else
``../shared/traces/mooncake/conversation_trace.jsonl`` beside the checkout; without it the two
workloads are skipped with a line saying how to get it: the file
``FAST25-release/traces/conversation_trace.jsonl`` of the repository kvcache-ai/Mooncake on
GitHub (Apache-2.0), for instance::

    git clone --depth 1 https://github.com/kvcache-ai/Mooncake /tmp/mooncake
    mkdir -p benchmarks/data/mooncake
    cp /tmp/mooncake/FAST25-release/traces/conversation_trace.jsonl benchmarks/data/mooncake/
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import statistics
import time

from aisim.config.engine import engine_config_from_dict
from aisim.replay import replay
from aisim.traces import read_trace

from mocker import mocker_engine, mocker_python, time_mocker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONVERSATION_NAME = "conversation_trace.jsonl"
CONVERSATION_PLACES = (os.path.join(REPO, "benchmarks", "data", "mooncake", CONVERSATION_NAME),
                       os.path.join(os.path.dirname(REPO), "shared", "traces", "mooncake", CONVERSATION_NAME))
AZURE_CODE_PLACES = (os.path.join(os.path.dirname(REPO), "shared", "traces", "azure2023",
                                  "AzureLLMInferenceTrace_code.csv"),)
CONVERSATION_HINT = ("FAST25-release/traces/conversation_trace.jsonl of kvcache-ai/Mooncake on GitHub, "
                     "into benchmarks/data/mooncake/ (or --conversation PATH)")

TARGET = 5.0  # aisim at least this many times faster than the mocker on every workload
UNIT = 512  # Mooncake's tokens per hash id


class Workload:
    """One workload of the comparison: aisim's engine and trace, and the mocker's job for the same requests.

    ``load()`` gives the trace table (timed with the replay); ``job`` is the mocker's job without
    its engine (see :func:`mocker.time_mocker`).
    """

    def __init__(self, name, eng, load, job, reject_too_long=False, note=""):
        self.name, self.eng, self.load, self.job = name, eng, load, job
        self.reject_too_long, self.note = reject_too_long, note


def _engine(blocks, source, seqs=128, budget=8192, max_model_len=131072):
    return engine_config_from_dict(
        {"num_gpu_blocks": blocks, "block_size": 16, "max_num_seqs": seqs, "max_num_batched_tokens": budget,
         "max_model_len": max_model_len, "enable_prefix_caching": True, "kv_cache_groups": [{"type": "full"}]},
        source=source)


def mooncake_file_workload(name, path, blocks, note="", max_model_len=131072):
    """A Mooncake JSONL file on a 128-sequence engine of ``blocks`` blocks (prompts too long rejected)."""
    eng = _engine(blocks, name, max_model_len=max_model_len)
    return Workload(name, eng, lambda: read_trace(path, "mooncake"),
                    {"kind": "mooncake", "path": path, "trace_block_size": UNIT}, reject_too_long=True, note=note)


def find(given, places):
    """``given`` when set, else the first of ``places`` that exists, else None."""
    if given:
        return given
    return next((p for p in places if os.path.exists(p)), None)


def head_lines(path, n, out_dir):
    """The first ``n`` lines of ``path`` as a file in ``out_dir``."""
    out = os.path.join(out_dir, f"{os.path.splitext(os.path.basename(path))[0]}_{n}.jsonl")
    with open(path, "rb") as src, open(out, "wb") as dst:
        for i, line in enumerate(src):
            if i == n:
                break
            dst.write(line)
    return out


def azure_as_mooncake(csv_path, out_dir):
    """Azure's trace as Mooncake JSONL: milliseconds from the first request, one private hash id per block."""
    out = os.path.join(out_dir, "azure_code.jsonl")
    t0 = None
    next_id = 0
    with open(csv_path, newline="", encoding="utf-8") as src, open(out, "w", encoding="utf-8") as dst:
        for row in csv.DictReader(src):
            stamp = row["TIMESTAMP"]
            whole, _, frac = stamp.partition(".")
            t = datetime.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(
                tzinfo=datetime.timezone.utc).timestamp() + float(f"0.{frac or 0}")
            t0 = t if t0 is None else t0
            prompt, output = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            blocks = -(-prompt // UNIT)
            dst.write(json.dumps({"timestamp": round((t - t0) * 1000.0), "input_length": prompt,
                                  "output_length": output,
                                  "hash_ids": list(range(next_id, next_id + blocks))}) + "\n")
            next_id += blocks
    return out


def target_workloads(tmp_dir, conversation=None):
    """The trace workloads of the targets: ([Workload, ...], [skip message, ...])."""
    found, skipped = [], []
    conv = find(conversation, CONVERSATION_PLACES)
    if conv is None or not os.path.exists(conv):
        skipped.append(f"conversation_3000, conversation: {CONVERSATION_NAME} not found; get {CONVERSATION_HINT}")
    else:
        found.append(mooncake_file_workload("conversation_3000", head_lines(conv, 3000, tmp_dir), 32768,
                                            "first 3,000 requests, 32,768 blocks"))
        found.append(mooncake_file_workload("conversation", conv, 32768, "whole trace, 32,768 blocks"))
    azure = find(None, AZURE_CODE_PLACES)
    if azure is None:
        skipped.append("azure_code: AzureLLMInferenceTrace_code.csv not found beside the checkout "
                       "(shared/traces/azure2023/)")
    else:
        found.append(mooncake_file_workload("azure_code", azure_as_mooncake(azure, tmp_dir), 2048,
                                            "8,819 requests at their times, 2,048 blocks: every prompt evicts",
                                            max_model_len=16384))
    return found, skipped


def time_aisim(w):
    """Seconds of one load + replay and of the replay alone, and the result."""
    t0 = time.perf_counter()
    trace = w.load()
    t1 = time.perf_counter()
    res = replay(trace, w.eng, reject_too_long=w.reject_too_long)
    t2 = time.perf_counter()
    return t2 - t0, t2 - t1, res


def compare(workloads, repeat, python=None):
    """Time every workload on both sides: a list of rows (dicts), or None when no mocker is available.

    The two sides take turns, ``repeat`` rounds a workload (who goes first alternates), so a
    shared machine's changing load falls on both: each round of the mocker is a process of its
    own that replays twice and counts the second; aisim replays once untimed first.
    """
    python = mocker_python(python)
    if python is None:
        return None
    rows = []
    for w in workloads:
        job = {w.name: dict(w.job, engine=mocker_engine(w.eng), repeat=2)}
        replay(w.load(), w.eng, reject_too_long=w.reject_too_long)  # warm-up
        total, alone, mocked = [], [], []
        for i in range(repeat):
            for side in (("mocker", "aisim") if i % 2 == 0 else ("aisim", "mocker")):
                if side == "aisim":
                    t, a, res = time_aisim(w)
                    total.append(t)
                    alone.append(a)
                else:
                    m = time_mocker(job, python)[w.name]
                    mocked.append(m["times_s"][-1])
        s = res.summary
        problem = None
        if m["completed"] is not None and m["completed"] != s["finished"]:
            problem = f"the mocker completed {m['completed']:,} requests, aisim {s['finished']:,}"
        t, a, mm = statistics.median(total), statistics.median(alone), statistics.median(mocked)
        rows.append({"workload": w.name, "note": w.note, "requests": s["requests"], "finished": s["finished"],
                     "steps": s["steps"], "preemptions": s["preemptions"], "aisim_s": t, "aisim_replay_s": a,
                     "mocker_s": mm, "mocker_completed": m["completed"], "ratio": mm / t, "ratio_replay": mm / a,
                     "runs": {"aisim_s": total, "aisim_replay_s": alone, "mocker_s": mocked}, "problem": problem})
    return rows


def table_rows(rows):
    """The printed table's cells, one list a workload."""
    return [[r["workload"], f"{r['requests']:,}", f"{r['steps']:,}", f"{r['preemptions']:,}",
             f"{r['mocker_s'] * 1e3:,.1f}", f"{r['aisim_s'] * 1e3:,.1f}", f"{r['aisim_replay_s'] * 1e3:,.1f}",
             f"{r['ratio']:.2f}x", f"{r['ratio_replay']:.2f}x", f">= {TARGET:.0f}x"] for r in rows]


TABLE_HEADER = ["vs Dynamo's mocker (medians)", "requests", "steps", "preempt", "mocker ms", "aisim ms",
                "replay ms", "mocker/aisim", "…/replay", "target"]


def verdicts(rows):
    """(label, passed, problem, detail) per workload: aisim (load + replay) at least TARGET times the mocker."""
    return [(f"{r['workload']}: >= {TARGET:.0f}x Dynamo's mocker", r["ratio"] >= TARGET, r["problem"],
             f"{r['ratio']:.2f}x ({r['mocker_s'] * 1e3:,.1f} ms against {r['aisim_s'] * 1e3:,.1f} ms; "
             f"the replay alone {r['ratio_replay']:.2f}x)") for r in rows]


def synthetic_job(prompt, output, requests):
    """The mocker's job for the synthetic shape (it builds its own requests: distinct prompts, all at once)."""
    return {"kind": "synthetic", "prompt": prompt, "output": output, "requests": requests}
