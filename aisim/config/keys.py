"""The keys of an engine configuration: name, default and meaning, written once.

:class:`~aisim.config.engine.EngineConfig` and
:class:`~aisim.config.engine.TimeModel` read their defaults from
:data:`ENGINE_KEYS` and :data:`TIME_MODEL_KEYS`; the per-group keys of
``kv_cache_groups`` are :data:`GROUP_KEYS` (their kinds are
:data:`aisim.config.kvgroups.KINDS`).  The tables of
``docs/configuration.md`` are rendered from these catalogues
(:mod:`aisim.config.readme`; run ``python -m aisim.config.readme`` to print
them) and a test checks that the page holds them.
"""

from __future__ import annotations

from dataclasses import dataclass

from aisim.config.routers import FALLBACKS, ROUTER_TABLE, router_names_text


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
    high : int or float, optional
        Largest accepted value of a number (an int for an integer key): what the replay core and
        memory can hold, or what vLLM accepts (:func:`check_high`; the constants below say why).
    shown : str, optional
        How the documentation states the default when the value alone does not say it.
    fitted : bool, optional
        A constant set by a fit to measurements (``aisim calibrate``,
        ``benchmarks/timing_accuracy.py --fit``) rather than read from a datasheet or chosen.
    kinds : tuple of str, optional
        The kinds of its section (the router's, the time model's) the key acts on; given for another
        kind it is refused (:func:`refuse_inert`).  None: every kind.
    """

    name: str
    default: object
    meaning: str
    low: int | None = None
    high: int | float | None = None
    shown: str | None = None
    fitted: bool = False
    kinds: tuple | None = None

    def range_text(self) -> str | None:
        """The accepted range as the documentation shows it (``1 to 2147483647``); None without ``high``."""
        if self.high is None:
            return None
        low = self.low if self.low is not None else 0
        return f"{low:g} to {self.high:g}" if isinstance(self.high, float) else f"{low} to {self.high}"

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


# Upper bounds of numbers (ConfigKey.high).  Token counts, block ids and block-table rows are int32 in
# the replay core (ext/types.pxd); byte counts are Python integers divided down to block counts.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# KV-cache groups one engine may have: the core's fixed-size group arrays (ext/kvcache.pxd MAX_GROUPS,
# exported as aisim._core.constants.MAX_GROUPS; a test checks the two agree).
MAX_GROUPS = 64
# Draft tokens per request and step: vLLM's rejection sampler asserts at most MAX_SPEC_LEN = 128
# (vllm/v1/sample/rejection_sampler.py, 0.31.0 to 0.33.0), so an engine with more fails its first
# verification.
MAX_SPEC_LEN = 128
# A time-model constant (seconds per step, per token, per request) of at most an hour: step times and
# their sums stay finite and meaningful (a constant near the largest float overflows to inf).
MAX_STEP_S = 3600.0
# Router and link seconds and weights: finite and far from overflow when multiplied by token counts.
MAX_ROUTER_VALUE = 1e6
# Replicas of a deployment: the router's cache index keeps one bit per replica (ext/deploy.pxd).
MAX_REPLICAS = 64


def _serve_text(field: str) -> str:
    """A ``vllm serve`` default by release, e.g. ``16 (0.31.0-0.33.0), 64 (0.34.0)``."""
    from aisim.config.versions import RELEASES

    runs: list = []
    for r in RELEASES:
        v = getattr(r, field)
        if runs and runs[-1][0] == v:
            runs[-1][2] = r.version
        else:
            runs.append([v, r.version, r.version])
    return ", ".join(f"{v:g} ({a}{'' if a == b else '-' + b})" for v, a, b in runs)


# Order is the order of EngineConfig's fields and of its resolved ``to_dict()``.
ENGINE_KEYS = (
    ConfigKey("num_gpu_blocks", None, "blocks in the KV-cache pool, including vLLM's null block 0",
              low=2, shown="required (or `kv_cache_bytes`)", high=INT32_MAX),
    ConfigKey("block_size", None, "tokens per KV-cache block (`CacheConfig.block_size`)", low=1,
              shown="the release's `CacheConfig.DEFAULT_BLOCK_SIZE`: " + _serve_text("block_size"), high=INT32_MAX),
    ConfigKey("max_num_seqs", 256, "as in vLLM's `SchedulerConfig`", low=1, high=INT32_MAX),
    ConfigKey("max_num_batched_tokens", 8192, "as in vLLM's `SchedulerConfig`", low=1, high=INT32_MAX),
    ConfigKey("max_num_scheduled_tokens", None, "per-step token budget", low=1,
              shown="= `max_num_batched_tokens`", high=INT32_MAX),
    ConfigKey("max_num_active_seqs", None, "admission cap into RUNNING", low=1, shown="= `max_num_seqs`",
              high=INT32_MAX),
    ConfigKey("max_model_len", 32768, "as in vLLM's `SchedulerConfig`", low=1, high=INT32_MAX),
    ConfigKey("enable_chunked_prefill", True, "as in vLLM"),
    ConfigKey("enable_prefix_caching", True, "as in vLLM"),
    ConfigKey("long_prefill_token_threshold", 0, "per-request per-step cap on new tokens (0 = off; vLLM 0.31+)",
              low=0, high=INT32_MAX),
    ConfigKey("long_prefill_token_threshold_adaptive", False, "floor the cap at the fair share of the batch"),
    ConfigKey("policy", "fcfs", "`fcfs` or `priority`"),
    ConfigKey("scheduler_reserve_full_isl", True, "admit a waiting request only when its whole sequence fits"),
    ConfigKey("watermark", 0.0, "fraction of blocks kept free at admission"),
    ConfigKey("async_scheduling", False, "vLLM's async engine loop (batch queue of two, output placeholders)"),
    ConfigKey("cache_aware_admission_window", 0, "FCFS admission looks this many waiting requests ahead and "
              "admits those with a cached prefix first (`SchedulerConfig`, from vLLM 0.34.0; FCFS with prefix "
              "caching only; 0 = arrival order)", low=0, high=INT32_MAX),
    ConfigKey("cache_aware_admission_threshold", 0.5, "KV usage from which `cache_aware_admission_window` "
              "applies"),
    ConfigKey("scheduler_extra", None, "the oracle's spelling of the two keys above", shown="empty"),
    ConfigKey("kv_cache_groups", None, "the groups in group-id order (keys and kinds below)",
              shown="one full-attention group"),
    ConfigKey("mamba_cache_mode", None, "`align` or `none`",
              shown="`align` with a state group and prefix caching, else `none`"),
    ConfigKey("prefix_match_unit", None, "hash block size of grouped caches (vLLM's `prefix_match_unit`)",
              low=1, shown="GCD of the cacheable groups' block sizes", high=INT32_MAX),
    ConfigKey("prefix_cache_retention_interval", 0, "engine default 0 (sparse); `null` keeps every "
              "window/state block (dense)"),
    ConfigKey("cache_extra", None, "the oracle's spelling of `prefix_cache_retention_interval` and "
              "`prefix_match_unit`", shown="empty"),
    ConfigKey("vllm_version", None, "the vLLM release whose rules are followed (differences: "
              "`docs/vllm-version-rules.md`)", shown="{default} (one of {supported})"),
    ConfigKey("time_model", None, "step time in seconds (keys below)",
              shown="the roofline once `gpu` is named, else `linear` (10 ms a step)"),
    ConfigKey("speculative", None, "speculative decoding (keys below)", shown="off"),
    ConfigKey("kv_offload", None, "KV offload behind the GPU cache: vLLM's CPU `OffloadingConnector` "
              "(`--kv-offloading-size`; keys below)", shown="off"),
    ConfigKey("model", None, "model name (catalog entries have model-specific rules, e.g. GLM-5.3-Flash); the "
              "roofline's model unless `time_model.model` is set"),
    ConfigKey("kv_cache_bytes", None, "KV-cache memory; with `page_size_bytes` on the groups it gives "
              "`num_gpu_blocks`", low=1, high=INT64_MAX),
    ConfigKey("startup_check", True, "refuse, as vLLM's engine does at start-up, a pool (`num_gpu_blocks` or "
              "`kv_cache_bytes`) that cannot hold one request of `max_model_len`; false only for a scheduler "
              "built without the engine's start-up (the oracle's recordings)"),
    ConfigKey("plan_notes", (), "why a plan chose what it chose (written by `aisim plan`)", shown="[]"),
)

# The roofline's efficiencies and overheads are fitted to published vLLM serving measurements:
# `python benchmarks/timing_accuracy.py --fit` on the sources `cssnoeasy`, `kvcached` (vLLM 0.19.0;
# Qwen2.5-7B on A100 80GB PCIe TP 1 and 2, Qwen3-0.6B on H100), `vllm-pr` and `inferencex` (Qwen3-30B-A3B
# on one H100 and one H200; GLM-4.5-Air FP8 on two B200, the one synchronous multi-GPU row, which sets the
# executor's cost), TPOT and throughput (and the TTFT of bursts and of cold long prompts), with
# the API server's costs in front of the engine (aisim/perf/frontend.py) and the routed experts at their
# kernel's published rate (aisim/perf/moe_kernel.py); the sources `gpustack` (vLLM 0.11.0), `dennislee22` (vLLM
# 0.10.1.1, Qwen2-7B and Qwen2.5-32B on one A100 80GB SXM), `simon-mo` (vLLM 0.8.2-0.8.4, DeepSeek-R1 on
# 8 H200, Llama-3.1-8B and Llama-3.2-3B FP8 on one, QwQ-32B on two H200 or H100), `michaelvll` and
# `michaelvll-sgl` (vLLM 0.8.4, DeepSeek-R1 on 8 H200) and `nerdalert` (vLLM 0.8.3, Llama-3.1-8B on one H100)
# are held out.  The points, their sources and the errors: benchmarks/data/README.md.
# The time-model kinds a key acts on.
LINEAR, ROOFLINE, TABLE = ("linear",), ("roofline",), ("table",)
TIME_MODEL_KEYS = (
    ConfigKey("kind", "linear", "`linear`: `base_s + per_token_s * tokens + per_req_s * requests`; "
              "`roofline`: from `model` on `tp` GPUs `gpu` (compute- or memory-bound, plus all-reduces); "
              "`table`: a profile at `path`", shown="`roofline` when `gpu` is set, else `linear`"),
    ConfigKey("base_s", 0.01, "linear: seconds per step", kinds=LINEAR, high=MAX_STEP_S),
    ConfigKey("per_token_s", 0.0, "linear: seconds per scheduled token", kinds=LINEAR, high=MAX_STEP_S),
    ConfigKey("per_req_s", 0.0, "linear: seconds per scheduled request", kinds=LINEAR, high=MAX_STEP_S),
    ConfigKey("gpu", None, "roofline: a GPU of the catalog (table below)", kinds=ROOFLINE),
    ConfigKey("model", None, "roofline: a catalog model or the path of a Hugging Face `config.json` (relative to "
              "the configuration file)", shown="the engine's `model`", kinds=ROOFLINE),
    ConfigKey("tp", 1, "tensor-parallel size: the roofline's, and every kind's GPUs per replica (the GPU "
              "count of sweeps and capacity searches)", low=1, high=INT32_MAX),
    ConfigKey("dtype", None, "roofline: weights and matrix products, `bf16` or `fp8`",
              shown="the checkpoint's (`fp8` when its `config.json` is FP8-quantized)", kinds=ROOFLINE),
    ConfigKey("overhead_s", 0.0021, "roofline: the CPU's seconds per step (scheduling, inputs, outputs; overlapped "
              "with the GPU under `async_scheduling`) (fitted)", fitted=True, kinds=ROOFLINE, high=MAX_STEP_S),
    ConfigKey("overhead_per_req_s", 5.4e-5, "roofline: the CPU's seconds per scheduled request of a step (fitted)",
              fitted=True, kinds=ROOFLINE, high=MAX_STEP_S),
    ConfigKey("executor_per_req_s", 1.2e-4, "roofline: with `tp` above 1, the CPU's further seconds per scheduled "
              "request of a step: vLLM's multiprocess executor sends the step to every GPU's worker process and awaits "
              "the reply (overlapped with the GPU under `async_scheduling`) (fitted)", fitted=True, kinds=ROOFLINE,
              high=MAX_STEP_S),
    ConfigKey("compute_efficiency", 0.67, "roofline: share of the GPU's achievable matmul FLOP/s (table below) "
              "a matrix product's full tiles reach, in (0, 1] (fitted)", fitted=True, kinds=ROOFLINE),
    ConfigKey("attention_efficiency", 0.79, "roofline: the same share for attention (at the rate of the KV "
              "cache's dtype), in (0, 1] (fitted)", fitted=True, kinds=ROOFLINE),
    ConfigKey("bandwidth_efficiency", 0.89, "roofline: share of peak memory bandwidth reached, in (0, 1] (fitted)",
              fitted=True, kinds=ROOFLINE),
    ConfigKey("layer_overhead_s", 0.0, "roofline: the GPU's fixed seconds per decoder layer and step (the small "
              "kernels between the matrix products) (fitted)", fitted=True, kinds=ROOFLINE, high=MAX_STEP_S),
    ConfigKey("triton_group_quant", False, "roofline: a block-FP8 checkpoint on Hopper quantizes the activations "
              "before each product with vLLM's Triton per-token-group kernel, priced at its published pace (vLLM "
              "0.8; 0.11 and later run a CUDA kernel, not priced; aisim/perf/block_fp8.py)", kinds=ROOFLINE),
    ConfigKey("time_scale", 1.0, "every step time multiplied by this (the ends of a calibration's band; "
              "`aisim calibrate`)", high=1e6),
    ConfigKey("calibration", None, "which fit set the fitted constants and its held-out errors (written by "
              "`aisim calibrate`; keys: `aisim/config/calibration.py`)", shown="the defaults' own"),
    ConfigKey("path", None, "table: profile CSV/Parquet (required; relative to the configuration file): "
              "`latency_s` over one or two of `batch_size`, `prefill_tokens`, `kv_tokens`; interpolated, "
              "never extrapolated", kinds=TABLE),
    ConfigKey("frontend", None, "requests of a trace clocked in seconds pass vLLM's API server (one serial queue, "
              "aisim/perf/frontend.py) before the engine sees them, as under `vllm serve`; false: engine only, as "
              "vLLM's offline `LLM` (and the oracle's recorder, whose step times a `linear` model holds)",
              shown="`true` for `roofline` and `table`, `false` for `linear`"),
    ConfigKey("frontend_per_request_s", 0.0028, "API server: seconds per request before the engine sees it "
              "(fitted)", fitted=True, high=MAX_STEP_S),
    ConfigKey("frontend_per_token_s", 1.6e-5, "API server: seconds per prompt token before the engine sees it "
              "(fitted)", fitted=True, high=MAX_STEP_S),
)

# Keys of ``speculative``: vLLM's SpeculativeConfig as far as the scheduler sees it, plus what the
# replay needs that vLLM learns from its models (how many drafts are accepted, what drafting costs).
SPECULATIVE_KEYS = (
    ConfigKey("num_speculative_tokens", None, "draft tokens proposed per request and step (k)", low=1,
              shown="required", high=MAX_SPEC_LEN),
    ConfigKey("method", "eagle", "`eagle` or `mtp` (k lookahead slots, EAGLE prefix-cache rules), "
              "`draft_model` (k lookahead slots, one draft slot of input budget per request), `ngram` "
              "(neither)"),
    ConfigKey("acceptance", None, "how many drafts the target model accepts (keys below)",
              shown="`permille` 700, `seed` 0"),
    ConfigKey("drafter_cost", None, "the drafter's time per step: a number is a fraction of the target "
              "step's time; a mapping `{base_s, per_token_s}` is a linear model over the step's scheduled "
              "tokens", shown="0"),
)

# Keys of ``kv_offload``: vLLM's CPU OffloadingConnector (``--kv-offloading-size``,
# ``--kv-offloading-backend native``, ``kv_connector_extra_config``) and the step clock of its transfers.
OFFLOAD_KEYS = (
    ConfigKey("cpu_blocks", None, "CPU tier size in offloaded blocks (chunks); or `size_gib`", low=1,
              shown="required unless `size_gib`", high=INT32_MAX),
    ConfigKey("size_gib", None, "the `--kv-offloading-size` in GiB: `int(size_gib * 2**30) // bytes_per_chunk` "
              "chunks, a chunk's bytes rounded up to 4096", shown="—"),
    ConfigKey("kv_bytes_per_block", None, "bytes of one GPU block's KV (all layers), for `size_gib` and the byte "
              "counters", low=1, shown="— (no byte counts)", high=INT64_MAX),
    ConfigKey("block_size", None, "offloaded block in tokens, a multiple of the engine's `block_size`; or "
              "`blocks_per_chunk`", low=1, shown="one GPU block", high=INT32_MAX),
    ConfigKey("blocks_per_chunk", None, "offloaded block in GPU blocks", low=1, shown="1", high=INT32_MAX),
    ConfigKey("load_delay_steps", 1, "a load issued in step N is reported by the output of step N + this", low=0,
              high=INT32_MAX),
    ConfigKey("store_delay_steps", 1, "a store issued in step N is reported by the output of step N + this "
              "(the worker submits stores when the next step begins)", low=1, high=INT32_MAX),
    ConfigKey("pcie_gen", None, "transfers take time instead of steps: PCIe generation (3 to 6) of the GPU's link to "
              "host memory; a load or store lasts its bytes over the link's rate, one at a time per direction, "
              "overlapped with compute (needs `kv_bytes_per_block`)", shown="— (step delays)"),
    ConfigKey("pcie_lanes", 16, "lanes of that link", low=1, high=64),
    ConfigKey("pcie_efficiency", 1.0, "share of the link's rate the copies reach, in (0, 1]"),
    ConfigKey("max_num_inflight_kv_loads", None, "most requests loading or loaded and not yet scheduled "
              "(vLLM's scheduler option); past it the waiting pass stops at the request", low=1,
              shown="no cap", high=INT32_MAX),
    ConfigKey("eviction_policy", "lru", "CPU tier policy: `lru` (vLLM's `LRUCachePolicy`)"),
    ConfigKey("extra", None, "further `kv_connector_extra_config` entries: `offload_prompt_only` (default true: "
              "only prompt tokens are stored), `store_threshold` (0 or 1: every new block is stored)",
              shown="empty"),
    # The disk tier: vLLM's TieringOffloadingSpec with one `fs` secondary tier (docs/kv-offload.md).
    ConfigKey("disk_tier", False, "a disk tier behind the CPU tier, as vLLM's `TieringOffloadingSpec` with one "
              "`fs` secondary tier runs it: every block stored to the CPU tier is written to disk, a CPU miss "
              "found on disk is read back into the CPU tier, then loaded; files are never deleted"),
    ConfigKey("disk_read_delay_steps", 1, "disk tier on the step clock: a read issued in step N is reported by "
              "the schedule of step N + this", low=1, high=INT32_MAX),
    ConfigKey("disk_write_delay_steps", 1, "disk tier on the step clock: a write issued in step N's output is "
              "reported by the schedule of step N + this (asynchronous scheduling processes that output "
              "after the schedule of step N + 1: N + 1 + this)", low=1, high=INT32_MAX),
    # NVMe defaults: Samsung PM9A3 U.2 data sheet, sequential read 6,900 MB/s and write 4,100 MB/s.
    ConfigKey("disk_read_gbps", 6.9, "disk tier on the clock (with `pcie_gen`): NVMe read rate in GB/s (1e9 "
              "bytes), one read at a time (default: a PCIe 4.0 data-centre NVMe drive's sequential read)"),
    ConfigKey("disk_write_gbps", 4.1, "... and write rate in GB/s, one write at a time (default: the same "
              "drive's sequential write)"),
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
    ConfigKey("base_s", 0.0, "seconds of drafting per step that proposes drafts", high=MAX_STEP_S),
    ConfigKey("per_token_s", 0.0, "seconds per token the step scheduled", high=MAX_STEP_S),
)

# The state group kinds (aisim.config.kvgroups.STATE_KINDS; a test checks the two agree).
STATE_GROUPS = ("mamba", "gdn", "kda", "conv")
# Per-group keys of ``kv_cache_groups``; order is the order error messages list them in.
GROUP_KEYS = (
    ConfigKey("type", None, "the group's kind (table below)", shown="required"),
    ConfigKey("block_size", None, "tokens per block", low=1, shown="the engine's `block_size`", high=INT32_MAX),
    ConfigKey("count", 1, "consecutive groups of this shape", low=1, high=MAX_GROUPS),
    ConfigKey("sliding_window", None, "window in tokens (required by `sliding_window`)", low=1, high=INT32_MAX,
              kinds=("sliding_window",)),
    ConfigKey("attention_chunk_size", None, "chunk in tokens (required by `chunked_local`)", low=1, high=INT32_MAX,
              kinds=("chunked_local",)),
    ConfigKey("prefix_cacheable", None, "whether the group's blocks can be prefix-cached",
              shown="the kind's default"),
    ConfigKey("num_speculative_blocks", None, "state groups: draft blocks", low=0,
              shown="`speculative.num_speculative_tokens`, else 0", high=INT32_MAX, kinds=STATE_GROUPS),
    ConfigKey("prefill_checkpoint_blocks", 0, "state groups: prefill-checkpoint blocks", low=0, high=INT32_MAX,
              kinds=STATE_GROUPS),
    ConfigKey("prefill_checkpoint_alignment", None, "state groups: prefill-checkpoint alignment in tokens", low=1,
              high=INT32_MAX, kinds=STATE_GROUPS),
    ConfigKey("page_size_bytes", None, "one layer's page (vLLM `KVCacheSpec.page_size_bytes`)", low=1, high=INT64_MAX),
    ConfigKey("num_layers", 1, "layers sharing the group's block table", low=1, high=INT32_MAX),
)


# A deployment file's ``deployment`` section (aisim/config/deployment.py).
DEPLOYMENT_KEYS = (
    ConfigKey("replicas", 1, "engines behind the router, each a complete replica of the engine file",
              low=1, high=MAX_REPLICAS),
    ConfigKey("router", "round_robin", router_names_text() + "; or a mapping with `kind` and the router keys "
              "below"),
    ConfigKey("prefill", None, "disaggregated: the prefill pool, a mapping of the pool keys below (with `decode`; "
              "then no `replicas` or `router` here)", shown="—"),
    ConfigKey("decode", None, "disaggregated: the decode pool, a mapping of the pool keys below", shown="—"),
    ConfigKey("link", None, "disaggregated: the prefill-to-decode KV transfer link, a mapping of the link keys "
              "below", shown="—"),
)

# ``deployment.prefill`` / ``deployment.decode`` keys (a disaggregated deployment's pools).
POOL_KEYS = (
    ConfigKey("replicas", 1, "engines in the pool", low=1, high=MAX_REPLICAS),
    ConfigKey("router", "round_robin", "the pool's router: a name or a mapping of the router keys below"),
    ConfigKey("engine", None, "the pool's engine file (relative to the deployment file); default the "
              "deployment's engine", shown="—"),
)

# ``deployment.link`` keys.
LINK_KEYS = (
    ConfigKey("bandwidth_gb_s", None, "transfer bandwidth in GB/s (10^9 bytes per second; `inf`: no transfer time "
              "but the latency)", shown="required"),
    ConfigKey("latency_s", 0.0, "seconds added to every transfer", high=MAX_ROUTER_VALUE),
    ConfigKey("transfer", "all", "`all`: every block the prefill replica holds for the request; `missing`: only "
              "those past the decode replica's prefix hit when it is chosen"),
)

# The routers that read what the replicas report (cache contents, first tokens, finishes): ext/deploy.pyx
# ``_choose`` (``by`` picks least_loaded's load, and session_affinity's falling back to it;
# ``overlap_weight`` prices kv_aware's choice, and session_affinity's falling back to it).
def _acted_on_by(option: str) -> tuple:
    """The routers that act on router key ``option`` (aisim.config.routers ``Router.options``)."""
    return tuple(r.name for r in ROUTER_TABLE if option in r.options)
# ``deployment.router`` keys (given as a mapping).
ROUTER_KEYS = (
    ConfigKey("kind", "round_robin", "the router (names above)"),
    ConfigKey("by", "requests", "`least_loaded`: count outstanding `requests`, or `tokens` (prompt + "
              "max output tokens of each outstanding request)", kinds=_acted_on_by("by")),
    ConfigKey("overlap_weight", 1.0, "`kv_aware` (and its use as a fallback): Dynamo's "
              "`overlap_score_weight`, the weight of the prefill term", kinds=_acted_on_by("overlap_weight"),
              high=MAX_ROUTER_VALUE),
    ConfigKey("seed", 0, "`random`: seed of the splitmix64 draws", low=0, kinds=_acted_on_by("seed")),
    ConfigKey("fallback", "kv_aware", "`session_affinity`: " + router_names_text(FALLBACKS) + ", the choice "
              "for a session's first turn and when its replica is overloaded", kinds=_acted_on_by("fallback")),
    ConfigKey("slack", 16, "`session_affinity`: a session's replica is overloaded when it has more than "
              "this many outstanding requests above the least loaded replica", low=0, kinds=_acted_on_by("slack"),
              high=INT32_MAX),
    ConfigKey("view_delay_s", 0.0, "the router sees what replicas report (cache contents, first tokens, "
              "finishes) this many seconds late; its own bookings at once", kinds=_acted_on_by("view_delay_s"),
              high=MAX_ROUTER_VALUE),
)


def defaults(keys) -> dict:
    """``name -> default`` of a catalogue."""
    return {k.name: k.default for k in keys}


def refuse_inert(raw: dict, keys, kind: str, prefix: str, at: str = "", what: str = "",
                 kind_key: str = "kind") -> None:
    """Raise :class:`~aisim.errors.ConfigError` naming the first key of ``raw`` that does not act on
    ``kind`` (its :attr:`ConfigKey.kinds`): an option accepted and ignored would be a silent wrong answer.

    ``prefix`` is the section's dotted path, ``at`` the file (:func:`where`), ``what`` the section's
    name in the message (``router``, ``time model``), ``kind_key`` the key that names the kind.
    """
    from aisim.errors import ConfigError

    for k in keys:
        if k.name in raw and k.kinds is not None and kind not in k.kinds:
            raise ConfigError(f"'{prefix}{k.name}'{at} does not apply to the {kind} {what} (it applies to "
                              f"{', '.join(k.kinds)}); remove it or change '{prefix}{kind_key}'")


def check_high(key: ConfigKey, value, prefix: str = "", at: str = "") -> None:
    """Raise :class:`~aisim.errors.ConfigError` when ``value`` (already checked to be a finite number of
    the right type, at least ``key.low``) exceeds ``key.high``; the message names the key and the range."""
    from aisim.errors import ConfigError

    if key.high is not None and value > key.high:
        raise ConfigError(f"'{prefix}{key.name}'{at} must be from {key.range_text()}, got {value!r}")


def key(keys, name: str) -> ConfigKey:
    """The key ``name`` of the catalogue ``keys``."""
    return next(k for k in keys if k.name == name)


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

