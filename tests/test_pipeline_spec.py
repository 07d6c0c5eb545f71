"""Pipeline specs: strict loading, input resolution and the run key."""

import json
import os
import shutil

import pytest

from aisim.errors import ConfigError
from aisim.errors import SpecError
from aisim.pipeline.runkey import resolve_inputs, run_key
from aisim.pipeline.spec import load_spec, spec_from_dict

from test_pipeline_common import DEMO, EXAMPLES, PIPELINES, demo_dict


def _write(tmp_path, text, name="spec.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_demo_spec_loads_with_shards_in_order():
    spec = load_spec(DEMO)
    assert spec.name == "demo"
    assert spec.database == os.path.join(PIPELINES, "demo.duckdb")
    assert [(m, e.name) for m, e in spec.shards()] == [
        ("llama-3.1-8b", "base"), ("llama-3.1-8b", "nocache"), ("qwen3-next-80b", "align")]
    inputs = resolve_inputs(spec)
    assert [f.display for f in inputs] == ["../examples/trace.jsonl", "../examples/qwen3-next-trace.jsonl"]
    assert all(len(f.sha256) == 64 and f.size > 0 for f in inputs)


def test_nightly_spec_loads_and_names_the_missing_traces():
    spec = load_spec(os.path.join(PIPELINES, "nightly.toml"))
    assert spec.window.start_s == 28800.0 and spec.window.end_s == 72000.0
    assert spec.sources[0].format == "mooncake" and spec.sources[0].model_column == "model"
    assert dict(spec.sources[0].model_map)["meta-llama/Llama-3.1-8B-Instruct"] == "llama-3.1-8b"
    assert len(spec.shards()) == 3
    with pytest.raises(SpecError, match="source 'gateway': no file matches '/srv/aisim/traces/gateway/"):
        resolve_inputs(spec)


BASE = f"""
name = "t"
database = "t.duckdb"
[[sources]]
paths = ["{EXAMPLES}/trace.jsonl"]
model = "m"
[[deployments]]
model = "m"
engines = {{ base = "{EXAMPLES}/engine.json" }}
"""


@pytest.mark.parametrize("edit,fragments", [
    (lambda s: s.replace('name = "t"', 'name = "t"\ndatbase = "x"'), ["unknown key 'datbase'", "spec.toml"]),
    (lambda s: s.replace('model = "m"\n[[deployments]]', 'modle = "m"\n[[deployments]]'),
     ["unknown key 'sources[0].modle'"]),
    (lambda s: s + '\n[window]\nstart = 1\n', ["unknown key 'window.start'"]),
    (lambda s: s.replace('engines = {', 'engine = "x"\nengines = {'), ["unknown key 'deployments[0].engine'"]),
    (lambda s: s.replace('name = "t"\n', ''), ["missing required key 'name'"]),
    (lambda s: s.replace('database = "t.duckdb"\n', ''), ["missing required key 'database'"]),
    (lambda s: s.replace('name = "t"', 'name = 3'), ["'name'", "must be a string"]),
    (lambda s: s.replace('name = "t"', 'name = "no spaces please"'), ["'name'", "must be a name"]),
    (lambda s: s.replace('paths = [', 'paths = 3 #['), ["'sources[0].paths'"]),
    (lambda s: s.replace('model = "m"\n[[deployments]]', 'model = "m"\nmodel_column = "model"\n[[deployments]]'),
     ["'sources[0].model'", "excludes 'model_column'"]),
    (lambda s: s.replace('model = "m"\n[[deployments]]', '[[deployments]]'), ["needs 'model'"]),
    (lambda s: s.replace('model = "m"\n[[deployments]]', 'model = "other"\n[[deployments]]'),
     ["'sources[0].model'", "no [[deployments]] entry"]),
    (lambda s: s.replace('paths = [', 'format = "nope"\npaths = ['), ["'sources[0].format'", "oracle"]),
    (lambda s: s.replace('paths = [', 'format = "oracle"\noptions = { bogus = 1 }\npaths = ['),
     ["sources[0].options.bogus"]),
    (lambda s: s + '\n[window]\nstart_s = 5.0\nend_s = 1.0\n', ["'window.end_s'", "greater than"]),
    (lambda s: s + '\n[window]\nstart_s = -1.0\n', ["'window.start_s'", "non-negative"]),
    (lambda s: s.replace('{ base = ', '{ "bad name" = '), ["not a valid engine name"]),
    (lambda s: s.replace(f'{EXAMPLES}/engine.json', 'missing.json'), ["cannot read engine configuration",
                                                                        "deployments[0].engines.base"]),
    (lambda s: s + '\n[[deployments]]\nmodel = "m"\nengines = ["a.json"]\n', ["repeats model 'm'"]),
    (lambda s: s.replace('name = "t"', 'name = "t"\n[sources]\nx = 1'), ["not valid TOML"]),
])
def test_bad_spec_is_refused_naming_key_and_file(tmp_path, edit, fragments):
    p = _write(tmp_path, edit(BASE))
    with pytest.raises(SpecError) as err:
        load_spec(p)
    for f in fragments:
        assert f in str(err.value)
    assert str(p) in str(err.value) or "cannot read" in str(err.value)


def test_bad_engine_configuration_names_file_and_key(tmp_path):
    with open(os.path.join(EXAMPLES, "engine.json")) as fh:
        cfg = json.load(fh)
    cfg["max_num_seq"] = 4
    (tmp_path / "bad.json").write_text(json.dumps(cfg))
    p = _write(tmp_path, BASE.replace(f"{EXAMPLES}/engine.json", "bad.json"))
    with pytest.raises(ConfigError, match=r"unknown key 'max_num_seq' in .*bad\.json"):
        load_spec(p)


def test_inline_engine_and_engine_list(tmp_path):
    inline = BASE.replace(f'engines = {{ base = "{EXAMPLES}/engine.json" }}',
                          'engines.small = { num_gpu_blocks = 4096, max_num_seqs = 8, max_model_len = 8192 }')
    spec = load_spec(_write(tmp_path, inline))
    (eng,) = spec.deployments[0].engines
    assert eng.name == "small" and eng.path is None and eng.config["max_num_seqs"] == 8
    listed = BASE.replace(f'engines = {{ base = "{EXAMPLES}/engine.json" }}',
                          f'engines = ["{EXAMPLES}/engine.json", "{EXAMPLES}/engine-nocache.json"]')
    spec = load_spec(_write(tmp_path, listed))
    assert [e.name for e in spec.deployments[0].engines] == ["engine", "engine-nocache"]
    bad = inline.replace("max_num_seqs = 8", "max_num_seqs = 0")
    with pytest.raises(ConfigError, match=r"'max_num_seqs'.*deployments\[0\]\.engines\.small"):
        load_spec(_write(tmp_path, bad))


def test_model_column_and_map(tmp_path):
    text = BASE.replace('model = "m"\n[[deployments]]',
                        'model_map = { "src-a" = "m" }\n[[deployments]]')
    spec = load_spec(_write(tmp_path, text))
    src = spec.sources[0]
    assert src.model is None and src.model_column == "model" and dict(src.model_map) == {"src-a": "m"}


def test_globs_and_missing_files(tmp_path):
    data = tmp_path / "traces"
    data.mkdir()
    for name in ("b.jsonl", "a.jsonl"):
        shutil.copy(os.path.join(EXAMPLES, "trace.jsonl"), data / name)
    raw = demo_dict(tmp_path / "x.duckdb")
    raw["sources"][0]["paths"] = ["traces/*.jsonl"]
    raw["sources"][0]["request_id_prefix"] = "x"
    spec = spec_from_dict(raw, base_dir=str(tmp_path))
    inputs = resolve_inputs(spec)
    assert [f.display for f in inputs][:2] == [os.path.join("traces", "a.jsonl"), os.path.join("traces", "b.jsonl")]
    raw["sources"][0]["paths"] = ["traces/*.csv"]
    with pytest.raises(SpecError, match=r"source 'llama-chat': no file matches 'traces/\*\.csv'"):
        resolve_inputs(spec_from_dict(raw, base_dir=str(tmp_path)))
    raw["sources"][0]["paths"] = ["traces/nope.jsonl"]
    with pytest.raises(SpecError, match="trace file 'traces/nope.jsonl' does not exist"):
        resolve_inputs(spec_from_dict(raw, base_dir=str(tmp_path)))
    raw["sources"][0]["paths"] = ["traces/a.jsonl"]
    raw["sources"][1]["paths"] = ["traces/*.jsonl"]
    with pytest.raises(SpecError, match="matched by both source 'llama-chat' and source 'qwen-chat'"):
        resolve_inputs(spec_from_dict(raw, base_dir=str(tmp_path)))


def test_run_key_is_the_work_not_the_wrapping(tmp_path):
    raw = demo_dict(tmp_path / "a.duckdb")
    spec = spec_from_dict(raw, base_dir=PIPELINES)
    key = run_key(spec, resolve_inputs(spec))
    assert len(key) == 16 and int(key, 16) >= 0
    # Another database, another description, keys in another order: the same run.
    other = demo_dict(tmp_path / "b.duckdb", description="words")
    other = dict(reversed(list(other.items())))
    other["deployments"] = list(reversed(other["deployments"]))
    spec2 = spec_from_dict(other, base_dir=PIPELINES)
    assert run_key(spec2, resolve_inputs(spec2)) == key
    # Another name, another window, or another engine file content: another run.
    spec3 = spec_from_dict(demo_dict(tmp_path / "a.duckdb", name="demo2"), base_dir=PIPELINES)
    assert run_key(spec3, resolve_inputs(spec3)) != key
    spec4 = spec_from_dict(demo_dict(tmp_path / "a.duckdb", window={"end_step": 100}), base_dir=PIPELINES)
    assert run_key(spec4, resolve_inputs(spec4)) != key
    eng = tmp_path / "engine.json"
    shutil.copy(os.path.join(EXAMPLES, "engine.json"), eng)
    raw5 = demo_dict(tmp_path / "a.duckdb")
    raw5["deployments"][0]["engines"]["base"] = str(eng)
    spec5 = spec_from_dict(raw5, base_dir=PIPELINES)
    k5 = run_key(spec5, resolve_inputs(spec5))
    cfg = json.loads(eng.read_text())
    eng.write_text(json.dumps(cfg, indent=4))  # same configuration, different bytes: the file changed
    spec6 = spec_from_dict(raw5, base_dir=PIPELINES)
    assert run_key(spec6, resolve_inputs(spec6)) != k5


def test_run_key_follows_input_content(tmp_path):
    trace = tmp_path / "trace.jsonl"
    shutil.copy(os.path.join(EXAMPLES, "trace.jsonl"), trace)
    raw = demo_dict(tmp_path / "a.duckdb")
    raw["sources"][0]["paths"] = [str(trace)]
    spec = spec_from_dict(raw, base_dir=PIPELINES)
    key = run_key(spec, resolve_inputs(spec))
    lines = trace.read_text().splitlines(keepends=True)
    trace.write_text("".join(lines[:-1]))
    assert run_key(spec, resolve_inputs(spec)) != key
