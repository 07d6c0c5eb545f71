"""The dense products of a block-FP8 checkpoint on Hopper, at the pace of vLLM's CUTLASS kernel.

A checkpoint whose FP8 weights carry one scale per 128 x 128 block (``quantization_config.
weight_block_size``, DeepSeek-V3/R1) runs its dense linear layers in vLLM's block-FP8 GEMM
(``apply_w8a8_block_fp8_linear``, ``vllm/model_executor/layers/quantization/utils/fp8_utils.py``:
the activations quantized per token and 128-wide group, then ``cutlass_scaled_mm`` when ``N``
and ``K`` are multiples of 128, the Triton ``w8a8_block_fp8_matmul`` otherwise).  On Hopper the
CUTLASS kernel (``cutlass_gemm_blockwise_sm90_fp8_dispatch``,
``csrc/quantization/cutlass_w8a8/c3x/scaled_mm_blockwise_sm90_fp8_dispatch.cuh``, 2025) cuts the
output into 128 x 128 tiles, each walking the whole depth ``K`` in 128-deep blocks with a scale a
block, the tiles of the grid in waves over the SMs: the persistent scheduler when ``K <= 3 N``,
else the Stream-K scheduler, which splits the depth of a small grid over idle SMs.

At a decode-sized batch one row of tiles covers every token, and the kernel takes far longer
than its weights' bytes: a tile's walk down ``K`` is bound by each block's latency, not by the
GPU's bandwidth.  The published runs of the kernel at 64 rows (SGLang's
``benchmark/bench_fp8_blockwise_gemm.py``, whose ``vllm`` column calls vLLM's
``cutlass_scaled_mm``; the GPU is not named, a Hopper one: DeepGEMM reaches 1.3 PFLOP/s FP8
beside them) lie on one line in the blocks walked: :data:`WALK_FIXED_S` plus
:data:`WALK_PER_BLOCK_S` a 128-deep block (the least-squares line through the persistent
scheduler's runs, :data:`PERSISTENT_RUNS`, all of one wave).  The kernel is persistent: it sets
up once and each wave of tiles walks the depth again, so a grid of ``w`` waves takes the fixed
part once and the walk ``w`` times (``_gemm_time``, ``ext/steptime.pyx``; the same tables' runs of more than one
wave lie within 10 % of it, but for the shallowest, ``K`` 512, up to 28 % under); under Stream-K a grid smaller than one wave takes
:data:`STREAM_K_FACTOR` of the line, the geometric mean of the published Stream-K runs
(:data:`STREAM_K_RUNS`) over the line.  The roofline takes the longer of that walk and its own
price of the product (its tiles' FLOPs, its bytes), for every product the kernel runs on a Hopper
GPU (:func:`gemm_walks`): not the MoE router (``ReplicatedLinear`` without quantization in
``DeepseekV2MoE``), the LM head (unquantized) nor ``kv_b`` (its decode form multiplies the
absorbed weights in BF16: ``MLACommonImpl.process_weights_after_loading``, ``W_UK_T`` and
``W_UV`` with ``torch.bmm``).  The Triton kernel of a product whose ``N`` is no multiple of 128
(MLA's ``kv_a``, 576 columns) walks ``K`` the same way, a tile a program, without a split: it
takes the persistent line (SGLang pull request 3893 timed vLLM's Triton kernel at ``N`` 576 x
``K`` 7,168 on an H200 at 47.3 us for 64 rows; the line gives 43.1).

Before each block-FP8 product (and both GEMMs of the routed experts) vLLM quantizes the BF16
activations per token and 128-wide group (``per_token_group_quant_fp8``, ``fp8_utils.py``).  vLLM
0.8.4 runs its Triton kernel there, one program of one warp a group; 0.11.0 and later prefer a
CUDA kernel (``torch.ops._C.per_token_group_fp8_quant``).  The Triton kernel's published runs
(:data:`QUANT_RUNS`) lie on one line in the elements quantized; with ``triton_group_quant`` the
roofline charges its slope, :data:`QUANT_S_PER_ELEMENT`, for every element a step quantizes
(:func:`quant_elements`).  The CUDA kernel is not priced.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from aisim.perf.fitline import least_squares_line

# Output tile of the kernel (rows, columns) and its depth step: TileShape 128 x 128 x 128, one weight scale
# a 128 x 128 block.
TILE = 128
# The products vLLM runs outside the block-FP8 kernel (see the module's docstring).
UNQUANTIZED = ("router", "lm_head", "kv_b")


class GemmRun(NamedTuple):
    """One published timing of vLLM's CUTLASS block-FP8 GEMM: ``us`` microseconds for ``m`` x ``k`` by ``k`` x ``n``."""

    source: str
    n: int
    k: int
    m: int
    us: float

    @property
    def blocks(self) -> float:
        """128-deep blocks each tile walks."""
        return self.k / TILE


_PR5207 = "SGLang pull request 5207 (2025-04-09), vllm column"
_PR5820 = "SGLang pull request 5820 (2025-04-28, main), vllm column"
# Runs of the persistent scheduler (K <= 3 N) at 64 rows, every grid within one wave of a Hopper GPU's 132 SMs
# (DeepSeek-V3's products at tensor parallelism 1-8).
PERSISTENT_RUNS = (
    GemmRun(_PR5207, 7168, 4096, 64, 30.912),
    GemmRun(_PR5207, 4608, 7168, 64, 45.696),
    GemmRun(_PR5207, 7168, 16384, 64, 91.040),
    GemmRun(_PR5207, 7168, 18432, 64, 100.704),
    GemmRun(_PR5820, 3072, 1536, 64, 14.592),
    GemmRun(_PR5820, 7168, 2304, 64, 18.720),
    GemmRun(_PR5820, 7168, 16384, 64, 76.448),
)
# Runs of the Stream-K scheduler (K > 3 N) at 64 rows.
STREAM_K_RUNS = (
    GemmRun(_PR5207, 2048, 7168, 64, 27.776),
    GemmRun(_PR5820, 512, 7168, 64, 20.864),
)


def _line(runs) -> tuple[float, float]:
    """Least squares of seconds on blocks walked: ``(fixed, per block)``."""
    return least_squares_line([r.blocks for r in runs], [r.us * 1e-6 for r in runs])


WALK_FIXED_S, WALK_PER_BLOCK_S = _line(PERSISTENT_RUNS)


def walk_seconds(k: float) -> float:
    """Seconds one wave of tiles takes to walk depth ``k`` (the persistent scheduler's line)."""
    return WALK_FIXED_S + WALK_PER_BLOCK_S * k / TILE


def cutlass(n: float, k: float) -> bool:
    """Whether vLLM runs an ``n`` x ``k`` weight in the CUTLASS kernel (``N`` and ``K`` multiples of 128:
    ``apply_w8a8_block_fp8_linear``'s ``shape_supported_by_cutlass``), else in Triton."""
    return n % TILE == 0 and k % TILE == 0


def stream_k(n: float, k: float) -> bool:
    """Whether the CUTLASS kernel takes the Stream-K scheduler for an ``n`` x ``k`` weight (``K > 3 N``)."""
    return cutlass(n, k) and k > 3.0 * n


def _stream_k_factor(runs) -> float:
    logs = [math.log(r.us * 1e-6 / walk_seconds(r.k)) for r in runs]
    return math.exp(sum(logs) / len(logs))


STREAM_K_FACTOR = _stream_k_factor(STREAM_K_RUNS)


def applies(model, gpu, dtype: str) -> bool:
    """Whether ``model``'s dense products run in the block-FP8 kernel on ``gpu`` with ``dtype`` weights:
    a checkpoint of 128 x 128 FP8 blocks served in FP8 on a Hopper GPU (compute capability 9, the runs')."""
    return model.weight_block == TILE and dtype == "fp8" and gpu.capability == 9


def gemm_walks(model, gpu, tp: int, dtype: str) -> list[tuple[float, float]]:
    """``(seconds a wave of tiles walks K, Stream-K factor)`` of each of ``model.gemms`` on one of ``tp``
    GPUs (:data:`WALK_FIXED_S` more once a product).

    ``(0, 1)`` for a product the kernel does not run (then the roofline alone prices it).
    """
    on = applies(model, gpu, dtype)
    out = []
    for g in model.gemms:
        if not on or g.name in UNQUANTIZED:
            out.append((0.0, 1.0))
            continue
        n, k = g.shape(tp)
        out.append((WALK_PER_BLOCK_S * k / TILE, STREAM_K_FACTOR if stream_k(n, k) else 1.0))
    return out


# SGLang pull request 4396 (2025-03-13): its Triton per-token-group kernel (the launch of vLLM 0.8.4's: a program
# of one warp, one stage, a 128-wide group) quantizing FP16 activations of 7,168 columns to FP8, 1 x L tokens:
# ``(tokens, us)``.  The runs time ``fn(x.clone())``: a copy of the input is in them.
QUANT_RUNS = ((64, 10.656), (128, 14.656), (256, 20.160001), (512, 31.808), (1024, 55.071998), (2048, 101.824))
QUANT_COLUMNS = 7168


def _quant_line(runs) -> tuple[float, float]:
    """Least squares of seconds on elements quantized: ``(fixed, per element)``."""
    return least_squares_line([t * QUANT_COLUMNS for t, _ in runs], [us * 1e-6 for _, us in runs])


QUANT_FIXED_S, QUANT_S_PER_ELEMENT = _quant_line(QUANT_RUNS)


def quant_elements(model, tp: int) -> float:
    """Activation elements a token quantizes per step on one of ``tp`` GPUs: the input of every block-FP8
    product of ``model.gemms`` (each of its layers), and per MoE layer the routed experts' two inputs (the
    hidden state, and ``top_k`` expert slices of ``N`` columns, :func:`aisim.perf.moe_kernel.expert_columns`).
    ``kv_b``'s prefill form quantizes its input too, on prefill tokens only: left out."""
    from aisim.perf.moe_kernel import expert_columns

    total = sum(g.count * g.shape(tp)[1] for g in model.gemms if g.name not in UNQUANTIZED)
    if model.moe_layers and model.expert_params:
        total += model.moe_layers * (model.hidden_size + model.experts_per_token * expert_columns(model, tp))
    return float(total)


def quant_seconds_per_token(model, gpu, tp: int, dtype: str, triton: bool) -> float:
    """Seconds the Triton per-token-group kernel adds per token of a step (0 unless ``triton`` and the
    block-FP8 kernel runs: :func:`applies`)."""
    if not (triton and applies(model, gpu, dtype)):
        return 0.0
    return QUANT_S_PER_ELEMENT * quant_elements(model, tp)
