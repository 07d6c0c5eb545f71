"""Speculative decoding: the ``speculative`` section of an engine configuration.

vLLM's scheduler sees speculative decoding through a few numbers its
``SpeculativeConfig`` and ``VllmConfig`` derive from the method and ``k``
(``num_speculative_tokens``): the KV slots a drafter writes past the
scheduled tokens (``num_lookahead_tokens``), the input budget each scheduled
request takes for drafting (``max_num_new_slots_for_drafting``), whether it
is an EAGLE-style drafter (``use_eagle``), and from that the prefix-cache rule
of the release: vLLM 0.31.0 and 0.32.0 drop the last matched block
(``use_eagle_block_drop``), vLLM 0.33.0 instead hashes every block together
with the token after it (``num_hash_lookahead_tokens``).
:func:`scheduler_view` computes them once, here, from
``vllm/config/speculative.py`` and ``vllm/config/vllm.py`` of each release.

What vLLM learns from its models aisim takes as inputs: how many drafts the
target model accepts (``acceptance``) and what drafting costs
(``drafter_cost``).  Acceptance is exact and deterministic: request i (its
index in the trace) verified for the n-th time with m drafts accepts
``min(m, A(i, n))``, where A is, first match wins, the request's trace field
``accept`` (``accept[n mod len]``), ``counts[n mod len]``, a draw from
``histogram`` (P(exactly j accepted)), or the hash rule: with ``sm`` one
splitmix64 output and ``h = sm(sm(sm(seed) ^ i) ^ n)``, the leading positions
j with ``sm(h ^ j) % 1000 < permille[min(j, len - 1)]``.  ``permille`` is thus
the acceptance rate of each draft position given that the ones before it were
accepted; a measured per-position rate plugs in directly, a measured
distribution of accepted lengths as ``histogram``.  Defaults and meanings:
:data:`aisim.config.keys.SPECULATIVE_KEYS`, ``ACCEPTANCE_KEYS``,
``DRAFTER_COST_KEYS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aisim.config.keys import (ACCEPTANCE_KEYS, DRAFTER_COST_KEYS, SPECULATIVE_KEYS, check_high, defaults, key,
                               refuse_unknown)
from aisim.config.keys import where as _where
from aisim.errors import ConfigError

METHODS = ("eagle", "mtp", "draft_model", "ngram")
# Methods whose drafter reads the target's hidden states (SpeculativeConfig.use_eagle).
EAGLE_METHODS = ("eagle", "mtp")

_S = defaults(SPECULATIVE_KEYS)
_A = defaults(ACCEPTANCE_KEYS)
_C = defaults(DRAFTER_COST_KEYS)
# Histogram draws are 53-bit integers compared with cumulative thresholds.
HISTOGRAM_BITS = 53
UINT64 = 2**64


@dataclass(frozen=True)
class SpeculativeConfig:
    """The ``speculative`` section, validated.

    Parameters
    ----------
    num_speculative_tokens : int
        Drafts proposed per request and step (k).
    method : {"eagle", "mtp", "draft_model", "ngram"}
    acceptance : dict
        The acceptance rule as configured (one of ``counts``, ``permille``,
        ``histogram``; ``seed``).
    drafter_cost : float or dict or None
        A fraction of the target step's time, or ``{base_s, per_token_s}``.
    """

    num_speculative_tokens: int
    method: str = _S["method"]
    acceptance: dict | None = None
    drafter_cost: float | dict | None = None

    @property
    def use_eagle(self) -> bool:
        """``SpeculativeConfig.use_eagle``: the drafter reads the target's hidden states."""
        return self.method in EAGLE_METHODS

    def rule(self) -> tuple[str, tuple, int]:
        """``(kind, values, seed)`` of the acceptance rule: ``counts``, ``histogram`` or ``permille``."""
        a = self.acceptance or {}
        seed = int(a.get("seed", _A["seed"]))
        if a.get("counts") is not None:
            return "counts", tuple(a["counts"]), seed
        if a.get("histogram") is not None:
            return "histogram", tuple(a["histogram"]), seed
        p = a.get("permille", _A["permille"])
        return "permille", (tuple(p) if isinstance(p, (list, tuple)) else (p,)), seed


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_speculative(raw, source=None) -> SpeculativeConfig:
    """Validate the ``speculative`` mapping of an engine configuration.

    Parameters
    ----------
    raw : dict
    source : str, optional
        File named in error messages.

    Raises
    ------
    ConfigError
        Naming the key (``speculative.acceptance.permille`` ...) and the value.
    """
    w = _where(source)
    if not isinstance(raw, dict):
        raise ConfigError(f"'speculative'{w} must be a mapping")
    refuse_unknown(raw, [k.name for k in SPECULATIVE_KEYS], "speculative.", w)
    k = raw.get("num_speculative_tokens")
    if k is None:
        raise ConfigError(f"'speculative.num_speculative_tokens'{w} is required")
    if not _int(k) or k < 1:
        raise ConfigError(f"'speculative.num_speculative_tokens'{w} must be a positive integer, got {k!r}")
    # vllm/v1/sample/rejection_sampler.py: RejectionSampler.forward asserts max_spec_len <= MAX_SPEC_LEN (128).
    check_high(key(SPECULATIVE_KEYS, "num_speculative_tokens"), k, "speculative.", w)
    method = raw.get("method", _S["method"])
    if method not in METHODS:
        raise ConfigError(f"'speculative.method'{w} must be one of {', '.join(METHODS)}, got {method!r}")
    acceptance = _acceptance(raw.get("acceptance"), k, w)
    cost = _drafter_cost(raw.get("drafter_cost"), w)
    return SpeculativeConfig(num_speculative_tokens=k, method=method, acceptance=acceptance, drafter_cost=cost)


def _acceptance(a, k, w) -> dict:
    if a is None:
        return {}
    if not isinstance(a, dict):
        raise ConfigError(f"'speculative.acceptance'{w} must be a mapping")
    refuse_unknown(a, [x.name for x in ACCEPTANCE_KEYS], "speculative.acceptance.", w)
    given = [key for key in ("counts", "permille", "histogram") if a.get(key) is not None]
    if len(given) > 1:
        raise ConfigError(f"'speculative.acceptance'{w} takes one of counts, permille and histogram, "
                          f"got {' and '.join(given)}")
    if "counts" in given:
        c = a["counts"]
        if not isinstance(c, list) or not c or not all(_int(x) and x >= 0 for x in c):
            raise ConfigError(f"'speculative.acceptance.counts'{w} must be a non-empty list of "
                              f"non-negative integers, got {c!r}")
        if "seed" in a:
            raise ConfigError(f"'speculative.acceptance.seed'{w} has no effect with counts; leave it out")
    if "permille" in given:
        p = a["permille"]
        values = p if isinstance(p, list) else [p]
        if not values or not all(_int(x) and 0 <= x <= 1000 for x in values):
            raise ConfigError(f"'speculative.acceptance.permille'{w} must be an integer in [0, 1000] or a "
                              f"non-empty list of them, got {p!r}")
    if "histogram" in given:
        hist = a["histogram"]
        ok = isinstance(hist, list) and len(hist) == k + 1 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in hist)
        if not ok:
            raise ConfigError(f"'speculative.acceptance.histogram'{w} must be a list of {k + 1} non-negative "
                              f"probabilities (exactly 0 .. {k} drafts accepted), got {hist!r}")
        if abs(math.fsum(hist) - 1.0) > 1e-9:
            raise ConfigError(f"'speculative.acceptance.histogram'{w} must sum to 1, got {math.fsum(hist)!r}")
    if "seed" in a:
        s = a["seed"]
        if not _int(s) or not 0 <= s < UINT64:
            raise ConfigError(f"'speculative.acceptance.seed'{w} must be an integer in [0, 2**64), got {s!r}")
    return dict(a)


def _drafter_cost(c, w):
    if c is None:
        return None
    if isinstance(c, dict):
        known = [x.name for x in DRAFTER_COST_KEYS]
        refuse_unknown(c, known, "speculative.drafter_cost.", w)
        out = {}
        for name in known:
            v = c.get(name, _C[name])
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"'speculative.drafter_cost.{name}'{w} must be a finite non-negative number "
                                  f"of seconds, got {v!r}")
            check_high(key(DRAFTER_COST_KEYS, name), v, "speculative.drafter_cost.", w)
            out[name] = float(v)
        return out
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0:
        raise ConfigError(f"'speculative.drafter_cost'{w} must be a non-negative fraction of the step time "
                          f"or a mapping with base_s and per_token_s, got {c!r}")
    if c > MAX_DRAFT_FRACTION:
        raise ConfigError(f"'speculative.drafter_cost'{w} must be from 0 to {MAX_DRAFT_FRACTION:g} (a fraction of "
                          f"the target step's time), got {c!r}")
    return float(c)


# A drafter at most a thousand times the target step's time: step times stay finite.
MAX_DRAFT_FRACTION = 1000.0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scheduler_view(cfg) -> dict | None:
    """What vLLM's scheduler derives from the speculative configuration of ``cfg``.

    The keys and their order are the ``speculative`` block of the recorded
    logs' header.  ``None`` without speculative decoding.

    Parameters
    ----------
    cfg : aisim.config.engine.EngineConfig

    Returns
    -------
    dict or None
    """
    from aisim.config.kvgroups import STATE_KINDS, expand_groups, group_block_sizes
    from aisim.config.versions import rules

    sp = cfg.speculative
    if sp is None:
        return None
    k = sp.num_speculative_tokens
    rel = rules(cfg.version)
    # VllmConfig.num_lookahead_tokens: EAGLE/MTP and draft models write k KV slots ahead.
    lookahead = k if sp.method in ("eagle", "mtp", "draft_model") else 0
    # VllmConfig.num_prefill_lookahead_tokens: EAGLE-family drafters read the next prefill token.
    prefill_lookahead = 1 if sp.use_eagle else 0
    # SpeculativeConfig.max_num_new_slots_for_drafting: a draft model keeps one unsliced input token.
    draft_slots = 1 if sp.method == "draft_model" else 0
    # VllmConfig.num_hash_lookahead_tokens replaces the drop when prefix caching is on.
    hash_lookahead = None
    block_drop = sp.use_eagle
    if rel.hash_lookahead_replaces_eagle_drop:
        hash_lookahead = prefill_lookahead if (sp.use_eagle and cfg.enable_prefix_caching) else 0
        if hash_lookahead:
            block_drop = False
    # Scheduler._spec_decode_step_blocks (spec_decode_step_blocks_attribute): blocks of one decode step's slots.
    groups = expand_groups(cfg.groups)
    sizes = group_block_sizes(cfg)
    step_blocks = None
    if rel.spec_decode_step_blocks_attribute:
        step_blocks = sum(_cdiv(1 + k + lookahead, s) for g, s in zip(groups, sizes) if g["type"] not in STATE_KINDS)
    from aisim.config.kvgroups import resolve_groups

    spec_blocks = [sp_["num_spec"] for g, sp_ in zip(groups, resolve_groups(cfg)["groups"])
                   if g["type"] in STATE_KINDS]
    return {
        "method": sp.method,
        "num_speculative_tokens": k,
        "num_lookahead_tokens": lookahead,
        "num_prefill_lookahead_tokens": prefill_lookahead,
        "draft_slots": draft_slots,
        "use_eagle": sp.use_eagle,
        "use_eagle_block_drop": block_drop,
        "num_hash_lookahead_tokens": hash_lookahead,
        "spec_decode_step_blocks": step_blocks,
        "num_speculative_blocks": spec_blocks,
        "async_scheduling": cfg.async_scheduling,
        "acceptance": dict(sp.acceptance or {}),
    }


def splitmix64(x: int) -> int:
    """One output of splitmix64 for state ``x`` (arithmetic mod 2**64).

    Parameters
    ----------
    x : int

    Returns
    -------
    int
    """
    z = (x + 0x9E3779B97F4A7C15) % UINT64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % UINT64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % UINT64
    return z ^ (z >> 31)


def histogram_thresholds(hist) -> list[int]:
    """Cumulative 53-bit thresholds of ``hist``: draw ``v`` accepts the first j with ``v < t[j]``."""
    out, acc = [], 0.0
    for p in hist:
        acc += p
        out.append(min(int(acc * 2**HISTOGRAM_BITS), 2**HISTOGRAM_BITS))
    out[-1] = 2**HISTOGRAM_BITS
    return out


def core_args(cfg) -> dict | None:
    """The replay core's speculative settings for ``cfg`` (None without speculative decoding)."""
    from aisim._core.constants import ACCEPT_KINDS

    view = scheduler_view(cfg)
    if view is None:
        return None
    sp = cfg.speculative
    kind, values, seed = sp.rule()
    table = histogram_thresholds(values) if kind == "histogram" else [int(v) for v in values]
    cost = sp.drafter_cost
    return {
        "num_speculative_tokens": view["num_speculative_tokens"],
        "num_lookahead_tokens": view["num_lookahead_tokens"],
        "draft_slots": view["draft_slots"],
        "use_eagle_block_drop": bool(view["use_eagle_block_drop"]),
        "num_hash_lookahead_tokens": int(view["num_hash_lookahead_tokens"] or 0),
        "acc_kind": ACCEPT_KINDS[kind],
        "acc_table": table,
        "acc_seed_mix": splitmix64(seed),
        "drafter_fraction": float(cost) if isinstance(cost, float) else 0.0,
        "drafter_base_s": cost["base_s"] if isinstance(cost, dict) else 0.0,
        "drafter_per_token_s": cost["per_token_s"] if isinstance(cost, dict) else 0.0,
    }
