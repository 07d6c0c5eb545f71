"""Models from a Hugging Face ``config.json``: the fields a roofline and a KV-cache plan need.

:func:`parse_hf_config` turns the dictionary of a ``config.json`` (or a catalog entry,
which is written the same way) into a :class:`~aisim.config.modelspec.ModelSpec`;
:func:`load_hf_config` reads the file strictly.  Architectures, by ``architectures[0]``:

* dense: ``LlamaForCausalLM``, ``MistralForCausalLM`` (a ``sliding_window`` makes every
  layer windowed), ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` (windowed from
  ``max_window_layers`` on when ``use_sliding_window``);
* MoE: ``MixtralForCausalLM``, ``Qwen2MoeForCausalLM``, ``Qwen3MoeForCausalLM``
  (``decoder_sparse_step``, ``mlp_only_layers``, a shared expert), ``Glm4MoeForCausalLM``
  and ``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM`` (``first_k_dense_replace``,
  ``moe_layer_freq``, shared experts; DeepSeek with MLA: ``kv_lora_rank``,
  ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``, ``q_lora_rank``);
* sliding-window hybrids: ``Gemma2ForCausalLM`` (every other layer), ``Gemma3ForCausalLM``
  and ``Gemma3ForConditionalGeneration`` (its ``text_config``; one global layer every
  ``sliding_window_pattern``);
* linear-attention hybrids: ``Qwen3NextForCausalLM`` (Gated DeltaNet layers, one full
  attention layer every ``full_attention_interval``; ``linear_*`` fields give the state).

A ``layer_types`` list, when present, names each layer's mixer and wins over the rules
above.  Parameter counts follow vLLM's layers: gated MLPs of three matrices, one router
per MoE layer and MLA's ``q_a``/``kv_a`` projections held whole by every tensor-parallel
rank (``ReplicatedLinear``), everything else split.  Norms and biases are left out.
Weights are BF16 unless ``quantization_config.quant_method`` is ``fp8`` (in square blocks of
``weight_block_size`` when given).  The context
length is the ``max_model_len`` vLLM derives when none is given (length fields and RoPE
scaling, :func:`_context_length`).  Anything else is refused with an error naming the field.
"""

from __future__ import annotations

import json
import os

from aisim.config.modelspec import DTYPE_BYTES, Gemm, LayerKind, ModelSpec
from aisim.errors import ConfigError

DENSE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
QWEN_MOE = ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
DEEPSEEK = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM")
GEMMA = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
ARCHITECTURES = DENSE + QWEN_MOE + ("MixtralForCausalLM",) + DEEPSEEK + GEMMA + ("Qwen3NextForCausalLM",)

# layer_types spellings of each mixer.
_FULL = ("full_attention", "attention", "global_attention")
_WINDOW = ("sliding_attention", "sliding_window", "local_attention")
_LINEAR = ("linear_attention",)


# The most layers a config.json may declare: each gets an entry of the per-layer tables (the
# deepest published models have a few hundred).
MAX_LAYERS = 10_000


class _Fields:
    """Typed reads of one config dictionary, every error naming the file and the field."""

    def __init__(self, cfg: dict, source: str, prefix: str = ""):
        self.cfg, self.source, self.prefix = cfg, source, prefix

    def error(self, key: str, what: str) -> ConfigError:
        return ConfigError(f"{self.source}: field '{self.prefix}{key}' {what}")

    def int(self, key: str, default=None, low: int = 1, high: int | None = None):
        v = self.cfg.get(key)
        if v is None:  # absent or null: the default, if the field has one
            if default is None:
                raise self.error(key, "is missing")
            return default
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise self.error(key, f"must be an integer of at least {low}, got {v!r}")
        if high is not None and v > high:
            raise self.error(key, f"must be an integer from {low} to {high:,}, got {v!r}")
        return v

    def opt_int(self, key: str, low: int = 1):
        v = self.cfg.get(key)
        return None if v is None else self.int(key, low=low)

    def bool(self, key: str, default: bool) -> bool:
        v = self.cfg.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.error(key, f"must be true or false, got {v!r}")
        return v

    def int_list(self, key: str) -> list:
        v = self.cfg.get(key) or []
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise self.error(key, f"must be a list of layer indices, got {v!r}")
        return v


def _weights_dtype(cfg: dict, f: _Fields) -> str:
    q = cfg.get("quantization_config")
    if q is None:
        return "bf16"
    if not isinstance(q, dict):
        raise f.error("quantization_config", "must be a mapping")
    method = q.get("quant_method")
    if method != "fp8":
        raise f.error("quantization_config.quant_method", f"must be fp8 (the only quantization modelled), "
                                                          f"got {method!r}")
    return "fp8"


def _weight_block(cfg: dict, f: _Fields) -> int:
    """The side of the square blocks of ``quantization_config.weight_block_size``; 0 without one."""
    block = (cfg.get("quantization_config") or {}).get("weight_block_size")
    if block is None:
        return 0
    if (not isinstance(block, list) or len(block) != 2 or block[0] != block[1]
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in block)):
        raise f.error("quantization_config.weight_block_size", f"must be two equal positive integers, got {block!r}")
    return block[0]


def _mixers(cfg: dict, f: _Fields, arch: str, n: int) -> list:
    """Each layer's mixer: ``("full", None)``, ``("sliding_window", w)`` or ``("gdn", None)``."""
    types = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    if types is not None:
        if not isinstance(types, list) or len(types) != n:
            raise f.error("layer_types", f"must list one mixer for each of the {n} layers")
        out = []
        for t in types:
            if t in _FULL:
                out.append(("full", None))
            elif t in _WINDOW:
                out.append(("sliding_window", f.int("sliding_window")))
            elif t in _LINEAR and arch == "Qwen3NextForCausalLM":
                out.append(("gdn", None))
            else:
                raise f.error("layer_types", f"names a layer mixer aisim does not model: {t!r}")
        return out
    if arch == "MistralForCausalLM" and window is not None:
        return [("sliding_window", f.int("sliding_window"))] * n
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and f.bool("use_sliding_window", False):
        start = f.int("max_window_layers", default=n, low=0)
        return [("full", None) if i < start else ("sliding_window", f.int("sliding_window")) for i in range(n)]
    if arch == "Gemma2ForCausalLM":
        return [("sliding_window", f.int("sliding_window")) if i % 2 == 0 else ("full", None) for i in range(n)]
    if arch in ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"):
        pattern = f.int("sliding_window_pattern", default=6)
        return [("full", None) if (i + 1) % pattern == 0 else ("sliding_window", f.int("sliding_window"))
                for i in range(n)]
    if arch == "Qwen3NextForCausalLM":
        interval = f.int("full_attention_interval", default=4)
        return [("full", None) if (i + 1) % interval == 0 else ("gdn", None) for i in range(n)]
    return [("full", None)] * n


def _moe_layers(cfg: dict, f: _Fields, arch: str, n: int) -> list:
    """Whether each layer's MLP has routed experts (vLLM's rule for the architecture)."""
    if arch == "MixtralForCausalLM":
        return [True] * n
    if arch in QWEN_MOE or arch == "Qwen3NextForCausalLM":
        step = f.int("decoder_sparse_step", default=1)
        dense = set(f.int_list("mlp_only_layers"))
        return [i not in dense and (i + 1) % step == 0 for i in range(n)]
    if arch in DEEPSEEK:
        if cfg.get("n_routed_experts") is None:
            return [False] * n
        first = f.int("first_k_dense_replace", default=0, low=0)
        freq = f.int("moe_layer_freq", default=1)
        return [i >= first and i % freq == 0 for i in range(n)]
    return [False] * n


# vllm/transformers_utils/model_arch_config_convertor.py derive_max_model_len_and_key: the smallest
# of these fields a config sets is the model's length, and ``model_max_length`` overrides them all.
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# vLLM reads a config through its transformers class, so an absent max_position_embeddings is the class
# default (transformers/models/*/configuration_*.py): the length field every architecture here has.
DEFAULT_MAX_POSITIONS = {
    "LlamaForCausalLM": ("LlamaConfig", 2048), "MistralForCausalLM": ("MistralConfig", 131072),
    "Qwen2ForCausalLM": ("Qwen2Config", 32768), "Qwen3ForCausalLM": ("Qwen3Config", 32768),
    "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", 32768), "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", 32768),
    "MixtralForCausalLM": ("MixtralConfig", 131072), "Glm4MoeForCausalLM": ("Glm4MoeConfig", 131072),
    "DeepseekV2ForCausalLM": ("DeepseekV2Config", 2048), "DeepseekV3ForCausalLM": ("DeepseekV3Config", 4096),
    "Gemma2ForCausalLM": ("Gemma2Config", 8192), "Gemma3ForCausalLM": ("Gemma3TextConfig", 131072),
    "Gemma3ForConditionalGeneration": ("Gemma3TextConfig", 131072), "Qwen3NextForCausalLM": ("Qwen3NextConfig", 32768),
}
# vllm/config/model.py _get_and_verify_max_len: RoPE types whose max_position_embeddings is already the
# scaled length; other types multiply it by their factor.
_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def _rope_parameters(raw: dict, f: _Fields) -> list:
    """``(type, factor)`` of each RoPE parameter set: ``rope_parameters`` (one, or one per layer type) or
    ``rope_scaling``; the legacy ``type`` key read as ``rope_type``, a set without a type ``default``."""
    key = "rope_parameters" if raw.get("rope_parameters") is not None else "rope_scaling"
    rope = raw.get(key)
    if rope is None:
        return []
    if not isinstance(rope, dict):
        raise f.error(key, f"must be a mapping, got {rope!r}")
    nested = rope and all(isinstance(v, dict) for v in rope.values())
    sets = [v for v in rope.values() if v] if nested else ([rope] if rope else [])
    out = []
    for rp in sets:
        kind = rp.get("rope_type", rp.get("type", "default"))
        factor = rp.get("factor")
        if not isinstance(kind, str):
            raise f.error(key, f"names its RoPE type as a string, got {kind!r}")
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0):
            raise f.error(f"{key}.factor", f"must be a positive number, got {factor!r}")
        out.append((kind, factor))
    return out


def _context_length(raw: dict, cfg: dict, f: _Fields, top: _Fields, arch: str) -> tuple[int, str]:
    """vLLM's default ``max_model_len`` for the config, and the field it comes from.

    ``vllm/config/model.py`` ``_get_and_verify_max_len`` with ``max_model_len`` unset: the
    derived length (``MAX_LEN_KEYS``, read from the language model's config, an absent
    ``max_position_embeddings`` at its class default), times the RoPE scaling factor unless the
    type is pre-scaled or the model is Gemma 3; LongRoPE defaults to
    ``original_max_position_embeddings``.  A tokenizer's ``model_max_length`` (not in
    ``config.json``) is not seen.
    """
    cls, default = DEFAULT_MAX_POSITIONS[arch]
    length, key = None, ""
    if cfg.get("max_position_embeddings") is None:
        length, key = default, f"max_position_embeddings, {cls}'s default"
    for k in MAX_LEN_KEYS:
        v = cfg.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 1:
            raise f.error(k, f"must be a positive number of tokens, got {v!r}")
        if length is None or v < length:
            length, key = v, k
    if cfg.get("model_max_length"):
        length, key = cfg["model_max_length"], "model_max_length"
    rope = _rope_parameters(raw, top)
    scale = [factor for kind, factor in rope if kind not in _PRESCALED_ROPE and factor]
    if scale and not arch.startswith("Gemma3"):
        length *= scale[-1]  # one factor for every layer type: vLLM keeps the last set's
    if any(kind == "longrope" for kind, _ in rope) and raw.get("original_max_position_embeddings") is not None:
        length = top.int("original_max_position_embeddings")
    return int(length), key


def parse_hf_config(raw: dict, source: str, name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from the dictionary of a Hugging Face ``config.json``.

    Parameters
    ----------
    raw : dict
        The decoded ``config.json`` (or a catalog entry written the same way).
    source : str
        Where it came from, named in every error.
    name : str, optional
        The model's name (default: ``_name_or_path`` or ``source``).

    Returns
    -------
    ModelSpec

    Raises
    ------
    ConfigError
        An architecture aisim does not model, or a missing or malformed field; the
        message names the file and the field.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a model configuration is a JSON object")
    top = _Fields(raw, source)
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise top.error("architectures", f"must list the model's architecture, e.g. [\"LlamaForCausalLM\"]; "
                                         f"got {archs!r}")
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise top.error("architectures", f"names {arch!r}, which aisim does not model; supported: "
                                         f"{', '.join(ARCHITECTURES)}")
    cfg, f = raw, top
    if arch == "Gemma3ForConditionalGeneration":
        cfg = raw.get("text_config")
        if not isinstance(cfg, dict):
            raise top.error("text_config", "must be the language model's configuration (a mapping)")
        f = _Fields(cfg, source, "text_config.")
    dtype = _weights_dtype(raw, top)
    hidden = f.int("hidden_size")
    n = f.int("num_hidden_layers", high=MAX_LAYERS)  # a table per layer is built: a bound memory can hold
    heads = f.int("num_attention_heads")
    kv_heads = f.int("num_key_value_heads", default=heads)
    head_dim = f.int("head_dim") if cfg.get("head_dim") is not None else hidden // heads
    vocab = f.int("vocab_size")
    tied = f.bool("tie_word_embeddings", arch in GEMMA) if arch != "Gemma3ForConditionalGeneration" \
        else top.bool("tie_word_embeddings", True)
    mixers = _mixers(cfg, f, arch, n)
    moe = _moe_layers(cfg, f, arch, n)
    mla = arch in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
    context_len, context_key = _context_length(raw, cfg, f, top, arch)

    # Attention and linear-attention mixers: parameters split by TP, held whole, per layer.
    attn_split = attn_whole = 0.0
    if mla:
        lora = f.int("kv_lora_rank")
        rope = f.int("qk_rope_head_dim")
        nope = f.int("qk_nope_head_dim")
        v_head = f.int("v_head_dim")
        q_lora = f.opt_int("q_lora_rank")
        attn_whole = hidden * (lora + rope) + (hidden * q_lora if q_lora else 0)
        attn_split = ((q_lora if q_lora else hidden) * heads * (nope + rope) + lora * heads * (nope + v_head)
                      + heads * v_head * hidden)
        # Decode form over the latent (absorbed weights), prefill form over up-projected heads
        # (vllm/v1/attention/backends/mla/common.py: MLACommonImpl.forward, _forward_prefill).
        # vllm/model_executor/models/deepseek_v2.py DeepseekV2MLAAttention: q_a_proj and
        # kv_a_proj_with_mqa replicated, q_b_proj / q_proj and kv_b_proj column-parallel, o_proj row-parallel.
        attn_gemms = [Gemm("kv_a", lora + rope, hidden, 0, "none"),
                      Gemm("q_b" if q_lora else "q", heads * (nope + rope), q_lora or hidden, 0),
                      Gemm("kv_b", heads * (nope + v_head), lora, 0), Gemm("o", hidden, heads * v_head, 0, "row")]
        if q_lora:
            attn_gemms.insert(0, Gemm("q_a", q_lora, hidden, 0, "none"))
        attn_kind = LayerKind("full", 0, num_kv_heads=1, head_size=lora + rope, num_heads=heads,
                              qk_dim=lora + rope, v_dim=lora, latent_dim=lora + rope,
                              prefill_qk_dim=nope + rope, prefill_v_dim=v_head, up_rank=lora, up_dim=nope + v_head)
    else:
        gate = 2 if arch == "Qwen3NextForCausalLM" else 1  # Qwen3-Next gates the attention output
        attn_split = hidden * heads * head_dim * gate + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
        # QKVParallelLinear (column-parallel; Qwen3-Next's query carries its gate) and o_proj row-parallel.
        attn_gemms = [Gemm("qkv", (heads * gate + 2 * kv_heads) * head_dim, hidden, 0),
                      Gemm("o", hidden, heads * head_dim, 0, "row")]
        attn_kind = LayerKind("full", 0, num_kv_heads=kv_heads, head_size=head_dim, num_heads=heads)
    gdn_split, gdn_kind, gdn_gemms = 0.0, None, []
    if any(kind == "gdn" for kind, _ in mixers):
        k_heads, k_dim = f.int("linear_num_key_heads"), f.int("linear_key_head_dim")
        v_heads, v_dim = f.int("linear_num_value_heads"), f.int("linear_value_head_dim")
        kernel = f.int("linear_conv_kernel_dim")
        key_dim, value_dim = k_heads * k_dim, v_heads * v_dim
        conv_dim = 2 * key_dim + value_dim
        gdn_split = hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * v_heads + conv_dim * kernel + value_dim * hidden
        # vLLM's GDN state: the convolution's last kernel-1 inputs and one dk x dv matrix per value head.
        state = 2 * (conv_dim * (kernel - 1) + v_heads * k_dim * v_dim)
        # Qwen3NextGatedDeltaNet: in_proj_qkvz and in_proj_ba column-parallel, out_proj row-parallel (its
        # short convolution is no matrix product).
        gdn_gemms = [Gemm("in_proj", 2 * key_dim + 2 * value_dim + 2 * v_heads, hidden, 0),
                     Gemm("out_proj", hidden, value_dim, 0, "row")]
        gdn_kind = LayerKind("gdn", 0, state_bytes=state, prefill_checkpoint_alignment=64,
                             num_heads=v_heads, state_flops=4.0 * v_heads * k_dim * v_dim)

    # MLPs.
    inter = f.int("intermediate_size") if not all(moe) else 0
    dense_mlp = 3.0 * hidden * inter
    # MergedColumnParallelLinear gate_up_proj, RowParallelLinear down_proj.
    mlp_gemms = [Gemm("gate_up", 2 * inter, hidden, 0), Gemm("down", hidden, inter, 0, "row")] if inter else []
    moe_gemms = []
    experts = top_k = 0
    expert = shared = router = 0.0
    if any(moe):
        if arch == "MixtralForCausalLM":
            experts, expert = f.int("num_local_experts"), 3.0 * hidden * f.int("intermediate_size")
            s = 0
        elif arch in DEEPSEEK:
            experts = f.int("n_routed_experts")
            expert = 3.0 * hidden * f.int("moe_intermediate_size")
            shared = f.int("n_shared_experts", default=0, low=0) * expert
            s = f.int("n_shared_experts", default=0, low=0) * f.int("moe_intermediate_size")
        else:
            experts = f.int("num_experts")
            expert = 3.0 * hidden * f.int("moe_intermediate_size")
            s = f.int("shared_expert_intermediate_size", default=0, low=0)
            shared = 3.0 * hidden * s + (hidden if s else 0)  # the shared expert and its sigmoid gate
        top_k = f.int("num_experts_per_tok")
        if top_k > experts:
            raise f.error("num_experts_per_tok", f"must not exceed the {experts} experts, got {top_k}")
        router = float(hidden * experts)
        # The router (ReplicatedLinear gate) and the shared experts (a dense MLP of n_shared x the
        # expert's width, or Qwen's shared_expert_intermediate_size; its sigmoid gate is one column).
        moe_gemms = [Gemm("router", experts, hidden, 0, "none")]
        if s:
            moe_gemms += [Gemm("shared_gate_up", 2 * s, hidden, 0), Gemm("shared_down", hidden, s, 0, "row")]

    dense = whole = 0.0
    total = float(vocab * hidden * (1 if tied else 2))
    for (kind, _), routed in zip(mixers, moe):
        if kind == "gdn":
            dense += gdn_split
            total += gdn_split
        else:
            dense += attn_split
            whole += attn_whole
            total += attn_split + attn_whole
        if routed:
            dense += shared
            whole += router
            total += experts * expert + shared + router
        else:
            dense += dense_mlp
            total += dense_mlp
    moe_layers = sum(moe)
    gemms = _count_gemms(mixers, moe, attn_gemms, gdn_gemms, mlp_gemms, moe_gemms)
    gemms.append(Gemm("lm_head", vocab, hidden, 1, "col", "requests"))  # ParallelLMHead

    kinds, order = {}, []
    for kind, window in mixers:
        key = (kind, window)
        if key not in kinds:
            order.append(key)
            kinds[key] = 0
        kinds[key] += 1
    layers = []
    for kind, window in order:
        base = gdn_kind if kind == "gdn" else attn_kind
        layers.append(LayerKind(kind, kinds[(kind, window)], num_kv_heads=base.num_kv_heads,
                                head_size=base.head_size, sliding_window=window, state_bytes=base.state_bytes,
                                prefill_checkpoint_alignment=base.prefill_checkpoint_alignment,
                                num_heads=base.num_heads, qk_dim=base.qk_dim, v_dim=base.v_dim,
                                latent_dim=base.latent_dim, state_flops=base.state_flops,
                                prefill_qk_dim=base.prefill_qk_dim, prefill_v_dim=base.prefill_v_dim,
                                up_rank=base.up_rank, up_dim=base.up_dim))
    active = dense + whole + moe_layers * top_k * expert
    label = name or (raw.get("_name_or_path") if isinstance(raw.get("_name_or_path"), str) else None) or source
    return ModelSpec(label, params=total, weight_bytes=DTYPE_BYTES[dtype], layers=tuple(layers), hidden_size=hidden,
                     num_heads=heads, active_params=active, vocab_size=vocab, tie_word_embeddings=tied,
                     dense_params=dense, replicated_params=whole, moe_layers=moe_layers, num_experts=experts,
                     experts_per_token=top_k, expert_params=expert, dtype=dtype, weight_block=_weight_block(raw, top),
                     context_len=context_len, context_key=context_key, gemms=tuple(gemms))


def _count_gemms(mixers, moe, attn, gdn, mlp, moe_gemms) -> list:
    """Each matrix product of the layers once, ``count`` the layers that run it, in first-use order."""
    counts, order = {}, []
    for (kind, _), routed in zip(mixers, moe):
        for g in (gdn if kind == "gdn" else attn) + (moe_gemms if routed else mlp):
            if g not in counts:
                counts[g] = 0
                order.append(g)
            counts[g] += 1
    return [Gemm(g.name, g.n, g.k, counts[g], g.split, g.rows) for g in order]


def load_hf_config(path: str | os.PathLike) -> ModelSpec:
    """Read a Hugging Face ``config.json`` strictly (:func:`parse_hf_config`).

    Raises
    ------
    ConfigError
        The file cannot be read, is not JSON, or :func:`parse_hf_config` refuses it.
    """
    from aisim.textin import decode_utf8, loads_json, read_bytes

    path = os.fspath(path)
    data = read_bytes(path, ConfigError, "model configuration")
    try:
        raw = loads_json(decode_utf8(data, path, ConfigError), path, ConfigError)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    return parse_hf_config(raw, path, name=path)
