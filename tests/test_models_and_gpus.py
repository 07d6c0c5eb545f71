"""Models from Hugging Face config.json files and the catalog, GPUs, roofline plans and their refusals."""

import json
import os
import tomllib

import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.catalog import MODELS, get_model
from aisim.config.engine import engine_config_from_dict, load_engine_config
from aisim.config.gpus import get_gpu
from aisim.config.hfconfig import load_hf_config, parse_hf_config
from aisim.errors import ConfigError

HF = os.path.join(os.path.dirname(__file__), "data", "hf")


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _hf(name):
    return os.path.join(HF, name)


# ---------------------------------------------------------------- config.json parsing


def test_a_dense_config_counts_its_parameters():
    m = load_hf_config(_hf("llama-3.1-8b.json"))
    # 32 layers of q, o 4096 x 4096, k, v 4096 x 1024, MLP 3 x 4096 x 14336; embedding and LM head 128256 x 4096.
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert m.dense_params == 32 * layer == 6_979_321_856
    assert m.params == 32 * layer + 2 * 128256 * 4096 == 8_029_995_008
    assert [(k.kind, k.count, k.num_kv_heads, k.head_size) for k in m.layers] == [("full", 32, 8, 128)]
    assert (m.vocab_size, m.tie_word_embeddings, m.dtype, m.moe_layers) == (128256, False, "bf16", 0)


def test_a_moe_config_splits_experts_from_what_every_token_uses():
    m = load_hf_config(_hf("qwen3-30b-a3b.json"))
    expert = 3 * 2048 * 768
    attn = 2 * 2048 * 4096 + 2 * 2048 * 512
    assert (m.moe_layers, m.num_experts, m.experts_per_token, m.expert_params) == (48, 128, 8, expert)
    assert m.dense_params == 48 * attn and m.replicated_params == 48 * 2048 * 128   # routers, held whole
    assert m.params == 48 * (attn + 128 * expert + 2048 * 128) + 2 * 151936 * 2048 == 30_531_911_680
    assert m.active_params == 48 * (attn + 2048 * 128 + 8 * expert)


def test_an_mla_config_keeps_a_latent_and_fp8_weights():
    m = load_hf_config(_hf("deepseek-r1.json"))
    (attn,) = m.layers
    # kv_lora_rank 512 + qk_rope_head_dim 64 per token and layer, one "head"; QK over 576, PV over 512.
    assert (attn.kind, attn.count, attn.latent_dim, attn.qk_dim, attn.v_dim, attn.num_heads) == (
        "full", 61, 576, 576, 512, 128)
    assert attn.bytes_per_token(8) == attn.bytes_per_token(1) == 576 * 2
    # 3 dense layers (first_k_dense_replace), 58 with 256 routed experts and one shared.
    assert (m.moe_layers, m.num_experts, m.experts_per_token, m.dtype, m.weight_bytes) == (58, 256, 8, "fp8", 1)
    # q_a (7168 x 1536) and kv_a (7168 x 576) held whole by every GPU, and each MoE layer's router.
    assert m.replicated_params == 61 * (7168 * 1536 + 7168 * 576) + 58 * 7168 * 256
    assert round(m.params / 1e9, 1) == 671.0


def test_a_sliding_window_config_windows_every_layer():
    m = load_hf_config(_hf("mistral-7b-instruct-v0.1.json"))
    assert [(k.kind, k.count, k.sliding_window) for k in m.layers] == [("sliding_window", 32, 4096)]


def test_the_catalog_and_the_real_files_agree():
    for name, file in (("llama-3.1-8b", "llama-3.1-8b.json"), ("qwen3-30b-a3b", "qwen3-30b-a3b.json"),
                       ("deepseek-r1", "deepseek-r1.json"), ("mistral-7b-v0.1", "mistral-7b-instruct-v0.1.json")):
        a, b = MODELS[name], load_hf_config(_hf(file))
        for field in ("params", "dense_params", "replicated_params", "expert_params", "moe_layers", "layers",
                      "vocab_size", "dtype", "context_len", "context_key"):
            assert getattr(a, field) == getattr(b, field), (name, field)


def _llama(**change):
    with open(_hf("llama-3.1-8b.json")) as fh:
        cfg = json.load(fh)
    cfg.pop("rope_scaling")
    cfg.update(change)
    return {k: v for k, v in cfg.items() if v is not None}


@pytest.mark.parametrize("cfg,length,key", [
    # The real files: Llama 3.1's llama3 and DeepSeek's yarn RoPE come already scaled (not x 8, not x 40).
    (_hf("llama-3.1-8b.json"), 131072, "max_position_embeddings"),
    (_hf("deepseek-r1.json"), 163840, "max_position_embeddings"),
    (_hf("qwen3-30b-a3b.json"), 40960, "max_position_embeddings"),
    # Other RoPE types multiply by their factor, one per layer type when nested; "default" has none.
    (_llama(max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 4}), 16384,
     "max_position_embeddings"),
    (_llama(max_position_embeddings=8192, rope_parameters={"rope_type": "dynamic", "factor": 2.0}), 16384,
     "max_position_embeddings"),
    (_llama(max_position_embeddings=8192, rope_parameters={"full_attention": {"rope_type": "default"},
                                                           "sliding_attention": {"rope_type": "linear",
                                                                                 "factor": 2}}), 16384,
     "max_position_embeddings"),
    # LongRoPE starts from the original length.
    (_llama(max_position_embeddings=131072, original_max_position_embeddings=4096,
            rope_scaling={"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}), 4096,
     "max_position_embeddings"),
    # The smallest of the length fields; model_max_length above them all; an absent max_position_embeddings
    # at its transformers class's default.
    (_llama(max_position_embeddings=8192, seq_length=4096), 4096, "seq_length"),
    (_llama(max_position_embeddings=4096, model_max_length=8192), 8192, "model_max_length"),
    (_llama(max_position_embeddings=None), 2048, "max_position_embeddings, LlamaConfig's default"),
    (_llama(max_position_embeddings=None, seq_length=1024), 1024, "seq_length"),
    (_llama(max_position_embeddings=None, architectures=["Qwen3ForCausalLM"]), 32768,
     "max_position_embeddings, Qwen3Config's default"),
])
def test_a_config_gets_the_max_model_len_vllm_derives(cfg, length, key):
    m = load_hf_config(cfg) if isinstance(cfg, str) else parse_hf_config(cfg, "config.json")
    assert (m.context_len, m.context_key) == (length, key)


def test_every_architecture_has_its_class_default_length():
    from aisim.config.hfconfig import ARCHITECTURES, DEFAULT_MAX_POSITIONS

    assert sorted(DEFAULT_MAX_POSITIONS) == sorted(ARCHITECTURES)


def test_the_catalog_s_context_lengths():
    # Gemma 3's file names no length: Gemma3TextConfig's 131,072, its linear factor 8 already in it (vLLM
    # skips the factor for Gemma 3).
    assert MODELS["gemma-3-27b"].context_key == "max_position_embeddings, Gemma3TextConfig's default"
    assert {k: m.context_len for k, m in MODELS.items()} == {
        "llama-3.1-8b": 131072, "llama-3.1-70b": 131072, "llama-3.2-3b": 131072, "mistral-7b-v0.1": 32768,
        "qwen2.5-7b": 32768,
        "qwen2.5-32b": 131072, "qwen3-0.6b": 40960, "qwen3-8b": 40960, "qwen3-14b": 40960, "qwen3-32b": 40960,
        "qwen3-30b-a3b": 40960, "qwen3-235b-a22b": 262144, "glm-4.5-air": 131072, "glm-4.6": 202752,
        "deepseek-r1": 163840, "gemma-3-27b": 131072, "qwen3-next-80b-a3b": 262144, "glm-5.3-flash": 0}


def test_hybrid_layer_patterns():
    # Gemma 3: one global layer every sliding_window_pattern (6): 10 of 62 global.
    gemma = MODELS["gemma-3-27b"]
    assert [(k.kind, k.count, k.sliding_window) for k in gemma.layers] == [
        ("sliding_window", 52, 1024), ("full", 10, None)]
    # Qwen3-Next: three Gated DeltaNet layers per full attention layer; a GDN state is the convolution's last
    # 3 inputs of (2 x 16 x 128 + 32 x 128) channels and 32 value heads of 128 x 128, bf16.
    nxt = MODELS["qwen3-next-80b-a3b"]
    gdn, full = nxt.layers
    assert (gdn.kind, gdn.count, full.kind, full.count) == ("gdn", 36, "full", 12)
    assert gdn.state_bytes == 2 * (8192 * 3 + 32 * 128 * 128) == 1_097_728
    # layer_types, when given, names each layer; Gemma 2 alternates windowed and global layers.
    cfg = {"architectures": ["Gemma2ForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "sliding_window": 128, "vocab_size": 1000}
    assert [(k.kind, k.count) for k in parse_hf_config(cfg, "g2").layers] == [("sliding_window", 2), ("full", 2)]
    typed = dict(cfg, layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"])
    assert [(k.kind, k.count) for k in parse_hf_config(typed, "g2").layers] == [("full", 2), ("sliding_window", 2)]


@pytest.mark.parametrize("change,fragment", [
    ({"architectures": ["GPT2LMHeadModel"]}, "field 'architectures' names 'GPT2LMHeadModel', which aisim does not "
                                             "model; supported: LlamaForCausalLM"),
    ({"architectures": None}, "field 'architectures' must list the model's architecture"),
    ({"num_hidden_layers": 0}, "field 'num_hidden_layers' must be an integer of at least 1, got 0"),
    ({"hidden_size": "4096"}, "field 'hidden_size' must be an integer of at least 1, got '4096'"),
    ({"vocab_size": None}, "field 'vocab_size' is missing"),
    ({"intermediate_size": None}, "field 'intermediate_size' is missing"),
    ({"quantization_config": {"quant_method": "awq"}},
     "field 'quantization_config.quant_method' must be fp8 (the only quantization modelled), got 'awq'"),
    ({"layer_types": ["full_attention"] * 31 + ["chunked_attention"]},
     "field 'layer_types' names a layer mixer aisim does not model: 'chunked_attention'"),
    ({"max_position_embeddings": "long"}, "field 'max_position_embeddings' must be a positive number of tokens, "
                                          "got 'long'"),
    ({"rope_scaling": {"type": "linear", "factor": -1}}, "field 'rope_scaling.factor' must be a positive number, "
                                                         "got -1"),
    ({"rope_scaling": [8.0]}, "field 'rope_scaling' must be a mapping, got [8.0]"),
])
def test_bad_configs_are_refused_naming_the_field(tmp_path, change, fragment):
    with open(_hf("llama-3.1-8b.json")) as fh:
        cfg = json.load(fh)
    cfg.update(change)
    if change.get("vocab_size", 0) is None:
        del cfg["vocab_size"]          # absent; intermediate_size stays, as null
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as err:
        load_hf_config(path)
    assert str(err.value).startswith(f"{path}: {fragment}")


# ---------------------------------------------------------------- GPUs


def test_gpus_by_name_and_alias():
    assert get_gpu("h100").fp8_flops == 1979e12 and get_gpu("A100") is get_gpu("A100-80GB")
    assert get_gpu("A100-40GB").hbm_bytes_per_s == 1.555e12 and get_gpu("MI300X").memory_gib == 192
    assert get_gpu("L40S").link_bytes_per_s_each_way == 32e9
    with pytest.raises(ConfigError, match="unknown GPU 'H800'; the catalog has: A100-40GB, A100-80GB"):
        get_gpu("H800")


# ---------------------------------------------------------------- engines and plans


def test_a_named_gpu_makes_the_roofline_the_default():
    cfg = engine_config_from_dict({"num_gpu_blocks": 100, "max_model_len": 4096,
                                   "model": "llama-3.1-8b", "time_model": {"gpu": "H100"}})
    assert (cfg.time_model.kind, cfg.time_model.model, cfg.time_model.tp) == ("roofline", "llama-3.1-8b", 1)
    assert engine_config_from_dict({"num_gpu_blocks": 100, "max_model_len": 4096}).time_model.kind == "linear"
    with pytest.raises(ConfigError, match=r"'time_model.model' in e.json is required by the roofline model \(or the "
                                          r"engine's 'model'\)"):
        engine_config_from_dict({"num_gpu_blocks": 100, "max_model_len": 4096,
                                 "time_model": {"gpu": "H100"}}, source="e.json")
    with pytest.raises(ConfigError, match="'time_model.dtype' in e.json must be bf16 or fp8, got 'int4'"):
        engine_config_from_dict({"num_gpu_blocks": 100, "max_model_len": 4096, "model": "llama-3.1-8b",
                                 "time_model": {"gpu": "H100", "dtype": "int4"}}, source="e.json")


def test_an_engine_names_a_config_json_relative_to_itself(tmp_path):
    (tmp_path / "m").mkdir()
    with open(_hf("qwen3-30b-a3b.json")) as fh:
        (tmp_path / "m" / "config.json").write_text(fh.read())
    (tmp_path / "engine.json").write_text(json.dumps({
        "num_gpu_blocks": 500, "max_model_len": 4096, "model": "m/config.json",
        "time_model": {"gpu": "H200", "tp": 2}}))
    cfg = load_engine_config(tmp_path / "engine.json")
    assert cfg.time_model.model == str(tmp_path / "m" / "config.json")
    assert get_model(cfg.time_model.model).num_experts == 128


def test_plan_writes_the_roofline_and_round_trips(tmp_path, monkeypatch):
    out = tmp_path / "plan.toml"
    r = _run("plan", "--model", "qwen3-30b-a3b", "--gpu", "H100", "--tp", "2", "--out", out)
    assert r.exit_code == 0, r.output
    doc = tomllib.loads(out.read_text())
    from aisim.config.keys import TIME_MODEL_KEYS

    fitted = {k.name: k.default for k in TIME_MODEL_KEYS if k.fitted}
    # The API server in front: vllm serve's (TIME_MODEL_KEYS frontend, on for a roofline).
    assert doc["time_model"] == {"kind": "roofline", "gpu": "H100", "model": "qwen3-30b-a3b", "tp": 2,
                                 "frontend": True, **fitted}
    # vllm serve's limits on an H100 (80 GB, not an A100): 8,192 tokens, 1,024 sequences.
    assert (doc["max_num_batched_tokens"], doc["max_num_seqs"]) == (8192, 1024)
    r = _run("config", "validate", out)
    assert r.exit_code == 0 and "valid" in r.output
    # TOML on stdout is valid TOML: the notes are its comment lines; a path in it is relative to the
    # current directory, where a redirection writes it.
    monkeypatch.chdir(tmp_path)
    r = _run("plan", "--model", _hf("deepseek-r1.json"), "--gpu", "B200", "--tp", "8")
    assert r.exit_code == 0, r.output
    doc = tomllib.loads(r.stdout)
    assert doc["time_model"]["gpu"] == "B200" and doc["model"] == os.path.relpath(_hf("deepseek-r1.json"), tmp_path)
    assert not os.path.isabs(doc["time_model"]["model"])
    assert (doc["max_num_batched_tokens"], doc["max_num_seqs"]) == (16384, 1024)   # >= 160 GB
    assert r.stdout.startswith("# Engine configuration planned by aisim.\n")
    path = tmp_path / "stdout.toml"
    path.write_text(r.stdout)
    assert _run("config", "validate", path).exit_code == 0
    # An A100 keeps vLLM's small defaults whatever its memory.
    r = _run("plan", "--model", "llama-3.1-8b", "--gpu", "A100-80GB", "--format", "json")
    assert (json.loads(r.stdout)["max_num_batched_tokens"], json.loads(r.stdout)["max_num_seqs"]) == (2048, 256)


@pytest.mark.parametrize("args,line", [
    (["--model", "llama-3.1-8b", "--gpu", "H800"],
     "error: unknown GPU 'H800'; the catalog has: A100-40GB, A100-80GB, A100-80GB-PCIe, L40S, H100, H200, B200, "
     "MI300X"),
    (["--model", "llama-3.1-8b", "--gpu", "H100", "--tp", "5"],
     "error: tensor parallelism 5 does not divide llama-3.1-8b's 32 attention heads"),
    (["--model", os.path.join(HF, "gpt2.json"), "--gpu", "H100"],
     f"error: {os.path.join(HF, 'gpt2.json')}: field 'architectures' names 'GPT2LMHeadModel', which aisim does not "
     "model; supported: " + ", ".join(__import__("aisim.config.hfconfig", fromlist=["x"]).ARCHITECTURES)),
    (["--model", "llama-3.1-8b"], "Error: --model needs --gpu (or --gpu-memory-gib)"),
    (["--model", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "131073"],
     "error: max_model_len 131,073 exceeds llama-3.1-8b's 131,072 tokens (max_position_embeddings); vLLM refuses "
     "a longer one"),
])
def test_plan_refuses_with_one_line(tmp_path, args, line):
    out = tmp_path / "plan.toml"
    r = _run("plan", *args, "--out", out)
    assert r.exit_code == 2 and r.stderr.strip().splitlines()[-1] == line and r.stdout == ""
    assert not out.exists()


def test_validate_refuses_an_engine_whose_model_aisim_does_not_model(tmp_path):
    path = tmp_path / "engine.json"
    path.write_text(json.dumps({"num_gpu_blocks": 100, "max_model_len": 4096, "model": os.path.join(HF, "gpt2.json"),
                                "time_model": {"gpu": "H100"}}))
    r = _run("config", "validate", path)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith(f"error: 'time_model' in {path}: {os.path.join(HF, 'gpt2.json')}: field "
                               "'architectures' names 'GPT2LMHeadModel'")


# ---------------------------------------------------------------- the summary says how steps were timed


def test_a_replay_on_the_bare_linear_default_says_so(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"request_id": "a", "prompt_len": 64, "max_tokens": 4, "arrival_time": 0.0}) + "\n")
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"num_gpu_blocks": 100, "max_model_len": 4096}))
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"num_gpu_blocks": 100, "max_model_len": 4096,
                               "model": "llama-3.1-8b", "time_model": {"gpu": "H100"}}))
    r = _run("replay", "--engine", bare, "--trace", trace, "--format", "json")
    assert json.loads(r.stdout)["time_model"] == "linear-default"
    r = _run("replay", "--engine", bare, "--trace", trace)
    assert "bare linear default: 10.0 ms a step, no GPU's (set time_model.gpu)" in r.stdout
    r = _run("replay", "--engine", gpu, "--trace", trace, "--format", "json")
    assert json.loads(r.stdout)["time_model"] == "roofline"
    r = _run("replay", "--engine", gpu, "--trace", trace)
    assert "roofline: llama-3.1-8b on 1 x H100" in r.stdout
    linear = tmp_path / "linear.json"
    linear.write_text(json.dumps({"num_gpu_blocks": 100, "max_model_len": 4096, "time_model": {"base_s": 0.02}}))
    assert json.loads(_run("replay", "--engine", linear, "--trace", trace, "--format", "json").stdout)[
        "time_model"] == "linear"
