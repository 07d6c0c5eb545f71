"""Knobs: what a spec's grid may vary, and the one way a grid point becomes a configuration.

A knob is a key a spec's grid varies (``aisim sweep``'s ``[grid]`` and ``[load]``, a capacity
spec's ``[fleet.grid]``, a pipeline spec's ``[capacity.fleet.grid]``).  :data:`KNOBS` lists every
one, once, with what it sets:

``engine``
    A top-level engine key (:data:`aisim.config.keys.ENGINE_KEYS`, ``plan_notes`` aside): its value
    replaces the base's (a table whole); ``"unset"`` removes the key (its default applies); a
    ``kv_cache_bytes`` knob drops the base's ``num_gpu_blocks`` (it sizes the pool instead).
``engine`` (vLLM's flag)
    ``kv_offloading_size``: ``vllm serve --kv-offloading-size`` in GiB, the KV offload tier
    (:func:`aisim.config.vllm_offload.offload_section`: the base's ``kv_offload`` section resized, its
    other keys kept, or a new one); ``"unset"`` removes the tier.  The tier's size as a dimension.
``deployment``
    A key of the base deployment (:data:`aisim.sweep.deployments.DEPLOYMENT_KNOBS`): ``replicas``
    and ``router`` of an aggregated deployment, ``prefill_*`` and ``decode_*`` of a disaggregated
    one's pools.
``load``
    A load level of the trace (:mod:`aisim.traces.load`): ``rate_scale``, ``poisson_rate`` or
    ``max_concurrency`` (a sweep's ``[load]`` table).

:data:`SPEC_KNOBS` says which knobs each spec kind takes, and :data:`REFUSED` why a kind refuses
the others (a capacity search varies the replicas itself).  :func:`resolve` is the one path from
a base engine, a base deployment and a grid point's knobs to the configuration replayed: every
knob a spec accepts changes what :func:`resolve` returns (``tests/test_knob_walk.py`` walks them
all), so none is accepted and ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aisim.config.keys import ENGINE_KEYS
from aisim.errors import ConfigError
from aisim.sweep.deployments import DEPLOYMENT_KNOBS

# A grid value that removes the key from the base configuration (TOML has no null).
UNSET = "unset"
# The load axes a sweep's [load] table varies, one per sweep (aisim.traces.load).
LOAD_AXES = ("rate_scale", "poisson_rate", "max_concurrency")

# Knobs named as vLLM's flags that set an engine section (engine_raw).
FLAG_KNOBS = ("kv_offloading_size",)

# Every knob and what it sets, in the order messages list them.
KNOBS = {**{k.name: "engine" for k in ENGINE_KEYS if k.name != "plan_notes"},
         **{k: "engine" for k in FLAG_KNOBS},
         **{k: "deployment" for k in DEPLOYMENT_KNOBS},
         **{k: "load" for k in LOAD_AXES}}

# The deployment knobs that set a disaggregated deployment's pools (the rest set an aggregated one).
POOL_KNOBS = tuple(k for k, path in DEPLOYMENT_KNOBS.items() if len(path) == 2)

# Why a spec kind refuses a knob it does not take.
_SEARCHED = ("the smallest-deployment search varies the replicas itself (up to 'fleet.max_replicas', "
             "'fleet.splits' for a prefill/decode split)")
REFUSED = {
    "capacity": {"replicas": _SEARCHED, "prefill_replicas": _SEARCHED, "decode_replicas": _SEARCHED,
                 **{k: "a capacity search sets the load itself ('fleet.poisson_rate', 'fleet.rate_scale' or the "
                       "rate it searches)" for k in LOAD_AXES}},
}

# The knobs of each spec kind's grid (a pipeline spec's [capacity.fleet.grid] is a capacity grid).
SPEC_KNOBS = {
    "sweep": tuple(k for k, what in KNOBS.items() if what != "load"),
    "sweep_load": LOAD_AXES,
    "capacity": tuple(k for k in KNOBS if k not in REFUSED["capacity"]),
}


def check_grid(grid: dict, kind: str, where: str = "", prefix: str = "grid.") -> None:
    """A ConfigError naming the first knob of ``grid`` that ``kind``'s grid does not take (with the
    reason when it is a knob elsewhere), or whose values are not a non-empty list of distinct values.

    Parameters
    ----------
    grid : dict
        Knob -> list of values.
    kind : str
        A key of :data:`SPEC_KNOBS`.
    where, prefix : str
        `` in FILE`` and the grid's key in its spec (``fleet.grid.``), for messages.
    """
    known = SPEC_KNOBS[kind]
    for k, vals in grid.items():
        if k not in known:
            why = REFUSED.get(kind, {}).get(k)
            if why is not None:
                raise ConfigError(f"knob '{prefix}{k}'{where} is not taken here: {why}")
            raise ConfigError(f"unknown knob '{prefix}{k}'{where}; knobs: {', '.join(known)}")
        if not isinstance(vals, list) or not vals:
            raise ConfigError(f"'{prefix}{k}'{where} must be a non-empty list of values")
        if len(set(map(json.dumps, vals))) != len(vals):
            raise ConfigError(f"'{prefix}{k}'{where} repeats a value")


def engine_raw(base: dict, knobs: dict) -> dict:
    """The engine configuration ``base`` (a dict) with the engine knobs of ``knobs`` applied; ``base``
    is left as it is (the other knobs are :func:`resolve`'s)."""
    cfg = dict(base)
    for k, v in knobs.items():
        if KNOBS.get(k) != "engine" or k in FLAG_KNOBS:
            continue
        if v == UNSET:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    if knobs.get("kv_cache_bytes", UNSET) != UNSET:
        cfg.pop("num_gpu_blocks", None)
    if "kv_offloading_size" in knobs:
        size = knobs["kv_offloading_size"]
        if size == UNSET:
            cfg.pop("kv_offload", None)
        else:
            from aisim.config.vllm_offload import offload_section, tier_bytes_per_block

            tm = cfg.get("time_model")
            tp = tm.get("tp", 1) if isinstance(tm, dict) else 1
            cfg["kv_offload"] = offload_section(size, "native", tier_bytes_per_block(cfg.get("kv_cache_groups"), tp),
                                                base=cfg.get("kv_offload"), where="knob 'kv_offloading_size'")
    return cfg


@dataclass(frozen=True)
class Resolved:
    """What a grid point replays.

    Attributes
    ----------
    config : dict
        The engine configuration with the knobs applied (the raw dictionary).
    engine : EngineConfig
        ``config`` validated.
    deployment : DeploymentConfig or None
        The base deployment with the deployment knobs applied (None: the engine alone).
    load : dict
        The load knobs (:mod:`aisim.traces.load`; empty: the trace as traced).
    """

    config: dict
    engine: object
    deployment: object
    load: dict

    def to_dict(self) -> dict:
        """Everything resolved, defaults filled in (what a test compares)."""
        return {"engine": self.engine.to_dict(), "load": dict(self.load),
                "deployment": self.deployment.to_dict() if self.deployment is not None else None}


def resolve(base: dict, deployment, knobs: dict, source: str, engine=None) -> Resolved:
    """The configuration a grid point replays: ``base`` and ``deployment`` with ``knobs`` applied.

    Parameters
    ----------
    base : dict
        The base engine configuration (raw).
    deployment : DeploymentConfig or None
        The base deployment; deployment knobs need one.
    knobs : dict
        Knob -> value (keys of :data:`KNOBS`).
    source : str
        Named in messages (``candidate c003 {...}``).
    engine : EngineConfig, optional
        ``base`` validated already: reused when no engine knob is set.

    Raises
    ------
    ConfigError
        A knob the rules refuse (the candidate is refused with the message), or a deployment knob
        without a deployment.
    """
    from aisim.config.engine import engine_config_from_dict
    from aisim.sweep.deployments import candidate_deployment

    unknown = [k for k in knobs if k not in KNOBS]
    if unknown:
        raise ConfigError(f"unknown knob {unknown[0]!r} in {source}; knobs: {', '.join(KNOBS)}")
    config = engine_raw(base, knobs)
    if engine is None or any(KNOBS[k] == "engine" for k in knobs):
        engine = engine_config_from_dict(config, source=source)
    fleet = deployment
    if any(KNOBS[k] == "deployment" for k in knobs):
        if deployment is None:
            raise ConfigError(f"deployment knobs in {source} need a deployment")
        fleet = candidate_deployment(deployment, knobs, source)
    load = {k: v for k, v in knobs.items() if KNOBS[k] == "load"}
    return Resolved(config=config, engine=engine, deployment=fleet, load=load)
