"""The engine configuration of a replay.

Keys are vLLM's own names (``SchedulerConfig``, ``CacheConfig``) so that a
configuration reads like the engine it models; keys, defaults and meanings are
the catalogue :mod:`aisim.config.keys` (defaults are those of the recorded
oracle scenarios: vLLM's ``SchedulerConfig``/``CacheConfig`` with an explicit
block count).  :func:`engine_config_from_dict` is the one way to an
:class:`EngineConfig`: loading is strict (an unknown key, a wrong type or an
out-of-range value is a :class:`~aisim.errors.ConfigError` naming the key and
the file) and every configuration passes the rules of :mod:`aisim.config.rule`.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import InitVar, asdict, dataclass, field

from aisim.config.keys import ENGINE_KEYS, TIME_MODEL_KEYS, check_high, defaults, key, refuse_inert, refuse_unknown
from aisim.config.keys import where as _where
from aisim.config.versions import DEFAULT_VLLM_VERSION, SUPPORTED_VLLM_VERSIONS, release
from aisim.errors import ConfigError
from aisim.textin import decode_utf8, loads_json, loads_yaml, read_bytes

_D = defaults(ENGINE_KEYS)
_T = defaults(TIME_MODEL_KEYS)
# Passed by engine_config_from_dict only: an EngineConfig exists only once the rules passed.
_FACTORY = object()
_USE_FACTORY = ("an EngineConfig is built by engine_config_from_dict(raw, source) (or EngineConfig.from_dict), "
                "which applies the defaults and the configuration rules; change one with cfg.replace(**changes)")


@dataclass(frozen=True)
class TimeModel:
    """How long an engine step takes (:mod:`aisim.perf`).

    ``kind = "linear"``: ``base_s + per_token_s * tokens + per_req_s * requests``.
    ``kind = "roofline"`` (the default once a ``gpu`` is named): ``model`` (a catalog
    model or a ``config.json`` path; default: the engine's ``model``) on ``tp`` GPUs
    ``gpu`` with ``dtype`` weights: each operator of a step at its own roofline, with
    fitted efficiencies and the CPU's ``overhead_s``, ``overhead_per_req_s`` and (``tp`` > 1)
    ``executor_per_req_s``
    (:mod:`aisim.perf.roofline`).  ``kind = "table"``: a profile of
    measured forward passes at ``path`` (CSV or Parquet; relative to the
    configuration file).  Defaults: :data:`aisim.config.keys.TIME_MODEL_KEYS`.
    """

    kind: str = _T["kind"]
    base_s: float = _T["base_s"]
    per_token_s: float = _T["per_token_s"]
    per_req_s: float = _T["per_req_s"]
    gpu: str | None = _T["gpu"]
    model: str | None = _T["model"]
    tp: int = _T["tp"]
    dtype: str | None = _T["dtype"]
    overhead_s: float = _T["overhead_s"]
    overhead_per_req_s: float = _T["overhead_per_req_s"]
    executor_per_req_s: float = _T["executor_per_req_s"]
    compute_efficiency: float = _T["compute_efficiency"]
    attention_efficiency: float = _T["attention_efficiency"]
    bandwidth_efficiency: float = _T["bandwidth_efficiency"]
    layer_overhead_s: float = _T["layer_overhead_s"]
    triton_group_quant: bool = _T["triton_group_quant"]
    time_scale: float = _T["time_scale"]
    calibration: dict | None = _T["calibration"]
    path: str | None = _T["path"]
    frontend: bool = _T["frontend"]
    frontend_per_request_s: float = _T["frontend_per_request_s"]
    frontend_per_token_s: float = _T["frontend_per_token_s"]

    def relevant(self) -> dict:
        """The keys that shape this kind of time model, in catalogue order (``None`` left out): those
        whose :attr:`~aisim.config.keys.ConfigKey.kinds` hold it; the API server's costs only when it is
        on, the time scale only when it scales, the Triton quantization only when on."""
        keep = [k.name for k in TIME_MODEL_KEYS if k.kinds is None or self.kind in k.kinds]
        if not self.frontend:
            keep = [k for k in keep if k not in ("frontend_per_request_s", "frontend_per_token_s")]
        if self.time_scale == 1.0:
            keep.remove("time_scale")
        if not self.triton_group_quant and "triton_group_quant" in keep:
            keep.remove("triton_group_quant")
        return {k: getattr(self, k) for k in keep if getattr(self, k) is not None}


@dataclass(frozen=True)
class EngineConfig:
    """A vLLM engine as aisim replays it, validated.

    Built only by :func:`engine_config_from_dict` (also
    :meth:`EngineConfig.from_dict`), which applies every default and the
    configuration rules (:mod:`aisim.config.rule`); direct construction and
    ``dataclasses.replace`` raise :class:`TypeError`.  :meth:`replace` gives a
    changed configuration through the same factory.  Keys, defaults and
    meanings: :data:`aisim.config.keys.ENGINE_KEYS`.

    Parameters
    ----------
    num_gpu_blocks : int
        Blocks in the shared KV-cache pool, including vLLM's null block 0
        (derived from ``kv_cache_bytes`` when only that is given).
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
    cache_aware_admission_window : int
        FCFS admission's look-ahead by cached prefix (vLLM 0.34.0 on; 0 = arrival order).
    cache_aware_admission_threshold : float
        KV usage from which the window applies.
    scheduler_extra : dict
        The oracle's spelling of the two keys above.
    kv_cache_groups : tuple of dict or None
        None: one full-attention group.  Otherwise the groups in group-id
        order; keys :data:`aisim.config.keys.GROUP_KEYS`, kinds
        :data:`aisim.config.kvgroups.KINDS`.
    mamba_cache_mode : {"align", "none"} or None
        Default: "align" with a state group and prefix caching on.
    prefix_match_unit : int or None
        Hash block size of grouped caches (vLLM's ``prefix_match_unit``).
    prefix_cache_retention_interval : int or None
        Engine default 0 (sparse); None keeps every window/state block (dense).
    cache_extra : dict
        The oracle's spelling of the two keys above.
    vllm_version : str or None
        The vLLM release whose rules are followed (:mod:`aisim.config.versions`).
    time_model : TimeModel
        Step time in seconds.
    kv_offload : aisim.config.offload.OffloadConfig or None
        KV offload behind the GPU cache (vLLM's CPU ``OffloadingConnector``).
    speculative : aisim.config.speculative.SpeculativeConfig or None
        Speculative decoding (``num_speculative_tokens``, ``method``,
        ``acceptance``, ``drafter_cost``); None: off.
    model : str or None
        Model name (catalog entries have model-specific rules).
    kv_cache_bytes : int or None
        KV-cache memory; with page sizes it gives ``num_gpu_blocks``.
    startup_check : bool
        True: a pool that cannot hold one request of ``max_model_len`` is
        refused, as vLLM refuses to start (:func:`aisim.config.rule.check_capacity`);
        False only for a scheduler built without the engine's start-up.
    plan_notes : tuple of str
        Why a plan chose what it chose (written by ``aisim plan``).
    declared : frozenset of str
        Keys the configuration set explicitly (the rule's "is it set" checks).
    raw : dict
        The configuration as given, which :meth:`replace` re-validates.
    source : str or None
        Where it came from, named in error messages.
    """

    num_gpu_blocks: int | None = _D["num_gpu_blocks"]
    block_size: int = _D["block_size"]
    max_num_seqs: int = _D["max_num_seqs"]
    max_num_batched_tokens: int = _D["max_num_batched_tokens"]
    max_num_scheduled_tokens: int | None = _D["max_num_scheduled_tokens"]
    max_num_active_seqs: int | None = _D["max_num_active_seqs"]
    max_model_len: int = _D["max_model_len"]
    enable_chunked_prefill: bool = _D["enable_chunked_prefill"]
    enable_prefix_caching: bool = _D["enable_prefix_caching"]
    long_prefill_token_threshold: int = _D["long_prefill_token_threshold"]
    long_prefill_token_threshold_adaptive: bool = _D["long_prefill_token_threshold_adaptive"]
    policy: str = _D["policy"]
    scheduler_reserve_full_isl: bool = _D["scheduler_reserve_full_isl"]
    watermark: float = _D["watermark"]
    async_scheduling: bool = _D["async_scheduling"]
    cache_aware_admission_window: int = _D["cache_aware_admission_window"]
    cache_aware_admission_threshold: float = _D["cache_aware_admission_threshold"]
    scheduler_extra: dict = field(default_factory=dict)
    kv_cache_groups: tuple | None = _D["kv_cache_groups"]
    mamba_cache_mode: str | None = _D["mamba_cache_mode"]
    prefix_match_unit: int | None = _D["prefix_match_unit"]
    prefix_cache_retention_interval: int | None = _D["prefix_cache_retention_interval"]
    cache_extra: dict = field(default_factory=dict)
    vllm_version: str | None = _D["vllm_version"]
    time_model: TimeModel = field(default_factory=TimeModel)
    speculative: object = _D["speculative"]
    kv_offload: object = _D["kv_offload"]
    model: str | None = _D["model"]
    kv_cache_bytes: int | None = _D["kv_cache_bytes"]
    startup_check: bool = _D["startup_check"]
    plan_notes: tuple = _D["plan_notes"]
    # What the configuration set explicitly, and where it came from (not configuration keys).
    declared: frozenset = field(default=frozenset(), compare=False, repr=False)
    raw: dict = field(default_factory=dict, compare=False, repr=False)
    source: str | None = field(default=None, compare=False, repr=False)
    _token: InitVar[object] = None

    def __post_init__(self, _token):
        # The one way in is the factory, so no configuration skips the rules.
        if _token is not _FACTORY:
            raise TypeError(_USE_FACTORY)

    @classmethod
    def from_dict(cls, raw: dict, source: str | None = None) -> EngineConfig:
        """:func:`engine_config_from_dict`."""
        return engine_config_from_dict(raw, source)

    def replace(self, **changes) -> EngineConfig:
        """This configuration with ``changes``, validated again by the factory.

        The declared keys (``raw``) plus ``changes`` go through
        :func:`engine_config_from_dict`; a changed key becomes declared.

        Raises
        ------
        ConfigError
            When the changed configuration breaks a rule.
        """
        raw = copy.deepcopy(self.raw)
        extras = [raw.get("cache_extra"), raw.get("scheduler_extra")]
        for k, v in changes.items():
            for extra in extras:
                if isinstance(extra, dict) and k in extra:  # one value for a key spelt both ways
                    extra[k] = v
            raw[k] = v
        return engine_config_from_dict(raw, self.source)

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
    def usable_blocks(self) -> int:
        """Blocks requests can hold: the pool less block 0, the null block vLLM's ``BlockPool`` keeps."""
        return self.num_gpu_blocks - 1

    @property
    def watermark_blocks(self) -> int:
        """``int(watermark * num_gpu_blocks)`` as vLLM's KVCacheManager computes it."""
        return int(self.watermark * self.num_gpu_blocks)

    def to_dict(self) -> dict:
        """The resolved configuration, every default filled in."""
        from aisim.config.kvgroups import expand_groups

        d = asdict(self)
        for k in ("declared", "raw", "source"):
            d.pop(k)
        d["kv_cache_groups"] = [{k: v for k, v in g.items() if v is not None} for g in
                                ({**gr} for gr in self.groups)]
        d["resolved_groups"] = [{k: v for k, v in g.items() if v is not None} for g in expand_groups(self.groups)]
        d["max_num_scheduled_tokens"] = self.token_budget
        d["max_num_active_seqs"] = self.active_seqs
        d["vllm_version"] = self.version
        d["mamba_cache_mode"] = self.resolved_mamba_cache_mode
        d["plan_notes"] = list(self.plan_notes)
        d["cache_extra"] = dict(self.cache_extra)
        d["scheduler_extra"] = dict(self.scheduler_extra)
        return d


_LOW = {k.name: k.low for k in ENGINE_KEYS}
_ENGINE_KEY = {k.name: k for k in ENGINE_KEYS}
# Integer keys checked by type and lower bound, in the order they are checked.
_INT_KEYS = {k: _LOW[k] for k in ("num_gpu_blocks", "kv_cache_bytes", "block_size", "max_num_seqs",
                                  "max_num_batched_tokens", "max_num_scheduled_tokens", "max_num_active_seqs",
                                  "max_model_len", "long_prefill_token_threshold",
                                  "cache_aware_admission_window")}
_NULLABLE_INT_KEYS = ("max_num_scheduled_tokens", "max_num_active_seqs", "kv_cache_bytes")
_BOOL_KEYS = tuple(k.name for k in ENGINE_KEYS if isinstance(k.default, bool))
_KNOWN = frozenset(k.name for k in ENGINE_KEYS)
_TIME_KEYS = {k.name for k in TIME_MODEL_KEYS}


def engine_config_from_dict(raw: dict, source: str | None = None) -> EngineConfig:
    """Validate ``raw`` strictly and build an :class:`EngineConfig`.

    Parameters
    ----------
    raw : dict
        Keys with vLLM's names.
    source : str, optional
        File the dictionary came from, named in error messages.

    Returns
    -------
    EngineConfig
        Every default applied, ``num_gpu_blocks`` derived from
        ``kv_cache_bytes`` when only that is given, and the configuration rules
        (:func:`aisim.config.rule.check_engine`) passed.

    Raises
    ------
    ConfigError
        For an unknown key, a wrong type, an out-of-range value or a
        configuration the rules refuse.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"engine configuration{_where(source)} must be a mapping of keys to values")
    refuse_unknown(raw, sorted(_KNOWN), "", _where(source))
    if raw.get("num_gpu_blocks") is None and raw.get("kv_cache_bytes") is None:
        raise ConfigError(f"missing capacity{_where(source)}: set 'num_gpu_blocks' or 'kv_cache_bytes'")
    kw = dict(raw)
    for key, low in _INT_KEYS.items():
        if key not in kw or (kw[key] is None and key in _NULLABLE_INT_KEYS):
            continue
        v = kw[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"'{key}'{_where(source)} must be an integer, got {v!r}")
        if v < low:
            raise ConfigError(f"'{key}'{_where(source)} must be at least {low}, got {v}")
        check_high(_ENGINE_KEY[key], v, "", _where(source))
    for key in _BOOL_KEYS:
        if key in kw and not isinstance(kw[key], bool):
            raise ConfigError(f"'{key}'{_where(source)} must be true or false, got {kw[key]!r}")
    if "watermark" in kw:
        w = kw["watermark"]
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w < 1.0:  # NaN fails too
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
    kw["time_model"] = _time_model(tm, source, kw.get("model"))
    if kw.get("speculative") is not None:
        from aisim.config.speculative import parse_speculative

        kw["speculative"] = parse_speculative(kw["speculative"], source)
    if kw.get("kv_offload") is not None:
        from aisim.config.offload import parse_offload

        kw["kv_offload"] = parse_offload(kw["kv_offload"], source)
    if kw.get("kv_cache_groups") is not None:
        kw["kv_cache_groups"] = _groups(kw["kv_cache_groups"], kw, source)
    notes = kw.get("plan_notes", ())
    if not isinstance(notes, (list, tuple)) or not all(isinstance(n, str) for n in notes):
        raise ConfigError(f"'plan_notes'{_where(source)} must be a list of strings")
    kw["plan_notes"] = tuple(notes)
    if kw.get("model") is not None and not isinstance(kw["model"], str):
        raise ConfigError(f"'model'{_where(source)} must be a string")
    # The oracle's spelling of two cache-config and two scheduler-config fields.
    _oracle_extra(kw, "cache_extra", ("prefix_cache_retention_interval", "prefix_match_unit"), source)
    _oracle_extra(kw, "scheduler_extra", ("cache_aware_admission_window", "cache_aware_admission_threshold"), source)
    _check_cache_aware(kw, source)
    # CacheConfig.DEFAULT_BLOCK_SIZE of the release (config/cache.py).
    kw.setdefault("block_size", release(version).block_size)
    if kw["block_size"] is None:
        kw["block_size"] = release(version).block_size
    unit = kw.get("prefix_match_unit")
    if unit is not None and (isinstance(unit, bool) or not isinstance(unit, int) or unit < 1):
        raise ConfigError(f"'prefix_match_unit'{_where(source)} must be a positive integer, got {unit!r}")
    if unit is not None:
        check_high(_ENGINE_KEY["prefix_match_unit"], unit, "", _where(source))
    if kw.get("num_gpu_blocks") is None:
        from aisim.config.kvgroups import groups_block_bytes

        per_block = groups_block_bytes(kw.get("kv_cache_groups"))
        if per_block <= 0:
            raise ConfigError(f"'kv_cache_bytes'{_where(source)} needs 'page_size_bytes' on the KV-cache groups "
                              "to give a block count; or set 'num_gpu_blocks'")
        kw["num_gpu_blocks"] = blocks = kw["kv_cache_bytes"] // per_block
        if blocks < 2:
            raise ConfigError(f"'kv_cache_bytes' ({kw['kv_cache_bytes']}){_where(source)} holds "
                              f"{blocks} block(s) of {per_block} bytes; at least 2 are needed")
    kw["declared"] = frozenset(raw) | frozenset(kw["cache_extra"]) | frozenset(kw["scheduler_extra"])
    kw["raw"] = copy.deepcopy(raw)
    cfg = EngineConfig(**kw, source=source, _token=_FACTORY)
    from aisim.config.rule import check_engine

    check_engine(cfg, source)
    if cfg.kv_offload is not None:
        from aisim.config.offload import check_offload

        check_offload(cfg, source)
    return cfg


def _oracle_extra(kw: dict, name: str, fields: tuple, source) -> None:
    """Move the ``fields`` a recorded configuration gives inside mapping ``name`` (the oracle's
    spelling) to the top level of ``kw``, refusing any other key and a field given twice apart."""
    extra = kw.get(name, {})
    if not isinstance(extra, dict):
        raise ConfigError(f"'{name}'{_where(source)} must be a mapping")
    for k, v in extra.items():
        if k not in fields:
            raise ConfigError(f"unknown key '{name}.{k}'{_where(source)}")
        if k in kw and kw[k] != v:
            raise ConfigError(f"'{k}'{_where(source)} is given twice with different values")
        kw[k] = v
    kw[name] = dict(extra)


def _check_cache_aware(kw: dict, source) -> None:
    """``cache_aware_admission_window`` and ``_threshold`` (vLLM's ``SchedulerConfig`` bounds)."""
    w = kw.get("cache_aware_admission_window", 0)
    if w is not None and not isinstance(w, bool) and isinstance(w, int) and w < 0:
        raise ConfigError(f"'cache_aware_admission_window'{_where(source)} must be at least 0, got {w}")
    if isinstance(w, bool) or not isinstance(w, int):
        raise ConfigError(f"'cache_aware_admission_window'{_where(source)} must be an integer, got {w!r}")
    t = kw.get("cache_aware_admission_threshold", 0.5)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t <= 1.0:  # NaN fails too
        raise ConfigError(f"'cache_aware_admission_threshold'{_where(source)} must be a number in [0, 1], "
                          f"got {t!r}")
    kw["cache_aware_admission_threshold"] = float(t)
    version = kw.get("vllm_version") or DEFAULT_VLLM_VERSION
    if w and not release(version).rules.cache_aware_admission:
        # config/scheduler.py: SchedulerConfig has no such field before the release that added it.
        raise ConfigError(f"'cache_aware_admission_window'{_where(source)}: vLLM {version} has no cache-aware "
                          "admission; set it to 0 or choose a release that has it")


def _relative(path: str, source) -> str:
    """``path`` relative to the directory of the configuration file ``source``, when it is a file."""
    if source and not os.path.isabs(path) and os.path.exists(os.path.dirname(os.path.abspath(source))):
        return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(source)), path))
    return path


def _time_model(tm: dict, source, engine_model=None) -> TimeModel:
    out = {}
    refuse_unknown(tm, sorted(_TIME_KEYS), "time_model.", _where(source))
    for k, v in tm.items():
        if k in ("kind", "gpu", "model", "path", "dtype"):
            if not isinstance(v, str):
                raise ConfigError(f"'time_model.{k}'{_where(source)} must be a string, got {v!r}")
            out[k] = v
        elif k == "calibration":
            from aisim.config.calibration import parse_calibration

            out[k] = parse_calibration(v, _where(source))
        elif k in ("frontend", "triton_group_quant"):
            if not isinstance(v, bool):
                raise ConfigError(f"'time_model.{k}'{_where(source)} must be true or false, got {v!r}")
            out[k] = v
        elif k == "tp":
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"'time_model.tp'{_where(source)} must be a positive integer, got {v!r}")
            check_high(key(TIME_MODEL_KEYS, k), v, "time_model.", _where(source))
            out[k] = v
        else:
            # not (v >= 0) also refuses NaN, which every comparison calls false
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not v >= 0:
                raise ConfigError(f"'time_model.{k}'{_where(source)} must be a finite non-negative number, "
                                  f"got {v!r}")
            check_high(key(TIME_MODEL_KEYS, k), v, "time_model.", _where(source))  # no step time overflows
            out[k] = float(v)
    # A named GPU makes the roofline the default: an engine that says what it runs on gets its step times.
    kind = out.setdefault("kind", "roofline" if "gpu" in out else "linear")
    if kind not in ("linear", "roofline", "table"):
        raise ConfigError(f"'time_model.kind'{_where(source)} must be linear, roofline or table, got {kind!r}")
    # A GPU's step times (roofline, a measured table) are served behind the API server; a linear
    # model's constants are an engine's alone (TIME_MODEL_KEYS "frontend").
    out.setdefault("frontend", kind != "linear")
    refuse_inert(tm, TIME_MODEL_KEYS, kind, "time_model.", _where(source), "time model")  # a constant it ignores
    for k in ("compute_efficiency", "attention_efficiency", "bandwidth_efficiency"):
        if k in out and not 0 < out[k] <= 1:
            raise ConfigError(f"'time_model.{k}'{_where(source)} must be in (0, 1], got {out[k]}")
    if "time_scale" in out and not out["time_scale"] > 0:
        raise ConfigError(f"'time_model.time_scale'{_where(source)} must be positive, got {out['time_scale']}")
    if "dtype" in out and out["dtype"] not in ("bf16", "fp8"):
        raise ConfigError(f"'time_model.dtype'{_where(source)} must be bf16 or fp8, got {out['dtype']!r}")
    if kind == "roofline":
        from aisim.config.catalog import check_tp, get_gpu, get_model, is_config_path

        if "model" not in out and isinstance(engine_model, str):
            out["model"] = engine_model
        for k in ("gpu", "model"):
            if k not in out:
                raise ConfigError(f"'time_model.{k}'{_where(source)} is required by the roofline model"
                                  + (" (or the engine's 'model')" if k == "model" else ""))
        if is_config_path(out["model"]):
            out["model"] = _relative(out["model"], source)
        try:
            get_gpu(out["gpu"])
            check_tp(get_model(out["model"]), out.get("tp", 1))
        except ConfigError as exc:
            raise ConfigError(f"'time_model'{_where(source)}: {exc}") from None
    if kind == "table":
        if "path" not in out:
            raise ConfigError(f"'time_model.path'{_where(source)} is required by the table model")
        out["path"] = _relative(out["path"], source)
    return TimeModel(**out)


def _groups(groups, kw, source):
    from aisim.config.keys import GROUP_KEYS, MAX_GROUPS
    from aisim.config.kvgroups import GROUP_DEFAULTS, KIND

    if not isinstance(groups, (list, tuple)) or not groups:
        raise ConfigError(f"'kv_cache_groups'{_where(source)} must be a non-empty list of groups")
    out = []
    for i, g in enumerate(groups):
        where = f"'kv_cache_groups[{i}]'{_where(source)}"
        if not isinstance(g, dict):
            raise ConfigError(f"{where} must be a mapping")
        refuse_unknown(g, list(GROUP_DEFAULTS), f"kv_cache_groups[{i}].", _where(source))
        kind = g.get("type")
        if not isinstance(kind, str) or kind not in KIND:  # a list or table is no kind (nor hashable)
            raise ConfigError(f"'kv_cache_groups[{i}].type'{_where(source)} must be one of "
                              f"{', '.join(KIND)}, got {kind!r}")
        for gk in GROUP_KEYS:
            v = g.get(gk.name)
            if gk.low is not None and v is not None and (isinstance(v, bool) or not isinstance(v, int)
                                                         or v < gk.low):
                raise ConfigError(f"'kv_cache_groups[{i}].{gk.name}'{_where(source)} must be an integer "
                                  f">= {gk.low}, got {v!r}")
            if v is not None and gk.low is not None:
                check_high(gk, v, f"kv_cache_groups[{i}].", _where(source))
        refuse_inert(g, GROUP_KEYS, kind, f"kv_cache_groups[{i}].", _where(source), "group", "type")
        if "prefix_cacheable" in g and not isinstance(g["prefix_cacheable"], bool):
            raise ConfigError(f"'kv_cache_groups[{i}].prefix_cacheable'{_where(source)} must be true or false")
        required = KIND[kind].required
        if required is not None and not g.get(required):
            raise ConfigError(f"'kv_cache_groups[{i}].{required}'{_where(source)} is required for a "
                              f"{kind} group")
        out.append(dict(g))
    # The core holds at most MAX_GROUPS groups; refused here, before the groups are expanded.
    total = sum(g.get("count", 1) for g in out)
    if total > MAX_GROUPS:
        raise ConfigError(f"'kv_cache_groups'{_where(source)} give {total} groups (counts added up); the replay core "
                          f"holds from 1 to {MAX_GROUPS}")
    return tuple(out)


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
    data = read_bytes(path, ConfigError, "engine configuration", by)
    ext = os.path.splitext(path)[1].lower()
    text = decode_utf8(data, path, ConfigError)
    try:
        if ext == ".toml":
            import tomllib

            raw = tomllib.loads(text)
        elif ext in (".yaml", ".yml"):
            raw = loads_yaml(text, path, ConfigError)
        else:
            raw = loads_json(text, path, ConfigError)
    except ImportError:
        raise ConfigError(f"{path}: reading YAML needs the 'pyyaml' package") from None
    except ConfigError:
        raise
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
