"""A deployment: replicas of one engine behind a router, read from a file's ``deployment`` section.

A deployment file (JSON, TOML or YAML, read as strictly as an engine file) holds one mapping,
``deployment``: ``replicas`` and ``router`` (a name, or a mapping with ``kind`` and the router's
options); or, disaggregated, ``prefill`` and ``decode`` pools (each with its ``replicas``, ``router``
and optionally its own ``engine`` file) and the ``link`` between them.  The keys and their defaults
are :data:`aisim.config.keys.DEPLOYMENT_KEYS`, :data:`~aisim.config.keys.ROUTER_KEYS`,
:data:`~aisim.config.keys.POOL_KEYS` and :data:`~aisim.config.keys.LINK_KEYS`; every error names
the key.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from aisim.config.keys import (DEPLOYMENT_KEYS, LINK_KEYS, POOL_KEYS, ROUTER_KEYS, check_high, defaults, key,
                               refuse_inert, refuse_unknown)
from aisim.config.keys import where as _where
from aisim.config.routers import FALLBACKS, ROUTERS
from aisim.errors import ConfigError


# The most replicas a deployment holds (aisim.config.keys MAX_REPLICAS, the replicas key's high).
MAX_REPLICAS = key(DEPLOYMENT_KEYS, "replicas").high

_D = defaults(DEPLOYMENT_KEYS)
_R = defaults(ROUTER_KEYS)
_P = defaults(POOL_KEYS)
_L = defaults(LINK_KEYS)

# The routers each router option acts on: the key's ``kinds`` (aisim/config/keys.py ROUTER_KEYS), read
# from the router table (aisim.config.routers ``Router.options``; ext/deploy.pyx ``_choose``).
ROUTER_OPTIONS = {k.name: k.kinds for k in ROUTER_KEYS if k.kinds is not None}


def acted_on(kind: str, options: dict) -> dict:
    """The ``options`` the ``kind`` router acts on (what a deployment writes back)."""
    return {k: v for k, v in options.items() if kind in ROUTER_OPTIONS.get(k, (kind,))}


def foreign_options(router) -> list:
    """The options a router mapping gives that its ``kind`` does not act on (:data:`ROUTER_OPTIONS`)."""
    if not isinstance(router, dict):
        return []
    kind = router.get("kind", _R["kind"])
    return [k for k in router if k in ROUTER_OPTIONS and kind not in ROUTER_OPTIONS[k]]


# What a link moves: every block the prefill replica holds, or only those the decode replica lacks.
TRANSFERS = ("all", "missing")


@dataclass(frozen=True)
class PoolConfig:
    """One pool of a disaggregated deployment.

    Attributes
    ----------
    replicas : int
    router : str
        One of :data:`ROUTERS`.
    options : dict
        The router's options (:data:`aisim.config.keys.ROUTER_KEYS` but ``kind``).
    engine : str or EngineConfig or None
        The pool's engine file (resolved against the deployment file), an engine given from
        Python, or None: the deployment's engine.
    """

    replicas: int
    router: str
    options: dict
    engine: object = None

    def to_dict(self) -> dict:
        d = {"replicas": self.replicas, "router": {"kind": self.router, **acted_on(self.router, self.options)}}
        if self.engine is not None:
            d["engine"] = self.engine if isinstance(self.engine, str) else getattr(self.engine, "name", "engine")
        return d


@dataclass(frozen=True)
class LinkConfig:
    """The prefill-to-decode KV transfer link.

    Attributes
    ----------
    bandwidth_gb_s : float
        10^9 bytes per second (may be ``inf``).
    latency_s : float
    transfer : str
        One of :data:`TRANSFERS`.
    """

    bandwidth_gb_s: float
    latency_s: float = _L["latency_s"]
    transfer: str = _L["transfer"]

    def to_dict(self) -> dict:
        return {"bandwidth_gb_s": self.bandwidth_gb_s, "latency_s": self.latency_s, "transfer": self.transfer}


@dataclass(frozen=True)
class DeploymentConfig:
    """A validated deployment.

    Attributes
    ----------
    replicas : int
        Engines behind the router.
    router : str
        One of :data:`ROUTERS`.
    options : dict
        Every :data:`aisim.config.keys.ROUTER_KEYS` key but ``kind``, defaults filled in.
    """

    replicas: int = _D["replicas"]
    router: str = _D["router"]
    options: dict = field(default_factory=lambda: {k: v for k, v in _R.items() if k != "kind"})
    prefill: PoolConfig | None = None
    decode: PoolConfig | None = None
    link: LinkConfig | None = None

    @property
    def disaggregated(self) -> bool:
        """Prefill and decode pools joined by a link."""
        return self.prefill is not None

    def describe(self) -> str:
        """One line: ``4 replicas behind the kv_aware router``, or both pools of a disaggregated one."""
        if self.disaggregated:
            return (f"{self.prefill.replicas} prefill replicas behind the {self.prefill.router} router, "
                    f"{self.decode.replicas} decode replicas behind the {self.decode.router} router")
        return f"{self.replicas} replicas behind the {self.router} router"

    def to_dict(self) -> dict:
        """The deployment as a file's ``deployment`` section would give it, every key resolved."""
        if self.disaggregated:
            return {"prefill": self.prefill.to_dict(), "decode": self.decode.to_dict(), "link": self.link.to_dict()}
        return {"replicas": self.replicas, "router": {"kind": self.router, **acted_on(self.router, self.options)}}


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_deployment(raw, source: str | None = None) -> DeploymentConfig:
    """Validate a ``deployment`` mapping.

    Parameters
    ----------
    raw : dict
    source : str, optional
        File named in error messages.

    Raises
    ------
    ConfigError
        Naming the key (``deployment.router.slack`` ...) and the value.
    """
    w = _where(source)
    if not isinstance(raw, dict):
        raise ConfigError(f"'deployment'{w} must be a mapping")
    refuse_unknown(raw, [k.name for k in DEPLOYMENT_KEYS], "deployment.", w)
    if any(k in raw for k in ("prefill", "decode", "link")):
        return _parse_disaggregated(raw, source, w)
    n, kind, opts = _pool(raw, "deployment.", w)
    return DeploymentConfig(replicas=n, router=kind, options=opts)


def _pool(raw: dict, at: str, w: str):
    """``replicas``, router name and options of a deployment (``at`` = "deployment.") or a pool."""
    n = raw.get("replicas", _D["replicas"])
    if not _int(n) or not 1 <= n <= MAX_REPLICAS:
        raise ConfigError(f"'{at}replicas'{w} must be an integer from 1 to {MAX_REPLICAS}, got {n!r}")
    r = raw.get("router", _D["router"])
    if isinstance(r, str):
        r = {"kind": r}
    if not isinstance(r, dict):
        raise ConfigError(f"'{at}router'{w} must be a router name or a mapping")
    refuse_unknown(r, [k.name for k in ROUTER_KEYS], f"{at}router.", w)
    kind = r.get("kind", _R["kind"])
    if kind not in ROUTERS:
        raise ConfigError(f"'{at}router.kind'{w} must be one of {', '.join(ROUTERS)}, got {kind!r}")
    refuse_inert(r, ROUTER_KEYS, kind, f"{at}router.", w, "router")  # an option the router ignores
    opts = {k: r.get(k, v) for k, v in _R.items() if k != "kind"}
    if opts["by"] not in ("requests", "tokens"):
        raise ConfigError(f"'{at}router.by'{w} must be requests or tokens, got {opts['by']!r}")
    if not _number(opts["overlap_weight"]) or opts["overlap_weight"] < 0:
        raise ConfigError(f"'{at}router.overlap_weight'{w} must be a finite number >= 0, "
                          f"got {opts['overlap_weight']!r}")
    if not _int(opts["seed"]) or not 0 <= opts["seed"] < 2 ** 64:
        raise ConfigError(f"'{at}router.seed'{w} must be an integer from 0 to 2**64 - 1, got {opts['seed']!r}")
    if opts["fallback"] not in FALLBACKS:
        raise ConfigError(f"'{at}router.fallback'{w} must be {' or '.join(FALLBACKS)}, "
                          f"got {opts['fallback']!r}")
    if not _int(opts["slack"]) or opts["slack"] < 0:
        raise ConfigError(f"'{at}router.slack'{w} must be an integer >= 0, got {opts['slack']!r}")
    if not _number(opts["view_delay_s"]) or opts["view_delay_s"] < 0:
        raise ConfigError(f"'{at}router.view_delay_s'{w} must be a finite number of seconds >= 0, "
                          f"got {opts['view_delay_s']!r}")
    for k in ("overlap_weight", "slack", "view_delay_s"):
        check_high(key(ROUTER_KEYS, k), opts[k], f"{at}router.", w)
    opts["overlap_weight"] = float(opts["overlap_weight"])
    opts["view_delay_s"] = float(opts["view_delay_s"])
    return n, kind, opts


def _parse_disaggregated(raw: dict, source: str | None, w: str) -> DeploymentConfig:
    for k in ("replicas", "router"):
        if k in raw:
            raise ConfigError(f"'deployment.{k}'{w}: a disaggregated deployment gives 'replicas' and 'router' "
                              "inside 'prefill' and 'decode'")
    pools = {}
    for name in ("prefill", "decode"):
        p = raw.get(name)
        if p is None:
            raise ConfigError(f"'deployment.{name}'{w} is missing: a disaggregated deployment needs "
                              "'prefill', 'decode' and 'link'")
        if not isinstance(p, dict):
            raise ConfigError(f"'deployment.{name}'{w} must be a mapping of {', '.join(k.name for k in POOL_KEYS)}")
        refuse_unknown(p, [k.name for k in POOL_KEYS], f"deployment.{name}.", w)
        n, kind, opts = _pool(p, f"deployment.{name}.", w)
        eng = p.get("engine", _P["engine"])
        if eng is not None and not isinstance(eng, str) and not hasattr(eng, "max_num_seqs"):
            raise ConfigError(f"'deployment.{name}.engine'{w} must be an engine file, got {eng!r}")
        if isinstance(eng, str):
            if not eng:
                raise ConfigError(f"'deployment.{name}.engine'{w} must name an engine file")
            if source and not os.path.isabs(eng):
                eng = os.path.join(os.path.dirname(os.path.abspath(source)), eng)
        pools[name] = PoolConfig(n, kind, opts, eng)
    link = raw.get("link")
    if link is None:
        raise ConfigError(f"'deployment.link'{w} is missing: a disaggregated deployment needs "
                          "'prefill', 'decode' and 'link'")
    if not isinstance(link, dict):
        raise ConfigError(f"'deployment.link'{w} must be a mapping of {', '.join(k.name for k in LINK_KEYS)}")
    refuse_unknown(link, [k.name for k in LINK_KEYS], "deployment.link.", w)
    bw = link.get("bandwidth_gb_s")
    if isinstance(bw, str) and bw.strip().lower() == "inf":
        bw = math.inf
    if bw is None:
        raise ConfigError(f"'deployment.link.bandwidth_gb_s'{w} is required (GB/s, or inf)")
    if isinstance(bw, bool) or not isinstance(bw, (int, float)) or math.isnan(bw) or bw <= 0:
        raise ConfigError(f"'deployment.link.bandwidth_gb_s'{w} must be a number of GB/s > 0 (or inf), got {bw!r}")
    lat = link.get("latency_s", _L["latency_s"])
    if not _number(lat) or lat < 0:
        raise ConfigError(f"'deployment.link.latency_s'{w} must be a finite number of seconds >= 0, got {lat!r}")
    check_high(key(LINK_KEYS, "latency_s"), lat, "deployment.link.", w)
    tr = link.get("transfer", _L["transfer"])
    if tr not in TRANSFERS:
        raise ConfigError(f"'deployment.link.transfer'{w} must be one of {', '.join(TRANSFERS)}, got {tr!r}")
    return DeploymentConfig(replicas=pools["prefill"].replicas + pools["decode"].replicas, router=pools["prefill"].router,
                            options=pools["prefill"].options, prefill=pools["prefill"], decode=pools["decode"],
                            link=LinkConfig(float(bw), float(lat), tr))


def deployment_config(replicas: int = 1, router: str | dict = "round_robin") -> DeploymentConfig:
    """A deployment from Python: ``deployment_config(4, {"kind": "kv_aware", "view_delay_s": 0.1})``."""
    return parse_deployment({"replicas": replicas, "router": router})


def load_deployment_config(path: str | os.PathLike) -> DeploymentConfig:
    """Read a deployment file (JSON, TOML or YAML): one mapping, ``deployment``.

    Raises
    ------
    ConfigError
        Naming the file and the key.
    """
    from aisim.config.engine import read_config_file

    path = os.fspath(path)
    raw = read_config_file(path)
    if not isinstance(raw, dict) or set(raw) != {"deployment"}:
        keys = ", ".join(repr(k) for k in raw) if isinstance(raw, dict) else type(raw).__name__
        raise ConfigError(f"{path}: a deployment file holds one mapping, 'deployment' (found {keys})")
    return parse_deployment(raw["deployment"], source=path)


def deployment_engines(deployment, engine):
    """The prefill and decode pools' engines of a disaggregated ``deployment`` (a pool's own engine
    file, or ``engine``)."""
    from aisim.config.engine import load_engine_config

    out = []
    for pool in (deployment.prefill, deployment.decode):
        e = pool.engine
        out.append(engine if e is None else load_engine_config(e) if isinstance(e, str) else e)
    return out
