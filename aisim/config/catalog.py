"""The built-in model catalog, and model look-up by catalog name or ``config.json`` path.

Each catalog model is written as the fields of its Hugging Face ``config.json`` that
aisim reads, and parsed by the same code as a ``config.json`` given as a path
(:func:`aisim.config.hfconfig.parse_hf_config`), so the catalog and a file cannot
disagree about what a field means.  GLM-5.3-Flash follows the seed's description
instead (hash block 2,176: one full-attention group, one ring group, four KDA groups).
GPUs live in :mod:`aisim.config.gpus`.
"""

from __future__ import annotations

import os

from aisim.config.gpus import GPUS, GPUSpec, get_gpu  # noqa: F401  (look-ups go through this module)
from aisim.config.modelspec import LayerKind, ModelSpec
from aisim.errors import ConfigError

__all__ = ["GPUS", "GPUSpec", "LayerKind", "MODELS", "ModelSpec", "check_tp", "get_gpu", "get_model"]


def _qwen3(hidden, inter, layers, heads, kv, tied=False):
    return {"architectures": ["Qwen3ForCausalLM"], "hidden_size": hidden, "intermediate_size": inter,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 128,
            "vocab_size": 151936, "tie_word_embeddings": tied, "max_position_embeddings": 40960}


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}

# name -> (display name, config.json fields).  Values: each model's config.json on Hugging Face.
_CONFIGS = {
    "llama-3.1-8b": ("llama-3.1-8b", {  # meta-llama/Llama-3.1-8B
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "tie_word_embeddings": False, "max_position_embeddings": 131072, "rope_scaling": _LLAMA3_ROPE}),
    "llama-3.1-70b": ("llama-3.1-70b", {  # meta-llama/Llama-3.1-70B
        "architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
        "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 128256, "tie_word_embeddings": False, "max_position_embeddings": 131072,
        "rope_scaling": _LLAMA3_ROPE}),
    "llama-3.2-3b": ("llama-3.2-3b", {  # meta-llama/Llama-3.2-3B: tied embeddings, Llama 3.2's rope factor 32
        "architectures": ["LlamaForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 128256, "tie_word_embeddings": True, "max_position_embeddings": 131072,
        "rope_scaling": dict(_LLAMA3_ROPE, factor=32.0)}),
    "mistral-7b-v0.1": ("mistral-7b-v0.1", {  # mistralai/Mistral-7B-Instruct-v0.1: a 4,096-token window everywhere
        "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": 4096,
        "vocab_size": 32000, "tie_word_embeddings": False, "max_position_embeddings": 32768}),
    "qwen2.5-7b": ("qwen2.5-7b", {  # Qwen/Qwen2.5-7B-Instruct
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
        "tie_word_embeddings": False, "use_sliding_window": False, "max_position_embeddings": 32768}),
    "qwen2.5-32b": ("qwen2.5-32b", {  # Qwen/Qwen2.5-32B
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 5120, "intermediate_size": 27648,
        "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8, "vocab_size": 152064,
        "tie_word_embeddings": False, "use_sliding_window": False, "max_position_embeddings": 131072}),
    "qwen3-0.6b": ("qwen3-0.6b", _qwen3(1024, 3072, 28, 16, 8, tied=True)),   # Qwen/Qwen3-0.6B
    "qwen3-8b": ("qwen3-8b", _qwen3(4096, 12288, 36, 32, 8)),                  # Qwen/Qwen3-8B
    "qwen3-14b": ("qwen3-14b", _qwen3(5120, 17408, 40, 40, 8)),                # Qwen/Qwen3-14B
    "qwen3-32b": ("qwen3-32b", _qwen3(5120, 25600, 64, 64, 8)),                # Qwen/Qwen3-32B
    "qwen3-30b-a3b": ("qwen3-30b-a3b", {  # Qwen/Qwen3-30B-A3B
        "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 40960}),
    "qwen3-235b-a22b": ("qwen3-235b-a22b", {  # Qwen/Qwen3-235B-A22B-Instruct-2507
        "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1536, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "vocab_size": 151936, "tie_word_embeddings": False,
        "max_position_embeddings": 262144}),
    "glm-4.5-air": ("glm-4.5-air", {  # zai-org/GLM-4.5-Air
        "architectures": ["Glm4MoeForCausalLM"], "hidden_size": 4096, "intermediate_size": 10944,
        "num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
        "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 1408,
        "first_k_dense_replace": 1, "vocab_size": 151552, "tie_word_embeddings": False,
        "max_position_embeddings": 131072}),
    "glm-4.6": ("glm-4.6", {  # zai-org/GLM-4.6
        "architectures": ["Glm4MoeForCausalLM"], "hidden_size": 5120, "intermediate_size": 12288,
        "num_hidden_layers": 92, "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
        "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 1536,
        "first_k_dense_replace": 3, "vocab_size": 151552, "tie_word_embeddings": False,
        "max_position_embeddings": 202752}),
    "deepseek-r1": ("deepseek-r1", {  # deepseek-ai/DeepSeek-R1 (DeepSeek-V3 architecture, FP8 weights)
        "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512,
        "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3, "moe_layer_freq": 1, "vocab_size": 129280, "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        "max_position_embeddings": 163840,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}}),
    "gemma-3-27b": ("gemma-3-27b", {  # google/gemma-3-27b-it: five 1,024-token window layers per global one
        "architectures": ["Gemma3ForConditionalGeneration"], "text_config": {
            "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62, "num_attention_heads": 32,
            "num_key_value_heads": 16, "head_dim": 128, "sliding_window": 1024, "sliding_window_pattern": 6,
            "vocab_size": 262208, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}}),
    "qwen3-next-80b-a3b": ("qwen3-next-80b-a3b", {  # Qwen/Qwen3-Next-80B-A3B-Instruct: 3 Gated DeltaNet layers per full one
        "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 2048, "intermediate_size": 5120,
        "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
        "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
        "linear_num_value_heads": 32, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 262144}),
}


# Hugging Face ids whose config.json has the catalog entry's geometry (an Instruct model shares its base
# model's when its config.json differs only in token ids): ``aisim plan --model ORG/NAME`` reads the catalog.
HF_IDS = {
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
                     "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct",
                      "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
    "llama-3.2-3b": ("meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct"),
    "mistral-7b-v0.1": ("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1"),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct",),
    "qwen2.5-32b": ("Qwen/Qwen2.5-32B",),
    "qwen3-0.6b": ("Qwen/Qwen3-0.6B",),
    "qwen3-8b": ("Qwen/Qwen3-8B",),
    "qwen3-14b": ("Qwen/Qwen3-14B",),
    "qwen3-32b": ("Qwen/Qwen3-32B",),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B",),
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B-Instruct-2507",),
    "glm-4.5-air": ("zai-org/GLM-4.5-Air",),
    "glm-4.6": ("zai-org/GLM-4.6",),
    "deepseek-r1": ("deepseek-ai/DeepSeek-R1",),
    "gemma-3-27b": ("google/gemma-3-27b-it",),
    "qwen3-next-80b-a3b": ("Qwen/Qwen3-Next-80B-A3B-Instruct",),
}
# Hugging Face id (lower case) -> catalog name.
_BY_HF_ID = {hf.lower(): key for key, ids in HF_IDS.items() for hf in ids}


def _catalog() -> dict:
    from aisim.config.hfconfig import parse_hf_config

    models = {key: parse_hf_config(cfg, f"the catalog entry {name}", name=name) for key, (name, cfg) in _CONFIGS.items()}
    # The seed's geometry: 2 KV heads x 256 dims in fp8 (1,024 B per token and layer), KDA states of
    # 2,170,880 B -> 2,176-token blocks.  No parameter split: the roofline reads its active parameters.
    models["glm-5.3-flash"] = ModelSpec(
        "GLM-5.3-Flash", params=30e9, active_params=3e9, weight_bytes=1, hidden_size=4096, num_heads=32, dtype="fp8",
        layers=(LayerKind("full", 12, num_kv_heads=2, head_size=256, kv_dtype_bytes=1),
                LayerKind("ring", 12, num_kv_heads=2, head_size=256, kv_dtype_bytes=1),
                LayerKind("kda", 48, state_bytes=2_170_880, prefill_checkpoint_alignment=16)))
    return models


MODELS = _catalog()


def is_config_path(name: str) -> bool:
    """Whether ``name`` names a ``config.json`` file rather than a catalog model or a Hugging Face id."""
    if catalog_name(name) is not None:
        return False
    return name.lower().endswith(".json") or os.sep in name or (os.altsep is not None and os.altsep in name)


def catalog_name(name: str) -> str | None:
    """The catalog entry ``name`` means: a catalog name (any case) or a Hugging Face id of :data:`HF_IDS`.

    A path that exists on disk is a file, never a catalog entry.
    """
    if not isinstance(name, str) or os.path.exists(name):
        return None
    key = name.lower()
    if key in MODELS:
        return key
    return _BY_HF_ID.get(key)


def _catalog_listing() -> str:
    return (", ".join(m.name for m in MODELS.values()) + " (each also by its Hugging Face ids, e.g. "
            f"{HF_IDS['llama-3.1-8b'][1]} for llama-3.1-8b)")


def _looks_like_hf_id(name: str) -> bool:
    # ORG/NAME with one slash, no file suffix: how the Hugging Face Hub names a model
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.lower().endswith(".json") and not name.startswith(".")


def get_model(name: str) -> ModelSpec:
    """The model ``name``: a catalog entry (case-insensitive), a Hugging Face id the catalog knows
    (:data:`HF_IDS`), or the path of a ``config.json``.

    Raises
    ------
    ConfigError
        An unknown catalog name or Hugging Face id (the message lists the catalog and says how to give a
        ``config.json``), or a ``config.json`` aisim cannot read or does not model.
    """
    if not isinstance(name, str):
        raise ConfigError(f"a model is a catalog name or a config.json path, got {name!r}")
    key = catalog_name(name)
    if key is not None:
        return MODELS[key]
    how = ("download the model's config.json (only that file: huggingface-cli download ORG/NAME config.json "
           "--local-dir DIR) and give its path, e.g. --model DIR/config.json")
    if _looks_like_hf_id(name) and not os.path.exists(name):
        raise ConfigError(f"model '{name}' is not in the catalog; the catalog has: {_catalog_listing()}. For "
                          f"another model, {how}")
    if is_config_path(name):
        from aisim.config.hfconfig import load_hf_config

        return load_hf_config(name)
    raise ConfigError(f"unknown model '{name}'; the catalog has: {_catalog_listing()}. For another model, {how}")


def check_tp(model: ModelSpec, tp) -> None:
    """Refuse a tensor-parallel size the model's attention heads cannot be split over.

    vLLM's ``ModelConfig.verify_with_parallel_config`` (``vllm/config/model.py``) requires the
    attention heads to divide evenly; ``QKVParallelLinear``
    (``vllm/model_executor/layers/linear.py``) splits KV heads evenly when there are at least as
    many as GPUs, and otherwise replicates each head, the GPUs dividing evenly over the heads.

    Raises
    ------
    ConfigError
        ``tp`` not a positive integer, or not compatible with the model's heads.
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tensor parallelism must be an integer of at least 1, got {tp!r}")
    if model.num_heads % tp:
        raise ConfigError(f"tensor parallelism {tp} does not divide {model.name}'s {model.num_heads} attention heads")
    for layer in model.layers:
        heads = layer.num_kv_heads
        if heads and (heads % tp if heads >= tp else tp % heads):
            raise ConfigError(f"tensor parallelism {tp} does not divide {model.name}'s {heads} KV heads "
                              f"({layer.kind} layers), nor do the heads divide it")
