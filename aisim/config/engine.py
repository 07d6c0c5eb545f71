"""The engine configuration of a replay.

Keys are vLLM's own names (``SchedulerConfig``, ``CacheConfig``) so that a
configuration reads like the engine it models; defaults are those of the
recorded oracle scenarios (vLLM's ``SchedulerConfig``/``CacheConfig`` with an
explicit block count).  Loading is strict: an unknown key, a wrong type or an
out-of-range value is a :class:`~aisim.errors.ConfigError` naming the key and
the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace

from aisim.errors import ConfigError

SUPPORTED_VLLM_VERSIONS = ("0.31.0", "0.32.0")
DEFAULT_VLLM_VERSION = "0.32.0"


@dataclass(frozen=True)
class TimeModel:
    """How long an engine step takes (:mod:`aisim.perf`).

    ``kind = "linear"``: ``base_s + per_token_s * tokens + per_req_s * requests``.
    ``kind = "roofline"``: from catalog ``gpu`` and ``model`` specs at tensor
    parallelism ``tp``, with compute and bandwidth efficiencies and a fixed
    ``overhead_s``.  ``kind = "table"``: a profile of measured forward passes
    at ``path`` (CSV or Parquet; relative to the configuration file).
    """

    kind: str = "linear"
    base_s: float = 0.01
    per_token_s: float = 0.0
    per_req_s: float = 0.0
    gpu: str | None = None
    model: str | None = None
    tp: int = 1
    overhead_s: float = 0.002
    compute_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    path: str | None = None


@dataclass(frozen=True)
class EngineConfig:
    """A vLLM engine as aisim replays it.

    Parameters
    ----------
    num_gpu_blocks : int
        Blocks in the shared KV-cache pool, including vLLM's null block 0.
    block_size : int
        Tokens per KV-cache block (``CacheConfig.block_size``).
    max_num_seqs, max_num_batched_tokens, max_model_len : int
        As in vLLM's ``SchedulerConfig``.
    max_num_scheduled_tokens, max_num_active_seqs : int or None
        Default to ``max_num_batched_tokens`` and ``max_num_seqs``.
    enable_chunked_prefill, enable_prefix_caching : bool
        As in vLLM.
    long_prefill_token_threshold : int
        Per-request per-step cap on new tokens (0 = off).
    long_prefill_token_threshold_adaptive : bool
        Floor the cap at the fair share of the batch.
    policy : {"fcfs", "priority"}
    scheduler_reserve_full_isl : bool
        Admit a waiting request only when its whole sequence fits (vLLM default on).
    watermark : float
        Fraction of blocks kept free when admitting.
    async_scheduling : bool
        vLLM's async engine loop (batch queue of two, output placeholders).
    kv_cache_groups : tuple of dict or None
        None: one full-attention group.  Otherwise the groups in group-id order: ``type`` (full, sliding_window,
        chunked_local, mamba/gdn/kda, ring), optional ``block_size``,
        ``count``, ``sliding_window``, ``attention_chunk_size``,
        ``prefix_cacheable``, ``num_speculative_blocks``,
        ``prefill_checkpoint_blocks``, ``prefill_checkpoint_alignment``,
        ``page_size_bytes`` (one layer's page) and ``num_layers``.
    mamba_cache_mode : {"align", "none"} or None
        Default: "align" with a state group and prefix caching on.
    prefix_match_unit : int or None
        Hash block size of grouped caches (vLLM's ``prefix_match_unit``).
    prefix_cache_retention_interval : int or None
        Engine default 0 (sparse); None keeps every window/state block (dense).
    vllm_version : str or None
        The vLLM release whose rules are followed (0.31.0 or 0.32.0; default 0.32.0).
    time_model : TimeModel
        Step time in seconds.
    model : str or None
        Model name (catalog entries have model-specific rules).
    kv_cache_bytes : int or None
        KV-cache memory; with page sizes it gives ``num_gpu_blocks``.
    plan_notes : tuple of str
        Why a plan chose what it chose (written by ``aisim plan``).
    """

    num_gpu_blocks: int | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_num_scheduled_tokens: int | None = None
    max_num_active_seqs: int | None = None
    max_model_len: int = 32768
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    policy: str = "fcfs"
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    async_scheduling: bool = False
    kv_cache_groups: tuple | None = None
    mamba_cache_mode: str | None = None
    prefix_match_unit: int | None = None
    prefix_cache_retention_interval: int | None = 0
    cache_extra: dict = field(default_factory=dict)
    vllm_version: str | None = None
    time_model: TimeModel = field(default_factory=TimeModel)
    model: str | None = None
    kv_cache_bytes: int | None = None
    plan_notes: tuple = ()
    # Keys the configuration set explicitly (not a configuration key).
    declared: frozenset = field(default=frozenset(), compare=False, repr=False)

    # ------------------------------------------------------------------ derived
    @property
    def groups(self) -> tuple:
        """The configured KV-cache groups, or one full-attention group."""
        return self.kv_cache_groups if self.kv_cache_groups is not None else ({"type": "full"},)

    @property
    def version(self) -> str:
        """``vllm_version`` with the default filled in."""
        return self.vllm_version or DEFAULT_VLLM_VERSION

    @property
    def token_budget(self) -> int:
        """Per-step token budget (``max_num_scheduled_tokens``)."""
        if self.max_num_scheduled_tokens is None:
            return self.max_num_batched_tokens
        return self.max_num_scheduled_tokens

    @property
    def active_seqs(self) -> int:
        """Admission cap into RUNNING (``max_num_active_seqs``)."""
        return self.max_num_seqs if self.max_num_active_seqs is None else self.max_num_active_seqs

    @property
    def resolved_mamba_cache_mode(self) -> str:
        """``mamba_cache_mode`` with vLLM's default filled in."""
        if self.mamba_cache_mode is not None:
            return self.mamba_cache_mode
        from aisim.config.kvgroups import STATE_KINDS, expand_groups

        has_state = any(g["type"] in STATE_KINDS for g in expand_groups(self.groups))
        return "align" if has_state and self.enable_prefix_caching else "none"

    @property
    def watermark_blocks(self) -> int:
        """``int(watermark * num_gpu_blocks)`` as vLLM's KVCacheManager computes it."""
        return int(self.watermark * self.num_gpu_blocks)

    def to_dict(self) -> dict:
        """The resolved configuration, every default filled in."""
        from aisim.config.kvgroups import expand_groups

        d = asdict(self)
        d.pop("declared", None)
        d["kv_cache_groups"] = [{k: v for k, v in g.items() if v is not None} for g in
                                ({**gr} for gr in self.groups)]
        d["resolved_groups"] = [{k: v for k, v in g.items() if v is not None} for g in expand_groups(self.groups)]
        d["max_num_scheduled_tokens"] = self.token_budget
        d["max_num_active_seqs"] = self.active_seqs
        d["vllm_version"] = self.version
        d["mamba_cache_mode"] = self.resolved_mamba_cache_mode
        d["plan_notes"] = list(self.plan_notes)
        d["cache_extra"] = dict(self.cache_extra)
        return d


_INT_KEYS = {
    "num_gpu_blocks": 2,
    "kv_cache_bytes": 1,
    "block_size": 1,
    "max_num_seqs": 1,
    "max_num_batched_tokens": 1,
    "max_num_scheduled_tokens": 1,
    "max_num_active_seqs": 1,
    "max_model_len": 1,
    "long_prefill_token_threshold": 0,
}
_BOOL_KEYS = (
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "long_prefill_token_threshold_adaptive",
    "scheduler_reserve_full_isl",
    "async_scheduling",
)
_GROUP_KEYS = {"type", "block_size", "count", "sliding_window", "attention_chunk_size"}
_TIME_KEYS = {f.name for f in fields(TimeModel)}


def _where(source: str | None) -> str:
    return f" in {source}" if source else ""


def engine_config_from_dict(raw: dict, source: str | None = None) -> EngineConfig:
    """Validate ``raw`` strictly and build an :class:`EngineConfig`.

    Parameters
    ----------
    raw : dict
        Keys with vLLM's names.
    source : str, optional
        File the dictionary came from, named in error messages.

    Raises
    ------
    ConfigError
        For an unknown key, a wrong type or an out-of-range value.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"engine configuration{_where(source)} must be a mapping of keys to values")
    known = {f.name for f in fields(EngineConfig)} - {"declared"}
    for key in raw:
        if key not in known:
            raise ConfigError(f"unknown key '{key}'{_where(source)}; known keys: {', '.join(sorted(known))}")
    if raw.get("num_gpu_blocks") is None and raw.get("kv_cache_bytes") is None:
        raise ConfigError(f"missing capacity{_where(source)}: set 'num_gpu_blocks' or 'kv_cache_bytes'")
    kw = dict(raw)
    for key, low in _INT_KEYS.items():
        if key not in kw or (kw[key] is None and key in ("max_num_scheduled_tokens", "max_num_active_seqs",
                                                         "kv_cache_bytes")):
            continue
        v = kw[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"'{key}'{_where(source)} must be an integer, got {v!r}")
        if v < low:
            raise ConfigError(f"'{key}'{_where(source)} must be at least {low}, got {v}")
    for key in _BOOL_KEYS:
        if key in kw and not isinstance(kw[key], bool):
            raise ConfigError(f"'{key}'{_where(source)} must be true or false, got {kw[key]!r}")
    if "watermark" in kw:
        w = kw["watermark"]
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w < 1.0:
            raise ConfigError(f"'watermark'{_where(source)} must be a number in [0, 1), got {w!r}")
        kw["watermark"] = float(w)
    if kw.get("policy", "fcfs") not in ("fcfs", "priority"):
        raise ConfigError(f"'policy'{_where(source)} must be 'fcfs' or 'priority', got {kw['policy']!r}")
    version = kw.get("vllm_version")
    if version is not None and version not in SUPPORTED_VLLM_VERSIONS:
        raise ConfigError(
            f"'vllm_version'{_where(source)} must be one of {', '.join(SUPPORTED_VLLM_VERSIONS)}, got {version!r}"
        )
    tm = kw.get("time_model", {})
    if not isinstance(tm, dict):
        raise ConfigError(f"'time_model'{_where(source)} must be a mapping")
    kw["time_model"] = _time_model(tm, source)
    if kw.get("kv_cache_groups") is not None:
        kw["kv_cache_groups"] = _groups(kw["kv_cache_groups"], kw, source)
    notes = kw.get("plan_notes", ())
    if not isinstance(notes, (list, tuple)) or not all(isinstance(n, str) for n in notes):
        raise ConfigError(f"'plan_notes'{_where(source)} must be a list of strings")
    kw["plan_notes"] = tuple(notes)
    if kw.get("model") is not None and not isinstance(kw["model"], str):
        raise ConfigError(f"'model'{_where(source)} must be a string")
    extra = kw.get("cache_extra", {})
    if not isinstance(extra, dict):
        raise ConfigError(f"'cache_extra'{_where(source)} must be a mapping")
    for k, v in extra.items():
        # The oracle's spelling of two cache-config fields.
        if k not in ("prefix_cache_retention_interval", "prefix_match_unit"):
            raise ConfigError(f"unknown key 'cache_extra.{k}'{_where(source)}")
        if k in kw and kw[k] != v:
            raise ConfigError(f"'{k}'{_where(source)} is given twice with different values")
        kw[k] = v
    kw["cache_extra"] = dict(extra)
    unit = kw.get("prefix_match_unit")
    if unit is not None and (isinstance(unit, bool) or not isinstance(unit, int) or unit < 1):
        raise ConfigError(f"'prefix_match_unit'{_where(source)} must be a positive integer, got {unit!r}")
    kw["declared"] = frozenset(raw) | frozenset(k for k in extra)
    cfg = EngineConfig(**kw)
    if cfg.num_gpu_blocks is None:
        from aisim.config.kvgroups import block_bytes

        per_block = block_bytes(cfg)
        if per_block <= 0:
            raise ConfigError(f"'kv_cache_bytes'{_where(source)} needs 'page_size_bytes' on the KV-cache groups "
                              "to give a block count; or set 'num_gpu_blocks'")
        cfg = replace(cfg, num_gpu_blocks=cfg.kv_cache_bytes // per_block)
        if cfg.num_gpu_blocks < 2:
            raise ConfigError(f"'kv_cache_bytes' ({cfg.kv_cache_bytes}){_where(source)} holds "
                              f"{cfg.num_gpu_blocks} block(s) of {per_block} bytes; at least 2 are needed")
    _check_relations(cfg, source)
    from aisim.config.rule import check_engine

    check_engine(cfg, source)
    return cfg


def _time_model(tm: dict, source) -> TimeModel:
    out = {}
    for k, v in tm.items():
        if k not in _TIME_KEYS:
            raise ConfigError(f"unknown key 'time_model.{k}'{_where(source)}; known keys: {', '.join(sorted(_TIME_KEYS))}")
        if k in ("kind", "gpu", "model", "path"):
            if not isinstance(v, str):
                raise ConfigError(f"'time_model.{k}'{_where(source)} must be a string, got {v!r}")
            out[k] = v
        elif k == "tp":
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"'time_model.tp'{_where(source)} must be a positive integer, got {v!r}")
            out[k] = v
        else:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"'time_model.{k}'{_where(source)} must be a non-negative number, got {v!r}")
            out[k] = float(v)
    kind = out.get("kind", "linear")
    if kind not in ("linear", "roofline", "table"):
        raise ConfigError(f"'time_model.kind'{_where(source)} must be linear, roofline or table, got {kind!r}")
    for k in ("compute_efficiency", "bandwidth_efficiency"):
        if k in out and not 0 < out[k] <= 1:
            raise ConfigError(f"'time_model.{k}'{_where(source)} must be in (0, 1], got {out[k]}")
    if kind == "roofline":
        from aisim.config.catalog import get_gpu, get_model

        for k in ("gpu", "model"):
            if k not in out:
                raise ConfigError(f"'time_model.{k}'{_where(source)} is required by the roofline model")
        try:
            get_gpu(out["gpu"])
            get_model(out["model"])
        except ConfigError as exc:
            raise ConfigError(f"'time_model'{_where(source)}: {exc}") from None
    if kind == "table":
        if "path" not in out:
            raise ConfigError(f"'time_model.path'{_where(source)} is required by the table model")
        if source and not os.path.isabs(out["path"]) and os.path.exists(os.path.dirname(os.path.abspath(source))):
            out["path"] = os.path.join(os.path.dirname(os.path.abspath(source)), out["path"])
    return TimeModel(**out)


def _groups(groups, kw, source):
    from aisim.config.kvgroups import GROUP_DEFAULTS, GROUP_KINDS

    if not isinstance(groups, (list, tuple)) or not groups:
        raise ConfigError(f"'kv_cache_groups'{_where(source)} must be a non-empty list of groups")
    out = []
    for i, g in enumerate(groups):
        where = f"'kv_cache_groups[{i}]'{_where(source)}"
        if not isinstance(g, dict):
            raise ConfigError(f"{where} must be a mapping")
        for k in g:
            if k not in GROUP_DEFAULTS:
                raise ConfigError(f"unknown key 'kv_cache_groups[{i}].{k}'{_where(source)}; "
                                  f"known keys: {', '.join(GROUP_DEFAULTS)}")
        kind = g.get("type")
        if kind not in GROUP_KINDS:
            raise ConfigError(f"'kv_cache_groups[{i}].type'{_where(source)} must be one of "
                              f"{', '.join(GROUP_KINDS)}, got {kind!r}")
        for k in ("block_size", "count", "sliding_window", "attention_chunk_size", "num_speculative_blocks",
                  "prefill_checkpoint_blocks", "prefill_checkpoint_alignment", "page_size_bytes", "num_layers"):
            v = g.get(k)
            low = 0 if k in ("num_speculative_blocks", "prefill_checkpoint_blocks") else 1
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
                raise ConfigError(f"'kv_cache_groups[{i}].{k}'{_where(source)} must be an integer "
                                  f">= {low}, got {v!r}")
        if "prefix_cacheable" in g and not isinstance(g["prefix_cacheable"], bool):
            raise ConfigError(f"'kv_cache_groups[{i}].prefix_cacheable'{_where(source)} must be true or false")
        if kind == "sliding_window" and not g.get("sliding_window"):
            raise ConfigError(f"'kv_cache_groups[{i}].sliding_window'{_where(source)} is required for a "
                              "sliding_window group")
        if kind == "chunked_local" and not g.get("attention_chunk_size"):
            raise ConfigError(f"'kv_cache_groups[{i}].attention_chunk_size'{_where(source)} is required "
                              "for a chunked_local group")
        out.append(dict(g))
    return tuple(out)


def _check_relations(cfg: EngineConfig, source):
    # vllm/config/scheduler.py SchedulerConfig.verify_max_model_len
    if cfg.max_num_batched_tokens < cfg.max_num_seqs:
        raise ConfigError(
            f"'max_num_batched_tokens' ({cfg.max_num_batched_tokens}){_where(source)} must be at least "
            f"'max_num_seqs' ({cfg.max_num_seqs})"
        )
    if not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
        raise ConfigError(
            f"'max_num_batched_tokens' ({cfg.max_num_batched_tokens}){_where(source)} must be at least "
            f"'max_model_len' ({cfg.max_model_len}) when 'enable_chunked_prefill' is false"
        )
    if cfg.long_prefill_token_threshold > cfg.max_model_len:
        raise ConfigError(
            f"'long_prefill_token_threshold' ({cfg.long_prefill_token_threshold}){_where(source)} must not "
            f"exceed 'max_model_len' ({cfg.max_model_len})"
        )
    if cfg.active_seqs > cfg.max_num_seqs:
        raise ConfigError(f"'max_num_active_seqs'{_where(source)} must not exceed 'max_num_seqs'")
    if cfg.token_budget > cfg.max_num_batched_tokens:
        raise ConfigError(f"'max_num_scheduled_tokens'{_where(source)} must not exceed 'max_num_batched_tokens'")
    if cfg.mamba_cache_mode not in (None, "none", "align"):
        raise ConfigError(f"'mamba_cache_mode'{_where(source)} must be 'align' or 'none', got {cfg.mamba_cache_mode!r}")
    from aisim.config.kvgroups import expand_groups

    groups = expand_groups(cfg.groups)
    unit = cfg.prefix_match_unit
    if unit is not None and len(groups) == 1 and unit != cfg.block_size and cfg.enable_prefix_caching:
        # vllm resolve_kv_cache_block_sizes: one group hashes at its block size.
        raise ConfigError(
            f"'prefix_match_unit' ({unit}){_where(source)} must equal 'block_size' "
            f"({cfg.block_size}) for a single KV-cache group"
        )
    if len(groups) > 1 and cfg.enable_prefix_caching and cfg.resolved_mamba_cache_mode == "align":
        sizes = [g["block_size"] or cfg.block_size for g in groups]
        if unit is not None and any(s % unit for s in sizes):
            raise ConfigError(f"'prefix_match_unit' ({unit}){_where(source)} must divide every group's "
                              f"block size {sizes}")
    r = cfg.prefix_cache_retention_interval
    if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 0):
        raise ConfigError(f"'prefix_cache_retention_interval'{_where(source)} must be null or an integer >= 0")


def read_config_file(path: str | os.PathLike, named_by: str = "") -> dict:
    """An engine configuration file (JSON, TOML or YAML) as a raw dictionary.

    Parameters
    ----------
    path : path-like
        ``.json``, ``.toml`` or ``.yaml``/``.yml``.
    named_by : str
        Who named the file (a spec key), for error messages.
    """
    path = os.fspath(path)
    by = f" (named by {named_by})" if named_by else ""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read engine configuration {path}{by}: {exc.strerror}") from None
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext == ".toml":
            import tomllib

            raw = tomllib.loads(data.decode("utf-8"))
        elif ext in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(data)
        else:
            raw = json.loads(data)
    except ImportError:
        raise ConfigError(f"{path}: reading YAML needs the 'pyyaml' package") from None
    except Exception as exc:  # parse errors of any of the three formats
        raise ConfigError(f"{path}: not valid {ext.lstrip('.') or 'JSON'}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"engine configuration {path} must be a mapping of keys to values")
    return raw


def load_engine_config(path: str | os.PathLike) -> EngineConfig:
    """Read an engine configuration file (JSON, TOML or YAML) strictly.

    Parameters
    ----------
    path : path-like
        ``.json``, ``.toml`` or ``.yaml``/``.yml``.

    Returns
    -------
    EngineConfig
    """
    path = os.fspath(path)
    return engine_config_from_dict(read_config_file(path), source=path)
