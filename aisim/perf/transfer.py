"""KV transfers between the GPU and the CPU tier of KV offload: the link's rate.

A copy moves its chunks' bytes over the GPU's PCIe link to host memory at the link's rate
(:data:`aisim.config.gpus.PCIE_LANE_BYTES_PER_S` per lane, times the lanes, times the share the
copies reach, ``kv_offload.pcie_efficiency``); the core runs one copy at a time per direction
(loads host to GPU, stores GPU to host), each overlapped with the engine's steps
(``ext/offload.pxi``, ``off_worker_output``).
"""

from __future__ import annotations

from aisim.config.gpus import PCIE_LANE_BYTES_PER_S


def link_bytes_per_s(offload) -> float:
    """Bytes per second one direction of the link moves (0: transfers counted in steps, not time).

    Parameters
    ----------
    offload : aisim.config.offload.OffloadConfig
    """
    if offload.pcie_gen is None:
        return 0.0
    return PCIE_LANE_BYTES_PER_S[offload.pcie_gen] * offload.pcie_lanes * offload.pcie_efficiency
