"""The deployment a sweep's candidates run on, and its knobs.

A sweep spec may name a base deployment (``deployment = "fleet.toml"``, a deployment file, or
the inline mapping a file's ``deployment`` section holds); each candidate then replays that
deployment of its engine (:func:`aisim.deploy.deploy`, one pipeline shard).  The grid varies it
with these knobs, next to the engine's:

``replicas``, ``router``
    An aggregated deployment's replica count and its router (a name, or a mapping with ``kind``
    and the router's options, replacing the base's router whole).
``prefill_replicas``, ``decode_replicas``, ``prefill_router``, ``decode_router``
    A disaggregated deployment's pools (the base must be disaggregated: it gives the link).

Without a ``deployment``, ``replicas`` and ``router`` vary replicas of the base engine behind a
round-robin router (one replica: the engine alone, still replayed as a deployment).  A knob's
value is checked as the deployment file's would be, per candidate: a bad one (a pool of zero
replicas, an unknown router) refuses the candidate with the reason, as do router options its
router does not act on (:data:`aisim.config.deployment.ROUTER_OPTIONS`).  A candidate's GPUs are
every replica's ``time_model.tp`` added up, both pools of a disaggregated deployment.
"""

from __future__ import annotations

import json
import os

from aisim.errors import ConfigError, SweepError

# The grid's deployment knobs: the deployment key each sets (a path in its mapping).
DEPLOYMENT_KNOBS = {
    "replicas": ("replicas",),
    "router": ("router",),
    "prefill_replicas": ("prefill", "replicas"),
    "decode_replicas": ("decode", "replicas"),
    "prefill_router": ("prefill", "router"),
    "decode_router": ("decode", "router"),
}
_POOL_KNOBS = tuple(k for k, path in DEPLOYMENT_KNOBS.items() if len(path) == 2)


def base_deployment(raw, grid: dict, base_dir: str, where: str):
    """The spec's ``deployment`` (a file or an inline mapping) as a
    :class:`~aisim.config.deployment.DeploymentConfig`; None without one and without deployment knobs.

    Raises
    ------
    SweepError
        A bad deployment, or knobs the base's kind of deployment has none of (naming the key).
    """
    from aisim.config.deployment import DeploymentConfig, load_deployment_config, parse_deployment

    knobs = [k for k in grid if k in DEPLOYMENT_KNOBS]
    try:
        if raw is None:
            base = DeploymentConfig() if knobs else None
        elif isinstance(raw, str) and raw:
            path = os.path.abspath(os.path.join(base_dir, os.path.expanduser(raw)))
            if not os.path.isfile(path):
                raise SweepError(f"'deployment'{where} names {raw!r}, which is not a file")
            base = load_deployment_config(path)
        elif isinstance(raw, dict):
            raw = dict(raw)
            for name in ("prefill", "decode"):  # a pool's engine file is relative to the spec
                pool = raw.get(name)
                if isinstance(pool, dict) and isinstance(pool.get("engine"), str) and pool["engine"]:
                    raw[name] = dict(pool, engine=os.path.join(base_dir, os.path.expanduser(pool["engine"])))
            base = parse_deployment(raw, source=where.removeprefix(" in ") or None)
        else:
            raise SweepError(f"'deployment'{where} must be a deployment file or an inline table")
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    for k in knobs:
        pooled = k in _POOL_KNOBS
        if pooled and not base.disaggregated:
            raise SweepError(f"'grid.{k}'{where} varies a pool of a disaggregated deployment: give 'deployment' "
                             "with prefill and decode pools and their link")
        if not pooled and base.disaggregated:
            pools = ", ".join(p for p in _POOL_KNOBS if p.endswith(k))
            raise SweepError(f"'grid.{k}'{where}: the base deployment is disaggregated; vary {pools}")
    if base is not None and "max_model_len" in grid:
        raise SweepError(f"'grid.max_model_len'{where}: a deployment refuses a prompt of max_model_len tokens or "
                         "more (it does not reject it); vary max_model_len without a deployment")
    if base is not None and base.disaggregated:
        from aisim.config.engine import load_engine_config

        for name, pool in (("prefill", base.prefill), ("decode", base.decode)):
            if isinstance(pool.engine, str):
                if not os.path.isfile(pool.engine):
                    raise SweepError(f"'deployment.{name}.engine'{where} names {pool.engine!r}, which is not a file")
                try:
                    load_engine_config(pool.engine)
                except ConfigError as exc:
                    raise SweepError(str(exc)) from None
    return base


def candidate_deployment(base, knobs: dict, source: str):
    """The base deployment with the candidate's deployment knobs applied (validated).

    Raises
    ------
    ConfigError
        The knobs make a deployment the rules refuse (the candidate is refused with it).
    """
    from aisim.config.deployment import foreign_options, parse_deployment
    from aisim.config.keys import ROUTER_KEYS, defaults

    raw = base.to_dict()
    for k, v in knobs.items():
        path = DEPLOYMENT_KNOBS.get(k)
        if path is None:
            continue
        if path[-1] == "router":
            wrong = foreign_options(v)
            if wrong:
                kind = v.get("kind", defaults(ROUTER_KEYS)["kind"])
                raise ConfigError(f"'{k}' {json.dumps(v, sort_keys=True)} in {source}: the {kind} router "
                                  f"does not act on {', '.join(repr(w) for w in wrong)}")
        if len(path) == 2:
            raw[path[0]] = dict(raw[path[0]], **{path[1]: v})
        else:
            raw[path[0]] = v
    return parse_deployment(raw, source=source)


def deployment_gpus(deployment, engine) -> int:
    """GPUs of ``deployment`` of ``engine``: every replica's ``time_model.tp`` (a pool's own engine's).

    ``deployment`` None is the engine alone: ``time_model.tp``.
    """
    if deployment is None:
        return engine.time_model.tp
    if not deployment.disaggregated:
        return deployment.replicas * engine.time_model.tp
    from aisim.config.deployment import deployment_engines

    pre, dec = deployment_engines(deployment, engine)
    return deployment.prefill.replicas * pre.time_model.tp + deployment.decode.replicas * dec.time_model.tp


def pool_engines(deployment, engine) -> list:
    """The engines other than ``engine`` that replay requests in ``deployment`` (its pools' own)."""
    if deployment is None or not deployment.disaggregated:
        return []
    from aisim.config.deployment import deployment_engines

    return [e for e in deployment_engines(deployment, engine) if e is not engine]


def write_best_deployment(path: str, deployment, notes: list) -> None:
    """Write ``deployment`` as a deployment file (TOML) that loads back to it."""
    from aisim.config.toml_out import dumps
    from aisim.files import write_text

    write_text(path, dumps({"deployment": deployment.to_dict()},
                           header_comments=["Deployment chosen by aisim sweep."] + notes), "'best_deployment'")


__all__ = ["DEPLOYMENT_KNOBS", "base_deployment", "candidate_deployment", "deployment_gpus", "pool_engines",
           "write_best_deployment"]
