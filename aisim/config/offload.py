"""KV offload: the ``kv_offload`` section of an engine configuration.

vLLM serves offloaded KV through its KV-connector path: ``vllm serve --kv-offloading-size X
--kv-offloading-backend native`` builds an ``OffloadingConnector`` whose scheduler side
(``OffloadingConnectorScheduler``) keeps a CPU tier of ``X`` GiB (``CPUOffloadingManager`` with
an LRU policy).  aisim replays that scheduler side exactly (``ext/offload.pxi``) and plays the
worker's copies on the step clock: a load issued in step N is reported by the output of step
N + ``load_delay_steps``, a store by N + ``store_delay_steps``.  Keys, defaults and meanings:
:data:`aisim.config.keys.OFFLOAD_KEYS`; the model: ``docs/kv-offload.md``.

What the replay does not model is refused here, with the reason: the ARC policy, a store
threshold of 2 or more (the manager's access counter), the priority policy, speculative decoding
and grouped (hybrid) KV caches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aisim.config.keys import OFFLOAD_KEYS, check_high, defaults, key, refuse_unknown
from aisim.config.keys import where as _where
from aisim.errors import ConfigError

_O = defaults(OFFLOAD_KEYS)
# vLLM's CPU tier pages: a chunk's bytes are rounded up to this (SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT).
CPU_PAGE_BYTES = 4096
EXTRA_KEYS = ("offload_prompt_only", "store_threshold")
DISK_KEYS = ("disk_read_delay_steps", "disk_write_delay_steps", "disk_read_gbps", "disk_write_gbps")


@dataclass(frozen=True)
class OffloadConfig:
    """The ``kv_offload`` section, validated.

    Parameters
    ----------
    cpu_blocks : int or None
        CPU tier size in chunks (None: from ``size_gib``).
    size_gib : float or None
        ``--kv-offloading-size`` in GiB.
    kv_bytes_per_block : int or None
        Bytes of one GPU block's KV.
    block_size, blocks_per_chunk : int or None
        The offloaded block, in tokens or in GPU blocks (at most one given).
    load_delay_steps, store_delay_steps : int
        The worker's transfer times in engine steps.
    max_num_inflight_kv_loads : int or None
        vLLM's cap on requests loading or loaded and not yet scheduled.
    pcie_gen, pcie_lanes, pcie_efficiency : int or None, int, float
        Transfers on the clock: the GPU's PCIe link to host memory (None: step delays).
    eviction_policy : str
        ``lru``.
    extra : dict
        ``offload_prompt_only`` and ``store_threshold``.
    disk_tier : bool
        A disk tier behind the CPU tier (vLLM's ``fs`` secondary tier).
    disk_read_delay_steps, disk_write_delay_steps : int
        The disk's reads and writes in engine steps (transfers on the step clock).
    disk_read_gbps, disk_write_gbps : float
        The disk's rates in GB/s (transfers on the clock).
    """

    cpu_blocks: int | None = None
    size_gib: float | None = None
    kv_bytes_per_block: int | None = None
    block_size: int | None = None
    blocks_per_chunk: int | None = None
    load_delay_steps: int = _O["load_delay_steps"]
    store_delay_steps: int = _O["store_delay_steps"]
    max_num_inflight_kv_loads: int | None = None
    pcie_gen: int | None = None
    pcie_lanes: int = _O["pcie_lanes"]
    pcie_efficiency: float = _O["pcie_efficiency"]
    eviction_policy: str = _O["eviction_policy"]
    extra: dict | None = None
    disk_tier: bool = _O["disk_tier"]
    disk_read_delay_steps: int = _O["disk_read_delay_steps"]
    disk_write_delay_steps: int = _O["disk_write_delay_steps"]
    disk_read_gbps: float = _O["disk_read_gbps"]
    disk_write_gbps: float = _O["disk_write_gbps"]

    @property
    def prompt_only(self) -> bool:
        """``offload_prompt_only``: only prompt tokens are stored (vLLM's default)."""
        return bool((self.extra or {}).get("offload_prompt_only", True))

    def chunk_blocks(self, engine_block_size: int) -> int:
        """GPU blocks per offloaded block (``blocks_per_chunk``)."""
        if self.blocks_per_chunk is not None:
            return self.blocks_per_chunk
        if self.block_size is not None:
            return self.block_size // engine_block_size
        return 1

    def chunk_bytes(self, engine_block_size: int) -> int:
        """Bytes of one CPU chunk as vLLM lays it out (0 without ``kv_bytes_per_block``)."""
        if not self.kv_bytes_per_block:
            return 0
        raw = self.kv_bytes_per_block * self.chunk_blocks(engine_block_size)
        return -(-raw // CPU_PAGE_BYTES) * CPU_PAGE_BYTES

    def num_chunks(self, engine_block_size: int) -> int:
        """The tier size in chunks (CPUOffloadingSpec: ``cpu_bytes_to_use // bytes_per_chunk``)."""
        if self.cpu_blocks is not None:
            return self.cpu_blocks
        return int(self.size_gib * 2**30) // self.chunk_bytes(engine_block_size)

    def to_dict(self) -> dict:
        """The section as written in a configuration (every key, defaults filled in)."""
        return {k.name: getattr(self, k.name) for k in OFFLOAD_KEYS
                if self.disk_tier or not k.name.startswith("disk_")}


def _int(raw: dict, name: str, at: str) -> int | None:
    v = raw.get(name, _O[name])
    if v is None:
        return None
    k = key(OFFLOAD_KEYS, name)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"'kv_offload.{name}'{at} must be an integer, got {v!r}")
    if v < k.low:
        raise ConfigError(f"'kv_offload.{name}'{at} must be at least {k.low}, got {v}")
    check_high(k, v, "kv_offload.", at)
    return v


def parse_offload(raw, source: str | None = None) -> OffloadConfig:
    """Validate a ``kv_offload`` mapping (the engine-independent checks).

    Raises
    ------
    ConfigError
        For an unknown key, a wrong type or range, both or neither of ``cpu_blocks`` and
        ``size_gib``, or a setting the replay does not model.
    """
    at = _where(source)
    if not isinstance(raw, dict):
        raise ConfigError(f"'kv_offload'{at} must be a mapping")
    refuse_unknown(raw, [k.name for k in OFFLOAD_KEYS], "kv_offload.", at)
    kw = {n: _int(raw, n, at) for n in ("cpu_blocks", "kv_bytes_per_block", "block_size", "blocks_per_chunk",
                                       "load_delay_steps", "store_delay_steps", "max_num_inflight_kv_loads",
                                       "pcie_lanes")}
    if kw["pcie_lanes"] is None:
        kw["pcie_lanes"] = _O["pcie_lanes"]
    gen = raw.get("pcie_gen")
    if gen is not None:
        from aisim.config.gpus import PCIE_LANE_BYTES_PER_S

        if isinstance(gen, bool) or gen not in PCIE_LANE_BYTES_PER_S:
            raise ConfigError(f"'kv_offload.pcie_gen'{at} must be one of {', '.join(map(str, PCIE_LANE_BYTES_PER_S))}, "
                              f"got {gen!r}")
        if kw["kv_bytes_per_block"] is None:
            raise ConfigError(f"'kv_offload.pcie_gen'{at} needs 'kv_offload.kv_bytes_per_block' (the bytes a "
                              "transfer moves)")
        kw["pcie_gen"] = int(gen)
    eff = raw.get("pcie_efficiency", _O["pcie_efficiency"])
    if isinstance(eff, bool) or not isinstance(eff, (int, float)) or not 0.0 < eff <= 1.0:
        raise ConfigError(f"'kv_offload.pcie_efficiency'{at} must be a number in (0, 1], got {eff!r}")
    kw["pcie_efficiency"] = float(eff)
    if (raw.get("cpu_blocks") is None) == (raw.get("size_gib") is None):
        raise ConfigError(f"'kv_offload'{at} needs exactly one of 'cpu_blocks' and 'size_gib'")
    gib = raw.get("size_gib")
    if gib is not None:
        if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not math.isfinite(gib) or gib <= 0:
            raise ConfigError(f"'kv_offload.size_gib'{at} must be a positive number, got {gib!r}")
        if kw["kv_bytes_per_block"] is None:
            raise ConfigError(f"'kv_offload.size_gib'{at} needs 'kv_offload.kv_bytes_per_block' to count chunks; "
                              "or set 'cpu_blocks'")
        kw["size_gib"] = float(gib)
    if kw["block_size"] is not None and kw["blocks_per_chunk"] is not None:
        raise ConfigError(f"'kv_offload'{at}: give 'block_size' or 'blocks_per_chunk', not both")
    policy = raw.get("eviction_policy", _O["eviction_policy"])
    if policy != "lru":
        raise ConfigError(f"'kv_offload.eviction_policy'{at} must be 'lru', got {policy!r} (vLLM's 'arc' is not "
                          "modelled)")
    extra = raw.get("extra") or {}
    if not isinstance(extra, dict):
        raise ConfigError(f"'kv_offload.extra'{at} must be a mapping")
    refuse_unknown(extra, EXTRA_KEYS, "kv_offload.extra.", at)
    if not isinstance(extra.get("offload_prompt_only", True), bool):
        raise ConfigError(f"'kv_offload.extra.offload_prompt_only'{at} must be true or false")
    thr = extra.get("store_threshold", 0)
    if isinstance(thr, bool) or not isinstance(thr, int) or thr < 0:
        raise ConfigError(f"'kv_offload.extra.store_threshold'{at} must be a non-negative integer, got {thr!r}")
    if thr >= 2:
        raise ConfigError(f"'kv_offload.extra.store_threshold'{at} of {thr} is not modelled (0 or 1: every new "
                          "block is stored)")
    kw.update(_disk(raw, at))
    return OffloadConfig(eviction_policy=policy, extra=dict(extra), **kw)


def _disk(raw: dict, at: str) -> dict:
    """The disk tier's keys, validated (none of them without ``disk_tier``)."""
    on = raw.get("disk_tier", False)
    if not isinstance(on, bool):
        raise ConfigError(f"'kv_offload.disk_tier'{at} must be true or false, got {on!r}")
    given = [k for k in DISK_KEYS if k in raw and raw[k] is not None]
    if not on:
        if given:
            raise ConfigError(f"'kv_offload.{given[0]}'{at} sets the disk tier; it needs 'kv_offload.disk_tier': "
                              "true")
        return {}
    out = {"disk_tier": True}
    for n in ("disk_read_delay_steps", "disk_write_delay_steps"):
        out[n] = _int(raw, n, at)
    for n in ("disk_read_gbps", "disk_write_gbps"):
        v = raw.get(n, _O[n])
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"'kv_offload.{n}'{at} must be a positive number of GB/s, got {v!r}")
        out[n] = float(v)
    return out


def check_offload(cfg, source: str | None = None) -> None:
    """The rules between ``kv_offload`` and the rest of the engine (``cfg``: an EngineConfig).

    Raises
    ------
    ConfigError
        When the tier's block is not a multiple of the engine's, the tier would hold no chunk, or
        the engine uses something the offload replay does not model.
    """
    off = cfg.kv_offload
    at = _where(source)
    if off is None:
        return
    if off.block_size is not None and off.block_size % cfg.block_size:
        raise ConfigError(f"'kv_offload.block_size' ({off.block_size}){at} must be a multiple of 'block_size' "
                          f"({cfg.block_size})")
    why = None
    if cfg.policy != "fcfs":
        why = "the priority policy"
    elif cfg.speculative is not None:
        # vLLM 0.34.0 distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py: an EAGLE/MTP
        # drafter group's volatile trailing chunk is neither stored (RequestOffloadState.storable_chunks)
        # nor loaded (_lookup_complete_chunks) while a request decodes, lookahead block hashes key
        # chunks by draft positions, and a store's horizon counts the scheduled drafts.
        why = ("speculative decoding (vLLM's OffloadingConnector keeps an EAGLE/MTP drafter group's trailing "
               "chunk out of its stores and lookups while a request decodes, which aisim's tier does not replay)")
    elif len(cfg.groups) != 1 or cfg.groups[0].get("type") != "full" or cfg.groups[0].get("count", 1) != 1:
        # Same file, _lookup_complete_chunks and GroupOffloadConfig: every group has its own chunks and
        # keys; a hit is narrowed group by group until it converges (sliding-window groups load only the
        # window's chunks, Mamba groups in align mode only aligned boundaries, with copy-on-write tails).
        why = ("a grouped (hybrid) KV cache (vLLM's OffloadingConnector keeps chunks per group and narrows a "
               "hit group by group: a sliding window's chunks, Mamba's aligned states; aisim's tier keeps one "
               "full-attention group)")
    elif not cfg.enable_prefix_caching:
        why = "prefix caching off"
    if why is not None:
        raise ConfigError(f"'kv_offload'{at} is replayed with FCFS, one full-attention "
                          f"group and prefix caching; this engine has {why}")
    if off.num_chunks(cfg.block_size) < 1:
        raise ConfigError(f"'kv_offload.size_gib' ({off.size_gib}){at} holds no chunk of "
                          f"{off.chunk_bytes(cfg.block_size)} bytes")

