"""The codes and column tables the core exports match its cdef enums, and every
Python-side name table covers exactly the core's codes."""

import numpy as np
import pytest

from aisim._core import constants, engine
from aisim._core.testing import enum_codes

ENUMS = enum_codes()


@pytest.mark.parametrize(
    "table, prefix, names",
    [
        (constants.REQUEST_STATUS, "ST_",
         {"pending": "PENDING", "waiting": "WAITING", "running": "RUNNING", "preempted": "PREEMPTED",
          "finished": "FINISHED"}),
        (constants.GROUP_KINDS, "GK_",
         {"full": "FULL", "sliding_window": "SWA", "chunked_local": "CHUNKED", "state": "MAMBA",
          "ring": "RING"}),
        (constants.EVENT_KINDS, "EV_",
         {"arrived": "ARRIVED", "sched": "SCHED", "new": "NEW", "resumed": "RESUMED",
          "preempted": "PREEMPTED", "finished": "FINISHED", "spec": "SPEC", "spec_accepted": "SPEC_ACCEPTED",
          "spec_padded": "SPEC_PADDED", "off_lookup": "OFF_LOOKUP", "off_lookup_ext": "OFF_LOOKUP_EXT",
          "off_load": "OFF_LOAD", "off_load_tokens": "OFF_LOAD_TOKENS", "off_load_chunks": "OFF_LOAD_CHUNKS",
          "off_store": "OFF_STORE", "off_store_chunks": "OFF_STORE_CHUNKS", "off_flush": "OFF_FLUSH",
          "off_wait": "OFF_WAIT", "off_done": "OFF_DONE", "off_recv": "OFF_RECV"}),
        (constants.ACCEPT_KINDS, "ACC_", {"permille": "PERMILLE", "counts": "COUNTS", "histogram": "HISTOGRAM"}),
        (constants.TIME_MODEL_KINDS, "TM_", {"linear": "LINEAR", "roofline": "ROOFLINE", "table": "TABLE"}),
        (constants.TABLE_AXES, "AX_", {"batch_size": "BATCH", "prefill_tokens": "PREFILL", "kv_tokens": "KV"}),
        (constants.STEP_KINDS, "LINE_", {"step": "STEP", "drain": "DRAIN"}),
    ],
)
def test_exported_codes_are_the_cdef_enum_values(table, prefix, names):
    assert table == {name: ENUMS[prefix + c] for name, c in names.items()}
    # The table lists every member of the enum, no more.
    assert sorted(table.values()) == sorted(v for k, v in ENUMS.items() if k.startswith(prefix))


def test_codes_are_dense():
    assert constants.names_by_code(constants.REQUEST_STATUS) == [
        "pending", "waiting", "running", "preempted", "finished"]
    assert constants.names_by_code(constants.STEP_KINDS) == ["step", "drain"]
    with pytest.raises(ValueError):
        constants.names_by_code({"a": 0, "b": 2})


def test_python_name_tables_cover_exactly_the_core_codes():
    from aisim import decisionlog, result_tables
    from aisim.config.kvgroups import GROUP_KINDS
    from aisim.perf.table import AXES

    assert {result_tables.STATUS_NAMES[c]: c for c in range(len(result_tables.STATUS_NAMES))} == constants.REQUEST_STATUS
    assert {result_tables.STEP_KINDS[c]: c for c in range(len(result_tables.STEP_KINDS))} == constants.STEP_KINDS
    assert sorted(set(GROUP_KINDS.values())) == sorted(constants.GROUP_KINDS.values())
    assert GROUP_KINDS == {"full": 0, "sliding_window": 1, "chunked_local": 2, "mamba": 3, "gdn": 3,
                           "kda": 3, "conv": 3, "ring": 4}
    assert AXES == constants.TABLE_AXES
    events = [decisionlog.EV_ARRIVED, decisionlog.EV_SCHED, decisionlog.EV_NEW, decisionlog.EV_RESUMED,
              decisionlog.EV_PREEMPTED, decisionlog.EV_FINISHED, decisionlog.EV_SPEC,
              decisionlog.EV_SPEC_ACCEPTED, decisionlog.EV_SPEC_PADDED]
    assert events == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert sorted(events + sorted(decisionlog._OFF.values())) == sorted(constants.EVENT_KINDS.values())


def test_time_model_kind_codes_reach_the_core():
    from aisim.config import TimeModel
    from aisim.perf.table import table_args  # noqa: F401  (imports the codes)
    from aisim.perf.roofline import roofline_args  # noqa: F401

    assert constants.TIME_MODEL_KINDS == {"linear": 0, "roofline": 1, "table": 2}
    assert TimeModel().kind == "linear"


STEP_ENUMS = ["SC_STEP", "SC_KIND", "SC_UPDATED_STEP", "SC_CLOCK", "SC_DURATION", "SC_NUM_REQS",
              "SC_PREFILL", "SC_DECODE", "SC_NUM_NEW", "SC_NUM_RESUMED", "SC_NUM_PREEMPTED",
              "SC_NUM_FINISHED", "SC_RUNNING", "SC_WAITING", "SC_FREE_SCHED", "SC_FREE_BLOCKS",
              "SC_CACHED_BLOCKS", "SC_QUERIES", "SC_HITS", "SC_P_QUERIES", "SC_P_HITS", "SC_SPEC_TOKENS",
              "SC_SPEC_ACCEPTED"]
REQ_ENUMS = ["RC_STATUS", "RC_OUTPUT", "RC_CACHED", "RC_CACHED_ALL", "RC_PREEMPTIONS", "RC_ARRIVAL",
             "RC_PICKED_UP", "RC_FIRST_SCHED", "RC_FIRST_TOKEN", "RC_FINISH", "RC_SPEC_DRAFTS", "RC_SPEC_ACCEPTED"]


def test_column_tables_follow_the_column_enums():
    assert [ENUMS[e] for e in STEP_ENUMS] == list(range(len(engine.STEP_COLUMNS)))
    assert ENUMS["N_STEP_COLS"] == len(engine.STEP_COLUMNS) == 23
    assert [ENUMS[e] for e in REQ_ENUMS] == list(range(len(engine.REQUEST_COLUMNS)))
    assert ENUMS["N_REQ_COLS"] == len(engine.REQUEST_COLUMNS) == 12
    assert engine.STEP_COLUMNS[:3] == (("step", "int64"), ("kind", "int32"), ("updated_step", "int64"))
    assert engine.REQUEST_COLUMNS[3] == ("cached_tokens_all_admissions", "int64")
    for name, dtype in engine.STEP_COLUMNS + engine.REQUEST_COLUMNS:
        assert np.dtype(dtype).name == dtype, name


def test_run_returns_every_column_with_its_dtype():
    from aisim.config import engine_config_from_dict
    from aisim.core_input import CoreTrace, core_config

    eng = engine_config_from_dict(dict(num_gpu_blocks=64, block_size=16, max_num_seqs=4,
                                       max_num_batched_tokens=256, max_model_len=512))
    trace = CoreTrace(
        prompt_len=np.array([40, 24]), max_tokens=np.array([3, 2]), priority=np.zeros(2, np.int32),
        arrival_key=np.zeros(2), id_rank=np.array([0, 1], np.int32), seg_off=np.array([0, 1], np.int32),
        seg_cnt=np.array([1, 1], np.int32), out_stream=np.array([11, 12], np.uint64),
        seg_stream=np.array([5, 5], np.uint64), seg_first=np.array([0, 0]), seg_len=np.array([40, 24]),
        arrival_step=np.zeros(2, np.int64),
    )
    out = engine.Engine(core_config(eng), trace).run()
    assert [(k, str(v.dtype)) for k, v in out["steps"].items()] == list(engine.STEP_COLUMNS)
    assert [(k, str(v.dtype)) for k, v in out["requests"].items()] == list(engine.REQUEST_COLUMNS)
    r = out["requests"]
    assert r["status"].tolist() == [constants.REQUEST_STATUS["finished"]] * 2
    assert r["output_tokens"].tolist() == [3, 2]
    # The second prompt is the first one's first 24 tokens: one 16-token block is a hit.
    assert r["cached_tokens"].tolist() == [0, 16]
    assert r["cached_tokens_all_admissions"].tolist() == [0, 16]
    # The last iteration schedules nothing: it reports the finished request (vLLM does too).
    assert out["steps"]["step"].tolist() == [0, 1, 2, 3]
    assert out["steps"]["prefill_tokens"].tolist() == [48, 0, 0, 0]
    assert out["steps"]["decode_tokens"].tolist() == [0, 2, 1, 0]
    assert out["steps"]["num_finished"].tolist() == [0, 1, 1, 0]
