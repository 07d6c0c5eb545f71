"""The grouped-prefix-caching rule (every refusal), plans from probes and from the catalog."""

import copy
import json

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aisim.cli import main
from aisim.config.engine import engine_config_from_dict, load_engine_config
from aisim.config.kvgroups import request_blocks
from aisim.config.rule import grouped_prefix_caching_problems, longest_startup_len, startup_blocks
from aisim.errors import ConfigError
from aisim.plan import plan_from_model, plan_from_probe

from helpers import make_trace

PAGE = 2176 * 1024


def glm(**over):
    """A GLM-5.3-Flash deployment that passes the rule (131,072 tokens, 70 usable blocks)."""
    kda = {"type": "kda", "count": 4, "block_size": 2176, "page_size_bytes": PAGE, "prefix_cacheable": True,
           "prefill_checkpoint_blocks": 0}
    cfg = {"model": "GLM-5.3-Flash", "vllm_version": "0.32.0", "num_gpu_blocks": 71, "block_size": 2176,
           "max_model_len": 131072, "max_num_batched_tokens": 8192, "prefix_match_unit": 2176,
           "mamba_cache_mode": "align",
           "kv_cache_groups": [
               {"type": "full", "block_size": 2176, "page_size_bytes": PAGE, "prefix_cacheable": True},
               {"type": "ring", "block_size": 2176, "page_size_bytes": PAGE, "prefix_cacheable": False},
               kda]}
    cfg.update(over)
    return cfg


def refused(raw, *fragments):
    with pytest.raises(ConfigError) as exc:
        engine_config_from_dict(raw, source="engine.toml")
    for f in fragments:
        assert f in str(exc.value)
    return str(exc.value)


def test_the_reference_deployment_passes():
    cfg = engine_config_from_dict(glm())
    assert grouped_prefix_caching_problems(cfg) == []
    # cdiv(131072, 2176) + 2 * 4 + 1 = 61 + 8 + 1
    assert startup_blocks(cfg) == 70


def test_undeclared_prefix_cacheable():
    raw = glm()
    del raw["kv_cache_groups"][1]["prefix_cacheable"]
    refused(raw, "'kv_cache_groups[1].prefix_cacheable' is not declared", "engine.toml")


def test_unequal_and_missing_page_sizes():
    raw = glm()
    raw["kv_cache_groups"][1]["page_size_bytes"] = PAGE // 2
    refused(raw, "'kv_cache_groups[1].page_size_bytes' (1114112) differs from 'kv_cache_groups[0].page_size_bytes' (2228224)")
    raw = glm()
    del raw["kv_cache_groups"][0]["page_size_bytes"]
    refused(raw, "'kv_cache_groups[0].page_size_bytes' is not declared")


def test_prefix_match_unit_required_and_equal_to_the_probe():
    raw = glm()
    del raw["prefix_match_unit"]
    refused(raw, "'prefix_match_unit' is not set")
    cfg = engine_config_from_dict(glm())
    assert grouped_prefix_caching_problems(cfg, probe_hash_block=1088) == [
        "'prefix_match_unit' (2176) differs from the probe's hash_block_size_tokens (1088)"]


def test_vllm_version_required_and_supported():
    raw = glm()
    del raw["vllm_version"]
    refused(raw, "'vllm_version' is not set; grouped prefix caching is modeled for vLLM 0.31.0, 0.32.0, 0.33.0 "
                 "and 0.34.0 only")
    refused(glm(vllm_version="0.30.0"), "'vllm_version'", "0.30.0")


def test_max_model_len_required():
    raw = glm()
    del raw["max_model_len"]
    refused(raw, "'max_model_len' is not set")


def test_state_group_needs_align_mode():
    refused(glm(mamba_cache_mode="none"),
            "'mamba_cache_mode' is 'none'; the prefix-cacheable state group kv_cache_groups[2] (kda) needs 'align'")


def test_convolution_group_is_refused():
    raw = glm()
    raw["kv_cache_groups"].append({"type": "conv", "block_size": 2176, "page_size_bytes": PAGE,
                                   "prefix_cacheable": True, "prefill_checkpoint_blocks": 0})
    refused(raw, "'kv_cache_groups[6].type' is 'conv': vLLM cannot prefix-cache a convolution state group")


def test_0_32_needs_checkpoint_geometry():
    raw = glm()
    del raw["kv_cache_groups"][2]["prefill_checkpoint_blocks"]
    refused(raw, "'kv_cache_groups[2].prefill_checkpoint_blocks' is not declared; vLLM 0.32.0 needs")
    # 0.31.0 has no such requirement.
    engine_config_from_dict(dict(raw, vllm_version="0.31.0"))


def test_glm_multiples_of_four():
    refused(glm(max_num_batched_tokens=8190),
            "'max_num_batched_tokens' (8190) must be a multiple of 4 for GLM-5.3-Flash prefix caching")
    engine_config_from_dict(glm(max_num_batched_tokens=8192))
    # A unit of 2,174 does not divide the 2,176-token blocks either; both name the field and value.
    refused(glm(prefix_match_unit=2174), "'prefix_match_unit' (2174)")


def test_startup_capacity():
    # vLLM's check (kv_cache_utils.check_enough_kv_cache_memory) reserves the
    # null block: usable = num_gpu_blocks - 1 must hold one max_model_len
    # request.  The seed counts 70 (74 with checkpoint blocks) as the blocks a
    # request needs; in num_gpu_blocks that is 71 (75), and 70 (74) is refused.
    engine_config_from_dict(glm(num_gpu_blocks=71))
    refused(glm(num_gpu_blocks=70), "'num_gpu_blocks' (70) leaves 69 usable blocks, but one request of "
            "max_model_len (131072) needs 70")
    raw = glm(num_gpu_blocks=75)
    raw["kv_cache_groups"][2].update(prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=16)
    assert startup_blocks(engine_config_from_dict(raw)) == 74
    raw["num_gpu_blocks"] = 74
    refused(raw, "needs 74")


def test_version_without_groups_and_unit_without_caching():
    refused({"num_gpu_blocks": 100, "vllm_version": "0.32.0"},
            "'vllm_version' (0.32.0) selects the grouped KV-cache rules and needs 'kv_cache_groups'")
    refused(glm(enable_prefix_caching=False), "'prefix_match_unit' (2176) needs 'enable_prefix_caching' true")


def test_a_cold_grouped_configuration_passes():
    raw = glm(enable_prefix_caching=False, num_gpu_blocks=71)  # 70 usable: one request of 131,072 tokens
    del raw["prefix_match_unit"]
    del raw["kv_cache_groups"][0]["prefix_cacheable"]
    engine_config_from_dict(raw)


# ---------------------------------------------------------------- plans from probes

def probe(**over):
    p = {"vllm_version": "0.31.0", "model": "GLM-5.3-Flash", "enable_prefix_caching": True,
         "hash_block_size_tokens": 2176, "mamba_cache_mode": "align", "block_size": 2176,
         "max_model_len": 131072, "max_num_batched_tokens": 8192, "max_num_seqs": 256, "num_gpu_blocks": 13815,
         "kv_cache_groups": copy.deepcopy(glm()["kv_cache_groups"])}
    p.update(over)
    return p


def test_plan_on_with_evidence():
    cfg, notes = plan_from_probe(probe())
    assert cfg.enable_prefix_caching and cfg.prefix_match_unit == 2176
    assert notes[0].startswith("prefix caching on")


@pytest.mark.parametrize("recorded,planned", [(None, True), (False, False), (True, True)])
def test_a_probe_without_async_scheduling_plans_the_release_default(recorded, planned):
    # vllm/config/vllm.py VllmConfig.__post_init__ turns async scheduling on when unset (0.31.0-0.34.0):
    # a probe that does not record it ran with it on; one that does is taken at its word.
    p = probe() if recorded is None else probe(async_scheduling=recorded)
    cfg, notes = plan_from_probe(p)
    assert cfg.async_scheduling is planned
    default_note = "async scheduling on: vLLM 0.31.0's default (the probe does not record it)"
    assert (default_note in notes) is (recorded is None)
    assert (default_note in cfg.plan_notes) is (recorded is None)


@pytest.mark.parametrize("change,reason", [
    (dict(enable_prefix_caching=False), "ran with prefix caching off"),
    (dict(hash_block_size_tokens=None), "did not record hash_block_size_tokens"),
    (dict(mamba_cache_mode="none"), "'mamba_cache_mode' is 'none'"),
    (dict(vllm_version="0.30.0"), "vllm_version 0.30.0 is not modeled"),
    (dict(vllm_version="0.25.1"), "vllm_version 0.25.1 is not modeled"),
    (dict(max_num_batched_tokens=8190), "'max_num_batched_tokens' (8190) must be a multiple of 4"),
])
def test_plan_cold_with_reason(change, reason):
    cfg, notes = plan_from_probe(probe(**change))
    assert not cfg.enable_prefix_caching
    assert notes[0] == "prefix caching off (cold replay)"
    assert any(reason in n for n in notes), notes


def test_plan_cold_for_a_convolution_group():
    p = probe()
    p["kv_cache_groups"].append({"type": "conv", "block_size": 2176, "page_size_bytes": PAGE,
                                 "prefix_cacheable": True, "prefill_checkpoint_blocks": 0})
    cfg, notes = plan_from_probe(p)
    assert not cfg.enable_prefix_caching
    assert any("convolution" in n for n in notes)


def test_plan_cli_writes_its_reasons(tmp_path):
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe(max_num_batched_tokens=8190)))
    out = tmp_path / "engine.toml"
    r = CliRunner().invoke(main, ["plan", "--probe", str(path), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "multiple of 4" in r.output
    text = out.read_text()
    assert "# prefix caching off (cold replay)" in text and "multiple of 4" in text
    cfg = load_engine_config(out)
    assert not cfg.enable_prefix_caching and any("multiple of 4" in n for n in cfg.plan_notes)
    r = CliRunner().invoke(main, ["config", "validate", str(out)])
    assert r.exit_code == 0 and "valid" in r.output
    r = CliRunner().invoke(main, ["config", "show", str(out), "--format", "json"])
    # Cold: KDA state groups hold one max_model_len block; the scheduler block is lcm(2176, 131072).
    assert r.exit_code == 0 and json.loads(r.output)["derived"]["scheduler_block_size"] == 2228224
    r = CliRunner().invoke(main, ["config", "show", str(out), "--format", "csv"])
    assert r.exit_code == 0 and "derived.scheduler_block_size,2228224" in r.stdout.splitlines()
    r = CliRunner().invoke(main, ["config", "show", str(out), "--format", "table"])
    assert r.exit_code == 0 and "derived.scheduler_block_size" in r.stdout and "2228224" in r.stdout
    r = CliRunner().invoke(main, ["plan", "--probe", str(path), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["enable_prefix_caching"] is False and "multiple of 4" in r.stderr


def test_config_validate_refuses_with_the_sentence(tmp_path):
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(glm(max_num_batched_tokens=8190)))
    r = CliRunner().invoke(main, ["config", "validate", str(path)])
    assert r.exit_code == 2 and "must be a multiple of 4" in r.output and "engine.json" in r.output


def test_plan_from_the_catalog():
    cfg, notes = plan_from_model("llama-3.1-8b", 80, vllm_version="0.33.0")
    assert cfg.enable_prefix_caching and cfg.block_size == 16 and cfg.vllm_version == "0.33.0"
    # vLLM 0.33.0: 80 GiB x 0.92 - 2 x 8,029,995,008 B of weights - 1 GiB of activations = 61,893,666,406 B,
    # over 32 layers x 4,096 B x 16 tokens a block (2,097,152 B): 29,513 blocks.
    assert cfg.num_gpu_blocks == 29513
    # The default release (0.34.0): 64-token blocks, the whole 80 GiB (the extensible KV cache):
    # 68,765,614,080 B over 32 x 4,096 x 64 = 8,388,608 B a block: 8,197 blocks.
    cfg, notes = plan_from_model("llama-3.1-8b", 80)
    assert cfg.block_size == 64 and cfg.num_gpu_blocks == 8197 and cfg.vllm_version == "0.34.0"
    cfg, notes = plan_from_model("glm-5.3-flash", 80)
    assert cfg.block_size == 2176 and not cfg.enable_prefix_caching
    assert "probe evidence" in notes[0]
    with pytest.raises(ConfigError, match="does not fit"):
        plan_from_model("qwen3-next-80b-a3b", 80)


def test_plan_writes_the_release_defaults(tmp_path):
    # aisim plan --vllm-version 0.34.0: vLLM 0.34.0's vllm serve defaults (config/cache.py): 64-token blocks
    # and the extensible KV cache (gpu_memory_utilization 1.0): 80 GiB - 16,059,990,016 B of weights - 1 GiB
    # = 68,765,614,080 B over 32 layers x 4,096 B x 64 tokens (8,388,608 B a block): 8,197 blocks.  0.33.0:
    # 16-token blocks at 0.92 of 80 GiB: 29,513 blocks (test_plan_from_the_catalog).
    import tomllib

    for version, bs, blocks in (("0.34.0", 64, 8197), ("0.33.0", 16, 29513)):
        out = tmp_path / f"plan-{version}.toml"
        r = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-8b", "--gpu-memory-gib", "80",
                                      "--vllm-version", version, "--out", str(out)])
        assert r.exit_code == 0, r.output
        doc = tomllib.loads(out.read_text())
        assert (doc["vllm_version"], doc["block_size"], doc["num_gpu_blocks"]) == (version, bs, blocks)
        assert engine_config_from_dict(doc).version == version
    r = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-8b", "--gpu-memory-gib", "80",
                                  "--vllm-version", "0.30.0"])
    assert r.exit_code == 2 and "'0.30.0' is not one of" in r.output


def _windowed(**over):
    """Cold full + 4,096-token window groups of 16-token blocks, 8,192 tokens a step, synchronous.

    ``startup_check`` false: these pools are measured against lengths they need not hold.
    """
    raw = {"num_gpu_blocks": 1000, "block_size": 16, "max_model_len": 32768, "max_num_batched_tokens": 8192,
           "async_scheduling": False, "enable_prefix_caching": False, "startup_check": False,
           "kv_cache_groups": [{"type": "full"}, {"type": "sliding_window", "sliding_window": 4096}]}
    return engine_config_from_dict({**raw, **over})


def test_startup_blocks_at_any_length_are_the_check_at_that_max_model_len():
    # SlidingWindowSpec.max_memory_usage_bytes at max_model_len L: cdiv(min(4095 + 8192, L), 16) + 1 window
    # blocks beside cdiv(L, 16) full ones: 769 at 100,000 tokens, 63 + 1 at 1,000.
    cfg = _windowed(max_model_len=100000)
    assert startup_blocks(cfg) == 6250 + 769
    assert int(request_blocks(cfg, 1000, startup=True)) == 63 + 64
    for length in (1, 16, 17, 4096, 12288, 12289, 50000, 100000):
        assert int(request_blocks(cfg, length, startup=True)) == startup_blocks(cfg.replace(max_model_len=length))


def test_the_longest_max_model_len_that_fits():
    # One full group: 2,168 blocks, the null block held back: 2,167 x 16 tokens.
    cfg = engine_config_from_dict({"num_gpu_blocks": 2168, "block_size": 16, "max_model_len": 131072,
                                   "startup_check": False})
    assert longest_startup_len(cfg) == 34672
    # Full + window: below 12,288 tokens the window holds cdiv(L, 16) + 1 blocks, so 2 cdiv(L, 16) + 1 <= 999.
    assert longest_startup_len(_windowed()) == 7984
    assert startup_blocks(_windowed(max_model_len=7984)) == 999
    assert startup_blocks(_windowed(max_model_len=7985)) == 1001
    # Already fitting: the configuration's own length; nothing fits: 0.
    assert longest_startup_len(_windowed(num_gpu_blocks=100000)) == 32768
    assert longest_startup_len(_windowed(num_gpu_blocks=2)) == 0


def test_a_plan_starts_with_the_max_model_len_vllm_serve_would():
    cfg, notes = plan_from_model("llama-3.1-8b", gpu="H100")
    assert cfg.max_model_len == 131072
    assert notes[2] == "max_model_len 131,072: llama-3.1-8b's context (max_position_embeddings), vllm serve's default"
    # Llama-3.1-70B on two A100s: 131,072 tokens need 8,192 blocks; the longest that fits the pool is cut to.
    cfg, notes = plan_from_model("llama-3.1-70b", gpu="A100-80GB", tp=2)
    assert cfg.max_model_len == 64 * (cfg.num_gpu_blocks - 1) < 131072
    assert notes[2] == (f"max_model_len {cfg.max_model_len:,}: llama-3.1-70b's context of 131,072 tokens does not "
                        "fit one request in the KV cache, so vllm serve would not start with its default; "
                        f"{cfg.max_model_len:,} is the longest that fits, the estimate its start-up error names")
    with pytest.raises(ConfigError, match=f"vLLM would not start: the longest that fits is {cfg.max_model_len:,}"):
        plan_from_model("llama-3.1-70b", gpu="A100-80GB", tp=2, max_model_len=cfg.max_model_len + 1)
    cfg, notes = plan_from_model("llama-3.1-70b", gpu="A100-80GB", tp=2, max_model_len=8192)
    assert cfg.max_model_len == 8192 and notes[2] == "max_model_len 8,192 (asked for)"
    with pytest.raises(ConfigError, match="max_model_len 131,073 exceeds llama-3.1-8b's 131,072 tokens"):
        plan_from_model("llama-3.1-8b", gpu="H100", max_model_len=131073)
    # A spec without a config to derive it from keeps aisim's default.
    cfg, notes = plan_from_model("glm-5.3-flash", gpu="H200")
    assert cfg.max_model_len == 32768 and notes[2] == "max_model_len 32,768: aisim's default (GLM-5.3-Flash names " \
                                                      "no context length)"


def test_a_moe_plan_says_at_what_share_its_experts_run():
    from aisim.perf.moe_kernel import expert_share

    # qwen3-235b-a22b's experts hold 1,536 intermediate columns: 192 a GPU at TP 8; deepseek-r1's 2,048 (FP8
    # weights): 256, in FP8 on an H200; qwen3-30b-a3b's 768 with FP8 weights: at the BF16 rate on an A100.
    _, notes = plan_from_model("qwen3-235b-a22b", tp=8, gpu="H100")
    assert notes[-1] == (f"routed experts at {expert_share(192):.2f} of the achievable BF16 matmul rate: vLLM's "
                         "fused-MoE kernel with 192 columns an expert a GPU (aisim/perf/moe_kernel.py)")
    _, notes = plan_from_model("deepseek-r1", tp=8, gpu="H200")
    assert notes[-1].startswith(f"routed experts at {expert_share(256, True):.2f} of the achievable FP8 matmul rate")
    _, notes = plan_from_model("qwen3-30b-a3b", gpu="A100-80GB", dtype="fp8")
    assert notes[-1].startswith(f"routed experts at {expert_share(768):.2f} of the achievable BF16 matmul rate")
    _, notes = plan_from_model("llama-3.1-8b", gpu="H100")
    assert not any("routed experts" in n for n in notes)


# ---------------------------------------------------------------- a plan that passes always replays

group_st = st.sampled_from([
    {"type": "full"}, {"type": "sliding_window", "sliding_window": 64}, {"type": "mamba"}, {"type": "ring"},
    {"type": "kda"}, {"type": "conv"}])


@st.composite
def probes(draw):
    bs = draw(st.sampled_from([16, 32, 64]))
    groups = [dict(g, block_size=bs, page_size_bytes=4096, prefix_cacheable=g["type"] != "ring",
                   prefill_checkpoint_blocks=draw(st.sampled_from([0, 1])))
              for g in [{"type": "full"}] + draw(st.lists(group_st, max_size=3))]
    for g in groups:
        if g["prefill_checkpoint_blocks"]:
            g["prefill_checkpoint_alignment"] = 1
    max_model_len = draw(st.sampled_from([512, 1024, 2048]))
    return {"vllm_version": draw(st.sampled_from(["0.31.0", "0.32.0", "0.30.0"])),
            "enable_prefix_caching": draw(st.booleans()),
            "hash_block_size_tokens": draw(st.sampled_from([bs, bs // 2, None])),
            "mamba_cache_mode": draw(st.sampled_from(["align", "none"])),
            "block_size": bs, "max_model_len": max_model_len,
            "max_num_batched_tokens": draw(st.sampled_from([256, 512])), "max_num_seqs": 8,
            "num_gpu_blocks": draw(st.integers(40, 400)), "kv_cache_groups": groups}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(probes(), st.integers(0, 2**31))
def test_a_plan_that_passes_always_replays(p, seed):
    from aisim.replay import replay

    try:
        cfg, notes = plan_from_probe(p)
    except ConfigError:
        return  # a probe the configuration refuses outright (e.g. a pool too small for any request)
    import random

    rnd = random.Random(seed)
    reqs = []
    for i in range(12):
        shared = rnd.randint(0, 200)
        own = rnd.randint(1, 150)
        reqs.append(dict(id=f"r{i}", prompt=shared + own, max_tokens=rnd.randint(1, 40), at=rnd.randint(0, 20),
                         segments=[("sys", 0, shared), (f"u{i}", shared, own)] if shared else None))
    from aisim.errors import TraceError

    try:
        result = replay(make_trace(reqs), cfg)
    except TraceError as exc:
        assert "KV-cache blocks" in str(exc)  # the pool cannot hold one of the requests at all
        return
    assert result.summary["finished"] == 12
