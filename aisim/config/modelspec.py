"""A model as aisim sees it: its decoder layers by kind and the weights a forward pass reads.

:class:`LayerKind` carries what vLLM needs to lay out the KV cache (attention heads and
head size, a sliding window, the bytes of a recurrent state) and what the roofline needs
to price attention (query heads, the dimensions of the QK and PV products).
:class:`ModelSpec` adds the parameter counts the roofline reads and multiplies: parameters
every token uses (split across tensor-parallel ranks or held whole by each), the routed
experts of MoE layers, the vocabulary.  Specs come from a Hugging Face ``config.json``
(:mod:`aisim.config.hfconfig`) or from the catalog (:mod:`aisim.config.catalog`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Bytes per weight of a serving dtype.
DTYPE_BYTES = {"bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class LayerKind:
    """``count`` decoder layers of one KV-cache spec.

    Attributes
    ----------
    kind : str
        ``full``, ``sliding_window``, ``mamba``, ``gdn``, ``kda`` or ``ring``.
    count : int
    num_kv_heads, head_size : int
        Attention layers: K/V heads and their size (MLA: one latent "head").
    kv_dtype_bytes : int
        Bytes of one cached K or V element.
    sliding_window : int or None
    state_bytes : int
        State layers: one layer's recurrent state (convolution + SSM), bytes.
    prefill_checkpoint_alignment : int or None
        State layers with prefill checkpoints.
    num_heads : int
        Query heads of an attention layer (0: the model's ``num_heads``).
    qk_dim, v_dim : int
        Per head, the length of the QK and of the PV product (0: ``head_size``).  MLA,
        which vLLM decodes with absorbed weights, multiplies over its latent: QK over
        ``kv_lora_rank + qk_rope_head_dim``, PV over ``kv_lora_rank``.
    latent_dim : int
        MLA: elements of the compressed KV of one token (``kv_lora_rank +
        qk_rope_head_dim``); every tensor-parallel rank holds all of it.
    prefill_qk_dim, prefill_v_dim : int
        Per head, the QK and PV lengths of a request vLLM runs in the prefill form (0:
        ``qk_dim`` and ``v_dim``, the one form of every non-MLA layer).  MLA prefills as
        multi-head attention over up-projected keys and values: QK over
        ``qk_nope_head_dim + qk_rope_head_dim``, PV over ``v_head_dim``.
    up_rank, up_dim : int
        MLA: ``kv_b_proj``, which up-projects a token's latent (``up_rank`` =
        ``kv_lora_rank`` elements) into ``up_dim`` = ``qk_nope_head_dim + v_head_dim``
        per head; a prefill-form request up-projects its cached context with it every
        step (0: none).
    state_flops : float
        State layers: FLOPs of one token's recurrent update (all heads of one layer).
    """

    kind: str
    count: int
    num_kv_heads: int = 0
    head_size: int = 0
    kv_dtype_bytes: int = 2
    sliding_window: int | None = None
    state_bytes: int = 0
    prefill_checkpoint_alignment: int | None = None
    num_heads: int = 0
    qk_dim: int = 0
    v_dim: int = 0
    latent_dim: int = 0
    state_flops: float = 0.0
    prefill_qk_dim: int = 0
    prefill_v_dim: int = 0
    up_rank: int = 0
    up_dim: int = 0

    def bytes_per_token(self, tp: int = 1) -> int:
        """KV bytes of one token in one layer, per GPU under tensor parallelism ``tp``.

        K and V of the layer's share of KV heads (a head is replicated when there are fewer
        heads than GPUs); MLA's latent once, whole on every GPU (``MLAAttentionSpec``).
        """
        if self.latent_dim:
            return self.latent_dim * self.kv_dtype_bytes
        heads = max(1, self.num_kv_heads // tp)
        return 2 * heads * self.head_size * self.kv_dtype_bytes


@dataclass(frozen=True)
class Gemm:
    """One matrix product of a forward pass: an ``n x k`` weight run in ``count`` layers.

    Attributes
    ----------
    name : str
        ``qkv``, ``o``, ``gate_up``, ``down``, ``router``, ``shared_gate_up``, ... (for inspection).
    n, k : int
        Output columns and depth of the whole weight (before tensor parallelism).
    count : int
        Layers that run it once per step.
    split : str
        How tensor parallelism cuts it: ``col`` (``n / tp`` a GPU, vLLM's
        ``ColumnParallelLinear``), ``row`` (``k / tp``, ``RowParallelLinear``) or ``none`` (held
        whole: ``ReplicatedLinear``).
    rows : str
        Its ``M``: ``tokens`` (every scheduled token) or ``requests`` (one row a scheduled
        request: the LM head on each request's last position).
    """

    name: str
    n: int
    k: int
    count: int
    split: str = "col"
    rows: str = "tokens"

    def shape(self, tp: int) -> tuple[float, float]:
        """``(n, k)`` on one of ``tp`` GPUs."""
        if self.split == "col":
            return self.n / tp, float(self.k)
        if self.split == "row":
            return float(self.n), self.k / tp
        return float(self.n), float(self.k)


@dataclass(frozen=True)
class ModelSpec:
    """A model's parameters and decoder layers (in layer order, by kind).

    Attributes
    ----------
    name : str
    params : float
        Total parameters (every expert, the embedding, an untied LM head).
    weight_bytes : float
        Bytes per parameter as served by default (2 for BF16, 1 for FP8 checkpoints).
    layers : tuple of LayerKind
        By kind, in order of first appearance (vLLM's KV-cache group order).
    hidden_size, num_heads : int
    active_params : float or None
        Parameters one token uses (MoE: the routed experts it picks); None: all.
    vocab_size : int
        0 when unknown (the roofline then reads ``active_params`` as the weights of a step).
    tie_word_embeddings : bool
    dense_params : float
        Non-embedding parameters every token uses that tensor parallelism splits.
    replicated_params : float
        Non-embedding parameters every tensor-parallel rank holds whole (MLA's
        down-projections, MoE routers).
    moe_layers, num_experts, experts_per_token : int
        Layers with routed experts, experts per such layer, experts a token picks.
    expert_params : float
        Parameters of one routed expert in one layer.
    dtype : str
        The checkpoint's weights: ``bf16`` or ``fp8``.
    weight_block : int
        The side of the square blocks an FP8 checkpoint's weights are scaled in
        (``quantization_config.weight_block_size``: 128 for DeepSeek-V3/R1); 0 for none.
    context_len : int
        The longest sequence vLLM derives from the config (its default ``max_model_len``);
        0 when the spec has no config to derive it from.
    context_key : str
        The field ``context_len`` comes from (and whether it is its transformers class's default).
    gemms : tuple of Gemm
        The dense matrix products of a forward pass, LM head included (routed experts apart:
        ``expert_params``); empty when the spec has no ``config.json`` to take shapes from.
    """

    name: str
    params: float
    weight_bytes: float
    layers: tuple = field(default_factory=tuple)
    hidden_size: int = 4096
    num_heads: int = 32
    active_params: float | None = None
    vocab_size: int = 0
    tie_word_embeddings: bool = False
    dense_params: float = 0.0
    replicated_params: float = 0.0
    moe_layers: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    expert_params: float = 0.0
    dtype: str = "bf16"
    weight_block: int = 0
    context_len: int = 0
    context_key: str = ""
    gemms: tuple = field(default_factory=tuple)

    @property
    def num_layers(self) -> int:
        return sum(layer.count for layer in self.layers)

    @property
    def detailed(self) -> bool:
        """Whether the spec carries its parameter split (specs from a ``config.json`` do)."""
        return self.vocab_size > 0
