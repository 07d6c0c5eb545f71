"""A pipeline run can drive multi-turn sessions in closed loop ([replay] closed_loop)."""

import duckdb
import pytest

from aisim.pipeline.run import run_pipeline
from aisim.errors import SpecError
from aisim.pipeline.spec import spec_from_dict
from aisim.traces.parquet import write_trace
from aisim.traces.synth import synth_trace


def _spec(tmp_path, replay=None):
    trace = synth_trace(40, seed=7, rate=2.0, turns=4, think_time_s=0.5, prompt="fixed:200", output="fixed:20")
    write_trace(trace, tmp_path / "sessions.parquet")
    raw = {"name": "sessions", "database": str(tmp_path / "db.duckdb"),
           "sources": [{"paths": ["sessions.parquet"], "format": "parquet", "model": "m"}],
           "deployments": [{"model": "m", "engines": {"e": {"num_gpu_blocks": 2000, "max_model_len": 4096}}}]}
    if replay is not None:
        raw["replay"] = replay
    return spec_from_dict(raw, base_dir=str(tmp_path))


def _turn_gaps(db):
    # Gap between each turn's arrival and the previous turn's finish, per session.
    with duckdb.connect(db, read_only=True) as con:
        return [g for (g,) in con.execute("""
            SELECT arrival_s - lag(finish_s) OVER (PARTITION BY session_id ORDER BY turn)
            FROM requests QUALIFY turn > 0""").fetchall()]


def test_closed_loop_sends_each_turn_after_the_previous_finishes(tmp_path):
    report = run_pipeline(_spec(tmp_path, {"closed_loop": True, "think_time_s": 1.5}), scheduler="sync")
    gaps = _turn_gaps(report.database)
    assert gaps and all(1.5 <= g < 1.5 + 0.011 for g in gaps)  # seen at the next 10 ms step


def test_open_loop_keeps_the_trace_timestamps(tmp_path):
    report = run_pipeline(_spec(tmp_path), scheduler="sync")
    assert any(g < 1.5 for g in _turn_gaps(report.database))


def test_replay_options_are_checked(tmp_path):
    with pytest.raises(SpecError, match="replay.think_time_s"):
        _spec(tmp_path, {"closed_loop": True, "think_time_s": -1})
    with pytest.raises(SpecError, match="unknown key 'replay.closedloop'"):
        _spec(tmp_path, {"closedloop": True})
