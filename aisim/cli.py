"""The ``aisim`` command line."""

from __future__ import annotations

import sys

import click

from aisim import __version__
from aisim.bench_cli import bench_options, model_options, set_option
from aisim.cli_util import (CONTEXT_SETTINGS, Group, Phases, console, echo_csv, echo_json, fail, flatten,
                            fmt_num, fmt_pct, fmt_seconds, format_option, new_table, one_blas_thread, out_option,
                            progress_option, trace_format_option)
from aisim.config.versions import SUPPORTED_VLLM_VERSIONS
from aisim.config.vllm_offload import offload_options


@click.group(cls=Group, context_settings=CONTEXT_SETTINGS)
@click.version_option(version=__version__, prog_name="aisim")
def main():
    """aisim: what would vLLM do with this workload?

    Replays request traces through a faithful model of vLLM's v1 scheduler and
    KV-cache manager and reports latency, throughput, prefix-cache reuse, KV-cache
    occupancy, queueing and preemptions.
    """


def _trace_formats() -> list:
    """The trace formats aisim reads (:data:`aisim.traces.FORMATS`), for ``--trace-format`` when it is used."""
    from aisim.traces import FORMATS

    return list(FORMATS)


@main.command()
@click.option("--engine", "engine_path", type=click.Path(dir_okay=False),
              help="Engine configuration (JSON, TOML or YAML; vLLM's key names); or --model and --gpu.")
@model_options
@click.option("--trace", "trace_path", required=True, type=click.Path(),
              help="Request trace (oracle or Mooncake JSONL, Azure CSV, agentic JSON, aisim Parquet).")
@trace_format_option(_trace_formats)
@click.option("--closed-loop", is_flag=True,
              help="Send a session's next turn when the previous one finishes (plus its think time).")
@click.option("--think-time", type=float, help="Think time of closed-loop turns, seconds (default: the trace's gaps).")
@click.option("--rate-scale", type=float,
              help="Scale the arrival rate: every arrival divided by this factor (steps stay whole).")
@click.option("--poisson-rate", type=float,
              help="Re-time the requests, in trace order, as a Poisson process of this many requests/s.")
@click.option("--seed", type=int, help="Seed of --poisson-rate's gaps (default 0).")
@click.option("--max-concurrency", type=int,
              help="Send at most this many requests at a time (as vllm bench serve --max-concurrency); a request "
                   "due while that many are in flight is sent when one finishes.")
@click.option("--reject-too-long", is_flag=True,
              help="Reject prompts of max_model_len tokens or more (status 'rejected'), as vLLM's server does, "
                   "instead of refusing the trace.")
@out_option("--out", "out_dir", kind="dir", help="Write requests.parquet, steps.parquet and summary.json here.")
@out_option("--decision-log", "decision_log",
              help="Write one JSON line per schedule() call, in the format of vLLM decision logs.")
@click.option("--vllm-version", type=click.Choice(SUPPORTED_VLLM_VERSIONS),
              help="With --model: plan the engine vllm serve of this release starts (its block size, "
                   "gpu_memory_utilization and batch limits; default the newest); with --engine: override the "
                   "file's vllm_version (validated again with the rules).")
@click.option("--deployment", "deployment_path", type=click.Path(dir_okay=False),
              help="Deployment file (a 'deployment' section: replicas, router): replay through replicas of the "
                   "engine behind the router; --decision-log then writes one log per replica (LOG.replicaN.EXT).")
@click.option("--no-macro-steps", "no_macro_steps", is_flag=True,
              help="Replay every engine step one at a time, quiet stretches of decoding too (the results are the "
                   "same bytes; for checking, and for timing the difference).")
@click.option("--engine-only", "engine_only", is_flag=True,
              help="No API server in front of the engine (time_model.frontend = false), as vLLM's offline LLM: "
                   "requests reach the engine when sent.")
@bench_options
@offload_options
@set_option()
@format_option()
@progress_option()
def replay(engine_path, model, gpu, tp, trace_path, trace_format, closed_loop, think_time, rate_scale, poisson_rate,
           seed, max_concurrency, reject_too_long, out_dir, decision_log, vllm_version, deployment_path,
           no_macro_steps, engine_only, request_rate, burstiness, num_prompts, percentile_metrics, metric_percentiles,
           goodput, kv_offloading_size, kv_offloading_backend, sets, fmt, progress):
    """Replay TRACE on an engine (--engine FILE, or --model and --gpu) and summarise what vLLM would do.

    \b
    As vllm bench serve, at 8 requests/s with a goodput SLO:
      aisim replay --model meta-llama/Llama-3.1-8B-Instruct --gpu H100 --trace T \\
        --request-rate 8 --goodput ttft:500 tpot:50 --format json
    """
    from aisim.config.engine import load_engine_config
    from aisim.errors import AisimError, ConfigError

    one_blas_thread()
    from aisim.output import write_result
    from aisim.replay import replay as run_replay
    from aisim.traces import read_trace

    # Phase progress only for large traces: a small one is done before a line could help.
    phases = Phases(progress)
    try:
        from aisim.bench_metrics import parse_goodput, parse_metric_percentiles, parse_percentile_metrics
        from aisim.config.overrides import apply_deployment, apply_engine, parse_sets

        if (engine_path is None) == (model is None):
            raise ConfigError("give the engine: --engine FILE, or --model and --gpu to plan one")
        if engine_path is not None and (gpu is not None or tp is not None):
            raise ConfigError("--gpu and --tp plan an engine with --model; --engine gives one already")
        metrics = {"percentile_metrics": parse_percentile_metrics(percentile_metrics),
                   "metric_percentiles": parse_metric_percentiles(metric_percentiles),
                   "goodput": parse_goodput(goodput)}
        overrides = user_sets = parse_sets(sets)
        bench_load = None
        if request_rate is not None or burstiness is not None:
            if request_rate is None:
                raise ConfigError("--burstiness shapes the gaps of --request-rate; add --request-rate")
            if rate_scale is not None or poisson_rate is not None or closed_loop:
                raise ConfigError("--request-rate re-times the trace; --rate-scale, --poisson-rate and --closed-loop "
                                  "are other ways to send it: give one")
            from aisim.traces.request_rate import check_request_rate

            bench_load = {"request_rate": request_rate, "burstiness": 1.0 if burstiness is None else burstiness,
                          "seed": 0 if seed is None else seed}
            check_request_rate(bench_load["request_rate"], bench_load["burstiness"])
            seed = None  # the gaps' seed, not --poisson-rate's
        if think_time is not None and not closed_loop:
            raise ConfigError("--think-time applies to closed-loop replays; add --closed-loop")
        if deployment_path and reject_too_long:
            raise ConfigError("--reject-too-long applies to a single engine's replay, not to a deployment")
        from aisim.traces.load import check_load

        flags = {"rate_scale": rate_scale, "poisson_rate": poisson_rate, "seed": seed,
                 "max_concurrency": max_concurrency}
        try:
            load = check_load(flags)
        except ConfigError as exc:  # the keys' checks, in the flags' names
            msg = str(exc)
            for k in flags:
                msg = msg.replace(f"'{k}'", f"--{k.replace('_', '-')}")
            raise ConfigError(msg) from None
        if load and closed_loop:
            raise ConfigError("--rate-scale, --poisson-rate and --max-concurrency shape open-loop replays; a closed "
                              "loop paces each turn by the previous one")
        from aisim.files import check_outputs

        # Refused before anything is replayed: an output that is one of the inputs, two outputs in one file.
        inputs = {"--engine": engine_path, "--trace": _trace_files(trace_path), "--deployment": deployment_path}
        check_outputs({"--out": out_dir, "--decision-log": decision_log}, inputs)
        with phases:
            deployment = None
            if deployment_path:
                from aisim.config.deployment import load_deployment_config

                deployment = load_deployment_config(deployment_path)
            deployment = apply_deployment(deployment, overrides, source=deployment_path)
            if model is not None:
                from aisim.bench_cli import plan_engine

                # vllm serve of --vllm-version: its block size, memory and batch limits, not only its rules.
                engine, notes = plan_engine(model, gpu, tp, vllm_version)
            else:
                engine = load_engine_config(engine_path)
            if kv_offloading_size is not None:
                from aisim.plan import offload_flags

                # vllm serve's flags: the tier first, then --set (one validation of both).
                overrides = [("kv_offload", offload_flags(engine, kv_offloading_size, kv_offloading_backend)),
                             *overrides]
            elif kv_offloading_backend is not None:
                raise ConfigError("--kv-offloading-backend goes with --kv-offloading-size (vLLM offloads only "
                                  "when a size is given)")
            engine = apply_engine(engine, overrides)
            if model is not None:
                from aisim.bench_cli import changed_notes, show_plan

                notes = [*notes, *changed_notes(engine, user_sets, kv_offloading_size)]
                engine = engine.replace(plan_notes=notes)  # as the plan aisim plan writes carries them
                show_plan(model, gpu, tp, notes, vllm_version)
            elif vllm_version:
                engine = engine.replace(vllm_version=vllm_version)
            if engine_only:
                engine = engine.replace(time_model=dict(engine.raw.get("time_model", {}), frontend=False))
            fmt_in = trace_format
            if fmt_in is None:
                from aisim.traces import guess_format

                fmt_in = guess_format(trace_path)
            options = {"max_model_len": engine.max_model_len} if fmt_in == "oracle" and not reject_too_long else {}
            phases("reading trace")
            trace = read_trace(trace_path, fmt_in, **options)
            if num_prompts is not None:
                trace = trace.slice(0, num_prompts)
            if bench_load is not None:
                from aisim.traces.request_rate import retime_request_rate

                trace = retime_request_rate(trace, **bench_load)
            if load:
                from aisim.traces.load import retime

                trace = retime(trace, **load)
            if progress is None and trace.num_rows <= PROGRESS_REQUESTS:
                phases.quiet()
            phases("replaying", f"{trace.num_rows:,} requests")
            if deployment is not None:
                from aisim.deploy import deploy, write_deployment

                result = deploy(trace, engine, deployment, record_decisions=decision_log is not None, name=trace_path,
                                max_concurrency=max_concurrency, closed_loop=closed_loop, think_time_s=think_time,
                                macro_steps=not no_macro_steps)
                if out_dir or decision_log:
                    phases("writing results", f"{result.summary['steps']:,} steps")
                    logs = write_deployment(result, out_dir, decision_log, inputs)
            else:
                result = run_replay(trace, engine, record_decisions=decision_log is not None,
                                    closed_loop=closed_loop, think_time_s=think_time, reject_too_long=reject_too_long,
                                    max_concurrency=max_concurrency, macro_steps=not no_macro_steps)
            if deployment is None and (out_dir or decision_log):
                phases("writing results", f"{result.summary['steps']:,} steps")
                if out_dir:
                    write_result(result, out_dir, decision_log, inputs)
                else:
                    from aisim.decisionlog import write_decision_log
                    from aisim.files import outputs

                    with outputs(inputs):
                        write_decision_log(result, decision_log)
    except AisimError as exc:
        fail(exc)
    import contextlib

    from aisim.bench_flags import bench_record

    load_used = {**(bench_load or {}), **load, "num_prompts": num_prompts}
    record = {**bench_record(result, trace_path, load_used, model, **metrics), **_summary_record(result, trace_path)}
    # A decision log on standard output keeps it to itself: the summary goes to stderr.
    to_stdout = decision_log in ("-", "/dev/stdout")
    with contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext():
        if fmt == "json":
            echo_json(record)
        elif fmt == "csv":
            echo_csv(["key", "value"], flatten(record))
        else:
            _print_summary(result, trace_path, record, metrics)
    # Where the files went: a message, so on stderr unless the output is the table.
    if out_dir or decision_log:
        note = console(stderr=fmt != "table" or to_stdout)
        if out_dir:
            note.print(f"results written to {out_dir}/ (requests.parquet, steps.parquet, summary.json)")
        if decision_log and deployment is None:
            note.print(f"decision log written to {decision_log}")
        elif decision_log:
            note.print(f"decision logs written to {', '.join(logs)}")


def _trace_files(path) -> list:
    """The files a trace path names (a glob's matches, a folder's files), for the check that no output is one."""
    import glob
    import os

    if os.path.isdir(path):
        return [os.path.join(path, f) for f in sorted(os.listdir(path))]
    return sorted(glob.glob(path)) or [path]


# Traces longer than this show phase progress on a terminal (without --progress/--no-progress).
PROGRESS_REQUESTS = 100_000


def _summary_record(result, trace_path) -> dict:
    usage = result.steps.column("kv_usage").to_numpy()
    return {"trace": trace_path, "vllm_version": result.engine.version, **result.summary,
            "kv_usage_mean": float(usage.mean()) if len(usage) else None,
            "kv_usage_max": float(usage.max()) if len(usage) else None}


def _time_model_line(engine, label: str) -> str:
    """How the step times were made, in one line of the printed summary."""
    tm = engine.time_model
    if label == "linear-default":
        return f"bare linear default: {fmt_seconds(tm.base_s)} a step, no GPU's (set time_model.gpu)"
    if tm.kind == "roofline":
        return f"roofline: {tm.model} on {tm.tp} x {tm.gpu}" + (f" ({tm.dtype})" if tm.dtype else "")
    if tm.kind == "table":
        return f"profile table {tm.path}"
    return f"linear: {tm.base_s:g} s + {tm.per_token_s:g} s/token + {tm.per_req_s:g} s/request"


_METRIC_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}


def _print_summary(result, trace_path, record, metrics):
    from aisim.bench_metrics import percentile_key

    s = result.summary
    title = f"aisim replay of {trace_path} (vLLM {result.engine.version} rules)"
    rows = []

    def add(*cells):
        rows.append(cells)

    add("requests finished", f"{fmt_num(s['finished'])} / {fmt_num(s['requests'])}")
    if s.get("rejected"):
        add("requests rejected", f"{fmt_num(s['rejected'])} (prompt of max_model_len tokens or more)")
    add("engine steps", f"{fmt_num(s['steps'])} ({fmt_num(s['empty_steps'])} empty)")
    add("duration", fmt_seconds(s["duration_s"]) + " (first send to last response)")
    add("step times", _time_model_line(result.engine, s["time_model"]))
    if getattr(result, "timed", True):  # a deployment runs by the clock
        tm = result.engine.time_model
        add("API server", f"{fmt_seconds(tm.frontend_per_request_s)} a request + "
                  f"{fmt_seconds(tm.frontend_per_token_s)} a prompt token, before the engine; latencies from the send"
                  if tm.frontend else "none (engine only); latencies from the send")
    # vllm bench serve's throughputs over the client's duration (aisim.throughput), as the goodput below.
    add("throughput", f"{fmt_num(s['throughput_req_s'])} req/s, "
        f"{fmt_num(s['throughput_tok_s'], 1)} output tok/s")
    if record["request_goodput"] is not None:
        limits = ", ".join(f"{k} {v:g} ms" for k, v in metrics["goodput"].items())
        add("goodput", f"{fmt_num(record['request_goodput'])} req/s within {limits}")
    qs = metrics["metric_percentiles"]
    for name in metrics["percentile_metrics"]:
        label = _METRIC_LABELS[name]
        heads = " / ".join(["mean", "median", *(percentile_key(name, q).split("_")[0].upper() for q in qs)])
        values = [record[f"mean_{name}_ms"], record[f"median_{name}_ms"],
                  *(record[percentile_key(name, q)] for q in qs)]
        add(f"{label} {heads}", " / ".join(fmt_seconds(v / 1000) for v in values))
    pc = s["prefix_cache_stats"]
    add("prefix cache hit rate",
              f"{fmt_pct(s['prefix_hit_rate'])} ({fmt_num(pc['hits'])} of {fmt_num(pc['queries'])} tokens)")
    if "kv_offload" in s:
        # vLLM's connector_prefix_cache_stats: tokens the tier offered over tokens asked.
        o = s["kv_offload"]
        cs = o["connector_prefix_cache_stats"]
        add("CPU tier hit rate", f"{fmt_pct(cs['hits'] / cs['queries'] if cs['queries'] else 0.0)} "
            f"({fmt_num(cs['hits'])} of {fmt_num(cs['queries'])} tokens; {fmt_num(o['loads'])} loads)")
        add("CPU tier stores / evictions", f"{fmt_num(o['store_chunks'])} / {fmt_num(o['cpu_evicted_chunks'])} "
            f"blocks of {fmt_num(o['cpu_chunks'])}")
    add("preemptions", fmt_num(s["preemptions"]))
    if "spec" in s:
        sp = s["spec"]
        add("draft acceptance", f"{fmt_pct(sp['acceptance_rate']) if sp['acceptance_rate'] is not None else '-'}"
                                      f" ({fmt_num(sp['accepted_tokens'])} of {fmt_num(sp['draft_tokens'])} drafts)")
    usage = result.steps.column("kv_usage").to_numpy()
    if len(usage):
        add("KV-cache usage mean / max", f"{fmt_pct(float(usage.mean()))} / {fmt_pct(float(usage.max()))}")
    if "replicas" in s:
        d = s["deployment"]
        if "prefill" in d:
            add("deployment", f"{d['prefill']['replicas']} prefill replicas, router "
                                    f"{d['prefill']['router']['kind']}; {d['decode']['replicas']} decode replicas, "
                                    f"router {d['decode']['router']['kind']}")
        else:
            add("deployment", f"{len(s['replicas'])} replicas, router {d['router']['kind']}")
        lb = s["load_balance"]
        add("requests per replica min / max", f"{fmt_num(lb['requests_min'])} / {fmt_num(lb['requests_max'])}")
        add("utilisation min / max", f"{fmt_pct(lb['utilisation_min'])} / {fmt_pct(lb['utilisation_max'])}")
    from aisim.plaintable import off_terminal, plain_ok, render

    if "replicas" not in s and off_terminal(sys.stdout) and plain_ok(title, rows):
        sys.stdout.write(render(title, rows, ("left", "right")))  # what rich prints, without rich
    else:
        t = new_table("what", ("value", {"justify": "right"}), title=title, show_header=False)
        t.columns[0].style = "bold"
        for cells in rows:
            t.add_row(*cells)
        console().print(t)
    if "replicas" in s:
        r = new_table("replica", ("requests", {"justify": "right"}), ("hit rate", {"justify": "right"}),
                      ("utilisation", {"justify": "right"}), ("TTFT p50", {"justify": "right"}),
                      title="replicas")
        for rep in s["replicas"]:
            r.add_row(str(rep["replica"]), fmt_num(rep["requests"]), fmt_pct(rep["prefix_hit_rate"]),
                      fmt_pct(rep["utilisation"]), fmt_seconds(rep["ttft_s"]["p50"]))
        console().print(r)


# ---------------------------------------------------------------- command modules
# Each command lives beside its feature and is registered here by where it lives: its module is
# imported when the command runs or a help page lists it, so ``aisim replay`` starts without the
# others' modules.
for _name, _where in (("pipeline", "aisim.pipeline.cli"), ("trace", "aisim.traces.cli"),
                      ("config", "aisim.config.cli"), ("plan", "aisim.plan.cli"),
                      ("calibrate", "aisim.calibrate.cli"), ("sweep", "aisim.sweep.cli"),
                      ("capacity", "aisim.capacity.cli"), ("query", "aisim.query.cli"),
                      ("report", "aisim.report.cli"), ("compare", "aisim.compare")):
    main.add_lazy_command(_name, _where)


if __name__ == "__main__":  # pragma: no cover
    main()
