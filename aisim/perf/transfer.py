"""KV transfers between the GPU and the CPU tier of KV offload (the link's rate), and the disk tier's.

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


def disk_args(offload) -> dict | None:
    """The disk tier as the core reads it (ext/offload.pxd ``DiskConfC``), or None without one.

    With the link on the clock (``pcie_gen``) a disk read or write lasts its chunks' bytes over the
    drive's rate (``disk_read_gbps`` / ``disk_write_gbps``, GB/s of 1e9 bytes), one read and one
    write at a time, overlapped with the engine's steps; otherwise it is reported
    ``disk_read_delay_steps`` / ``disk_write_delay_steps`` steps after it was issued.

    Parameters
    ----------
    offload : aisim.config.offload.OffloadConfig
    """
    if not offload.disk_tier:
        return None
    timed = offload.pcie_gen is not None
    return {
        "read_delay": offload.disk_read_delay_steps,
        "write_delay": offload.disk_write_delay_steps,
        "read_bytes_per_s": offload.disk_read_gbps * 1e9 if timed else 0.0,
        "write_bytes_per_s": offload.disk_write_gbps * 1e9 if timed else 0.0,
    }
