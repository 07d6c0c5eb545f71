"""Plans: an engine configuration from probe evidence or from the model catalog.

A *probe* is what a running vLLM engine reported at start-up (schema below).
``plan_from_probe`` turns it into an engine configuration: prefix caching is
on when the probe ran with it on, recorded its hash block, and the
grouped-prefix rule (:mod:`aisim.config.rule`) passes; otherwise the plan is
cold and says why, in the file it writes.  The decisions are the rule
module's; this module only maps probe or catalog evidence to configuration
keys and notes.  ``plan_from_model`` plans without
a probe from the catalog geometry and a GPU memory size: a single-group model
keeps prefix caching, a grouped one replays cold for want of evidence.

Probe schema (JSON)::

    {
      "vllm_version": "0.31.0",              # the engine's release
      "model": "GLM-5.3-Flash",              # optional
      "enable_prefix_caching": true,         # as the engine ran
      "hash_block_size_tokens": 2176,        # Request.block_hashes granularity, if recorded
      "mamba_cache_mode": "align",           # optional
      "block_size": 2176,                    # cache_config.block_size
      "max_model_len": 131072,
      "max_num_batched_tokens": 8192,        # scheduler limits (optional)
      "max_num_seqs": 256,
      "num_gpu_blocks": 13815,               # or "kv_cache_bytes"
      "kv_cache_groups": [                   # one entry per KV-cache group
        {"type": "full", "block_size": 2176, "page_size_bytes": 2228224,
         "num_layers": 12, "prefix_cacheable": true}, ...
      ],
      "tensor_parallel_size": 1,             # workers whose pages one block spans (optional)
      "kv_offloading_size": 64.0,            # --kv-offloading-size, GiB (optional)
      "kv_offloading_backend": "native",     # --kv-offloading-backend (optional)
      "kv_transfer_config": {                # vllm_config.kv_transfer_config (optional)
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 68719476736}},
      "max_num_inflight_kv_loads": 8         # scheduler option (optional)
    }

A probe whose engine ran vLLM's ``OffloadingConnector`` (its ``kv_transfer_config``, or the
``--kv-offloading-*`` flags that make one) plans a ``kv_offload`` section
(:mod:`aisim.config.vllm_offload`); the resolved ``kv_transfer_config`` wins over the flags.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from aisim.config.engine import EngineConfig, engine_config_from_dict
from aisim.config.keys import ENGINE_KEYS, defaults
from aisim.config.kvgroups import GROUP_DEFAULTS, STATE_KINDS
from aisim.config.rule import (catalog_cold_reason, grouped_prefix_caching_problems, probe_cold_reason,
                               unmodeled_version_note)
from aisim.config.toml_out import dumps
from aisim.config.versions import is_supported, release, supported_text
from aisim.errors import ConfigError
from aisim.perf.moe_kernel import expert_kernel
from aisim.textin import decode_utf8, loads_json, read_bytes

PROBE_KEYS = {
    "schema", "vllm_version", "model", "enable_prefix_caching", "hash_block_size_tokens", "mamba_cache_mode",
    "block_size", "max_model_len", "max_num_batched_tokens", "max_num_seqs", "num_gpu_blocks",
    "kv_cache_bytes", "kv_cache_groups", "long_prefill_token_threshold", "enable_chunked_prefill",
    "async_scheduling", "tensor_parallel_size", "kv_offloading_size", "kv_offloading_backend",
    "kv_transfer_config", "max_num_inflight_kv_loads",
}
_ENGINE_DEFAULTS = defaults(ENGINE_KEYS)
SCHEDULER_KEYS = ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold",
                  "enable_chunked_prefill", "async_scheduling")


def load_probe(path) -> dict:
    """Read and check a probe file (unknown keys are errors naming the key and file)."""
    path = os.fspath(path)
    data = read_bytes(path, ConfigError, "probe")
    try:
        probe = loads_json(decode_utf8(data, path, ConfigError), path, ConfigError)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    check_probe(probe, path)
    return probe


# The type of each probe key; integers with their smallest value (the engine keys' own lower bounds,
# aisim.config.keys).
_LOW = {k.name: k.low for k in ENGINE_KEYS}
_PROBE_INTS = {"block_size": _LOW["block_size"], "max_model_len": _LOW["max_model_len"],
               "max_num_batched_tokens": _LOW["max_num_batched_tokens"], "max_num_seqs": _LOW["max_num_seqs"],
               "num_gpu_blocks": _LOW["num_gpu_blocks"], "kv_cache_bytes": _LOW["kv_cache_bytes"],
               "long_prefill_token_threshold": _LOW["long_prefill_token_threshold"],
               "hash_block_size_tokens": 1, "tensor_parallel_size": 1, "max_num_inflight_kv_loads": 1}
_PROBE_BOOLS = ("enable_prefix_caching", "enable_chunked_prefill", "async_scheduling")
_PROBE_STRINGS = ("vllm_version", "model", "mamba_cache_mode", "kv_offloading_backend")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_probe(probe, where: str = "the probe") -> None:
    """Refuse a probe with an unknown or missing key or a value of the wrong type, naming the key.

    Parameters
    ----------
    probe : dict
        A decoded probe.
    where : str
        Its file, for messages.

    Raises
    ------
    ConfigError
        The first problem found.
    """
    if not isinstance(probe, dict):
        raise ConfigError(f"{where}: a probe is a JSON object")
    for k in probe:
        if k not in PROBE_KEYS:
            raise ConfigError(f"unknown key '{k}' in probe {where}; known keys: {', '.join(sorted(PROBE_KEYS))}")
    for k in ("vllm_version", "max_model_len", "kv_cache_groups"):
        if k not in probe:
            raise ConfigError(f"probe {where} lacks '{k}'")
    if probe.get("num_gpu_blocks") is None and probe.get("kv_cache_bytes") is None:
        raise ConfigError(f"probe {where} lacks 'num_gpu_blocks' or 'kv_cache_bytes'")
    for k, v in probe.items():
        if v is None and k not in ("vllm_version", "max_model_len", "kv_cache_groups"):
            continue  # an optional key left unset
        if k in _PROBE_INTS and (not _is_int(v) or v < _PROBE_INTS[k]):
            raise ConfigError(f"'{k}' in probe {where} must be an integer of at least {_PROBE_INTS[k]}, got {v!r}")
        if k in _PROBE_BOOLS and not isinstance(v, bool):
            raise ConfigError(f"'{k}' in probe {where} must be true or false, got {v!r}")
        if k in _PROBE_STRINGS and not isinstance(v, str):
            raise ConfigError(f"'{k}' in probe {where} must be a string, got {v!r}")
        if k == "kv_offloading_size" and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise ConfigError(f"'kv_offloading_size' in probe {where} must be a positive number of GiB, got {v!r}")
        if k == "kv_transfer_config" and not isinstance(v, dict):
            raise ConfigError(f"'kv_transfer_config' in probe {where} must be a mapping, got {v!r}")
    groups = probe["kv_cache_groups"]
    if not isinstance(groups, list) or not groups:
        raise ConfigError(f"'kv_cache_groups' in probe {where} must be a non-empty list of groups, got {groups!r}")
    for i, g in enumerate(groups):
        if not isinstance(g, dict):
            raise ConfigError(f"'kv_cache_groups[{i}]' in probe {where} must be a mapping of keys to values, "
                              f"got {g!r}")
        count = g.get("count", 1)
        if count is not None and (not _is_int(count) or count < 1):
            raise ConfigError(f"'kv_cache_groups[{i}].count' in probe {where} must be an integer of at least 1, "
                              f"got {count!r}")


def plan_from_probe(probe: dict) -> tuple[EngineConfig, list[str]]:
    """An engine configuration from probe evidence, and the reasons behind it.

    Returns
    -------
    (EngineConfig, list of str)
        The plan and its notes; the notes name every reason prefix caching is off, and the KV
        offload tier the probed engine ran (or why the plan has none).
    """
    cfg, notes = _plan_probe_engine(probe)
    section, note = probe_offload(probe, cfg)
    if note is not None:
        notes.append(note)
    if section is None:
        return (cfg if note is None else cfg.replace(plan_notes=notes)), notes
    return with_offload(cfg, section, notes, "the probed engine's KV offload tier")


def probe_offload(probe: dict, cfg: EngineConfig):
    """The ``kv_offload`` section a probe shows (None: none), and a note on a connector not replayed.

    ``kv_transfer_config`` (what vLLM resolved) is read first, else ``kv_offloading_size`` and
    ``kv_offloading_backend``; ``max_num_inflight_kv_loads`` joins the section.
    """
    from aisim.config.vllm_offload import from_transfer_config, offload_section, tier_bytes_per_block

    per_block = tier_bytes_per_block(cfg.raw.get("kv_cache_groups"), probe.get("tensor_parallel_size") or 1)
    section, note = from_transfer_config(probe.get("kv_transfer_config"), per_block, " in the probe")
    backend = probe.get("kv_offloading_backend") or "native"
    if section is None and note is None and probe.get("kv_offloading_size") is not None and backend == "lmcache":
        # VllmConfig._post_init_kv_transfer_config: lmcache runs LMCacheMPConnector.
        _, note = from_transfer_config({"kv_connector": "LMCacheMPConnector"}, per_block)
    elif section is None and note is None and probe.get("kv_offloading_size") is not None:
        section = offload_section(probe["kv_offloading_size"], backend, per_block,
                                  where="'kv_offloading_size' in the probe")
    if section is not None and probe.get("max_num_inflight_kv_loads") is not None:
        section["max_num_inflight_kv_loads"] = probe["max_num_inflight_kv_loads"]
    return section, note


def offload_flags(cfg: EngineConfig, size_gib: float, backend: str | None = None, tp: int | None = None) -> dict:
    """The ``kv_offload`` section vLLM's ``--kv-offloading-size size_gib --kv-offloading-backend backend``
    gives ``cfg``: sized so, its other keys kept.

    ``tp``: the workers one block's pages span (default: the time model's ``tp``).

    Raises
    ------
    ConfigError
        A bad size or backend, or an engine whose groups do not give a block's bytes.
    """
    from aisim.config.vllm_offload import offload_section, tier_bytes_per_block

    tp = cfg.time_model.tp if tp is None else tp
    return offload_section(size_gib, backend or "native", tier_bytes_per_block(cfg.raw.get("kv_cache_groups"), tp),
                           base=cfg.raw.get("kv_offload"))


def offload_note(cfg: EngineConfig, what: str) -> str:
    """One line on ``cfg``'s KV offload tier: its size and chunks."""
    off = cfg.kv_offload
    size = f"{off.size_gib:g} GiB, " if off.size_gib is not None else ""
    disk = ", a disk tier behind it (TieringOffloadingSpec, fs)" if off.disk_tier else ""
    return f"{what}: vLLM's CPU OffloadingConnector, {size}{off.num_chunks(cfg.block_size):,} chunks{disk}"


def with_offload(cfg: EngineConfig, section: dict, notes: list, what: str) -> tuple[EngineConfig, list[str]]:
    """``cfg`` with the ``kv_offload`` ``section`` and a note saying so; or, when the engine is one the
    offload replay does not model (aisim.config.offload), ``cfg`` without it and a note giving the
    reason."""
    try:
        planned = cfg.replace(kv_offload=section)
    except ConfigError as exc:
        notes = [*notes, f"no KV offload tier: {exc}"]
        return cfg.replace(plan_notes=notes), notes
    notes = [*notes, offload_note(planned, what)]
    return planned.replace(plan_notes=notes), notes


def _plan_probe_engine(probe: dict) -> tuple[EngineConfig, list[str]]:
    """The engine of a probe without its KV offload tier, and the notes."""
    check_probe(probe)
    groups = []
    for g in probe["kv_cache_groups"]:
        groups.append({k: v for k, v in g.items() if k in GROUP_DEFAULTS and v is not None})
    # Unrecorded, the block size is the release's default (the engine configuration fills it in).
    block_size = probe.get("block_size", groups[0].get("block_size") if groups else None)
    raw = {
        "max_model_len": probe["max_model_len"],
        "kv_cache_groups": groups,
    }
    if block_size is not None:
        raw["block_size"] = block_size
    for k in SCHEDULER_KEYS + ("num_gpu_blocks", "kv_cache_bytes", "model", "mamba_cache_mode"):
        if probe.get(k) is not None:
            raw[k] = probe[k]
    version = probe["vllm_version"]
    notes = []
    unmodeled = unmodeled_version_note(version)
    if unmodeled is None:
        raw["vllm_version"] = version
        if probe.get("async_scheduling") is None:
            # Unrecorded, the engine ran the release's start-up default (config/vllm.py
            # VllmConfig.__post_init__ turns SchedulerConfig.async_scheduling on when unset).
            raw["async_scheduling"] = release(version).async_scheduling
            notes.append(f"async scheduling {'on' if raw['async_scheduling'] else 'off'}: vLLM {version}'s "
                         "default (the probe does not record it)")
    else:
        notes.append(unmodeled)
    hash_block = probe.get("hash_block_size_tokens")
    grouped = sum(int(g.get("count", 1)) for g in groups) > 1
    cold = probe_cold_reason(ran_with_prefix_caching=probe.get("enable_prefix_caching", False), grouped=grouped,
                             hash_block=hash_block, version=version)
    if cold is not None:
        notes.append(cold)
    else:
        warm = dict(raw, enable_prefix_caching=True)
        if grouped:
            warm["prefix_match_unit"] = hash_block
        try:
            cfg = engine_config_from_dict(warm, source="the probe")
        except ConfigError as exc:
            cfg = None
            problems = [str(exc)]
        else:
            problems = grouped_prefix_caching_problems(cfg, probe_hash_block=hash_block if grouped else None)
        if not problems:
            notes.insert(0, "prefix caching on: the probed engine ran with it and the grouped-prefix rule passes"
                         if grouped else "prefix caching on, as the probed engine ran")
            cfg = engine_config_from_dict(dict(warm, plan_notes=notes), source="the probe")
            return cfg, notes
        notes.extend(problems)
    notes.insert(0, "prefix caching off (cold replay)")
    cold = dict(raw, enable_prefix_caching=False, plan_notes=notes)
    # Without prefix caching vLLM runs state groups outside align mode.
    cold.pop("mamba_cache_mode", None)
    return engine_config_from_dict(cold, source="the probe"), notes


def serve_batch_defaults(gpu, vllm_version: str | None = None) -> dict:
    """``max_num_batched_tokens`` and ``max_num_seqs`` that ``vllm serve`` picks on ``gpu``.

    vLLM's ``EngineArgs.get_batch_defaults`` (``vllm/engine/arg_utils.py``) for the OpenAI API
    server (``UsageContext.OPENAI_API_SERVER``; the offline ``LLM`` class gets larger token
    budgets): 16,384 tokens and 1,024 sequences from 160 GiB of device memory on, 8,192 and 1,024
    from 70 GiB on unless the GPU is an A100 (or a GB10 where the release says so:
    ``Release.gb10_small_batches``), else 2,048 and 256.
    """
    name = gpu.name.lower()
    if gpu.memory_gib >= 160:
        return {"max_num_batched_tokens": 16384, "max_num_seqs": 1024}
    if gpu.memory_gib >= 70 and "a100" not in name and not (release(vllm_version).gb10_small_batches and "gb10" in name):
        return {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}
    return {"max_num_batched_tokens": 2048, "max_num_seqs": 256}


def plan_from_model(name: str, gpu_memory_gib: float | None = None, tp: int = 1, max_model_len: int | None = None,
                    gpu_memory_utilization: float | None = None, gpu: str | None = None,
                    dtype: str | None = None, vllm_version: str | None = None) -> tuple[EngineConfig, list[str]]:
    """Plan from a model (catalog or ``config.json``): geometry, pool, scheduler limits, step times.

    Parameters
    ----------
    name : str
        Catalog model name or the path of a Hugging Face ``config.json``.
    gpu_memory_gib : float, optional
        Memory of one GPU; default: the memory of ``gpu``.
    tp : int
        Tensor-parallel size (heads and weights are split across GPUs).
    max_model_len : int, optional
        Default: ``vllm serve``'s, the model's context length (:func:`plan_max_model_len`).
    gpu_memory_utilization : float, optional
        Share of the GPU's memory vLLM may use; default: the release's (``Release.gpu_memory_utilization``:
        0.92, or 1.0 where the extensible KV cache is on by default).
    gpu : str, optional
        Catalog GPU: the plan gets the roofline step time of the model on ``tp`` of them and
        ``vllm serve``'s batch limits for that GPU (:func:`serve_batch_defaults`).
    dtype : {"bf16", "fp8"}, optional
        Weights as served; default: the checkpoint's.
    vllm_version : str, optional
        The release ``vllm serve`` runs (default: :data:`aisim.config.versions.DEFAULT_VLLM_VERSION`):
        its start-up defaults (block size, memory share, async scheduling, the batch limits) are the
        plan's, and the plan names it.

    Returns
    -------
    (EngineConfig, list of str)
        The plan and its notes.
    """
    import os

    from aisim.config.catalog import check_tp, get_gpu, get_model, is_config_path
    from aisim.config.geometry import kv_cache_bytes, kv_cache_groups, num_blocks

    if vllm_version is not None and not is_supported(vllm_version):
        raise ConfigError(f"vllm_version must be one of {supported_text(', ')}, got {vllm_version!r}")
    rel = release(vllm_version)
    if gpu_memory_utilization is None:
        gpu_memory_utilization = rel.gpu_memory_utilization
    model = get_model(name)
    if is_config_path(name):
        # Named in the notes by its file and directory, not the absolute path (a plan moves with its files).
        parent = os.path.basename(os.path.dirname(os.path.abspath(name)))
        model = dataclasses.replace(model, name=f"{parent}/{os.path.basename(name)}" if parent else
                                    os.path.basename(name))
    spec = get_gpu(gpu) if gpu is not None else None
    if dtype is not None and dtype not in ("bf16", "fp8"):
        raise ConfigError(f"dtype must be bf16 or fp8, got {dtype!r}")
    if gpu_memory_gib is None:
        if spec is None:
            raise ConfigError("a plan from a model needs a GPU or its memory (--gpu or --gpu-memory-gib)")
        gpu_memory_gib = spec.memory_gib
    if isinstance(gpu_memory_gib, bool) or not isinstance(gpu_memory_gib, (int, float)) \
            or not math.isfinite(gpu_memory_gib) or not gpu_memory_gib > 0:
        raise ConfigError(f"GPU memory must be a finite number of GiB above 0, got {gpu_memory_gib!r}")
    if max_model_len is not None and (not _is_int(max_model_len) or max_model_len < _LOW["max_model_len"]):
        raise ConfigError(f"'max_model_len' must be an integer of at least {_LOW['max_model_len']}, "
                          f"got {max_model_len!r}")
    check_tp(model, tp)
    groups, bs = kv_cache_groups(model, block_size=rel.block_size, prefix_caching=True, tp=tp)
    kv = kv_cache_bytes(model, gpu_memory_gib, tp, gpu_memory_utilization, dtype=dtype)
    blocks = num_blocks(groups, kv) if kv > 0 else 0
    where = f"{gpu_memory_gib:g} GiB" if spec is None else f"{spec.name} ({gpu_memory_gib:g} GiB)"
    if blocks < 2:
        raise ConfigError(f"{model.name} does not fit {where} x TP {tp}: its weights leave "
                          f"{max(kv, 0) / (1 << 30):.1f} GiB for the KV cache")
    grouped = sum(g["count"] for g in groups) > 1
    notes = [f"{model.name} on {where} x TP {tp}: {kv / (1 << 30):.1f} GiB of KV cache at "
             f"gpu_memory_utilization {gpu_memory_utilization:g}, {blocks} blocks of {bs} tokens"]
    model_name = os.path.abspath(name) if is_config_path(name) else model.name
    version = rel.version
    raw = {"model": model_name, "vllm_version": version, "block_size": bs, "num_gpu_blocks": blocks,
           "kv_cache_groups": groups, "async_scheduling": rel.async_scheduling}
    # vllm serve's start-up defaults of the release (config/cache.py CacheConfig, config/vllm.py
    # VllmConfig.__post_init__).
    notes.append(f"vLLM {version} defaults: block size {rel.block_size}, gpu_memory_utilization "
                 f"{rel.gpu_memory_utilization:g}" + (" (the extensible KV cache takes the memory left after the "
                                                   "weights and activations)" if rel.extensible_kv_cache else "")
                 + f", async scheduling {'on' if rel.async_scheduling else 'off'}"
                 + (", the API server in front of the engine" if spec is not None else ""))
    if spec is not None:
        raw.update(serve_batch_defaults(spec, version))
        raw["time_model"] = {"kind": "roofline", "gpu": spec.name, "tp": tp}
        if dtype is not None:
            raw["time_model"]["dtype"] = dtype
        notes.append(f"step times: roofline of {model.name} on {tp} x {spec.name} "
                     f"({dtype or model.dtype} weights); batch limits of vllm serve on {spec.name}: "
                     f"{raw['max_num_batched_tokens']} tokens, {raw['max_num_seqs']} sequences")
        kernel = expert_kernel(model, tp, spec, dtype or model.dtype)  # as the roofline prices the experts
        if kernel is not None:
            rate = "FP8" if kernel.fp8 else "BF16"
            notes.append(f"routed experts at {kernel.share:.2f} of the achievable {rate} matmul rate: vLLM's "
                         f"fused-MoE kernel with {kernel.n:g} columns an expert a GPU (aisim/perf/moe_kernel.py)")
    cold = catalog_cold_reason(grouped)
    if cold is not None:
        notes.insert(0, f"prefix caching off (cold replay): {cold}")
        raw["enable_prefix_caching"] = False
    else:
        notes.insert(0, "prefix caching on (one KV-cache group)")
    raw["max_model_len"], note = plan_max_model_len(model, raw, max_model_len, where, tp)
    notes.insert(2, note)  # after the pool it is cut to
    raw["plan_notes"] = notes
    return engine_config_from_dict(raw, source=f"the model {model.name}"), notes


def plan_max_model_len(model, raw: dict, asked: int | None, where: str, tp: int) -> tuple[int, str]:
    """The plan's ``max_model_len`` and its note: the one ``vllm serve`` would start with.

    Unset, vLLM takes the model's context length (``vllm/config/model.py``
    ``_get_and_verify_max_len``; :attr:`ModelSpec.context_len`); a spec without one keeps the
    engine default.  A length above the model's is refused, as vLLM refuses it.  vLLM will not
    start when one request of ``max_model_len`` does not fit the KV cache
    (``vllm/v1/core/kv_cache_utils.py`` ``check_enough_kv_cache_memory``, whose error names the
    longest that fits): a length asked for is then refused with that estimate; the model's own
    length is cut to it, as ``--max-model-len -1`` (auto-fit, vLLM 0.32) does.
    """
    from aisim.config.rule import longest_startup_len

    context, field = model.context_len, model.context_key
    if asked is not None and context and asked > context:
        raise ConfigError(f"max_model_len {asked:,} exceeds {model.name}'s {context:,} tokens ({field}); "
                          "vLLM refuses a longer one")
    length = asked or context or _ENGINE_DEFAULTS["max_model_len"]
    # The pool's geometry at this length, before vLLM's start-up check, which is what this decides.
    cfg = engine_config_from_dict({**raw, "max_model_len": length, "startup_check": False},
                                  source=f"the model {model.name}")
    fits = longest_startup_len(cfg)
    if fits >= length:
        if asked is not None:
            return length, f"max_model_len {length:,} (asked for)"
        if context:
            return length, f"max_model_len {length:,}: {model.name}'s context ({field}), vllm serve's default"
        return length, f"max_model_len {length:,}: aisim's default ({model.name} names no context length)"
    if fits < _LOW["max_model_len"] or asked is not None:
        raise ConfigError(f"one request of max_model_len {length:,} needs more KV cache than {where} x TP {tp} "
                          f"leaves ({raw['num_gpu_blocks']} blocks of {raw['block_size']} tokens); vLLM would not "
                          f"start: the longest that fits is {fits:,} (--max-model-len)")
    return fits, (f"max_model_len {fits:,}: {model.name}'s context of {length:,} tokens does not fit one request in "
                  f"the KV cache, so vllm serve would not start with its default; {fits:,} is the longest that "
                  "fits, the estimate its start-up error names")


def engine_toml(cfg: EngineConfig, notes, base_dir: str | os.PathLike | None = None) -> str:
    """The plan as an engine configuration file, its notes as comments and ``plan_notes``.

    ``base_dir``: the directory the file is written to (default: the current one).  A path the
    plan names (a model's ``config.json``, a profile table) is written relative to it, as the
    configuration loader reads it (:func:`aisim.config.engine.engine_config_from_dict`: relative
    to the file), so the plan moves with its files and loads from any directory.
    """
    base = os.path.abspath(base_dir if base_dir is not None else os.getcwd())
    d = cfg.to_dict()
    doc = {k: d[k] for k in (
        "model", "vllm_version", "num_gpu_blocks", "block_size", "max_model_len", "max_num_seqs",
        "max_num_batched_tokens", "enable_prefix_caching", "enable_chunked_prefill", "prefix_match_unit",
        "mamba_cache_mode", "async_scheduling", "plan_notes")}
    if cfg.vllm_version is None:
        doc.pop("vllm_version")
    if not any(g["type"] in STATE_KINDS for g in d["resolved_groups"]):
        doc.pop("mamba_cache_mode")
    doc["plan_notes"] = list(notes)  # the notes the comments carry, --set and offload lines included
    doc["time_model"] = cfg.time_model.relevant()
    for part, key in ((doc, "model"), (doc["time_model"], "model"), (doc["time_model"], "path")):
        if isinstance(part.get(key), str) and os.path.isabs(part[key]):
            part[key] = os.path.relpath(part[key], base).replace(os.sep, "/")
    doc["kv_cache_groups"] = [dict(g) for g in d["kv_cache_groups"]]
    for k in cfg.raw:  # any other key the plan declares (aisim plan --set): written, never dropped
        if k not in doc and d.get(k) is not None:
            doc[k] = d[k]
    if cfg.kv_offload is not None:  # the section as a file writes it: no disk tier's keys without the disk tier
        doc["kv_offload"] = cfg.kv_offload.to_dict()
    return dumps(doc, header_comments=["Engine configuration planned by aisim."] + list(notes))
