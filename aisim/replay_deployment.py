"""``run_deployment``: a trace through replicas of the engine behind a router (or disaggregated
prefill and decode pools), in the compiled core (``aisim._core.deploy``)."""

from __future__ import annotations

import math

import numpy as np

from aisim._core.constants import GROUP_KINDS
from aisim.config.engine import EngineConfig
from aisim.core_input import CoreTrace, core_config
from aisim.errors import ConfigError, ReplayError, TraceError
from aisim.replay_input import (
    _check_concurrency, _check_think, _closed_loop, _is_trace_table, _whole_arrays, _with_private,
)
from aisim.trace_checks import _validate
from aisim.traces.frame import from_frame


def run_deployment(trace, engine: EngineConfig, deployment, *, name: str | None = None,
                   record_events: bool = False, record_routing: bool = False, max_concurrency: int | None = None,
                   closed_loop: bool = False, think_time_s: float | None = None, macro_steps: bool = True):
    """Run ``trace`` through ``deployment.replicas`` copies of ``engine`` behind its router.

    The one way into the core's deployments (``aisim._core.deploy.Deployment``);
    :func:`aisim.deploy.deploy` is its public face.  ``trace`` must be clocked in seconds
    (``arrival_s``); its turns arrive at their timestamps (open loop) unless ``closed_loop``.  ``name`` names the trace
    in errors.  ``max_concurrency`` caps the client's requests in flight, and ``closed_loop``
    (``think_time_s``) sends a session's next turn when its previous turn finishes, as
    :func:`replay`'s do; ``macro_steps`` as :func:`aisim.deploy.deploy`'s.  Returns the validated trace
    table and the core's columns (``Deployment.run``).
    """
    from aisim._core.deploy import Deployment

    if not _is_trace_table(trace):
        trace = from_frame(trace)
    if (trace.schema.metadata or {}).get(b"clock") != b"time":
        raise TraceError(f"{name or 'the trace'}: arrivals are engine steps (arrival_step); a deployment "
                         "needs arrivals in seconds (arrival_s), the one clock its replicas share")
    _check_think(closed_loop, think_time_s)
    sessions = np.full(trace.num_rows, -1, dtype=np.int64)
    if "session_id" in trace.column_names:
        sid = trace.column("session_id").to_pylist()
        seen: dict = {}
        for i, s in enumerate(sid):
            if s is not None:
                sessions[i] = seen.setdefault(s, len(seen))
    pd = None
    if deployment.disaggregated:
        from aisim.config.deployment import deployment_engines

        p_eng, d_eng = deployment_engines(deployment, engine)
        for eng, pool in ((p_eng, "prefill"), (d_eng, "decode")):
            _validate(trace, eng)
            _pd_supported(eng, pool, getattr(deployment, pool).engine is not None)
        config = core_config(p_eng)
        d_config = core_config(d_eng)
        link = deployment.link
        d_router = _router(deployment.decode.router, deployment.decode.options, d_config, d_eng, sessions)
        if link.transfer == "missing" and d_router["group"] < 0:
            raise ConfigError("'deployment.link.transfer' missing reads the decode engine's prefix cache of a "
                              "full-attention group; it has none")
        from aisim.config.kvgroups import block_bytes

        bb = block_bytes(p_eng)
        if bb == 0 and math.isfinite(link.bandwidth_gb_s):
            raise ConfigError("'deployment.link.bandwidth_gb_s': the prefill engine's block bytes are unknown "
                              "(give the model's geometry), so a transfer cannot be timed; use inf")
        pd = {"config": d_config, "replicas": deployment.decode.replicas, "router": d_router,
              "bandwidth": link.bandwidth_gb_s * 1e9, "latency_s": link.latency_s,
              "missing": link.transfer == "missing", "block_bytes": float(bb)}
        n_rep, router = deployment.prefill.replicas, _router(deployment.prefill.router, deployment.prefill.options,
                                                             config, p_eng, sessions)
    else:
        _validate(trace, engine)
        config = core_config(engine)
        n_rep, router = deployment.replicas, _router(deployment.router, deployment.options, config, engine, sessions)
    arrays = _whole_arrays(trace, engine, True)
    if closed_loop:
        arrays["next_turn"], arrays["think_s"] = _closed_loop(trace, think_time_s)
    core_trace = _with_private(CoreTrace(**arrays), config, *([pd["config"]] if pd else []))
    cap = _check_concurrency(max_concurrency, closed_loop)
    try:
        out = Deployment(config, core_trace, n_rep, router, record_events, record_routing, pd, cap,
                         macro_steps).run()
    except (ValueError, RuntimeError) as exc:
        raise ReplayError(str(exc)) from None
    return trace, out


def _pd_supported(engine: EngineConfig, pool: str, own: bool) -> None:
    """Refuse what disaggregated pools do not model: drafts, Mamba state groups and a KV offload tier
    on a decode replica."""
    if engine.kv_offload is not None and pool == "decode":
        # vLLM runs a tier beside the P/D transfer only through a MultiConnector of NixlConnector and
        # OffloadingConnector (--kv-offloading-size alone replaces the NixlConnector:
        # VllmConfig._post_init_kv_transfer_config).  On a prefill replica the NixlConnector matches
        # nothing (nixl/pull_scheduler.py, get_num_new_matched_tokens) and never defers, so the tier
        # runs as in a single engine.  On a decode replica MultiConnector.get_num_new_matched_tokens
        # asks every child in order: the first with tokens loads them, and a child's "ask again"
        # (None) defers the request; aisim's remote admission (remote_kv.pxi) does not ask a tier.
        where = "remove the decode pool engine's 'kv_offload' section" if own else \
            ("the engine's 'kv_offload' section gives the decode pool a tier too; give the decode pool "
             "its own engine without one ('deployment.decode.engine')")
        raise ConfigError("a disaggregated deployment models a KV offload tier on its prefill replicas only "
                          "(vLLM's MultiConnector of NixlConnector and OffloadingConnector); a decode replica "
                          f"with a tier asks it beside the transfer, which aisim does not replay: {where}")
    if engine.speculative is not None:
        raise ConfigError("a disaggregated deployment does not model speculative decoding yet; "
                          "remove the engine's 'speculative' section")
    if any(g["kind"] == GROUP_KINDS["state"] for g in core_config(engine).groups):
        raise ConfigError("a disaggregated deployment does not model Mamba state groups yet (vLLM's connectors "
                          "back off one token for them)")


def _router(name: str, opts: dict, config, engine: EngineConfig, sessions) -> dict:
    """The core's settings of one router over replicas of ``engine``."""
    from aisim.config.routers import ROUTER_BY_NAME, router_code

    row = ROUTER_BY_NAME[name]
    kv = row.reads_prefix_cache or ("fallback" in row.options and ROUTER_BY_NAME[opts["fallback"]].reads_prefix_cache)
    full = [i for i, g in enumerate(config.groups) if g["kind"] == GROUP_KINDS["full"]]
    if kv and not full:
        raise ConfigError(f"router {name!r} reads the prefix cache of a full-attention group; "
                          "this engine has none")
    if kv and config.speculative is not None and config.speculative["num_hash_lookahead_tokens"] > 0:
        raise ConfigError(f"router {name!r}: the engine's block keys cover EAGLE lookahead tokens "
                          f"(vLLM {engine.version}), which the router cannot see; use another router")
    return {
        "kind": router_code(name), "by_tokens": opts["by"] == "tokens", "weight": opts["overlap_weight"],
        "fallback": router_code(opts["fallback"]), "slack": opts["slack"],
        "view_delay_s": opts["view_delay_s"], "seed": opts["seed"], "session": sessions,
        "n_sessions": int(sessions.max()) + 1 if len(sessions) else 0,
        "group": full[0] if full else -1, "block": config.groups[full[0]]["block_size"] if full else 1,
    }
