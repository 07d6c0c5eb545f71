"""Malformed probes and plan options, pools the core cannot hold, and databases a run cannot land in."""

import copy
import json
import os

import duckdb
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.engine import engine_config_from_dict
from aisim.errors import ConfigError, PipelineError, SpecError
from aisim.pipeline import landing
from aisim.pipeline.run import run_pipeline
from aisim.pipeline.runkey import resolve_inputs
from aisim.pipeline.spec import spec_from_dict
from aisim.plan import load_probe, plan_from_model, plan_from_probe

from conftest import ORACLE
from test_pipeline_common import EXAMPLES, PIPELINES, demo_dict, demo_spec

PROBE = {"vllm_version": "0.31.0", "max_model_len": 4096, "num_gpu_blocks": 1000,
         "kv_cache_groups": [{"type": "full", "block_size": 16}]}


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _probe(tmp_path, **change):
    p = copy.deepcopy(PROBE)
    p.update(change)
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(p))
    return path


# ---------------------------------------------------------------- probes


@pytest.mark.parametrize("change,fragment", [
    ({"kv_cache_groups": "full"}, "'kv_cache_groups' in probe {p} must be a non-empty list of groups, got 'full'"),
    ({"kv_cache_groups": [1, 2]}, "'kv_cache_groups[0]' in probe {p} must be a mapping of keys to values, got 1"),
    ({"kv_cache_groups": []}, "'kv_cache_groups' in probe {p} must be a non-empty list of groups, got []"),
    ({"kv_cache_groups": [{"type": "full", "count": "2"}]},
     "'kv_cache_groups[0].count' in probe {p} must be an integer of at least 1, got '2'"),
    ({"max_model_len": "4096"}, "'max_model_len' in probe {p} must be an integer of at least 1, got '4096'"),
    ({"max_model_len": 0}, "'max_model_len' in probe {p} must be an integer of at least 1, got 0"),
    ({"num_gpu_blocks": 1.5}, "'num_gpu_blocks' in probe {p} must be an integer of at least 2, got 1.5"),
    ({"hash_block_size_tokens": True}, "'hash_block_size_tokens' in probe {p} must be an integer of at least 1, "
                                       "got True"),
    ({"enable_prefix_caching": "yes"}, "'enable_prefix_caching' in probe {p} must be true or false, got 'yes'"),
    ({"vllm_version": 31}, "'vllm_version' in probe {p} must be a string, got 31"),
    ({"model": ["m"]}, "'model' in probe {p} must be a string, got ['m']"),
])
def test_malformed_probes_name_the_key(tmp_path, change, fragment):
    path = _probe(tmp_path, **change)
    with pytest.raises(ConfigError) as err:
        load_probe(path)
    assert str(err.value) == fragment.format(p=path)
    out = tmp_path / "plan.toml"
    r = _run("plan", "--probe", path, "--out", out)
    assert r.exit_code == 2 and r.stderr == f"error: {fragment.format(p=path)}\n"
    assert not out.exists()


def test_plan_from_probe_checks_a_dictionary_too():
    with pytest.raises(ConfigError, match=r"'kv_cache_groups\[0\]' in probe the probe must be a mapping"):
        plan_from_probe(dict(PROBE, kv_cache_groups=["full"]))


# ---------------------------------------------------------------- plan options


@pytest.mark.parametrize("args,fragment", [
    (["--tp", "0"], "error: tensor parallelism must be an integer of at least 1, got 0"),
    (["--tp", "3"], "error: tensor parallelism 3 does not divide llama-3.1-8b's 32 attention heads"),
    (["--max-model-len", "0"], "error: 'max_model_len' must be an integer of at least 1, got 0"),
])
def test_plan_refuses_bad_model_options(tmp_path, args, fragment):
    out = tmp_path / "plan.toml"
    r = _run("plan", "--model", "llama-3.1-8b", "--gpu-memory-gib", "80", "--out", out, *args)
    assert r.exit_code == 2 and r.stderr == fragment + "\n"
    assert not out.exists()


def test_tensor_parallelism_above_the_kv_heads_replicates_them():
    cfg, _ = plan_from_model("llama-3.1-8b", 80, tp=16)  # 16 GPUs share 8 heads: each head on two
    assert cfg.num_gpu_blocks > 2
    with pytest.raises(ConfigError, match="tensor parallelism 12 does not divide"):
        plan_from_model("llama-3.1-8b", 80, tp=12)


# ---------------------------------------------------------------- pools


def test_num_gpu_blocks_beyond_int32_is_refused(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"num_gpu_blocks": 2**31, "max_model_len": 1024}))
    r = _run("config", "validate", path)
    assert r.exit_code == 2
    # The core's block ids are 32-bit: the catalogue's bound (aisim.config.keys INT32_MAX).
    assert r.stderr == f"error: 'num_gpu_blocks' in {path} must be from 2 to 2147483647, got 2147483648\n"


def test_a_pool_beyond_the_core_memory_limit_is_refused():
    with pytest.raises(ConfigError) as err:
        engine_config_from_dict({"num_gpu_blocks": 100_000, "max_num_seqs": 10**6, "max_model_len": 10**6,
                                 "max_num_batched_tokens": 10**6, "block_size": 16}, source="e.json")
    assert str(err.value) == ("'num_gpu_blocks' (100000), 'max_num_seqs' (1000000) and 'max_model_len' (1000000) "
                              "in e.json need 698.5 GiB of replay-core memory; the limit is 64 GiB")
    with pytest.raises(ConfigError, match=r"'max_model_len' in e.json must be from 1 to 2147483647, got 4294967296"):
        engine_config_from_dict({"num_gpu_blocks": 100, "max_model_len": 2**32}, source="e.json")


def test_a_pool_given_as_memory_must_hold_one_request_of_max_model_len():
    raw = {"kv_cache_bytes": 100 * 4096, "max_model_len": 4096, "block_size": 16,
           "kv_cache_groups": [{"type": "full", "page_size_bytes": 4096}]}
    with pytest.raises(ConfigError) as err:
        engine_config_from_dict(raw, source="e.json")
    assert str(err.value) == ("'kv_cache_bytes' (409600) in e.json gives 'num_gpu_blocks' (100) leaves 99 usable "
                              "blocks, but one request of max_model_len (4096) needs 256 blocks; the estimated maximum "
                              "model length is 1584; vLLM refuses to start such an engine")
    assert engine_config_from_dict(dict(raw, max_model_len=1584)).num_gpu_blocks == 100


# 100 blocks of 16 tokens: block 0 is vLLM's null block, so 99 usable blocks hold 99 * 16 = 1,584 tokens;
# one request of max_model_len 2048 needs 2048 / 16 = 128 blocks.  vLLM applies num_gpu_blocks_override
# before its start-up check (get_kv_cache_configs), so an explicit num_gpu_blocks is refused as well.
SMALL_POOL = {"num_gpu_blocks": 100, "block_size": 16, "max_model_len": 2048}
SMALL_POOL_REASON = ("leaves 99 usable blocks, but one request of max_model_len (2048) needs 128 blocks; the "
                     "estimated maximum model length is 1584; vLLM refuses to start such an engine")


def test_an_explicit_pool_must_hold_one_request_of_max_model_len():
    with pytest.raises(ConfigError) as err:
        engine_config_from_dict(SMALL_POOL, source="e.json")
    assert str(err.value) == "'num_gpu_blocks' (100) in e.json " + SMALL_POOL_REASON
    # 1,584 tokens fit; 1,585 need a 100th block; 129 blocks hold 2,048 tokens.
    assert engine_config_from_dict(dict(SMALL_POOL, max_model_len=1584)).max_model_len == 1584
    with pytest.raises(ConfigError, match=r"needs 100 blocks; the estimated maximum model length is 1584;"):
        engine_config_from_dict(dict(SMALL_POOL, max_model_len=1585))
    assert engine_config_from_dict(dict(SMALL_POOL, num_gpu_blocks=129)).num_gpu_blocks == 129
    # A scheduler built without the engine's start-up (the oracle's recordings) takes the pool as it is.
    assert engine_config_from_dict(dict(SMALL_POOL, startup_check=False)).num_gpu_blocks == 100
    with pytest.raises(ConfigError, match=r"^'startup_check' must be true or false, got 0$"):
        engine_config_from_dict(dict(SMALL_POOL, startup_check=0))


def test_config_validate_and_replay_refuse_a_pool_too_small_for_max_model_len(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps(SMALL_POOL))
    trace = os.path.join(ORACLE, "full_small", "trace.jsonl")
    for args in (("config", "validate", path),
                 ("replay", "--engine", path, "--trace", trace, "--out", tmp_path / "out")):
        r = _run(*map(str, args))
        assert r.exit_code == 2, r.output
        assert r.stderr == f"error: 'num_gpu_blocks' (100) in {path} {SMALL_POOL_REASON}\n"
    assert not (tmp_path / "out").exists()


def test_the_recorded_full_small_scenario_is_one_vllm_would_refuse():
    # 200 blocks of 16 tokens hold 199 * 16 = 3,184 tokens; max_model_len 4096 needs 256 blocks.  The oracle
    # recorded it on a scheduler built without the start-up check; its replay sets startup_check false
    # (tests/helpers.py oracle_engine_dict), and test_oracle replays it exactly.
    with open(os.path.join(ORACLE, "full_small", "config.json")) as fh:
        raw = json.load(fh)
    with pytest.raises(ConfigError, match=r"^'num_gpu_blocks' \(200\) leaves 199 usable blocks, but one request of "
                                          r"max_model_len \(4096\) needs 256 blocks; the estimated maximum model "
                                          r"length is 3184; vLLM refuses"):
        engine_config_from_dict(raw)
    assert engine_config_from_dict(dict(raw, startup_check=False)).num_gpu_blocks == 200


# ---------------------------------------------------------------- databases


def test_a_database_that_is_not_duckdb_is_refused_before_replaying(tmp_path):
    db = tmp_path / "notes.duckdb"
    db.write_text("my notes, not a database\n" * 10)
    with pytest.raises(PipelineError) as err:
        run_pipeline(demo_spec(db), scheduler="sync")
    assert str(err.value) == f"{db} is not a DuckDB database"
    assert db.read_text() == "my notes, not a database\n" * 10


def test_a_duckdb_file_of_something_else_is_refused(tmp_path):
    db = tmp_path / "other.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE sales (id INTEGER)")
    con.close()
    r = _run("pipeline", "run", os.path.join(PIPELINES, "demo.toml"), "--db", db, "--scheduler", "sync",
             "--progress", "none")
    assert r.exit_code == 2
    assert r.stderr == f"error: database {db} is not an aisim run database: it has tables (sales) but no 'runs' table\n"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE runs (run_id VARCHAR)")
    con.close()
    with pytest.raises(PipelineError, match="its 'runs' table has other columns than aisim's"):
        run_pipeline(demo_spec(db), scheduler="sync")


def test_a_database_under_a_read_only_directory_is_refused(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    # the tests may run as root, whom permission bits do not stop: the directory answers as read-only
    monkeypatch.setattr(landing.os, "access", lambda p, mode: False if str(p) == str(ro) else real(p, mode))
    with pytest.raises(PipelineError) as err:
        run_pipeline(demo_spec(ro / "sub" / "d.duckdb"), scheduler="sync")
    assert str(err.value) == f"cannot create database {ro / 'sub' / 'd.duckdb'}: the directory {ro} is not writable"
    assert os.listdir(ro) == []


def test_a_database_path_under_a_file_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PipelineError) as err:
        run_pipeline(demo_spec(blocker / "d.duckdb"), scheduler="sync")
    assert str(err.value) == f"cannot create database {blocker / 'd.duckdb'}: {blocker} is not a directory"


# ---------------------------------------------------------------- reader options


def test_an_option_the_format_has_not_fails_spec_loading(tmp_path):
    raw = demo_dict(tmp_path / "d.duckdb")
    raw["sources"][0] = dict(raw["sources"][0], format="mooncake-delta", options={"max_model_len": 10})
    with pytest.raises(SpecError) as err:
        spec_from_dict(raw, source="s.toml")
    assert str(err.value) == ("unknown key 'sources[0].options.max_model_len' in s.toml: the 'mooncake-delta' "
                              "trace reader takes no option 'max_model_len'")


def test_an_option_the_guessed_format_has_not_fails_the_check(tmp_path):
    raw = demo_dict(tmp_path / "d.duckdb")
    raw["sources"][0] = {k: v for k, v in raw["sources"][0].items() if k != "format"}
    raw["sources"][0]["options"] = {"unit_tokens": 16}
    spec = spec_from_dict(raw, source="s.toml")
    with pytest.raises(SpecError) as err:
        resolve_inputs(spec)
    assert str(err.value) == (f"source 'llama-chat': {os.path.join(EXAMPLES, 'trace.jsonl')} is read as 'oracle', "
                              "whose reader takes no option 'unit_tokens'; set the source's 'format'")


# ---------------------------------------------------------------- schedulers


@pytest.mark.parametrize("value", ["locl", "tcp://host", "host:99999", "http://host:8786", "host:port", ""])
def test_a_scheduler_that_is_no_address_is_refused_before_replaying(tmp_path, value):
    db = tmp_path / "d.duckdb"
    r = _run("pipeline", "run", os.path.join(PIPELINES, "demo.toml"), "--db", db, "--scheduler", value,
             "--progress", "none")
    assert r.exit_code == 2
    assert r.stderr == ("error: --scheduler must be 'local', 'sync' or a Dask scheduler address "
                        f"(tcp://host:port or host:port), got {value!r}\n")
    assert not db.exists()


@pytest.mark.parametrize("value", ["sync", "local", "tcp://10.0.0.1:8786", "node-3.example:8786", "[::1]:8786"])
def test_scheduler_values_that_are_accepted(value):
    from aisim.pipeline.run import check_scheduler

    assert check_scheduler(value) is None


def test_a_roofline_tensor_parallelism_the_kv_heads_do_not_split_is_refused():
    with pytest.raises(ConfigError) as err:
        engine_config_from_dict({"num_gpu_blocks": 100, "time_model": {"kind": "roofline", "gpu": "H100",
                                                                        "model": "qwen2.5-7b", "tp": 7}},
                                source="e.json")
    # 7 divides the 28 attention heads; the 4 KV heads neither split over 7 GPUs nor divide them.
    assert str(err.value) == ("'time_model' in e.json: tensor parallelism 7 does not divide qwen2.5-7b's 4 KV "
                              "heads (full layers), nor do the heads divide it")


def test_a_sweep_with_an_option_its_format_has_not_is_refused(tmp_path):
    from aisim.errors import SweepError
    from aisim.sweep.runner import load_sweep

    path = tmp_path / "s.toml"
    path.write_text(f'name = "s"\ndatabase = "s.duckdb"\nmodel = "m"\nbase = "{EXAMPLES}/engine.json"\n'
                    f'[trace]\npaths = ["{EXAMPLES}/trace.jsonl"]\nformat = "oracle"\n'
                    '[trace.options]\nunit_tokens = 16\n[grid]\nmax_num_seqs = [8]\n[slo]\nttft_s = 1.0\n')
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    assert str(err.value) == (f"unknown key 'trace.options.unit_tokens' in {path}: the 'oracle' trace reader "
                              "takes no option 'unit_tokens'")
