"""The ``aisim`` command line."""

from __future__ import annotations

import click

from aisim import __version__
from aisim.cli_util import CONTEXT_SETTINGS, console, fail, fmt_num, fmt_seconds
from aisim.config.versions import SUPPORTED_VLLM_VERSIONS


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(version=__version__, prog_name="aisim")
def main():
    """aisim: what would vLLM do with this workload?

    Replays request traces through a faithful model of vLLM's v1 scheduler and
    KV-cache manager and reports latency, throughput, prefix-cache reuse, KV-cache
    occupancy, queueing and preemptions.
    """


@main.command()
@click.option("--engine", "engine_path", required=True, type=click.Path(dir_okay=False),
              help="Engine configuration (JSON, TOML or YAML; vLLM's key names).")
@click.option("--trace", "trace_path", required=True, type=click.Path(),
              help="Request trace (oracle or Mooncake JSONL, Azure CSV, agentic JSON, aisim Parquet).")
@click.option("--trace-format", type=click.Choice(["oracle", "mooncake", "mooncake-delta", "azure", "agentic",
                                                   "parquet"]), help="Trace format (default: guessed from the file).")
@click.option("--closed-loop", is_flag=True,
              help="Send a session's next turn when the previous one finishes (plus its think time).")
@click.option("--think-time", type=float, help="Think time of closed-loop turns, seconds (default: the trace's gaps).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Write requests.parquet, steps.parquet and summary.json here.")
@click.option("--decision-log", "decision_log", type=click.Path(dir_okay=False),
              help="Write one JSON line per schedule() call, in the format of vLLM decision logs.")
@click.option("--vllm-version", type=click.Choice(SUPPORTED_VLLM_VERSIONS),
              help="Override the configuration's vllm_version (validated again with the rules).")
def replay(engine_path, trace_path, trace_format, closed_loop, think_time, out_dir, decision_log, vllm_version):
    """Replay TRACE on the engine of CONFIG and summarise what vLLM would do."""
    from aisim.config.engine import load_engine_config
    from aisim.errors import AisimError, ConfigError
    from aisim.output import write_result
    from aisim.replay import replay as run_replay
    from aisim.traces import read_trace

    try:
        if think_time is not None and not closed_loop:
            raise ConfigError("--think-time applies to closed-loop replays; add --closed-loop")
        engine = load_engine_config(engine_path)
        if vllm_version:
            engine = engine.replace(vllm_version=vllm_version)
        fmt = trace_format
        if fmt is None:
            from aisim.traces import guess_format

            fmt = guess_format(trace_path)
        options = {"max_model_len": engine.max_model_len} if fmt == "oracle" else {}
        trace = read_trace(trace_path, fmt, **options)
        result = run_replay(trace, engine, record_decisions=decision_log is not None,
                            closed_loop=closed_loop, think_time_s=think_time)
        if out_dir or decision_log:
            if out_dir:
                write_result(result, out_dir, decision_log)
            else:
                from aisim.decisionlog import write_decision_log

                write_decision_log(result, decision_log)
    except AisimError as exc:
        fail(exc)
    _print_summary(result, trace_path, out_dir, decision_log)


def _print_summary(result, trace_path, out_dir, decision_log):
    from rich.table import Table

    s = result.summary
    out = console()
    t = Table(title=f"aisim replay of {trace_path} (vLLM {result.engine.version} rules)", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    t.add_row("requests finished", f"{s['finished']:,} / {s['requests']:,}")
    t.add_row("engine steps", f"{s['steps']:,} ({s['empty_steps']} empty)")
    t.add_row("simulated time", fmt_seconds(s["duration_s"]))
    t.add_row("throughput", f"{fmt_num(s['throughput_req_s'])} req/s, {fmt_num(s['throughput_tok_s'])} output tok/s")
    for name, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        q = s[name]
        t.add_row(f"{label} p50 / p90 / p99", " / ".join(fmt_seconds(q[k]) for k in ("p50", "p90", "p99")))
    pc = s["prefix_cache_stats"]
    t.add_row("prefix cache hit rate", f"{100 * s['prefix_hit_rate']:.1f}% ({pc['hits']:,} of {pc['queries']:,} tokens)")
    t.add_row("preemptions", f"{s['preemptions']:,}")
    usage = result.steps.column("kv_usage").to_numpy()
    if len(usage):
        t.add_row("KV-cache usage mean / max", f"{100 * usage.mean():.1f}% / {100 * usage.max():.1f}%")
    out.print(t)
    if out_dir:
        out.print(f"results written to {out_dir}/ (requests.parquet, steps.parquet, summary.json)")
    if decision_log:
        out.print(f"decision log written to {decision_log}")


# ---------------------------------------------------------------- command modules
# Each command lives beside its feature and is registered here.
from aisim.config.cli import config  # noqa: E402
from aisim.pipeline.cli import pipeline  # noqa: E402
from aisim.plan.cli import plan  # noqa: E402
from aisim.query.cli import query  # noqa: E402
from aisim.report.cli import report  # noqa: E402
from aisim.sweep.cli import sweep  # noqa: E402
from aisim.traces.cli import trace  # noqa: E402

for _command in (pipeline, trace, config, plan, sweep, query, report):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
