"""Every ``vllm bench serve`` flag and what ``aisim replay`` offers for it: one mapping, and the docs table.

:data:`FLAGS` lists the flags of vLLM 0.33's ``vllm bench serve`` (``vllm/benchmarks/serve.py``
``add_cli_args`` and ``vllm/benchmarks/datasets/datasets.py`` ``add_dataset_parser``), in their
order, each with the aisim option that means the same (None: none does) and a note.  The table in
``docs/vllm-bench-serve.md`` is rendered from it (``python -m aisim.bench_flags --write``; a test
checks the file equals the rendering and that every named aisim option exists).

:func:`bench_record` is the start of ``aisim replay --format json``: vLLM's setup keys, its result
keys (:mod:`aisim.bench_metrics`), then the engine, load and versions the replay used.
"""

from __future__ import annotations

import math
import os
import sys

VLLM_BENCH_VERSION = "0.33.0"

_NO_SERVER = "no server: the engine is simulated"
_TRACE_TOKENS = "token counts come from the trace"
_DATASET = "a named dataset's option; aisim reads token counts from a trace (`aisim trace synth` makes synthetic ones)"
_SAMPLING = "sampling does not change what the scheduler does; output lengths come from the trace"

# (vLLM flag, aisim replay option or None, note)
FLAGS = (
    # datasets.py add_dataset_parser
    ("--trust-remote-code", None, "no model code is loaded"),
    ("--seed", "--seed", "seeds the gaps of --request-rate (or of --poisson-rate)"),
    ("--num-prompts", "--num-prompts", "the trace's first N requests (vLLM samples N from a dataset)"),
    ("--dataset-name", "--trace-format", "trace formats: oracle or Mooncake JSONL, Azure CSV, agentic JSON, Parquet"),
    ("--no-stream", None, "latencies are those of a streamed response"),
    ("--dataset-path", "--trace", "the request trace"),
    ("--no-oversample", None, "requests are the trace's, never repeated"),
    ("--skip-chat-template", None, _TRACE_TOKENS),
    ("--enable-multimodal-chat", None, "multimodal inputs are not modelled"),
    ("--disable-shuffle", None, "the trace's order is always kept"),
    ("--custom-output-len", None, _DATASET),
    ("--custom-ensure-client-side-data", None, _DATASET),
    ("--spec-bench-output-len", None, _DATASET),
    ("--spec-bench-category", None, _DATASET),
    ("--sharegpt-output-len", None, _DATASET),
    ("--timed-trace-chunk-hash-size", None, "a Mooncake trace's block size is a reader option (`--trace-format "
                                            "mooncake`, 512 tokens by default)"),
    ("--timed-trace-sec-multiplier", "--rate-scale", "`--rate-scale F` divides every arrival by F"),
    ("--timed-trace-label-timestamp", None, "each trace format names its own fields"),
    ("--timed-trace-label-input-length", None, "each trace format names its own fields"),
    ("--timed-trace-label-output-length", None, "each trace format names its own fields"),
    ("--timed-trace-label-hash-ids", None, "each trace format names its own fields"),
    ("--blazedit-min-distance", None, _DATASET),
    ("--blazedit-max-distance", None, _DATASET),
    ("--asr-max-audio-len-sec", None, "audio is not modelled"),
    ("--asr-min-audio-len-sec", None, "audio is not modelled"),
    ("--hf-subset", None, _DATASET),
    ("--hf-split", None, _DATASET),
    ("--hf-name", None, _DATASET),
    ("--hf-output-len", None, _DATASET),
    ("--bfcl-categories", None, _DATASET),
    ("--prefix-repetition-prefix-len", None, "`aisim trace synth --prefix-len`"),
    ("--prefix-repetition-suffix-len", None, _DATASET),
    ("--prefix-repetition-num-prefixes", None, "`aisim trace synth --prefix-groups`"),
    ("--prefix-repetition-output-len", None, _DATASET),
    ("--speed-bench-dataset-subset", None, _DATASET),
    ("--speed-bench-output-len", None, _DATASET),
    ("--speed-bench-category", None, _DATASET),
    ("--random-input-len", None, "`aisim trace synth --prompt`"),
    ("--random-output-len", None, "`aisim trace synth --output`"),
    ("--random-range-ratio", None, "`aisim trace synth` draws lengths from a distribution"),
    ("--random-prefix-len", None, "`aisim trace synth --prefix-len`"),
    ("--random-batch-size", None, "embedding batches are not modelled"),
    ("--no-reranker", None, "pooling models are not modelled"),
    ("--random-mm-base-items-per-request", None, "multimodal inputs are not modelled"),
    ("--random-mm-num-mm-items-range-ratio", None, "multimodal inputs are not modelled"),
    ("--random-mm-limit-mm-per-prompt", None, "multimodal inputs are not modelled"),
    ("--random-mm-bucket-config", None, "multimodal inputs are not modelled"),
    # serve.py add_cli_args
    ("--label", None, "the JSON records the model, engine and load instead"),
    ("--backend", None, _NO_SERVER),
    ("--base-url", None, _NO_SERVER),
    ("--host", None, _NO_SERVER),
    ("--port", None, _NO_SERVER),
    ("--endpoint", None, _NO_SERVER),
    ("--header", None, _NO_SERVER),
    ("--max-concurrency", "--max-concurrency", "at most C requests in flight; a held-back request is sent when one "
                                               "finishes"),
    ("--model", "--model", "plans the engine on `--gpu` (`--tp`) as `aisim plan` does: a catalog model, a Hugging "
                           "Face id the catalog knows, or a config.json; or `--engine FILE`"),
    ("--input-len", None, _TRACE_TOKENS),
    ("--output-len", None, _TRACE_TOKENS),
    ("--tokenizer", None, _TRACE_TOKENS),
    ("--tokenizer-mode", None, _TRACE_TOKENS),
    ("--use-beam-search", None, "beam search is not modelled"),
    ("--logprobs", None, _SAMPLING),
    ("--request-rate", "--request-rate", "vLLM's arrivals: gamma gaps scaled so the last request is sent at N/R s; "
                                         "inf sends all at 0 s; without it the trace's own arrivals"),
    ("--burstiness", "--burstiness", "the gamma shape of the gaps (1: Poisson)"),
    ("--probe-request-rate", None, "probe requests are not modelled"),
    ("--disable-tqdm", "--no-progress", "progress is shown on a terminal only"),
    ("--num-warmups", None, "a simulated engine needs no warm-up"),
    ("--profile", None, _NO_SERVER),
    ("--save-result", "--format json", "the result on stdout; `--out DIR` writes the per-request tables"),
    ("--save-detailed", "--out", "requests.parquet: every request's times and tokens"),
    ("--append-result", None, "redirect `--format json` output"),
    ("--metadata", None, "the JSON records the engine, load and versions"),
    ("--result-dir", "--out", "requests.parquet, steps.parquet and summary.json"),
    ("--result-filename", None, "redirect `--format json` output to a file"),
    ("--ignore-eos", None, "always so: each request generates the trace's output length"),
    ("--self-timed", None, "the default: the trace's arrivals, unless `--request-rate` re-times them"),
    ("--percentile-metrics", "--percentile-metrics", "ttft, tpot, itl, e2el (client queue times are not modelled)"),
    ("--metric-percentiles", "--metric-percentiles", "same default, 99"),
    ("--goodput", "--goodput", "same keys (ttft, tpot, e2el) and milliseconds; `request_goodput` in the JSON"),
    ("--request-id-prefix", None, "request ids are the trace's"),
    ("--top-p", None, _SAMPLING),
    ("--top-k", None, _SAMPLING),
    ("--min-p", None, _SAMPLING),
    ("--temperature", None, _SAMPLING),
    ("--frequency-penalty", None, _SAMPLING),
    ("--presence-penalty", None, _SAMPLING),
    ("--repetition-penalty", None, _SAMPLING),
    ("--served-model-name", None, _NO_SERVER),
    ("--lora-modules", None, "LoRA adapters are not modelled"),
    ("--lora-assignment", None, "LoRA adapters are not modelled"),
    ("--ramp-up-strategy", None, "one rate per replay; `aisim capacity` searches rates"),
    ("--ramp-up-start-rps", None, "one rate per replay; `aisim capacity` searches rates"),
    ("--ramp-up-end-rps", None, "one rate per replay; `aisim capacity` searches rates"),
    ("--ready-check-timeout-sec", None, _NO_SERVER),
    ("--chat-template-kwargs", None, _TRACE_TOKENS),
    ("--extra-body", None, _NO_SERVER),
    ("--skip-tokenizer-init", None, _TRACE_TOKENS),
    ("--insecure", None, _NO_SERVER),
    ("--plot-timeline", None, "`aisim report --replay DIR` draws a replay's time series and latency CDFs"),
    ("--timeline-itl-thresholds", None, "no timeline plot"),
    ("--plot-dataset-stats", None, "`aisim trace inspect` summarises a trace"),
)


def render_table() -> str:
    """``docs/vllm-bench-serve.md``: the mapping as Markdown."""
    lines = [
        "# `vllm bench serve` flags in aisim",
        "",
        f"Every flag of `vllm bench serve` (vLLM {VLLM_BENCH_VERSION}) and the `aisim replay` option that means",
        "the same, or why there is none. Generated from `aisim/bench_flags.py`",
        "(`python -m aisim.bench_flags --write`); a test checks this file.",
        "",
        "`aisim replay --format json` prints vLLM's result keys with vLLM's names and units: `duration`,",
        "`completed`, `failed`, `total_input_tokens`, `total_output_tokens`, `request_throughput`,",
        "`request_goodput`, `output_throughput`, `total_token_throughput`, `max_concurrent_requests`, and",
        "`mean_*_ms`, `median_*_ms`, `std_*_ms`, `p*_*_ms` of each percentile metric; then `goodput`,",
        "`aisim_version`, `engine` (every key resolved) and `load`, then aisim's own summary. Where the",
        "numbers differ in meaning:",
        "",
        "- `duration` runs from the first request's arrival to the last response (vLLM's client also counts",
        "  the gap before its first request).",
        "- ITL is every gap between two streamed outputs of a request, pooled, as vLLM's client takes it:",
        "  an output is one engine step's (1 + the accepted drafts with speculative decoding), streamed",
        "  at the end of that step. The replay keeps the gaps as (gap, count) pairs, not per request.",
        "- `max_output_tokens_per_s` needs every chunk's time and is left out; the per-request lists",
        "  (`ttfts`, `itls`, `latencies`, ...) are the columns of `requests.parquet` (`--out DIR`).",
        "- `--request-rate` draws its gaps from aisim's own generator (seeded by `--seed`), not numpy's",
        "  global one, so the arrivals follow vLLM's rule but are not vLLM's draws.",
        "",
        "| `vllm bench serve` | `aisim replay` | note |",
        "|---|---|---|",
    ]
    for flag, ours, note in FLAGS:
        lines.append(f"| `{flag}` | {f'`{ours}`' if ours else '—'} | {note} |")
    return "\n".join(lines) + "\n"


DOC_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "vllm-bench-serve.md")


def bench_record(result, trace_path: str, load: dict, model: str | None, percentile_metrics, metric_percentiles,
                 goodput: dict) -> dict:
    """vLLM's setup and result keys of a replay, then the engine, load and versions used.

    Parameters
    ----------
    result : aisim.replay.ReplayResult or the deployment's result
    trace_path : str
    load : dict
        How the trace was sent: ``request_rate``, ``burstiness``, ``seed`` (of ``--request-rate``), or
        :mod:`aisim.traces.load`'s keys; ``num_prompts``.
    model : str or None
        ``--model`` as given (else the engine's model).
    """
    from aisim import __version__
    from aisim.bench_metrics import bench_metrics

    # JSON has no infinity: "inf", as vLLM writes an infinite request rate.
    load = {k: "inf" if isinstance(v, float) and math.isinf(v) else v for k, v in load.items()}
    record = {
        "model_id": model if model is not None else result.engine.model,
        "num_prompts": result.requests.num_rows,
        "request_rate": load.get("request_rate"),
        "burstiness": load.get("burstiness"),
        "max_concurrency": load.get("max_concurrency"),
    }
    record.update(bench_metrics(result.requests, result.gaps, percentile_metrics,
                                metric_percentiles, goodput or None))
    record["goodput"] = dict(goodput) if goodput else None
    record["aisim_version"] = __version__
    record["engine"] = result.engine.to_dict()
    record["load"] = {k: v for k, v in load.items() if v is not None}
    return record


def main(argv=None) -> int:
    """``python -m aisim.bench_flags [--write]``: print (or write) the docs table."""
    argv = sys.argv[1:] if argv is None else argv
    text = render_table()
    if "--write" in argv:
        from aisim.files import write_text

        write_text(DOC_PATH, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
