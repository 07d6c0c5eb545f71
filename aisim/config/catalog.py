"""A small built-in catalog of model geometries and GPUs.

Each model lists its decoder layers by kind with what vLLM needs to size the
KV cache: attention layers (KV heads, head size, KV dtype bytes, an optional
sliding window), state layers (Mamba / GDN / KDA: bytes of one layer's
recurrent state, prefill-checkpoint alignment) and ring layers.  The numbers
are public architecture parameters rounded to what the KV-cache layout needs;
GLM-5.3-Flash follows the seed's description (hash block 2,176: one
full-attention group, one ring group, four KDA groups).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aisim.errors import ConfigError


@dataclass(frozen=True)
class LayerKind:
    """``count`` decoder layers of one KV-cache spec."""

    kind: str                       # full, sliding_window, mamba, gdn, kda, ring
    count: int
    num_kv_heads: int = 0           # attention layers
    head_size: int = 0
    kv_dtype_bytes: int = 2
    sliding_window: int | None = None
    state_bytes: int = 0            # state layers: one layer's state (conv + SSM), bytes
    prefill_checkpoint_alignment: int | None = None  # state layers with prefill checkpoints

    def bytes_per_token(self, tp: int = 1) -> int:
        """K + V bytes of one token in one layer, per GPU under tensor parallelism ``tp``."""
        heads = max(1, self.num_kv_heads // tp)
        return 2 * heads * self.head_size * self.kv_dtype_bytes


@dataclass(frozen=True)
class ModelSpec:
    """A model's parameters and decoder layers (in layer order, by kind)."""

    name: str
    params: float                   # total parameters
    weight_bytes: float             # bytes per parameter as served
    layers: tuple = field(default_factory=tuple)
    hidden_size: int = 4096
    num_heads: int = 32
    active_params: float | None = None  # MoE: parameters touched per token

    @property
    def num_layers(self) -> int:
        return sum(layer.count for layer in self.layers)


MODELS = {
    "llama-3.1-8b": ModelSpec(
        "llama-3.1-8b", params=8.03e9, weight_bytes=2, hidden_size=4096, num_heads=32,
        layers=(LayerKind("full", 32, num_kv_heads=8, head_size=128),),
    ),
    "gemma-3-27b": ModelSpec(
        # Five sliding-window layers (window 1,024) per full-attention layer.
        "gemma-3-27b", params=27.4e9, weight_bytes=2, hidden_size=5376, num_heads=32,
        layers=(LayerKind("sliding_window", 52, num_kv_heads=16, head_size=128, sliding_window=1024),
                LayerKind("full", 10, num_kv_heads=16, head_size=128)),
    ),
    "qwen3-next-80b-a3b": ModelSpec(
        # Three Gated DeltaNet layers per full-attention layer.
        "qwen3-next-80b-a3b", params=80e9, active_params=3e9, weight_bytes=2, hidden_size=2048, num_heads=16,
        layers=(LayerKind("gdn", 36, state_bytes=1_097_728, prefill_checkpoint_alignment=64),
                LayerKind("full", 12, num_kv_heads=2, head_size=256)),
    ),
    "glm-5.3-flash": ModelSpec(
        # The seed's geometry: 2 KV heads x 256 dims in fp8 (1,024 B per token
        # and layer), KDA states of 2,170,880 B -> 2,176-token blocks.
        "GLM-5.3-Flash", params=30e9, active_params=3e9, weight_bytes=1, hidden_size=4096, num_heads=32,
        layers=(LayerKind("full", 12, num_kv_heads=2, head_size=256, kv_dtype_bytes=1),
                LayerKind("ring", 12, num_kv_heads=2, head_size=256, kv_dtype_bytes=1),
                LayerKind("kda", 48, state_bytes=2_170_880, prefill_checkpoint_alignment=16)),
    ),
}


@dataclass(frozen=True)
class GPUSpec:
    """Peak dense BF16 FLOP/s, HBM bandwidth and memory of one GPU."""

    name: str
    flops: float
    hbm_bytes_per_s: float
    memory_gib: float


GPUS = {
    "A100": GPUSpec("A100", flops=312e12, hbm_bytes_per_s=2.039e12, memory_gib=80),
    "L40S": GPUSpec("L40S", flops=362e12, hbm_bytes_per_s=0.864e12, memory_gib=48),
    "H100": GPUSpec("H100", flops=989e12, hbm_bytes_per_s=3.35e12, memory_gib=80),
    "H200": GPUSpec("H200", flops=989e12, hbm_bytes_per_s=4.8e12, memory_gib=141),
    "B200": GPUSpec("B200", flops=2250e12, hbm_bytes_per_s=8.0e12, memory_gib=180),
}


def get_model(name: str) -> ModelSpec:
    """The catalog entry of ``name`` (case-insensitive)."""
    key = name.lower()
    if key not in MODELS:
        raise ConfigError(f"unknown model '{name}'; the catalog has: {', '.join(m.name for m in MODELS.values())}")
    return MODELS[key]


def get_gpu(name: str) -> GPUSpec:
    """The catalog entry of GPU ``name`` (case-insensitive)."""
    for key, gpu in GPUS.items():
        if key.lower() == name.lower():
            return gpu
    raise ConfigError(f"unknown GPU '{name}'; the catalog has: {', '.join(GPUS)}")


def check_tp(model: "ModelSpec", tp) -> None:
    """Refuse a tensor-parallel size ``model``'s KV heads cannot be split over.

    vLLM's ``QKVParallelLinear`` (``vllm/model_executor/layers/linear.py``):
    with at least as many KV heads as GPUs the heads divide evenly, with fewer
    each head is replicated and the GPUs divide evenly over the heads.

    Raises
    ------
    ConfigError
        ``tp`` not a positive integer, or not compatible with a layer's KV heads.
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tensor parallelism must be an integer of at least 1, got {tp!r}")
    for layer in model.layers:
        heads = layer.num_kv_heads
        if heads and (heads % tp if heads >= tp else tp % heads):
            raise ConfigError(f"tensor parallelism {tp} does not divide {model.name}'s {heads} KV heads "
                              f"({layer.kind} layers), nor do the heads divide it")
