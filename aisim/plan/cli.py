"""``aisim plan``: an engine configuration from a probe or from the model catalog, explained."""

from __future__ import annotations

import os

import click

from aisim.cli_util import CONTEXT_SETTINGS, fail, format_option, out_option
from aisim.config.vllm_offload import offload_options
from aisim.config.overrides import set_option
from aisim.config.versions import SUPPORTED_VLLM_VERSIONS


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--probe", "probe_path", type=click.Path(dir_okay=False), help="Probe JSON of a running vLLM engine.")
@click.option("--model", help="Catalog model or path of a Hugging Face config.json, to plan without a probe.")
@click.option("--gpu", help="Catalog GPU (with --model): roofline step times and vllm serve's batch limits on it.")
@click.option("--gpu-memory-gib", type=float, help="Memory of one GPU (with --model; default: the --gpu's).")
@click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True),
              help="As vllm serve: the share of each GPU's memory the engine may use (with --model; default: "
                   "the --vllm-version's, 1 with 0.34.0's extensible KV cache, else 0.92).")
@click.option("--tp", "--tensor-parallel-size", "-tp", "tp", type=int, default=1, show_default=True,
              help="Tensor-parallel size (with --model).")
@click.option("--dtype", type=click.Choice(["bf16", "fp8"]),
              help="Weights as served (with --model; default: the checkpoint's).")
@click.option("--max-model-len", type=int,
              help="Longest sequence (with --model; default: the model's context length, as vllm serve, "
                   "cut to the longest that fits the KV cache).")
@click.option("--vllm-version", type=click.Choice(SUPPORTED_VLLM_VERSIONS),
              help="The release vllm serve runs (with --model; default: the newest): its start-up defaults "
                   "(block size, gpu_memory_utilization, async scheduling, batch limits) are the plan's.")
@offload_options
@set_option()
@out_option("--out", "out_path", help="Write the engine configuration (paths relative to it): JSON when the name ends "
                                       "in .json, .yaml or .yml (as --engine reads it), else TOML.")
@format_option("toml", default="toml")
def plan(probe_path, model, gpu, gpu_memory_gib, gpu_memory_utilization, tp, dtype, max_model_len, vllm_version,
         kv_offloading_size, kv_offloading_backend, sets, out_path, fmt):
    """Plan an engine configuration from a probe or from a model and GPU, and explain it."""
    from aisim.errors import AisimError
    from aisim.files import check_outputs, write_text
    from aisim.plan import engine_toml, load_probe, plan_from_model, plan_from_probe

    try:
        if (probe_path is None) == (model is None):
            raise click.UsageError("give exactly one of --probe and --model")
        if probe_path and vllm_version:
            raise click.UsageError("--vllm-version goes with --model; a probe names its own release")
        if probe_path and gpu_memory_utilization is not None:
            raise click.UsageError("--gpu-memory-utilization goes with --model; a probe gives its KV-cache pool")
        inputs = {"--probe": probe_path, "--model": model if model and os.path.exists(model) else None}
        check_outputs({"--out": out_path}, inputs)
        if probe_path:
            cfg, notes = plan_from_probe(load_probe(probe_path))
        else:
            if gpu_memory_gib is None and gpu is None:
                raise click.UsageError("--model needs --gpu (or --gpu-memory-gib)")
            cfg, notes = plan_from_model(model, gpu_memory_gib, tp, max_model_len, gpu=gpu, dtype=dtype,
                                         vllm_version=vllm_version, gpu_memory_utilization=gpu_memory_utilization)
        offload = []
        if kv_offloading_size is not None:
            from aisim.plan import offload_flags

            offload = [("kv_offload", offload_flags(
                cfg, kv_offloading_size, kv_offloading_backend,
                tp if model else (load_probe(probe_path).get("tensor_parallel_size") or 1)))]
        elif kv_offloading_backend is not None:
            raise click.UsageError("--kv-offloading-backend goes with --kv-offloading-size (vLLM offloads only "
                                   "when a size is given)")
        if sets or offload:
            from aisim.config.overrides import apply_engine, describe_sets, parse_sets, split_sets

            overrides = parse_sets(sets)
            if split_sets(overrides)[1]:
                raise click.UsageError("a plan is an engine configuration: --set takes engine keys here")
            # The tier and the --set keys together, validated once.
            cfg = apply_engine(cfg, offload + overrides)
            if offload:
                from aisim.plan.planner import offload_note

                notes = [*notes, offload_note(cfg, f"--kv-offloading-size {kv_offloading_size:g}")]
            if overrides:
                notes = [*notes, f"changed with --set: {describe_sets(overrides)}"]
        text = engine_toml(cfg, notes, os.path.dirname(os.path.abspath(out_path)) if out_path else None)
        if out_path:
            write_text(out_path, file_text(text, out_path), "--out", inputs=inputs)
    except AisimError as exc:
        fail(exc)
    # The notes and where the plan went are messages: on stdout beside a table, else on stderr.  TOML on
    # stdout stays valid TOML: its notes are its comment lines.
    err = fmt != "table" or out_path in ("-", "/dev/stdout")
    if fmt != "toml" or out_path:
        for n in notes:
            click.echo(f"- {n}", err=err)
    if out_path:
        click.echo(f"plan written to {out_path}", err=err)
    elif fmt == "toml":
        click.echo(text, nl=False)
    else:
        import tomllib

        from aisim.config.cli import print_config

        print_config(tomllib.loads(text), fmt, title="planned engine configuration")


def file_text(toml_text: str, path: str) -> str:
    """The plan as the file ``path`` holds it: JSON (``--format json``'s, keys sorted) when ``--engine``
    reads ``path`` as JSON or YAML (by its suffix, :func:`aisim.config.engine.read_config_file`), else the
    TOML with its notes as comments."""
    if os.path.splitext(os.fspath(path))[1].lower() not in (".json", ".yaml", ".yml"):
        return toml_text
    import json
    import tomllib

    return json.dumps(tomllib.loads(toml_text), indent=2, sort_keys=True) + "\n"
