"""The routers a deployment can put in front of its replicas: one row per router, written once.

Every place that names a router reads it from :data:`ROUTER_TABLE`: configuration validation
(:mod:`aisim.config.deployment`), the documentation of the router keys (:mod:`aisim.config.keys`),
the replay (:mod:`aisim.replay_deployment`, which hands the core the router's code) and the tests.  The
core's ``RouterKind`` (``ext/deploy.pxd``) is the dispatch of ``_choose`` in ``ext/deploy.pyx``;
a row names its code there by the enum's own name (``aisim._core.constants.ROUTER_KINDS``).
Adding a router adds a row here, its enum value and branch in the core, and its tests.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Router:
    """One router.

    Attributes
    ----------
    name : str
        The name a deployment file gives (``router`` or ``router.kind``).
    core : str
        Its ``RouterKind`` in ``ext/deploy.pxd``.
    options : tuple of str
        The router keys (:data:`aisim.config.keys.ROUTER_KEYS`) it acts on.
    reads_prefix_cache : bool
        It reads the replicas' prefix caches (needs a full-attention group).
    fallback : bool
        ``session_affinity`` may fall back to it.
    meaning : str
        One line for the documentation.
    """

    name: str
    core: str
    options: tuple = ()
    reads_prefix_cache: bool = False
    fallback: bool = False
    meaning: str = ""


ROUTER_TABLE = (
    Router("round_robin", "RT_ROUND_ROBIN", meaning="request k goes to replica k mod N"),
    Router("random", "RT_RANDOM", ("seed",), meaning="a seeded splitmix64 draw"),
    Router("least_loaded", "RT_LEAST_LOADED", ("by", "view_delay_s"), fallback=True,
           meaning="fewest outstanding requests (or tokens), ties to the lowest index"),
    Router("kv_aware", "RT_KV_AWARE", ("overlap_weight", "view_delay_s"), reads_prefix_cache=True, fallback=True,
           meaning="Dynamo's cost: weight x prefill tokens / block + decode blocks, lowest wins"),
    Router("session_affinity", "RT_SESSION", ("by", "overlap_weight", "fallback", "slack", "view_delay_s"),
           meaning="a session's turns stick to one replica; the fallback when it is overloaded"),
)
ROUTER_BY_NAME = {r.name: r for r in ROUTER_TABLE}
# Router names, in the table's order.
ROUTERS = tuple(ROUTER_BY_NAME)
# The routers session_affinity may fall back to.
FALLBACKS = tuple(r.name for r in ROUTER_TABLE if r.fallback)


def router_names_text(names=ROUTERS) -> str:
    """``names`` as Markdown prose: ```a`, `b` or `c```."""
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def router_code(name: str) -> int:
    """The core's ``RouterKind`` code of router ``name`` (a validated name)."""
    from aisim._core.constants import ROUTER_KINDS

    return ROUTER_KINDS[ROUTER_BY_NAME[name].core]
