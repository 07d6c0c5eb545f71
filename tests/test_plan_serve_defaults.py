"""``aisim plan`` writes what ``vllm serve`` of the chosen release starts with, and no absolute path."""

import os
import shutil
import tomllib

import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.engine import load_engine_config
from aisim.config.versions import RELEASES
from aisim.plan import plan_from_model

HF = os.path.join(os.path.dirname(__file__), "data", "hf")


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_the_serve_defaults_of_each_release_are_pinned():
    # Read from the wheels: vllm/config/vllm.py VllmConfig.__post_init__ turns async scheduling on
    # when unset (every release); vllm/config/cache.py: DEFAULT_BLOCK_SIZE 16 and gpu_memory_utilization
    # 0.92 up to 0.33.0, 64 and 1.0 (the extensible KV cache) in 0.34.0.
    assert [(r.version, r.async_scheduling, r.block_size, r.gpu_memory_utilization) for r in RELEASES] == [
        ("0.31.0", True, 16, 0.92), ("0.32.0", True, 16, 0.92), ("0.33.0", True, 16, 0.92), ("0.34.0", True, 64, 1.0)]


# The KV cache at gpu_memory_utilization 0.92: 80 GiB x 0.92 - 16,059,990,016 B of weights - 1 GiB of
# activations = 61,893,666,406 B, over 2,097,152 B a block (32 layers x 4,096 B x 16 tokens): 29,513.
# 0.34.0: the whole 80 GiB - weights - activations = 68,765,614,080 B over 32 x 4,096 x 64 = 8,388,608 B
# a block: 8,197.
@pytest.mark.parametrize("version, block_size, blocks", [
    ("0.31.0", 16, 29513), ("0.32.0", 16, 29513), ("0.33.0", 16, 29513), ("0.34.0", 64, 8197)])
def test_a_plan_writes_the_release_s_serve_defaults(tmp_path, version, block_size, blocks):
    out = tmp_path / "plan.toml"
    r = _run("plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--vllm-version", version, "--out", out)
    assert r.exit_code == 0, r.output
    doc = tomllib.loads(out.read_text())
    # H100: 80 GiB, not an A100: the API server's 8,192 tokens and 1,024 sequences
    # (EngineArgs.get_batch_defaults, UsageContext.OPENAI_API_SERVER).
    assert (doc["vllm_version"], doc["async_scheduling"], doc["block_size"]) == (version, True, block_size)
    assert (doc["max_num_batched_tokens"], doc["max_num_seqs"]) == (8192, 1024)
    assert doc["num_gpu_blocks"] == blocks
    assert doc["time_model"]["frontend"] is True
    cfg = load_engine_config(out)
    assert cfg.async_scheduling and cfg.vllm_version == version


def test_gpu_memory_utilization_given_overrides_the_release_s():
    # vLLM 0.33.0 at 80 GiB x 0.9: 28,694 blocks of 16 tokens (as vLLM's 0.9 of older releases gave).
    cfg, _ = plan_from_model("llama-3.1-8b", 80, gpu_memory_utilization=0.9, vllm_version="0.33.0")
    assert cfg.num_gpu_blocks == 28694


def test_a_probe_names_its_own_release():
    r = _run("plan", "--probe", "x.json", "--vllm-version", "0.31.0")
    assert r.exit_code == 2 and "--vllm-version goes with --model" in r.output


def test_a_written_plan_holds_no_absolute_path_and_loads_from_any_directory(tmp_path, monkeypatch):
    # The plan and its model's config.json side by side; copied elsewhere together, the copy loads
    # from a third directory (the config.json found next to the plan, not where it was planned).
    src = tmp_path / "a"
    src.mkdir()
    shutil.copy(os.path.join(HF, "qwen3-30b-a3b.json"), src / "config.json")
    r = _run("plan", "--model", src / "config.json", "--gpu", "H100", "--out", src / "plan.toml")
    assert r.exit_code == 0, r.output
    text = (src / "plan.toml").read_text()
    assert str(tmp_path) not in text
    doc = tomllib.loads(text)
    assert doc["model"] == "config.json" and doc["time_model"]["model"] == "config.json"
    dst = tmp_path / "b" / "nested"
    dst.mkdir(parents=True)
    shutil.copy(src / "plan.toml", dst / "plan.toml")
    shutil.copy(src / "config.json", dst / "config.json")
    shutil.rmtree(src)
    elsewhere = tmp_path / "c"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_engine_config(os.path.join("..", "b", "nested", "plan.toml"))
    assert cfg.time_model.model == str(dst / "config.json")
    assert (cfg.num_gpu_blocks, cfg.max_num_seqs) == (doc["num_gpu_blocks"], 1024)
    # A plan written into a subdirectory names the config.json relative to it.
    r = _run("plan", "--model", dst / "config.json", "--gpu", "H100", "--out", elsewhere / "sub" / "p.toml")
    assert r.exit_code == 0, r.output
    assert tomllib.loads((elsewhere / "sub" / "p.toml").read_text())["model"] == "../../b/nested/config.json"
    assert load_engine_config(elsewhere / "sub" / "p.toml").time_model.model == str(dst / "config.json")


@pytest.mark.parametrize("name", ["plan.json", "plan.yaml"])
def test_a_plan_written_to_a_json_or_yaml_name_is_what_engine_reads(tmp_path, name):
    # --engine reads a file by its suffix (TOML only for .toml): a plan named .json is --format json's
    # output, byte for byte, and replays; a .toml name keeps the TOML with its notes as comments.
    import json

    out = tmp_path / name
    r = _run("plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--out", out)
    assert r.exit_code == 0, r.output
    printed = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--format", "json"])
    assert out.read_text() == printed.stdout
    doc = json.loads(out.read_text())
    assert (doc["num_gpu_blocks"], doc["block_size"], doc["max_model_len"]) == (8197, 64, 131072)
    cfg = load_engine_config(out)
    assert (cfg.num_gpu_blocks, cfg.block_size, cfg.max_num_seqs) == (8197, 64, 1024)
    toml_out = tmp_path / "plan.toml"
    assert _run("plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--out", toml_out).exit_code == 0
    assert toml_out.read_text().startswith("# Engine configuration planned by aisim.\n")
    assert tomllib.loads(toml_out.read_text()) == doc


def test_vllm_serve_s_memory_and_parallel_flags():
    # --gpu-memory-utilization 0.92 on 0.34.0: 80 GiB x 0.92 - 16,059,990,016 B of weights - 1 GiB of
    # activations = 61,893,657,395 B over 8,388,608 B a block: 7,378 (1 gives 8,197, above).
    import json

    r = _run("plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--gpu-memory-utilization", "0.92",
             "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["num_gpu_blocks"] == 7378
    # The notes: the pool at the value given; the release's default named as its default.
    assert "64.0" not in r.stderr and "at gpu_memory_utilization 0.92, 7378 blocks of 64 tokens" in r.stderr
    assert "- vLLM 0.34.0 defaults: block size 64, gpu_memory_utilization 1 (the extensible" in r.stderr
    # TP 2 at 0.9: 72 GiB - 8,029,995,008 B of weights - 1 GiB = 68,205,674,496 B over 4,194,304 B: 16,261.
    by_name = {}
    for flag in ("--tp", "--tensor-parallel-size", "-tp"):
        r = _run("plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--gpu-memory-utilization", "0.9", flag, "2",
                 "--format", "json")
        assert r.exit_code == 0, r.output
        by_name[flag] = r.stdout
    assert len(set(by_name.values())) == 1 and json.loads(by_name["--tp"])["num_gpu_blocks"] == 16261
    for bad in ("0", "1.5"):
        r = _run("plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--gpu-memory-utilization", bad)
        assert r.exit_code == 2 and f"{bad} is not in the range 0<x<=1" in r.output
