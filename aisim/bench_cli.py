"""The ``vllm bench serve`` options of ``aisim replay``: their click declarations and what they resolve to.

``--model/--gpu/--tp`` plan the engine as ``aisim plan`` does; ``--request-rate``/``--burstiness``
re-time the trace as vLLM's client sends it (:mod:`aisim.traces.request_rate`); ``--num-prompts``
takes the trace's first requests; ``--percentile-metrics``, ``--metric-percentiles`` and
``--goodput`` choose the statistics of :mod:`aisim.bench_metrics`.  ``--set`` (:mod:`aisim.config.overrides`)
changes engine and deployment keys.  The mapping of every ``vllm bench serve`` flag is
:data:`aisim.bench_flags.FLAGS`.
"""

from __future__ import annotations

import click

from aisim.config.overrides import set_option  # noqa: F401  (the replay's options are found here)


class NargsOption(click.Option):
    """An option that takes every value up to the next option, as argparse's ``nargs="+"``
    (``--goodput ttft:500 tpot:50``); repeating the option adds more."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("multiple", True)
        super().__init__(*args, **kwargs)

    def add_to_parser(self, parser, ctx):
        super().add_to_parser(parser, ctx)
        for name in self.opts:
            opt = parser._long_opt.get(name) or parser._short_opt.get(name)
            if opt is not None:
                opt.process = self._eater(opt.process)

    @staticmethod
    def _eater(process):
        def eat(value, state):
            values = [value]
            while state.rargs and not state.rargs[0].startswith("-"):
                values.append(state.rargs.pop(0))
            for v in values:
                process(v, state)
        return eat


def model_options(f):
    """``--model``, ``--gpu``, ``--tp``: an engine planned on the fly, as ``aisim plan`` plans it."""
    f = click.option("--tp", "--tensor-parallel-size", "-tp", "tp", type=int, default=None,
                     help="Tensor-parallel size of the planned engine (with --model; default 1).")(f)
    f = click.option("--gpu", help="Catalog GPU of the planned engine (with --model).")(f)
    f = click.option("--model", help="Plan the engine for this model (a catalog name, a Hugging Face id the "
                                     "catalog knows, or a config.json path) on --gpu, as aisim plan does; "
                                     "instead of --engine.")(f)
    return f


def bench_options(f):
    """The load and metric options named as ``vllm bench serve`` names them."""
    f = click.option("--goodput", "goodput", cls=NargsOption, metavar="KEY:MS ...",
                     help="Goodput SLOs in milliseconds, as vllm bench serve: ttft:500 tpot:50 (keys ttft, tpot, "
                          "e2el); request_goodput counts the finished requests within all of them.")(f)
    f = click.option("--metric-percentiles", help="Comma-separated percentiles of the selected metrics "
                                                  "(default 99).")(f)
    f = click.option("--percentile-metrics", help="Comma-separated metrics to report: ttft, tpot, itl, e2el "
                                                  "(default ttft,tpot,itl).")(f)
    f = click.option("--num-prompts", type=click.IntRange(min=1),
                     help="Replay the trace's first N requests.")(f)
    f = click.option("--burstiness", type=float,
                     help="With --request-rate: gamma-distributed gaps of this shape (1: Poisson; lower is "
                          "burstier, inf: even gaps).")(f)
    f = click.option("--request-rate", type=float,
                     help="Send the trace's requests, in order, at this many per second as vllm bench serve "
                          "does (Poisson or gamma gaps scaled so the last is sent at N/rate s; inf: all at "
                          "0 s); --seed seeds the gaps.")(f)
    return f


def plan_engine(model: str, gpu: str | None, tp: int | None, vllm_version: str | None = None):
    """The engine ``aisim plan --model MODEL --gpu GPU --tp TP --vllm-version V`` plans, and its notes.

    ``vllm_version`` (default the newest) picks the release whose ``vllm serve`` start-up defaults
    (block size, ``gpu_memory_utilization``, batch limits) the plan takes.

    Raises
    ------
    aisim.errors.ConfigError
        No ``--gpu``, or what the planner refuses.
    """
    from aisim.errors import ConfigError
    from aisim.plan import plan_from_model

    if gpu is None:
        raise ConfigError("--model plans the engine on a GPU: add --gpu (e.g. --gpu H100)")
    return plan_from_model(model, None, 1 if tp is None else tp, None, gpu=gpu, vllm_version=vllm_version)


def show_plan(model: str, gpu: str, tp: int | None, notes, vllm_version: str | None = None) -> None:
    """The plan's notes on stderr, as ``aisim plan`` prints them."""
    version = f" --vllm-version {vllm_version}" if vllm_version else ""
    click.echo(f"engine planned for {model} on {1 if tp is None else tp} x {gpu} (aisim plan --model {model} "
               f"--gpu {gpu}{'' if tp is None else f' --tp {tp}'}{version}):", err=True)
    for n in notes:
        click.echo(f"- {n}", err=True)


def changed_notes(engine, overrides, kv_offloading_size) -> list:
    """Notes on what the flags changed in a planned engine (``aisim plan``'s own lines): the KV offload
    tier of ``--kv-offloading-size`` and the engine keys of ``--set``."""
    from aisim.config.overrides import describe_sets, split_sets

    notes = []
    if kv_offloading_size is not None:
        from aisim.plan.planner import offload_note

        notes.append(offload_note(engine, f"--kv-offloading-size {kv_offloading_size:g}"))
    engine_sets = split_sets(overrides)[0]
    if engine_sets:
        notes.append(f"changed with --set: {describe_sets(engine_sets)}")
    return notes
