"""The public trace builder: DataFrames and Arrow tables of requests become traces, checked by column and row."""

import subprocess
import sys

import pyarrow as pa
import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.errors import TraceError
from aisim.replay import replay
from aisim.traces import from_frame, read_trace
from aisim.traces.common import bad_rows

ENGINE = engine_config_from_dict({"num_gpu_blocks": 400, "max_model_len": 4096})
COLUMNS = {"request_id": ["a", "b", "c"], "prompt_len": [300, 200, 100], "max_tokens": [4, 3, 2],
           "arrival_time": [0.0, 0.5, 0.25], "prefix_group": [7, 7, 0], "prefix_len": [64, 64, 0]}


def test_an_arrow_table_replays_like_the_same_oracle_trace(tmp_path):
    import json

    path = tmp_path / "t.jsonl"
    with open(path, "w") as fh:
        for i in range(3):
            row = {k: v[i] for k, v in COLUMNS.items() if k not in ("prefix_group", "prefix_len")}
            if COLUMNS["prefix_len"][i]:
                row.update(prefix_group=COLUMNS["prefix_group"][i], prefix_len=COLUMNS["prefix_len"][i])
            fh.write(json.dumps(row) + "\n")
    built = from_frame(pa.table(COLUMNS))
    read = read_trace(path, "oracle")
    assert built.column("request_id").to_pylist() == ["a", "c", "b"]
    for name in ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "priority", "segments"):
        assert built.column(name).to_pylist() == read.column(name).to_pylist(), name
    a, b = replay(pa.table(COLUMNS), ENGINE), replay(read, ENGINE)
    assert a.requests.column("cached_tokens").to_pylist() == b.requests.column("cached_tokens").to_pylist()
    assert a.summary == b.summary


def test_sessions_number_their_turns_and_ids_default_to_rows():
    t = from_frame(pa.table({"prompt_len": [10, 10, 10], "max_tokens": [1, 1, 1], "arrival_step": [5, 0, 2],
                             "session_id": ["s", "s", None]}))
    assert t.column("request_id").to_pylist() == ["row1", "row2", "row0"]
    assert t.column("turn").to_pylist() == [0, 0, 1]
    assert t.schema.metadata[b"clock"] == b"step" and t.schema.metadata[b"format"] == b"frame"


@pytest.mark.parametrize("change,message", [
    ({"prompt_len": [300, 0, 100]}, "the frame: row 1: field 'prompt_len' must be at least 1"),
    ({"max_tokens": [4, 3.5, 2]}, "the frame: row 1: field 'max_tokens' must be an integer"),
    ({"arrival_time": [0.0, float("inf"), 1.0]},
     "the frame: row 1: field 'arrival_time' must be a finite non-negative number of seconds"),
    ({"arrival_time": [0.0, None, 1.0]},
     "the frame: row 1: field 'arrival_time' must be a finite non-negative number of seconds"),
    ({"prefix_len": [64, 300, 0]}, "the frame: row 1: field 'prefix_len' exceeds 'prompt_len'"),
    ({"request_id": ["a", "a", "c"]}, "the frame: row 1: field 'request_id': 'a' already used on row 0"),
    ({"prompt_len": [300, 2**31, 100]}, "the frame: row 1: field 'prompt_len' must be below 2147483648"),
])
def test_bad_rows_name_the_row_and_column_or_are_skipped(change, message):
    table = pa.table(dict(COLUMNS, **change))
    with pytest.raises(TraceError) as err:
        from_frame(table)
    assert str(err.value) == message
    kept = from_frame(table, skip_bad_rows=True)
    assert kept.column("request_id").to_pylist() == ["a", "c"] and bad_rows(kept) == 1


@pytest.mark.parametrize("columns,message", [
    ({"prompt_len": [1], "arrival_time": [0.0]}, "the frame: missing column 'max_tokens'"),
    ({"prompt_len": [1], "max_tokens": [1]},
     "the frame: exactly one of the columns 'arrival_time' and 'arrival_step' is required"),
    ({"prompt_len": [1], "max_tokens": [1], "arrival_time": [0.0], "promt": [1]},
     "the frame: unknown column 'promt'; known columns: prompt_len, max_tokens, arrival_time, arrival_step, "
     "request_id, prefix_group, prefix_len, session_id, turn, priority, model, accept"),
    ({"prompt_len": ["1"], "max_tokens": [1], "arrival_time": [0.0]},
     "the frame: column 'prompt_len' must hold integers, got string"),
    ({"prompt_len": [1], "max_tokens": [1], "arrival_time": [0.0], "prefix_len": [0]},
     "the frame: columns 'prefix_len' and 'prefix_group' go together"),
])
def test_bad_columns_are_named(columns, message):
    with pytest.raises(TraceError) as err:
        replay(pa.table(columns), ENGINE)
    assert str(err.value) == message


def test_something_that_is_no_frame_is_refused():
    with pytest.raises(TraceError, match="a trace frame must be a pandas or polars DataFrame or a pyarrow Table, "
                                         "got dict"):
        replay(COLUMNS, ENGINE)


def test_a_pandas_dataframe_replays_like_its_arrow_table():
    pd = pytest.importorskip("pandas")
    a = replay(pd.DataFrame(COLUMNS), ENGINE)
    b = replay(pa.table(COLUMNS), ENGINE)
    assert a.summary == b.summary
    with pytest.raises(TraceError, match="the frame: row 2: field 'prompt_len' must be at least 1"):
        from_frame(pd.DataFrame(dict(COLUMNS, prompt_len=[300, 200, -1])))


def test_a_polars_dataframe_replays_like_its_arrow_table():
    pl = pytest.importorskip("polars")
    assert replay(pl.DataFrame(COLUMNS), ENGINE).summary == replay(pa.table(COLUMNS), ENGINE).summary


def test_the_package_shortcut_replays_again_after_the_module_is_imported():
    # ``import aisim.replay`` rebinds the package attribute to the module; the call must still work.
    script = (
        "import pyarrow as pa, aisim\n"
        "from aisim.config.engine import engine_config_from_dict\n"
        "engine = engine_config_from_dict({'num_gpu_blocks': 64, 'block_size': 16, 'max_model_len': 1008})\n"
        "table = pa.table({'prompt_len': [20, 40], 'max_tokens': [3, 2], 'arrival_time': [0.0, 0.0]})\n"
        "first = aisim.replay(table, engine).summary['finished']\n"
        "import aisim.replay\n"
        "second = aisim.replay(table, engine).summary['finished']\n"
        "print(first, second, aisim.replay.replay is not None)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2", "2", "True"]


def test_a_frame_carries_accept_lists_to_speculative_decoding():
    eng = engine_config_from_dict({"num_gpu_blocks": 64, "max_num_batched_tokens": 64, "max_num_seqs": 4,
                                   "max_model_len": 256,
                                   "speculative": {"num_speculative_tokens": 2, "acceptance": {"counts": [0]}}})
    table = pa.table({"prompt_len": [16, 16], "max_tokens": [7, 7], "arrival_step": [0, 0],
                      "accept": pa.array([[2], None], pa.list_(pa.int64()))})
    assert from_frame(table).column("accept").to_pylist() == [[2], None]
    out = replay(table, eng).requests.to_pylist()
    # row0 accepts both drafts every step (3 tokens a step), row1 none (1): after the prefill's output,
    # 7 = 1 + 3 * 2 takes row0 2 verifications (4 drafts) and row1 6 (12 drafts).
    assert [(r["spec_drafts"], r["spec_accepted"]) for r in out] == [(4, 4), (12, 0)]
    with pytest.raises(TraceError, match=r"row 0: field 'accept' must be null or a non-empty list"):
        from_frame(pa.table({"prompt_len": [1], "max_tokens": [1], "arrival_step": [0],
                             "accept": pa.array([[]], pa.list_(pa.int64()))}))
