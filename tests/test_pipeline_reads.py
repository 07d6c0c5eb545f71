"""The pipeline's read tasks: large files read in blocks by a chain of tasks, grouped by model in staging.

Every test compares a run whose files are cut into small blocks (the chain
of count, parse, resolve and route tasks) with the same run reading each
file in one task: the landed tables must be the same, row for row.
"""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aisim.errors import ShardFailed
from aisim.pipeline import graph
from aisim.pipeline.run import build_plan, run_pipeline
from aisim.pipeline.runkey import resolve_inputs, run_key
from aisim.pipeline.spec import spec_from_dict
from aisim.traces import blocks
from aisim.traces.synth import synth_trace

from test_pipeline_common import demo_spec, dump


def _both(spec_of, tmp_path, monkeypatch, block_bytes):
    """Land ``spec_of(db)`` read whole, then in blocks of ``block_bytes``; return both dumps and the plan."""
    whole = tmp_path / "whole.duckdb"
    run_pipeline(spec_of(whole), scheduler="sync")
    monkeypatch.setattr(blocks, "BLOCK_BYTES", block_bytes)
    cut = tmp_path / "blocks.duckdb"
    spec = spec_of(cut)
    plan = build_plan(spec, resolve_inputs(spec), "x" * 16)
    run_pipeline(spec, scheduler="sync")
    return dump(whole), dump(cut), plan


def test_the_demo_read_in_blocks_lands_the_same_rows(tmp_path, monkeypatch):
    whole, cut, plan = _both(demo_spec, tmp_path, monkeypatch, 16384)
    assert [len(r["blocks"]) for r in plan["reads"]] == [14, 2]  # ceil(219,571 / 16,384), ceil(31,942 / 16,384)
    assert cut == whole and len(cut["requests"]) == 4300


def _mooncake(tmp_path):
    """A Mooncake trace of two served models with multi-turn sessions, some turns timed by a delay."""
    lines = []
    for i in range(600):
        row = {"input_length": 100 + i % 700, "output_length": 5 + i % 40,
               "hash_ids": list(range(i % 9, i % 9 + -(-(100 + i % 700) // 512))),
               "model": "org/big" if i % 3 else "org/small", "session_id": f"s{i % 50}"}
        if i % 7 == 3 and i >= 50:
            row["delay"] = 250 + i % 5
        else:
            row["timestamp"] = 1_700_000_000_000 + 500 * i + (i % 4) * 10
        lines.append(json.dumps(row))
    path = tmp_path / "gateway.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _mooncake_spec(trace, window=None):
    def spec_of(db):
        raw = {"name": "gateway", "database": str(db),
               "sources": [{"paths": [str(trace)], "format": "mooncake-delta", "model_map": {"org/big": "big"}}],
               "deployments": [{"model": "big", "engines": {"a": {"num_gpu_blocks": 4000, "max_model_len": 65536},
                                                            "b": {"num_gpu_blocks": 900, "max_model_len": 57536}}}]}
        if window:
            raw["window"] = window
        return spec_from_dict(raw, base_dir=str(trace.parent))
    return spec_of


def test_sessions_models_and_a_window_read_in_blocks(tmp_path, monkeypatch):
    trace = _mooncake(tmp_path)
    whole, cut, plan = _both(_mooncake_spec(trace, {"start_s": 20.0, "end_s": 250.0}), tmp_path, monkeypatch, 3000)
    assert len(plan["reads"][0]["blocks"]) > 10
    assert cut == whole
    # The counts from the raw lines: a delay counts from the session's previous turn (50 lines up).
    arrival = {}
    for i, line in enumerate(trace.read_text().splitlines()):
        row = json.loads(line)
        arrival[i] = row["timestamp"] if "timestamp" in row else arrival[i - 50] + row["delay"]
    t0 = min(arrival.values())
    inside = [i for i, t in arrival.items() if 20_000 <= t - t0 < 250_000]
    small = [i for i in inside if i % 3 == 0]
    (run,) = whole["runs"]
    assert run[11:15] == (600, len(inside), len(small), 0)  # rows read, in the window, skipped, bad
    assert len(whole["requests"]) == 2 * (len(inside) - len(small))


def test_a_bad_line_in_a_late_block_is_named(tmp_path, monkeypatch):
    trace = _mooncake(tmp_path)
    lines = trace.read_text().splitlines()
    lines[570] = lines[570].replace('"output_length": ', '"output_length": -')
    trace.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 3000)
    with pytest.raises(ShardFailed) as err:
        run_pipeline(_mooncake_spec(trace)(tmp_path / "d.duckdb"), scheduler="sync")
    assert str(err.value) == (f"reading gateway.jsonl (source 'source-0') failed: {trace}:571: field "
                              "'output_length' must be at least 1, got -15")
    assert not os.path.exists(tmp_path / "d.duckdb") and not os.path.exists(tmp_path / "d.duckdb.staging")


def test_a_parquet_trace_is_read_by_row_groups(tmp_path, monkeypatch):
    trace = synth_trace(700, seed=3, rate=4.0, turns=3, prompt="uniform:50:900", output="uniform:4:60")
    path = tmp_path / "t.parquet"
    pq.write_table(trace, path, row_group_size=100)

    def spec_of(db):
        return spec_from_dict({"name": "pq", "database": str(db),
                               "sources": [{"paths": [str(path)], "format": "parquet", "model": "m"}],
                               "deployments": [{"model": "m", "engines": {"e": {"num_gpu_blocks": 3000}}}]},
                              base_dir=str(tmp_path))
    whole = tmp_path / "whole.duckdb"
    monkeypatch.setattr("aisim.pipeline.reads.plan_blocks", lambda *a: None)
    run_pipeline(spec_of(whole), scheduler="sync")
    monkeypatch.undo()
    spec = spec_of(tmp_path / "groups.duckdb")
    assert len(build_plan(spec, resolve_inputs(spec), "x" * 16)["reads"][0]["blocks"]) == 7
    run_pipeline(spec, scheduler="sync")
    assert dump(tmp_path / "groups.duckdb") == dump(whole)


def test_no_task_result_carries_rows(tmp_path, monkeypatch):
    """Rows go through staging: what every task returns is a small dictionary (or a count)."""
    from aisim.pipeline.staging import Staging

    monkeypatch.setattr(blocks, "BLOCK_BYTES", 16384)
    spec = demo_spec(tmp_path / "d.duckdb")
    inputs = resolve_inputs(spec)
    plan = build_plan(spec, inputs, run_key(spec, inputs), Staging(str(tmp_path / "stage")))
    shards, stats, names, _ = graph.build_graph(plan)
    results = {}
    import dask
    from dask.callbacks import Callback

    with Callback(posttask=lambda key, result, *a: results.__setitem__(key, result)):
        dask.compute(*shards, *stats, scheduler="sync")
    kinds = {k.split("-")[1] for k in results}
    assert kinds == {"count", "parse", "resolve", "route", "stats", "shard"}
    for key, result in results.items():
        assert not _has_arrow(result), key
        assert len(json.dumps(result, default=str)) < 20_000, key


def _has_arrow(x) -> bool:
    if isinstance(x, (pa.Table, pa.Array, pa.ChunkedArray, pa.RecordBatch)):
        return True
    if isinstance(x, dict):
        return any(_has_arrow(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_has_arrow(v) for v in x)
    return False



@pytest.mark.parametrize("closed_loop", [False, True])
def test_a_shard_ranks_ids_and_links_turns_as_a_replay_does(tmp_path, closed_loop):
    """Two overlapping files of one model, the priority policy and sessions: DuckDB merges the
    parts, ranks the ids and links the turns; the landed rows are aisim.replay's on the merged trace."""
    import duckdb
    import numpy as np
    import pyarrow.compute as pc

    from aisim.config.engine import engine_config_from_dict
    from aisim.replay import replay
    from aisim.traces.parquet import write_trace

    parts = []
    for k in range(2):
        t = synth_trace(150, seed=20 + k, rate=6.0, turns=3, think_time_s=0.4, prompt="uniform:40:700",
                        output="uniform:3:40")
        ids = pa.array([f"{'ab'[k]}{i:03d}" for i in range(t.num_rows)][::-1])  # string order != trace order
        t = t.set_column(t.schema.get_field_index("request_id"), "request_id", ids)
        sessions = pc.binary_join_element_wise(pa.scalar("ab"[k]), t.column("session_id"), "")
        t = t.set_column(t.schema.get_field_index("session_id"), "session_id", sessions)
        prio = pa.array(np.random.default_rng(k).integers(0, 3, t.num_rows).astype(np.int32))
        t = t.set_column(t.schema.get_field_index("priority"), "priority", prio)
        # Whole seconds: many requests share (priority, arrival), and their ids' order decides.
        whole = pa.array(np.floor(t.column("arrival_s").to_numpy()))
        t = t.set_column(t.schema.get_field_index("arrival_s"), "arrival_s", whole)
        write_trace(t, tmp_path / f"{'ab'[k]}.parquet")
        parts.append(t)
    cfg = {"num_gpu_blocks": 900, "max_model_len": 4096, "max_num_seqs": 24, "policy": "priority"}
    raw = {"name": "prio", "database": str(tmp_path / "p.duckdb"),
           "sources": [{"paths": ["*.parquet"], "format": "parquet", "model": "m"}],
           "deployments": [{"model": "m", "engines": {"e": cfg}}]}
    if closed_loop:
        raw["replay"] = {"closed_loop": True}
    run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync")
    merged = pa.concat_tables([p.replace_schema_metadata(None) for p in parts])
    key = merged.column("arrival_s").to_numpy()
    merged = merged.take(pa.array(np.argsort(key, kind="stable"))).replace_schema_metadata({"clock": "time"})
    direct = replay(merged, engine_config_from_dict(cfg), closed_loop=closed_loop)
    with duckdb.connect(str(tmp_path / "p.duckdb"), read_only=True) as con:
        got = con.execute("SELECT request_id, arrival_s, first_token_s, finish_s, preemptions FROM requests "
                          "ORDER BY request_index").fetchall()
    want = list(zip(*(direct.requests.column(c).to_pylist()
                      for c in ("request_id", "arrival_s", "first_token_s", "finish_s", "preemptions"))))
    assert got == want


def test_files_that_overlap_in_time_merge_a_batch_at_a_time(tmp_path, monkeypatch):
    """Three gateway files of the same hours, each read in blocks: merged holding a few rows of each,
    they land what DuckDB's full sort of them lands."""
    from aisim.pipeline import merge

    for k in range(3):
        lines = []
        for i in range(200):
            # In order within a file; files 0 and 1 tie on every arrival, file 2 falls between them.
            lines.append(json.dumps({"timestamp": 1_000_000 + 37 * i + (0 if k < 2 else 5 + 20 * (i % 2)),
                                     "input_length": 64 + (i * 7 + k) % 300, "output_length": 3 + i % 9,
                                     "model": "m", "request_id": f"f{k}-{i}"}))
        (tmp_path / f"g{k}.jsonl").write_text("\n".join(lines) + "\n")

    def spec_of(db):
        return spec_from_dict({"name": "overlap", "database": str(db),
                               "sources": [{"paths": ["g*.jsonl"], "format": "mooncake", "model": "m"}],
                               "deployments": [{"model": "m", "engines": {"e": {"num_gpu_blocks": 400, "max_model_len": 4096}}}]},
                              base_dir=str(tmp_path))
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 2000)
    monkeypatch.setattr(merge, "MERGE_ROWS", 7)
    calls = []
    real = merge.ShardTrace._merge_files
    monkeypatch.setattr(merge.ShardTrace, "_merge_files", lambda self: calls.append(1) or real(self))
    run_pipeline(spec_of(tmp_path / "merged.duckdb"), scheduler="sync")
    assert calls == [1, 1]  # the shard's two passes: its private requests (stream_private), the replay
    monkeypatch.setattr(merge.ShardTrace, "_merge_files", lambda self: self._sorted(False, False, None))
    run_pipeline(spec_of(tmp_path / "sorted.duckdb"), scheduler="sync")
    got, want = dump(tmp_path / "merged.duckdb"), dump(tmp_path / "sorted.duckdb")
    assert got == want and len(got["requests"]) == 600
