"""Non-finite numbers, bytes that are not UTF-8 and keys given twice: one clear error, nothing written."""

import os

import pyarrow as pa
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.engine import load_engine_config
from aisim.errors import ConfigError, PipelineError, SpecError, SweepError, TraceError
from aisim.pipeline.run import run_pipeline
from aisim.pipeline.spec import load_spec
from aisim.plan import load_probe
from aisim.sweep.runner import load_sweep
from aisim.traces import read_trace
from aisim.traces.common import bad_rows
from aisim.traces.parquet import write_trace
from aisim.traces.synth import synth_trace

from test_pipeline_common import EXAMPLES, demo_spec

ENGINE = os.path.join(EXAMPLES, "engine.json")
GOOD = '{"request_id": "a", "prompt_len": 10, "max_tokens": 2, "arrival_time": 0.5}\n'


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _write(path, text, mode="w"):
    with open(path, mode) as fh:
        fh.write(text)
    return path


# ---------------------------------------------------------------- non-finite numbers in traces


@pytest.mark.parametrize("fmt,text,fragment", [
    ("oracle", GOOD + '{"request_id": "b", "prompt_len": 10, "max_tokens": 2, "arrival_time": Infinity}\n',
     ":2: field 'arrival_time' must be a finite number, got inf"),
    ("oracle", GOOD + '{"request_id": "b", "prompt_len": 10, "max_tokens": 2, "arrival_time": NaN}\n',
     ":2: field 'arrival_time' must be a finite number, got nan"),
    ("mooncake", '{"timestamp": 1, "input_length": 5, "output_length": 1}\n'
                 '{"timestamp": -Infinity, "input_length": 5, "output_length": 1}\n',
     ":2: field 'timestamp' must be a finite number, got -inf"),
    ("mooncake-delta", '{"timestamp": NaN, "input_length": 5, "output_length": 1}\n',
     ":1: field 'timestamp' must be a finite number, got nan"),
])
def test_non_finite_numbers_in_jsonl_traces_are_named(tmp_path, fmt, text, fragment):
    path = _write(tmp_path / "t.jsonl", text)
    with pytest.raises(TraceError) as err:
        read_trace(path, fmt)
    assert str(err.value) == f"{path}{fragment}"


def test_non_finite_time_in_an_agentic_trace_is_named(tmp_path):
    path = _write(tmp_path / "c.json", '{"block_size": 4,\n "requests": [\n {"t": Infinity, "in": 4, "out": 1}]}')
    with pytest.raises(TraceError, match=r"c\.json:3: requests\[0\]: field 't' must be a finite number, got inf"):
        read_trace(path, "agentic")


@pytest.mark.parametrize("value,shown", [(float("inf"), "inf"), (float("nan"), "nan")])
def test_non_finite_arrival_in_a_parquet_trace_is_named(tmp_path, value, shown):
    table = read_trace(_write(tmp_path / "t.jsonl", GOOD), "oracle")
    arrival = pa.array([value], pa.float64())
    table = table.set_column(table.schema.get_field_index("arrival_s"), "arrival_s", arrival)
    path = tmp_path / "t.parquet"
    write_trace(table, path)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value) == (f"{path}:1: field 'arrival_s' must be a finite non-negative number "
                              "(the trace's clock is 'time')")


def test_the_replay_command_refuses_an_infinite_arrival_and_writes_nothing(tmp_path):
    trace = _write(tmp_path / "t.jsonl", '{"request_id": "b", "prompt_len": 10, "max_tokens": 2, '
                                         '"arrival_time": 1e999}\n')
    r = _run("replay", "--engine", ENGINE, "--trace", trace, "--out", tmp_path / "out")
    assert r.exit_code == 2
    assert r.stderr == f"error: {trace}:1: field 'arrival_time' must be a finite number, got inf\n"
    assert not (tmp_path / "out").exists()


def test_synthetic_options_must_be_finite():
    with pytest.raises(ConfigError, match="synth: 'rate' must be a number"):
        synth_trace(10, seed=1, rate=float("nan"))


# ---------------------------------------------------------------- non-finite numbers in configurations


@pytest.mark.parametrize("key,value", [("per_token_s", "NaN"), ("base_s", "Infinity")])
def test_time_model_numbers_must_be_finite(tmp_path, key, value):
    path = _write(tmp_path / "e.json", '{"num_gpu_blocks": 100, "time_model": {"%s": %s}}' % (key, value))
    with pytest.raises(ConfigError, match=rf"'time_model.{key}' in .*e\.json must be a finite non-negative number"):
        load_engine_config(path)


def test_watermark_nan_is_refused(tmp_path):
    path = _write(tmp_path / "e.json", '{"num_gpu_blocks": 100, "watermark": NaN}')
    r = _run("config", "validate", path)
    assert r.exit_code == 2
    assert "'watermark' in" in r.stderr and "must be a number in [0, 1), got nan" in r.stderr


@pytest.mark.parametrize("table,fragment", [
    ("[window]\nstart_s = nan\n", "'window.start_s' in {spec} must be a non-negative number, got nan"),
    ("[window]\nend_s = inf\n", "'window.end_s' in {spec} must be a non-negative number, got inf"),
    ("[replay]\nclosed_loop = true\nthink_time_s = inf\n",
     "'replay.think_time_s' in {spec} must be a finite non-negative number of seconds, got inf"),
    ("[replay]\nthink_time_s = 1.0\n",
     "'replay.think_time_s' in {spec} applies to closed-loop replays; set 'replay.closed_loop = true'"),
])
def test_spec_numbers_must_be_finite_and_think_time_needs_closed_loop(tmp_path, table, fragment):
    spec = _write(tmp_path / "s.toml", 'name = "x"\ndatabase = "x.duckdb"\n' + table +
                  f'[[sources]]\nname = "a"\npaths = ["{EXAMPLES}/trace.jsonl"]\nmodel = "m"\n'
                  f'[[deployments]]\nmodel = "m"\nengines = {{ base = "{ENGINE}" }}\n')
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert str(err.value) == fragment.format(spec=spec)
    r = _run("pipeline", "check", spec)
    assert r.exit_code == 2 and r.stderr == f"error: {fragment.format(spec=spec)}\n"


def test_a_window_that_selects_nothing_lands_nothing(tmp_path):
    db = tmp_path / "d.duckdb"
    spec = demo_spec(db, window={"start_step": 10**9, "start_s": 1e9})
    with pytest.raises(PipelineError, match=r"the window \(start_s = 1000000000.0, start_step = 1000000000\) selects "
                                            "none of the 2300 rows read; nothing is landed"):
        run_pipeline(spec, scheduler="sync")
    assert not db.exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-1.0"])
def test_sweep_slo_thresholds_must_be_finite_and_positive(tmp_path, value):
    path = _write(tmp_path / "s.toml", f'name = "s"\ndatabase = "s.duckdb"\nmodel = "m"\nbase = "{ENGINE}"\n'
                  f'[trace]\npaths = ["{EXAMPLES}/trace.jsonl"]\n[grid]\nmax_num_seqs = [8]\n'
                  f'[slo]\nttft_s = {value}\n')
    with pytest.raises(SweepError, match=rf"'slo.ttft_s' in .*s\.toml must be a finite positive number of "
                                         rf"seconds, got {value.replace('.', '[.]')}"):
        load_sweep(path)


@pytest.mark.parametrize("memory", ["nan", "inf", "0", "-8"])
def test_plan_refuses_gpu_memory_that_is_not_a_positive_finite_number(tmp_path, memory):
    out = tmp_path / "plan.toml"
    r = _run("plan", "--model", "llama-3.1-8b", "--gpu-memory-gib", memory, "--out", out)
    assert r.exit_code == 2
    assert r.stderr.startswith("error: GPU memory must be a finite number of GiB above 0, got ")
    assert not out.exists()


@pytest.mark.parametrize("args,fragment", [
    (["--closed-loop", "--think-time", "nan"], "error: think_time_s must be a finite non-negative number of "
                                               "seconds, got nan"),
    (["--think-time", "1"], "error: --think-time applies to closed-loop replays; add --closed-loop"),
])
def test_replay_think_time_must_be_finite_and_closed_loop(tmp_path, args, fragment):
    trace = _write(tmp_path / "t.jsonl", GOOD)
    r = _run("replay", "--engine", ENGINE, "--trace", trace, "--out", tmp_path / "out", *args)
    assert r.exit_code == 2 and r.stderr == fragment + "\n"
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- bytes that are not UTF-8


def test_a_jsonl_line_that_is_not_utf8_is_named_or_skipped(tmp_path):
    path = _write(tmp_path / "t.jsonl", GOOD.encode() + b'{"request_id": "\xff", "prompt_len": 1}\n', "wb")
    with pytest.raises(TraceError) as err:
        read_trace(path, "oracle")
    assert str(err.value) == f"{path}:2: not UTF-8 text (byte 0xff at column 17)"
    table = read_trace(path, "oracle", skip_bad_rows=True)
    assert table.num_rows == 1 and bad_rows(table) == 1


def test_a_csv_row_that_is_not_utf8_is_named_or_skipped(tmp_path):
    path = _write(tmp_path / "a.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                      b"2023-11-16 18:17:03.1,10,2\n2023-11-16 18:17:04.1,1\xe90,2\n", "wb")
    with pytest.raises(TraceError) as err:
        read_trace(path, "azure")
    assert str(err.value) == f"{path}:3: field 'ContextTokens': not UTF-8 text (byte 0xe9 at column 2)"
    table = read_trace(path, "azure", skip_bad_rows=True)
    assert table.num_rows == 1 and bad_rows(table) == 1


def test_an_agentic_file_that_is_not_utf8_is_named(tmp_path):
    path = _write(tmp_path / "c.json", b'{"block_size": 4,\n "id": "\xc3\x28"}', "wb")
    with pytest.raises(TraceError) as err:
        read_trace(path, "agentic")
    assert str(err.value) == f"{path}:2: not UTF-8 text (byte 0xc3 at column 9)"


@pytest.mark.parametrize("name", ["e.json", "e.toml", "e.yaml"])
def test_an_engine_file_that_is_not_utf8_is_named(tmp_path, name):
    path = _write(tmp_path / name, b"\n\x00\x9f\x92binary", "wb")
    r = _run("config", "validate", path)
    assert r.exit_code == 2 and r.stderr == f"error: {path}:2: not UTF-8 text (byte 0x9f at column 2)\n"


def test_a_binary_spec_probe_or_sweep_is_named(tmp_path):
    blob = bytes(range(256))
    path = _write(tmp_path / "s.toml", blob, "wb")
    with pytest.raises(SpecError, match=r"s\.toml:2: not UTF-8 text \(byte 0x80 at column 118\)"):
        load_spec(path)
    with pytest.raises(SweepError, match=r"s\.toml:2: not UTF-8 text"):
        load_sweep(path)
    with pytest.raises(ConfigError, match=r"s\.toml:2: not UTF-8 text"):
        load_probe(path)


# ---------------------------------------------------------------- keys given twice


def test_a_key_given_twice_in_an_engine_file_is_refused(tmp_path):
    js = _write(tmp_path / "e.json", '{"num_gpu_blocks": 100, "block_size": 16, "num_gpu_blocks": 200}')
    with pytest.raises(ConfigError) as err:
        load_engine_config(js)
    assert str(err.value) == f"{js}: key 'num_gpu_blocks' appears twice"
    ya = _write(tmp_path / "e.yaml", "num_gpu_blocks: 100\ntime_model:\n  base_s: 1\n  base_s: 2\n")
    with pytest.raises(ConfigError) as err:
        load_engine_config(ya)
    assert str(err.value) == f"{ya}:4: key 'base_s' appears twice"


def test_a_key_given_twice_in_a_probe_is_refused(tmp_path):
    path = _write(tmp_path / "p.json", '{"vllm_version": "0.31.0", "vllm_version": "0.32.0"}')
    with pytest.raises(ConfigError) as err:
        load_probe(path)
    assert str(err.value) == f"{path}: key 'vllm_version' appears twice"


def test_a_key_given_twice_in_a_trace_line_is_a_bad_row(tmp_path):
    path = _write(tmp_path / "t.jsonl", GOOD + '{"request_id": "b", "request_id": "c", "prompt_len": 1}\n')
    with pytest.raises(TraceError) as err:
        read_trace(path, "oracle")
    assert str(err.value) == f"{path}:2: key 'request_id' appears twice"
    assert bad_rows(read_trace(path, "oracle", skip_bad_rows=True)) == 1
    moon = _write(tmp_path / "m.jsonl", '{"timestamp": 1, "timestamp": 2, "input_length": 5, "output_length": 1}\n')
    with pytest.raises(TraceError, match=r"m\.jsonl:1: key 'timestamp' appears twice"):
        read_trace(moon, "mooncake")


def test_a_key_given_twice_in_an_agentic_trace_names_its_line(tmp_path):
    path = _write(tmp_path / "c.json", '{"block_size": 4,\n "requests": [\n {"t": 0, "in": 4,\n "in": 5, "out": 1}]}')
    with pytest.raises(TraceError) as err:
        read_trace(path, "agentic")
    assert str(err.value) == f"{path}:4: key 'in' appears twice"
    top = _write(tmp_path / "d.json", '{"block_size": 4,\n "block_size": 8, "requests": []}')
    with pytest.raises(TraceError) as err:
        read_trace(top, "agentic")
    assert str(err.value) == f"{top}:2: key 'block_size' appears twice"


# ---------------------------------------------------------------- skip_bad_rows in the oracle reader


def test_the_oracle_reader_skips_and_counts_bad_rows(tmp_path):
    path = _write(tmp_path / "t.jsonl", GOOD + "{not json\n"
                  '{"request_id": "c", "prompt_len": 10, "max_tokens": 2, "arrival_step": 3}\n'
                  '{"request_id": "d", "prompt_len": 10, "max_tokens": 2, "arrival_time": 2.0}\n')
    table = read_trace(path, "oracle", skip_bad_rows=True)
    assert table.column("request_id").to_pylist() == ["a", "d"]
    assert bad_rows(table) == 2
    assert table.schema.metadata[b"first_bad_row"].decode() == f"{path}:2: not valid JSON (Expecting property " \
                                                               "name enclosed in double quotes)"
    assert table.schema.metadata[b"format"] == b"oracle"
    with pytest.raises(TraceError, match=r"the trace has no requests \(1 bad lines skipped\)"):
        read_trace(_write(tmp_path / "u.jsonl", "{bad\n"), "oracle", skip_bad_rows=True)


@pytest.mark.parametrize("fmt,text,fragment", [
    ("oracle", '{"request_id": "a", "prompt_len": 3000000000, "max_tokens": 1, "arrival_step": 0}\n',
     ":1: field 'prompt_len' must be below 2147483648, got 3000000000"),
    ("oracle", '{"request_id": "a", "prompt_len": 3, "max_tokens": 1, "arrival_step": 0, "priority": -2147483649}\n',
     ":1: field 'priority' must be at least -2147483648, got -2147483649"),
    ("mooncake", '{"timestamp": 1, "input_length": 5, "output_length": 3000000000}\n',
     ":1: field 'output_length' must be below 2147483648, got 3000000000"),
])
def test_counts_beyond_the_trace_tables_int32_are_named(tmp_path, fmt, text, fragment):
    path = _write(tmp_path / "t.jsonl", text)
    with pytest.raises(TraceError) as err:
        read_trace(path, fmt)
    assert str(err.value) == f"{path}{fragment}"
