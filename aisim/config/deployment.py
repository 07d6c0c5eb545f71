"""A deployment: replicas of one engine behind a router, read from a file's ``deployment`` section.

A deployment file (JSON, TOML or YAML, read as strictly as an engine file) holds one mapping,
``deployment``: ``replicas`` and ``router`` (a name, or a mapping with ``kind`` and the router's
options).  The keys and their defaults are :data:`aisim.config.keys.DEPLOYMENT_KEYS` and
:data:`aisim.config.keys.ROUTER_KEYS`; every error names the key.  Disaggregated pools
(``prefill``, ``decode``, ``link``) are known keys that are refused: they are not modelled yet.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from aisim.config.keys import DEPLOYMENT_KEYS, ROUTER_KEYS, defaults, refuse_unknown
from aisim.config.keys import where as _where
from aisim.errors import ConfigError

# Router names, in the core's RouterKind order (ext/deploy.pxd; a test checks the two agree).
ROUTERS = ("round_robin", "random", "least_loaded", "kv_aware", "session_affinity")

# The most replicas a deployment holds: the router's cache index keeps one bit per replica.
MAX_REPLICAS = 64

_D = defaults(DEPLOYMENT_KEYS)
_R = defaults(ROUTER_KEYS)


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

    def to_dict(self) -> dict:
        """The deployment as a file's ``deployment`` section would give it, every key resolved."""
        return {"replicas": self.replicas, "router": {"kind": self.router, **self.options}}


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
    for pd in ("prefill", "decode", "link"):
        if pd in raw:
            raise ConfigError(f"'deployment.{pd}'{w}: disaggregated prefill/decode pools are not modelled yet; "
                              "give 'replicas' and 'router' only")
    n = raw.get("replicas", _D["replicas"])
    if not _int(n) or not 1 <= n <= MAX_REPLICAS:
        raise ConfigError(f"'deployment.replicas'{w} must be an integer from 1 to {MAX_REPLICAS}, got {n!r}")
    r = raw.get("router", _D["router"])
    if isinstance(r, str):
        r = {"kind": r}
    if not isinstance(r, dict):
        raise ConfigError(f"'deployment.router'{w} must be a router name or a mapping")
    refuse_unknown(r, [k.name for k in ROUTER_KEYS], "deployment.router.", w)
    kind = r.get("kind", _R["kind"])
    if kind not in ROUTERS:
        raise ConfigError(f"'deployment.router.kind'{w} must be one of {', '.join(ROUTERS)}, got {kind!r}")
    opts = {k: r.get(k, v) for k, v in _R.items() if k != "kind"}
    if opts["by"] not in ("requests", "tokens"):
        raise ConfigError(f"'deployment.router.by'{w} must be requests or tokens, got {opts['by']!r}")
    if not _number(opts["overlap_weight"]) or opts["overlap_weight"] < 0:
        raise ConfigError(f"'deployment.router.overlap_weight'{w} must be a finite number >= 0, "
                          f"got {opts['overlap_weight']!r}")
    if not _int(opts["seed"]) or not 0 <= opts["seed"] < 2 ** 64:
        raise ConfigError(f"'deployment.router.seed'{w} must be an integer from 0 to 2**64 - 1, got {opts['seed']!r}")
    if opts["fallback"] not in ("kv_aware", "least_loaded"):
        raise ConfigError(f"'deployment.router.fallback'{w} must be kv_aware or least_loaded, "
                          f"got {opts['fallback']!r}")
    if not _int(opts["slack"]) or opts["slack"] < 0:
        raise ConfigError(f"'deployment.router.slack'{w} must be an integer >= 0, got {opts['slack']!r}")
    if not _number(opts["view_delay_s"]) or opts["view_delay_s"] < 0:
        raise ConfigError(f"'deployment.router.view_delay_s'{w} must be a finite number of seconds >= 0, "
                          f"got {opts['view_delay_s']!r}")
    opts["overlap_weight"] = float(opts["overlap_weight"])
    opts["view_delay_s"] = float(opts["view_delay_s"])
    return DeploymentConfig(replicas=n, router=kind, options=opts)


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
