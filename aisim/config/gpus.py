"""GPUs the roofline step-time model and ``aisim plan`` know, from their vendors' datasheets.

Each entry holds the published peak *dense* tensor throughput (BF16 and FP8; the
datasheets print sparse figures twice as large), the memory bandwidth and size, and the
GPU-to-GPU interconnect bandwidth used by tensor-parallel all-reduces.  Interconnect
figures are the vendors' bidirectional totals per GPU; a ring all-reduce sends and
receives at once, so each direction gets half (:attr:`GPUSpec.link_bytes_per_s_each_way`).

Datasheet peaks are not what matrix multiplications reach: each GPU also carries its
*maximum achievable matmul FLOP/s* (MAMF), the best of a search over GEMM shapes measured and
published in Stas Bekman's "Machine Learning Engineering" (github.com/stas00/ml-engineering,
``compute/accelerator/README.md``, table "Maximum Achievable Matmul FLOPS comparison table"). The
roofline's compute efficiency is a share of that; where no measurement is published (L40S; FP8
on MI300X) the datasheet peak stands in.

The roofline prices each matrix product by the tiles it runs in (:mod:`aisim.perf.roofline`), so
each GPU carries its number of streaming multiprocessors (AMD: compute units) from the vendor's
architecture documents: NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs on the A100),
NVIDIA H100 Tensor Core GPU Architecture whitepaper (132 on the H100 SXM5; the H200 is the same
GH100 part), NVIDIA Ada GPU Architecture whitepaper and the L40S datasheet (142), NVIDIA Blackwell
architecture technical brief (148 on the B200), AMD CDNA 3 Instruction Set Architecture / MI300X
data sheet (304 compute units); and its CUDA compute capability's major version (NVIDIA's CUDA GPUs
table), which vLLM reads for defaults (the CUDA-graph sizes: :mod:`aisim.perf.graphs`).

The all-reduce *latency* is no datasheet number: it is the fixed cost of one small
all-reduce inside vLLM's decode step (custom all-reduce kernels over NVLink/NVSwitch or
Infinity Fabric; NCCL over PCIe), an assumption of aisim stated here once.
"""

from __future__ import annotations

from dataclasses import dataclass

from aisim.errors import ConfigError

# PCIe between a GPU and host memory (KV offload's CPU tier): bytes per second per lane and direction,
# the transfer rate after line coding (PCI-SIG base specifications: 3.0 8 GT/s and 4.0 16 GT/s and
# 5.0 32 GT/s with 128b/130b; 6.0 64 GT/s in 256-byte FLITs of 242 payload bytes).
PCIE_LANE_BYTES_PER_S = {3: 8e9 * 128 / 130 / 8, 4: 16e9 * 128 / 130 / 8, 5: 32e9 * 128 / 130 / 8,
                         6: 64e9 * 242 / 256 / 8}

# One all-reduce of a decode step: ~8 us over NVLink/NVSwitch or Infinity Fabric (vLLM's custom
# all-reduce), ~25 us over PCIe (NCCL).  Assumptions, not datasheet numbers.
_SWITCHED_LATENCY_S = 8e-6
_PCIE_LATENCY_S = 25e-6


@dataclass(frozen=True)
class GPUSpec:
    """One GPU as the roofline sees it.

    Attributes
    ----------
    name : str
        Catalog name (case-insensitive on look-up).
    bf16_flops : float
        Peak dense BF16 tensor FLOP/s.
    fp8_flops : float or None
        Peak dense FP8 tensor FLOP/s; None where the GPU has no FP8 tensor cores (FP8
        weights then run as weight-only quantization at the BF16 rate).
    hbm_bytes_per_s : float
        Peak memory bandwidth.
    memory_gib : float
        Memory of one GPU as sold (GB on the datasheet).
    link_bytes_per_s : float
        GPU-to-GPU bandwidth per GPU, both directions together (datasheet figure).
    link_latency_s : float
        Fixed seconds of one all-reduce (an assumption, see the module docstring).
    bf16_mamf, fp8_mamf : float or None
        Maximum achievable matmul FLOP/s measured with BF16 and FP8 inputs (see the module
        docstring); None where none is published.
    sms : int
        Streaming multiprocessors (AMD: compute units) that run a kernel's tiles.
    capability : int
        CUDA compute capability, major version (0: not an NVIDIA GPU).
    aliases : tuple of str
        Other names accepted on look-up.
    """

    name: str
    bf16_flops: float
    fp8_flops: float | None
    hbm_bytes_per_s: float
    memory_gib: float
    link_bytes_per_s: float
    link_latency_s: float
    bf16_mamf: float | None = None
    fp8_mamf: float | None = None
    sms: int = 0
    capability: int = 0
    aliases: tuple = ()

    @property
    def flops(self) -> float:
        """Peak dense BF16 FLOP/s (the rate of BF16 weights and of FP8 weights without FP8 cores)."""
        return self.bf16_flops

    def multiplies_fp8(self, dtype: str) -> bool:
        """Whether ``dtype`` weights multiply in FP8 here: FP8 weights and FP8 tensor cores (else BF16)."""
        return dtype == "fp8" and self.fp8_flops is not None

    def flops_for(self, dtype: str) -> float:
        """Peak dense FLOP/s of matrix products with ``dtype`` weights (``bf16`` or ``fp8``)."""
        if self.multiplies_fp8(dtype):
            return self.fp8_flops
        return self.bf16_flops

    def achievable_flops(self, dtype: str) -> float:
        """Matmul FLOP/s reachable with ``dtype`` weights: the measured MAMF, else the datasheet peak."""
        if self.multiplies_fp8(dtype):
            return self.fp8_mamf or self.fp8_flops
        return self.bf16_mamf or self.bf16_flops

    @property
    def link_bytes_per_s_each_way(self) -> float:
        """Interconnect bandwidth in one direction: half the bidirectional datasheet figure."""
        return self.link_bytes_per_s / 2


GPUS = {
    # MAMF (BF16 / FP8, TFLOPS): A100 SXM 271.2, A100 PCIe 252.9, H100 SXM 794.5 / 1,402.6 ("H200 is the
# same" for BF16; H200 FP8 1,453.4), B200 SXM 1,745.0 / 3,432.5, MI300X 668.4 / not measured.
# NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf):
    # BF16 312 TFLOPS (624 with sparsity), no FP8; 40GB HBM2 1,555 GB/s; 80GB HBM2e 2,039 GB/s (SXM),
    # 1,935 GB/s (PCIe); NVLink 600 GB/s; PCIe Gen4 64 GB/s.
    "A100-40GB": GPUSpec("A100-40GB", bf16_flops=312e12, fp8_flops=None, hbm_bytes_per_s=1.555e12, memory_gib=40,
                         link_bytes_per_s=600e9, link_latency_s=_SWITCHED_LATENCY_S, bf16_mamf=271.2e12,
                         sms=108, capability=8, aliases=("A100-40GB-SXM",)),
    "A100-80GB": GPUSpec("A100-80GB", bf16_flops=312e12, fp8_flops=None, hbm_bytes_per_s=2.039e12, memory_gib=80,
                         link_bytes_per_s=600e9, link_latency_s=_SWITCHED_LATENCY_S, bf16_mamf=271.2e12,
                         sms=108, capability=8, aliases=("A100", "A100-80GB-SXM")),
    # The PCIe card without an NVLink bridge: GPUs talk over PCIe Gen4 x16.
    "A100-80GB-PCIe": GPUSpec("A100-80GB-PCIe", bf16_flops=312e12, fp8_flops=None, hbm_bytes_per_s=1.935e12,
                              memory_gib=80, link_bytes_per_s=64e9, link_latency_s=_PCIE_LATENCY_S, bf16_mamf=252.9e12,
                              sms=108, capability=8),
    # NVIDIA L40S datasheet (resources.nvidia.com/en-us-l40s/l40s-datasheet-28413): BF16 362.05 TFLOPS
    # (733 with sparsity), FP8 733 TFLOPS (1,466 with sparsity); 48GB GDDR6 864 GB/s; PCIe Gen4 x16 64 GB/s,
    # no NVLink.
    "L40S": GPUSpec("L40S", bf16_flops=362.05e12, fp8_flops=733e12, hbm_bytes_per_s=0.864e12, memory_gib=48,
                    link_bytes_per_s=64e9, link_latency_s=_PCIE_LATENCY_S, sms=142, capability=8),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16 1,979 TFLOPS and FP8 3,958 TFLOPS with
    # sparsity (989 and 1,979 dense); 80GB HBM3 3.35 TB/s; NVLink 900 GB/s.
    "H100": GPUSpec("H100", bf16_flops=989e12, fp8_flops=1979e12, hbm_bytes_per_s=3.35e12, memory_gib=80,
                    link_bytes_per_s=900e9, link_latency_s=_SWITCHED_LATENCY_S, bf16_mamf=794.5e12, fp8_mamf=1402.6e12,
                    sms=132, capability=9, aliases=("H100-SXM", "H100-80GB")),
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): the H100's tensor cores (989 / 1,979 TFLOPS dense
    # BF16 / FP8); 141GB HBM3e 4.8 TB/s; NVLink 900 GB/s.
    "H200": GPUSpec("H200", bf16_flops=989e12, fp8_flops=1979e12, hbm_bytes_per_s=4.8e12, memory_gib=141,
                    link_bytes_per_s=900e9, link_latency_s=_SWITCHED_LATENCY_S, bf16_mamf=794.5e12, fp8_mamf=1453.4e12,
                    sms=132, capability=9, aliases=("H200-SXM",)),
    # NVIDIA DGX B200 datasheet: 8 GPUs with 1,440 GB HBM3e at 64 TB/s (180 GB, 8 TB/s each), FP8 72 PFLOPS
    # with sparsity (4.5 PFLOPS dense per GPU; BF16 half of it), NVLink 5 1.8 TB/s per GPU.
    "B200": GPUSpec("B200", bf16_flops=2250e12, fp8_flops=4500e12, hbm_bytes_per_s=8.0e12, memory_gib=180,
                    link_bytes_per_s=1800e9, link_latency_s=_SWITCHED_LATENCY_S, bf16_mamf=1745.0e12,
                    fp8_mamf=3432.5e12, sms=148, capability=10),
    # AMD Instinct MI300X data sheet: BF16 1,307.4 TFLOPS and FP8 2,614.9 TFLOPS dense (twice with sparsity);
    # 192GB HBM3 5.3 TB/s; Infinity Fabric 128 GB/s per link, 7 links to the other GPUs of a platform.
    "MI300X": GPUSpec("MI300X", bf16_flops=1307.4e12, fp8_flops=2614.9e12, hbm_bytes_per_s=5.3e12, memory_gib=192,
                      link_bytes_per_s=7 * 128e9, link_latency_s=_SWITCHED_LATENCY_S, bf16_mamf=668.4e12,
                      sms=304),
}


def get_gpu(name: str) -> GPUSpec:
    """The catalog entry of GPU ``name`` (case-insensitive; aliases such as ``A100`` accepted).

    Raises
    ------
    ConfigError
        An unknown name; the message lists the catalog.
    """
    if isinstance(name, str):
        want = name.lower()
        for gpu in GPUS.values():
            if want == gpu.name.lower() or want in (a.lower() for a in gpu.aliases):
                return gpu
    raise ConfigError(f"unknown GPU {name!r}; the catalog has: {', '.join(GPUS)}")
