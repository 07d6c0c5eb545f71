"""The KV offload columns of the step rows: a step that moves nothing counts 0 and keeps the tier's
levels of the step before, in a whole replay and across every piece a streamed one hands over."""

import os

import numpy as np
import pytest

from aisim.columns import OFFLOAD_STEPS
from aisim.config.engine import engine_config_from_dict
from aisim.replay import replay

from conftest import DATA
from helpers import ipc_bytes, oracle_engine_dict, oracle_hash_id_trace
from test_replay_stream import _streamed

LEVELS = ("offload_cpu_used", "offload_cpu_evictable")


@pytest.fixture(scope="module")
def multiturn():
    d = os.path.join(DATA, "oracle", "offload", "offload_multiturn")
    eng = engine_config_from_dict(oracle_engine_dict(d, "0.34.0"))
    trace = oracle_hash_id_trace(os.path.join(d, "trace.jsonl"))
    return trace, eng, replay(trace, eng)


def test_a_quiet_step_keeps_the_levels_of_the_step_before(multiturn):
    _, _, whole = multiturn
    cols = {c.name: whole.steps.column(c.name).to_numpy() for c in OFFLOAD_STEPS.columns}
    counts = [c.name for c in OFFLOAD_STEPS.columns if c.name not in LEVELS]
    busy = np.zeros(whole.steps.num_rows, dtype=bool)
    for name in counts:
        busy |= cols[name] != 0
    quiet = np.flatnonzero(~busy)
    assert 0 < len(quiet) < whole.steps.num_rows
    for name in LEVELS:
        before = np.concatenate(([0], cols[name][:-1]))
        assert np.array_equal(cols[name][quiet], before[quiet])
    # The store counts add up to the connector's totals (the recorded run's: 491 stores of 12,583 chunks).
    off = whole.summary["kv_offload"]
    assert (int(cols["offload_stores"].sum()), int(cols["offload_store_chunks"].sum())) == (491, 12583)
    assert (off["stores"], off["store_chunks"]) == (491, 12583)


@pytest.mark.parametrize("out_rows", [1, 7])
def test_every_piece_carries_the_levels_of_the_piece_before(multiturn, out_rows):
    trace, eng, whole = multiturn
    _, steps, summary = _streamed(trace, eng, chunk=50, out_rows=out_rows)
    assert ipc_bytes(steps.combine_chunks()) == ipc_bytes(whole.steps.combine_chunks())
    assert summary == whole.summary
