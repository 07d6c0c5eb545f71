"""A replay's summary: totals, prefix-cache statistics and latency percentiles, added up in pieces."""

from __future__ import annotations

import numpy as np

from aisim._core.constants import REQUEST_STATUS
from aisim._core.constants import STEP_KINDS as STEP_KIND_CODES
from aisim.columns import LATENCIES, LATENCY_STATS
from aisim.config.engine import EngineConfig
from aisim.stats import percentiles
from aisim.throughput import Span, per_second

# A request vLLM's server refuses before it reaches the engine (``reject_too_long``): the core
# never sees it, so its status code follows the core's (the requests table labels it ``rejected``).
REJECTED = len(REQUEST_STATUS)

# The request columns the summary reads (with the core's ``status``).
SUMMARY_COLUMNS = ("arrival_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "output_tokens",
                   "cached_tokens")


def time_model_label(engine: EngineConfig) -> str:
    """How the replay's step times were made: ``roofline``, ``table``, ``linear`` or ``linear-default``.

    ``linear-default`` is the bare default, a constant :data:`aisim.config.keys.TIME_MODEL_KEYS`
    ``base_s`` per step whatever ran: latencies then count steps, not seconds of any GPU.
    """
    tm = engine.time_model
    raw = engine.raw.get("time_model") or {}
    if tm.kind == "linear" and not set(raw) - {"kind"}:
        return "linear-default"
    return tm.kind


def summarize(st: dict, rq: dict, engine: EngineConfig, timed: bool, spec_counts: dict | None = None) -> dict:
    """Totals, prefix-cache statistics and latency percentiles of one replay.

    ``st`` and ``rq`` are the step and request columns as numpy arrays;
    ``spec_counts`` the core's speculative-decoding counters.
    """
    totals = Totals()
    totals.add_steps(st)
    totals.add_requests(rq)
    return totals.summary(engine, timed, spec_counts)


class Totals:
    """What a replay's summary adds up, given its step and request rows in pieces, in order.

    Counts and sums add up exactly; the latency statistics keep each
    latency's values (8 bytes a request each), so that their mean and
    percentiles are those of the whole replay to the last bit.
    """

    _STEP_SUMS = ("num_preempted", "prefill_tokens", "decode_tokens", "num_reqs", "num_new", "prefix_queries",
                  "prefix_hits", "num_resumed", "preempted_prefix_queries", "preempted_prefix_hits",
                  "spec_tokens", "spec_accepted")

    def __init__(self):
        self.n_steps = self.n_step_lines = self.empty_steps = 0
        self.last_step = 0
        self.sums = dict.fromkeys(self._STEP_SUMS, 0)
        self.end = None
        self.n_reqs = self.n_done = self.n_rejected = self.prompt_tokens = self.output_tokens = self.cached_tokens = 0
        self.done_output_tokens = 0
        self.span = Span()
        self.latencies = {name: [] for name in LATENCIES}

    def add_steps(self, st: dict) -> None:
        n = len(st["step"])
        if n == 0:
            return
        is_step = st["kind"] == STEP_KIND_CODES["step"]
        self.n_step_lines += n
        self.n_steps += int(is_step.sum())
        self.empty_steps += int((is_step & (st["num_reqs"] == 0)).sum())
        self.last_step = int(st["step"][-1])
        for k in self._STEP_SUMS:
            self.sums[k] += int(st[k].sum())
        end = float((st["clock_s"] + st["duration_s"]).max())
        self.end = end if self.end is None or end > self.end else self.end

    def add_requests(self, rq: dict) -> None:
        n = len(rq["status"])
        if n == 0:
            return
        self.n_reqs += n
        done = rq["status"] == REQUEST_STATUS["finished"]
        self.n_done += int(done.sum())
        self.n_rejected += int((rq["status"] == REJECTED).sum())
        self.prompt_tokens += int(rq["prompt_tokens"].sum())
        self.output_tokens += int(rq["output_tokens"].sum())
        self.done_output_tokens += int(rq["output_tokens"][done].sum())
        self.cached_tokens += int(rq["cached_tokens"].sum())
        self.span.add(rq["arrival_s"], rq["finish_s"])
        for name in LATENCIES:
            v = rq[name]
            self.latencies[name].append(v[~np.isnan(v)])

    def summary(self, engine: EngineConfig, timed: bool, spec_counts: dict | None = None) -> dict:
        """The replay summary (see :func:`summarize`); with speculative decoding, its totals too."""
        sums = self.sums
        end = self.end if self.end is not None else 0.0
        # vllm bench serve's benchmark_duration and throughputs (aisim.throughput).
        span = self.span.duration(self.n_done)
        caching = engine.enable_prefix_caching
        summary = {
            "requests": self.n_reqs,
            "finished": self.n_done,
            "unfinished": self.n_reqs - self.n_done - self.n_rejected,
            "rejected": self.n_rejected,
            "steps": self.n_steps,
            "empty_steps": self.empty_steps,
            "last_step_index": self.last_step if self.n_step_lines else 0,
            "preemptions": sums["num_preempted"],
            "scheduled_tokens": sums["prefill_tokens"] + sums["decode_tokens"],
            "scheduled_req_steps": sums["num_reqs"],
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            # PrefixCacheStats: one record per admission that performed a lookup.
            "prefix_cache_stats": {
                "requests": sums["num_new"] if caching else 0,
                "queries": sums["prefix_queries"],
                "hits": sums["prefix_hits"],
                "preempted_requests": sums["num_resumed"] if caching else 0,
                "preempted_queries": sums["preempted_prefix_queries"],
                "preempted_hits": sums["preempted_prefix_hits"],
            },
            "prefix_hit_tokens_at_admission": self.cached_tokens,
            "clock_end_s": end,
            "duration_s": span,
            "throughput_req_s": per_second(self.n_done, span),
            "throughput_tok_s": per_second(self.done_output_tokens, span),
            "timed": timed,
            "time_model": time_model_label(engine),
        }
        # The statistics the summaries table flattens (aisim.columns.LATENCY_STATS; a test checks the keys).
        for name in LATENCIES:
            parts = self.latencies[name]
            v = np.concatenate(parts) if len(parts) > 1 else (parts[0] if parts else np.zeros(0))
            if v.size:
                p50, p90, p99 = percentiles(v)
                with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, in one line
                    mean = float(v.mean())
                summary[name] = {"mean": mean, "p50": p50, "p90": p90, "p99": p99}
            else:
                summary[name] = dict.fromkeys(LATENCY_STATS)
        q = summary["prefix_cache_stats"]
        summary["prefix_hit_rate"] = q["hits"] / q["queries"] if q["queries"] else 0.0
        if engine.speculative is not None:
            summary.update(_spec_summary(sums["spec_tokens"], sums["spec_accepted"], spec_counts))
        _refuse_non_finite(summary, engine)
        return summary


def _refuse_non_finite(summary: dict, engine: EngineConfig) -> None:
    """Raise :class:`~aisim.errors.ReplayError` when a time of ``summary`` is inf or NaN: no result is
    printed or landed with a latency that is not a number (the bounds on the time model keep step
    times finite; a profile table's own values are not bounded)."""
    import math

    from aisim.errors import ReplayError

    times = [("clock_end_s", summary["clock_end_s"])] + [
        (f"{name} {stat}", summary[name][stat]) for name in LATENCIES for stat in LATENCY_STATS]
    for what, v in times:
        if v is not None and not math.isfinite(v):
            raise ReplayError(f"the replay's {what} is {v}: the step times of the {time_model_label(engine)} "
                              "time model overflow; no result is given")


def _spec_summary(drafts: int, accepted: int, counts: dict) -> dict:
    """Speculative-decoding totals: aisim's verifications and vLLM's ``SpecDecodingStats``.

    ``drafts`` and ``accepted`` sum the steps' ``spec_tokens`` and ``spec_accepted``;
    ``counts`` are the core's (``Engine.spec_counts``).
    """
    return {
        "spec": {
            "draft_tokens": drafts,
            "accepted_tokens": accepted,
            "verifications": counts["verifications"],
            "padded_requests": counts["padded_requests"],
            "padded_tokens": counts["padded_tokens"],
            "draft_feeds": counts["draft_feeds"],
            "acceptance_rate": accepted / drafts if drafts else None,
            "accepted_per_verification": accepted / counts["verifications"] if counts["verifications"] else None,
        },
        # vLLM's SpecDecodingStats, summed over update_from_output calls (padding included).
        "spec_decoding_stats": {k: counts[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")},
    }
