"""The keys of an engine configuration: name, default and meaning, written once.

:class:`~aisim.config.engine.EngineConfig` and
:class:`~aisim.config.engine.TimeModel` read their defaults from
:data:`ENGINE_KEYS` and :data:`TIME_MODEL_KEYS`; the per-group keys of
``kv_cache_groups`` are :data:`GROUP_KEYS` (their kinds are
:data:`aisim.config.kvgroups.KINDS`).  The README's "Engine configuration"
tables are rendered from these catalogues (:mod:`aisim.config.readme`; run
``python -m aisim.config.readme`` to print them) and a test checks that the
README holds them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigKey:
    """One configuration key.

    Parameters
    ----------
    name : str
        The key as written in a configuration file (vLLM's name where vLLM has one).
    default : object
        The value of an absent key (``None``: derived, see ``shown``).
    meaning : str
        One line for the documentation (Markdown).
    low : int, optional
        Smallest accepted value of an integer key.
    shown : str, optional
        How the documentation states the default when the value alone does not say it.
    fitted : bool, optional
        A constant set by a fit to measurements (``aisim calibrate``,
        ``benchmarks/timing_accuracy.py --fit``) rather than read from a datasheet or chosen.
    """

    name: str
    default: object
    meaning: str
    low: int | None = None
    shown: str | None = None
    fitted: bool = False

    def default_text(self) -> str:
        """The default as the documentation shows it."""
        if self.shown is not None:
            return self.shown
        v = self.default
        if isinstance(v, bool):
            return "true" if v else "false"
        if v is None:
            return "—"
        if isinstance(v, str):
            return f"`{v}`"
        return repr(v)


# Order is the order of EngineConfig's fields and of its resolved ``to_dict()``.
ENGINE_KEYS = (
    ConfigKey("num_gpu_blocks", None, "blocks in the KV-cache pool, including vLLM's null block 0",
              low=2, shown="required (or `kv_cache_bytes`)"),
    ConfigKey("block_size", 16, "tokens per KV-cache block (`CacheConfig.block_size`)", low=1),
    ConfigKey("max_num_seqs", 256, "as in vLLM's `SchedulerConfig`", low=1),
    ConfigKey("max_num_batched_tokens", 8192, "as in vLLM's `SchedulerConfig`", low=1),
    ConfigKey("max_num_scheduled_tokens", None, "per-step token budget", low=1,
              shown="= `max_num_batched_tokens`"),
    ConfigKey("max_num_active_seqs", None, "admission cap into RUNNING", low=1, shown="= `max_num_seqs`"),
    ConfigKey("max_model_len", 32768, "as in vLLM's `SchedulerConfig`", low=1),
    ConfigKey("enable_chunked_prefill", True, "as in vLLM"),
    ConfigKey("enable_prefix_caching", True, "as in vLLM"),
    ConfigKey("long_prefill_token_threshold", 0, "per-request per-step cap on new tokens (0 = off; vLLM 0.31+)",
              low=0),
    ConfigKey("long_prefill_token_threshold_adaptive", False, "floor the cap at the fair share of the batch"),
    ConfigKey("policy", "fcfs", "`fcfs` or `priority`"),
    ConfigKey("scheduler_reserve_full_isl", True, "admit a waiting request only when its whole sequence fits"),
    ConfigKey("watermark", 0.0, "fraction of blocks kept free at admission"),
    ConfigKey("async_scheduling", False, "vLLM's async engine loop (batch queue of two, output placeholders)"),
    ConfigKey("kv_cache_groups", None, "the groups in group-id order (keys and kinds below)",
              shown="one full-attention group"),
    ConfigKey("mamba_cache_mode", None, "`align` or `none`",
              shown="`align` with a state group and prefix caching, else `none`"),
    ConfigKey("prefix_match_unit", None, "hash block size of grouped caches (vLLM's `prefix_match_unit`)",
              low=1, shown="GCD of the cacheable groups' block sizes"),
    ConfigKey("prefix_cache_retention_interval", 0, "engine default 0 (sparse); `null` keeps every "
              "window/state block (dense)"),
    ConfigKey("cache_extra", None, "the oracle's spelling of `prefix_cache_retention_interval` and "
              "`prefix_match_unit`", shown="empty"),
    ConfigKey("vllm_version", None, "the vLLM release whose rules are followed (differences: "
              "`docs/vllm-version-rules.md`)", shown="{default} (one of {supported})"),
    ConfigKey("time_model", None, "step time in seconds (keys below)",
              shown="the roofline once `gpu` is named, else `linear` (10 ms a step)"),
    ConfigKey("speculative", None, "speculative decoding (keys below)", shown="off"),
    ConfigKey("model", None, "model name (catalog entries have model-specific rules, e.g. GLM-5.3-Flash); the "
              "roofline's model unless `time_model.model` is set"),
    ConfigKey("kv_cache_bytes", None, "KV-cache memory; with `page_size_bytes` on the groups it gives "
              "`num_gpu_blocks`", low=1),
    ConfigKey("plan_notes", (), "why a plan chose what it chose (written by `aisim plan`)", shown="[]"),
)

# The roofline's efficiencies and overheads are fitted to published vLLM serving measurements:
# `python benchmarks/timing_accuracy.py --fit` on the sources `cssnoeasy`, `kvcached` (vLLM 0.19.0;
# Qwen2.5-7B on A100 80GB PCIe TP 1 and 2, Qwen3-0.6B on H100), `vllm-pr` and `inferencex` (Qwen3-30B-A3B
# on one H100 and one H200), TPOT and throughput (and the TTFT of bursts and of cold long prompts), with
# the API server's costs in front of the engine (aisim/perf/frontend.py) and the routed experts at their
# kernel's published rate (aisim/perf/moe_kernel.py); the sources `gpustack` (vLLM 0.11.0), `dennislee22` (vLLM
# 0.10.1.1, Qwen2-7B and Qwen2.5-32B on one A100 80GB SXM), `simon-mo` (vLLM 0.8.2-0.8.4, DeepSeek-R1 on
# 8 H200, Llama-3.1-8B FP8 on one) and `nerdalert` (vLLM 0.8.3, Llama-3.1-8B on one H100) are held out.  The
# points, their sources and the errors: benchmarks/data/README.md.
TIME_MODEL_KEYS = (
    ConfigKey("kind", "linear", "`linear`: `base_s + per_token_s * tokens + per_req_s * requests`; "
              "`roofline`: from `model` on `tp` GPUs `gpu` (compute- or memory-bound, plus all-reduces); "
              "`table`: a profile at `path`", shown="`roofline` when `gpu` is set, else `linear`"),
    ConfigKey("base_s", 0.01, "linear: seconds per step"),
    ConfigKey("per_token_s", 0.0, "linear: seconds per scheduled token"),
    ConfigKey("per_req_s", 0.0, "linear: seconds per scheduled request"),
    ConfigKey("gpu", None, "roofline: a GPU of the catalog (table below)"),
    ConfigKey("model", None, "roofline: a catalog model or the path of a Hugging Face `config.json` (relative to "
              "the configuration file)", shown="the engine's `model`"),
    ConfigKey("tp", 1, "roofline: tensor-parallel size", low=1),
    ConfigKey("dtype", None, "roofline: weights and matrix products, `bf16` or `fp8`",
              shown="the checkpoint's (`fp8` when its `config.json` is FP8-quantized)"),
    ConfigKey("overhead_s", 0.002, "roofline: the CPU's seconds per step (scheduling, inputs, outputs; overlapped "
              "with the GPU under `async_scheduling`) (fitted)", fitted=True),
    ConfigKey("overhead_per_req_s", 6.0e-5, "roofline: the CPU's seconds per scheduled request of a step (fitted)",
              fitted=True),
    ConfigKey("compute_efficiency", 0.67, "roofline: share of the GPU's achievable matmul FLOP/s (table below) "
              "a matrix product's full tiles reach, in (0, 1] (fitted)", fitted=True),
    ConfigKey("attention_efficiency", 0.73, "roofline: the same share for attention (at the rate of the KV "
              "cache's dtype), in (0, 1] (fitted)", fitted=True),
    ConfigKey("bandwidth_efficiency", 0.84, "roofline: share of peak memory bandwidth reached, in (0, 1] (fitted)",
              fitted=True),
    ConfigKey("layer_overhead_s", 0.0, "roofline: the GPU's fixed seconds per decoder layer and step (the small "
              "kernels between the matrix products) (fitted)", fitted=True),
    ConfigKey("path", None, "table: profile CSV/Parquet (required; relative to the configuration file): "
              "`latency_s` over one or two of `batch_size`, `prefill_tokens`, `kv_tokens`; interpolated, "
              "never extrapolated"),
)

# Keys of ``speculative``: vLLM's SpeculativeConfig as far as the scheduler sees it, plus what the
# replay needs that vLLM learns from its models (how many drafts are accepted, what drafting costs).
SPECULATIVE_KEYS = (
    ConfigKey("num_speculative_tokens", None, "draft tokens proposed per request and step (k)", low=1,
              shown="required"),
    ConfigKey("method", "eagle", "`eagle` or `mtp` (k lookahead slots, EAGLE prefix-cache rules), "
              "`draft_model` (k lookahead slots, one draft slot of input budget per request), `ngram` "
              "(neither)"),
    ConfigKey("acceptance", None, "how many drafts the target model accepts (keys below)",
              shown="`permille` 700, `seed` 0"),
    ConfigKey("drafter_cost", None, "the drafter's time per step: a number is a fraction of the target "
              "step's time; a mapping `{base_s, per_token_s}` is a linear model over the step's scheduled "
              "tokens", shown="0"),
)

# Keys of ``speculative.acceptance``.  A request's trace field ``accept`` (a list) comes first; then
# ``counts``; then ``histogram`` or the hash rule (``permille``).  Request i (its index in the trace)
# verified for the n-th time with m drafts accepts min(m, A(i, n)).
ACCEPTANCE_KEYS = (
    ConfigKey("counts", None, "accepted drafts of a request's n-th verification: `counts[n mod len]`"),
    ConfigKey("permille", 700, "the hash rule: acceptance rate of each draft position given the ones "
              "before it, in 1/1000 (an integer for every position, or one per position, the last "
              "repeated)", shown="700"),
    ConfigKey("histogram", None, "`[p0, p1, ..., pk]`: probability of accepting exactly j drafts, drawn "
              "per verification from a generator seeded by `seed`, the request and n"),
    ConfigKey("seed", 0, "seed of the hash rule and of the histogram draws", low=0),
)

# Keys of ``speculative.drafter_cost`` given as a mapping.
DRAFTER_COST_KEYS = (
    ConfigKey("base_s", 0.0, "seconds of drafting per step that proposes drafts"),
    ConfigKey("per_token_s", 0.0, "seconds per token the step scheduled"),
)

# Per-group keys of ``kv_cache_groups``; order is the order error messages list them in.
GROUP_KEYS = (
    ConfigKey("type", None, "the group's kind (table below)", shown="required"),
    ConfigKey("block_size", None, "tokens per block", low=1, shown="the engine's `block_size`"),
    ConfigKey("count", 1, "consecutive groups of this shape", low=1),
    ConfigKey("sliding_window", None, "window in tokens (required by `sliding_window`)", low=1),
    ConfigKey("attention_chunk_size", None, "chunk in tokens (required by `chunked_local`)", low=1),
    ConfigKey("prefix_cacheable", None, "whether the group's blocks can be prefix-cached",
              shown="the kind's default"),
    ConfigKey("num_speculative_blocks", None, "state groups: draft blocks", low=0,
              shown="`speculative.num_speculative_tokens`, else 0"),
    ConfigKey("prefill_checkpoint_blocks", 0, "state groups: prefill-checkpoint blocks", low=0),
    ConfigKey("prefill_checkpoint_alignment", None, "state groups: prefill-checkpoint alignment in tokens", low=1),
    ConfigKey("page_size_bytes", None, "one layer's page (vLLM `KVCacheSpec.page_size_bytes`)", low=1),
    ConfigKey("num_layers", 1, "layers sharing the group's block table", low=1),
)


# A deployment file's ``deployment`` section (aisim/config/deployment.py).
DEPLOYMENT_KEYS = (
    ConfigKey("replicas", 1, "engines behind the router, each a complete replica of the engine file (1 to 64)",
              low=1),
    ConfigKey("router", "round_robin", "`round_robin`, `random`, `least_loaded`, `kv_aware` or "
              "`session_affinity`; or a mapping with `kind` and the router keys below"),
    ConfigKey("prefill", None, "disaggregated: the prefill pool, a mapping of the pool keys below (with `decode`; "
              "then no `replicas` or `router` here)", shown="—"),
    ConfigKey("decode", None, "disaggregated: the decode pool, a mapping of the pool keys below", shown="—"),
    ConfigKey("link", None, "disaggregated: the prefill-to-decode KV transfer link, a mapping of the link keys "
              "below", shown="—"),
)

# ``deployment.prefill`` / ``deployment.decode`` keys (a disaggregated deployment's pools).
POOL_KEYS = (
    ConfigKey("replicas", 1, "engines in the pool (1 to 64)", low=1),
    ConfigKey("router", "round_robin", "the pool's router: a name or a mapping of the router keys below"),
    ConfigKey("engine", None, "the pool's engine file (relative to the deployment file); default the "
              "deployment's engine", shown="—"),
)

# ``deployment.link`` keys.
LINK_KEYS = (
    ConfigKey("bandwidth_gb_s", None, "transfer bandwidth in GB/s (10^9 bytes per second; `inf`: no transfer time "
              "but the latency)", shown="required"),
    ConfigKey("latency_s", 0.0, "seconds added to every transfer"),
    ConfigKey("transfer", "all", "`all`: every block the prefill replica holds for the request; `missing`: only "
              "those past the decode replica's prefix hit when it is chosen"),
)

# ``deployment.router`` keys (given as a mapping).
ROUTER_KEYS = (
    ConfigKey("kind", "round_robin", "the router (names above)"),
    ConfigKey("by", "requests", "`least_loaded`: count outstanding `requests`, or `tokens` (prompt + "
              "max output tokens of each outstanding request)"),
    ConfigKey("overlap_weight", 1.0, "`kv_aware` (and its use as a fallback): Dynamo's "
              "`overlap_score_weight`, the weight of the prefill term"),
    ConfigKey("seed", 0, "`random`: seed of the splitmix64 draws", low=0),
    ConfigKey("fallback", "kv_aware", "`session_affinity`: `kv_aware` or `least_loaded`, the choice "
              "for a session's first turn and when its replica is overloaded"),
    ConfigKey("slack", 16, "`session_affinity`: a session's replica is overloaded when it has more than "
              "this many outstanding requests above the least loaded replica", low=0),
    ConfigKey("view_delay_s", 0.0, "the router sees what replicas report (cache contents, first tokens, "
              "finishes) this many seconds late; its own bookings at once"),
)


def defaults(keys) -> dict:
    """``name -> default`` of a catalogue."""
    return {k.name: k.default for k in keys}


def where(source: str | None) -> str:
    """`` in FILE`` for an error message about a configuration read from ``source``, else ``""``."""
    return f" in {source}" if source else ""


def refuse_unknown(raw: dict, known, prefix: str, at: str = "") -> None:
    """Raise :class:`~aisim.errors.ConfigError` naming the first key of ``raw`` not in ``known``.

    ``prefix`` is the section's dotted path (``"speculative."``), ``at`` the file (:func:`where`);
    the message lists ``known`` in the order given.
    """
    from aisim.errors import ConfigError

    for key in raw:
        if key not in known:
            raise ConfigError(f"unknown key '{prefix}{key}'{at}; known keys: {', '.join(known)}")

