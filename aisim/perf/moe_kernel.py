"""The routed experts' matmul rate, from vLLM's own fused-MoE kernel benchmark.

vLLM multiplies a layer's routed experts in one grouped Triton kernel
(``vllm/model_executor/layers/fused_moe/fused_moe.py``, ``fused_experts`` over
``moe_align_block_size``): each expert's tokens padded to the kernel's block of rows, each
expert's slice of ``N`` columns (``moe_intermediate_size / tp``) multiplied apart.  The
narrower the slice, the further below a dense GEMM's rate it runs.  vLLM's
``benchmarks/kernels/benchmark_moe.py`` times the whole op (both expert GEMMs and what sits
between them) for ``M`` tokens: ``6 x M x top_k x hidden x N`` FLOPs.  Its outputs are
published with the kernel configurations vLLM ships; :data:`KERNEL_RUNS` records those at
prefill-sized batches on GPUs of the catalog.

From them, the experts' share of the GPU's achievable matmul rate (``GPUSpec.achievable_flops``)
is ``1 / (a + b / N)`` (:func:`expert_share`): ``a`` and ``b`` are the least-squares line of
``1 / share`` against ``1 / N`` over the BF16 runs, so a slice of ``N`` columns reaches
``1 / a`` of the rate when ``N`` is large and half of that at ``N = b / a``.  The roofline
prices the routed experts' FLOPs at that share of the weights' dtype's rate, against reading the
experts the step touches: the kernel's own time, not the fitted ``compute_efficiency`` of the
dense products' tiles.

With FP8 products (FP8 weights on a GPU with FP8 tensor cores) the experts reach
:data:`FP8_FACTOR` of that share of the FP8 rate: the geometric mean, over the published runs of
the Triton kernel with FP8 weights and activations (:data:`FP8_KERNEL_RUNS`), of each run's share
of the FP8 rate over the BF16 line's share at its ``N``.  vLLM's FP8 MoE path differs between
releases, GPUs and checkpoints (Triton per-tensor or block-FP8, CUTLASS, DeepGEMM); the fitting
sources prefer the factor to none (benchmarks/data/README.md).  FP8 weights on a GPU without FP8
tensor cores run at the BF16 rate and share.  The small slices of tensor parallelism 4-8 (``N``
96-384) lie below every published run at a prefill-sized batch: their share is the line's,
extrapolated.

A decode-sized batch reads the experts it touches and multiplies few rows: the kernel is bound by
its reads, at a share of the GPU's peak bandwidth measured from the published decode-sized runs of
the same benchmark: :data:`READ_SHARE` with BF16 weights (:data:`DECODE_KERNEL_RUNS`),
:data:`FP8_READ_SHARE` with FP8 weights and activations (:data:`FP8_DECODE_KERNEL_RUNS`: the
activations quantized, the products scaled), not the fitted ``bandwidth_efficiency`` of the dense
products.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from aisim.config.catalog import get_gpu
from aisim.perf.fitline import least_squares_line


class KernelRun(NamedTuple):
    """One published ``benchmark_moe.py`` timing: ``us`` microseconds for ``m`` tokens."""

    source: str
    gpu: str
    experts: int
    n: int
    hidden: int
    top_k: int
    m: int
    us: float

    @property
    def flops(self) -> float:
        """Both expert GEMMs: gate and up (``2 N`` wide), then down (``N`` deep), per routed token."""
        return 6.0 * self.m * self.top_k * self.hidden * self.n


# BF16 runs on GPUs of the catalog, the largest prefill-sized batch each source published, tuned where
# it published both (vLLM ships the tuned configuration).  Pull request 40542 timed the kernel with a
# standalone tuner over benchmark_moe.py's search space, 44818 with its own microbenchmark of the op.
KERNEL_RUNS = (
    KernelRun("vLLM pull request 24700 (Mixtral-8x7B at TP 2, tuned)", "H100", 8, 7168, 4096, 2, 1536, 1122.93),
    KernelRun("vLLM pull request 40542 (Kimi-VL-A3B, tuned)", "A100-80GB", 64, 1408, 2048, 6, 4096, 2636.6),
    KernelRun("vLLM pull request 44818 (Gemma 4 26B-A4B, tuned)", "H200", 128, 704, 2816, 8, 4096, 1189.6),
)
# Runs of the Triton kernel with per-tensor FP8 weights and activations (``--dtype fp8_w8a8``): 0.13 of
# the H100's measured FP8 rate and 0.23 of the L40S's datasheet FP8 peak (no measured rate published)
# at N 768, where the BF16 line gives 0.44.
FP8_KERNEL_RUNS = (
    KernelRun("vLLM pull request 24700 (Qwen3-30B-A3B, main branch of 2025-09)", "H100", 128, 768, 2048, 8, 4096,
              1647.57),
    KernelRun("vLLM pull request 53710 (Qwen3-VL-30B-A3B, tuned)", "L40S", 128, 768, 2048, 8, 4096, 1846.43),
)


# Decode-sized runs of the kernel, at batches where random routing touches every expert (or all but a few)
# and the products are small: the kernel reads every touched expert's 3 x hidden x N weights once.  Pull
# request 24700 (H100, vLLM's main branch of 2025-09): Mixtral-8x7B in BF16 at TP 2 (the tuned configuration)
# and Qwen3-30B-A3B with per-tensor FP8 weights and activations (the same run as the first FP8 run above).
DECODE_KERNEL_RUNS = (
    KernelRun("vLLM pull request 24700 (Mixtral-8x7B at TP 2, tuned)", "H100", 8, 7168, 4096, 2, 64, 483.14),
    KernelRun("vLLM pull request 24700 (Mixtral-8x7B at TP 2, tuned)", "H100", 8, 7168, 4096, 2, 96, 494.42),
    KernelRun("vLLM pull request 24700 (Mixtral-8x7B at TP 2, tuned)", "H100", 8, 7168, 4096, 2, 128, 491.39),
)
FP8_DECODE_KERNEL_RUNS = (
    KernelRun("vLLM pull request 24700 (Qwen3-30B-A3B, main branch of 2025-09)", "H100", 128, 768, 2048, 8, 64, 262.73),
    KernelRun("vLLM pull request 24700 (Qwen3-30B-A3B, main branch of 2025-09)", "H100", 128, 768, 2048, 8, 96, 270.98),
    KernelRun("vLLM pull request 24700 (Qwen3-30B-A3B, main branch of 2025-09)", "H100", 128, 768, 2048, 8, 128, 273.72),
)


def touched_experts(experts: float, top_k: float, tokens: float) -> float:
    """Distinct experts ``tokens`` tokens picking ``top_k`` of ``experts`` uniformly touch, on average."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def run_read_share(run: KernelRun, weight_bytes: int) -> float:
    """The run's weight reads (every touched expert once, ``weight_bytes`` an element) as a share of its GPU's
    peak bandwidth."""
    weights = touched_experts(run.experts, run.top_k, run.m) * 3.0 * run.hidden * run.n * weight_bytes
    return weights / (run.us * 1e-6) / get_gpu(run.gpu).hbm_bytes_per_s


def _read_share(runs, weight_bytes: int) -> float:
    """Geometric mean of the runs' read shares."""
    return math.exp(sum(math.log(run_read_share(r, weight_bytes)) for r in runs) / len(runs))


def run_share(run: KernelRun, dtype: str = "bf16") -> float:
    """The run's FLOP/s as a share of its GPU's achievable matmul rate in ``dtype``."""
    return run.flops / (run.us * 1e-6) / get_gpu(run.gpu).achievable_flops(dtype)


def _fit(runs) -> tuple[float, float]:
    """Least squares of ``1 / share`` on ``1 / N``: ``(a, b)``."""
    return least_squares_line([1.0 / r.n for r in runs], [1.0 / run_share(r) for r in runs])


SHARE_A, SHARE_B = _fit(KERNEL_RUNS)


def _bf16_share(n: float) -> float:
    return min(1.0, 1.0 / (SHARE_A + SHARE_B / n))


def _fp8_factor(runs) -> float:
    """Geometric mean of each FP8 run's share of the FP8 rate over the BF16 line's at its ``N``."""
    logs = [math.log(run_share(r, "fp8") / _bf16_share(r.n)) for r in runs]
    return math.exp(sum(logs) / len(logs))


FP8_FACTOR = _fp8_factor(FP8_KERNEL_RUNS)
READ_SHARE = _read_share(DECODE_KERNEL_RUNS, 2)
FP8_READ_SHARE = _read_share(FP8_DECODE_KERNEL_RUNS, 1)


def expert_share(n: float, fp8: bool = False) -> float:
    """Share of the achievable matmul rate the routed experts reach with ``n`` columns a GPU (at most 1).

    Parameters
    ----------
    n : float
        The kernel's ``N``: one expert's intermediate size on one GPU (:func:`expert_columns`).
    fp8 : bool
        Whether the products run in FP8 (FP8 weights on a GPU with FP8 tensor cores): the share
        of the FP8 rate, :data:`FP8_FACTOR` of the BF16 one.
    """
    return _bf16_share(n) * (FP8_FACTOR if fp8 else 1.0)


def expert_columns(model, tp: int) -> float:
    """``N`` of the fused-MoE kernel: one routed expert's intermediate size on one of ``tp`` GPUs."""
    return model.expert_params / (3.0 * model.hidden_size) / tp


class ExpertKernel(NamedTuple):
    """How a model's routed experts run: the kernel's ``n`` columns, in FP8 or not, at ``share`` of the matmul
    rate, reading the touched experts at ``read_share`` of peak bandwidth."""

    n: float
    fp8: bool
    share: float
    read_share: float


def expert_kernel(model, tp: int, gpu, dtype: str) -> ExpertKernel | None:
    """The fused-MoE kernel of ``model``'s routed experts on ``tp`` of ``gpu`` with ``dtype`` weights.

    None for a model without routed experts of known size.  The roofline prices the experts
    with it and ``aisim plan`` notes it.
    """
    if not (model.moe_layers and model.expert_params):
        return None
    n, fp8 = expert_columns(model, tp), gpu.multiplies_fp8(dtype)
    return ExpertKernel(n, fp8, expert_share(n, fp8), FP8_READ_SHARE if fp8 else READ_SHARE)
