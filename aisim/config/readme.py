"""The reference's configuration tables, rendered from the key, kind, GPU and model catalogues.

``python -m aisim.config.readme`` prints them; tests check that
``docs/configuration.md`` (engine keys) and ``docs/deployments.md``
(deployment keys) contain exactly this text, so the documented keys, defaults, supported
versions and group kinds cannot drift from the code.
"""

from __future__ import annotations

from aisim.config.catalog import MODELS
from aisim.config.gpus import GPUS
from aisim.config.keys import (ACCEPTANCE_KEYS, DEPLOYMENT_KEYS, DRAFTER_COST_KEYS, ENGINE_KEYS, GROUP_KEYS,
                               LINK_KEYS, OFFLOAD_KEYS, POOL_KEYS, ROUTER_KEYS, SPECULATIVE_KEYS, TIME_MODEL_KEYS)
from aisim.config.kvgroups import KINDS
from aisim.config.versions import DEFAULT_VLLM_VERSION, SUPPORTED_VLLM_VERSIONS


def _table(keys, fmt=None) -> list[str]:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for k in keys:
        shown = k.default_text()
        for name, value in (fmt or {}).items():
            shown = shown.replace("{" + name + "}", value)
        bound = f" ({k.range_text()})" if k.high is not None else ""  # the range the validator accepts
        rows.append(f"| `{k.name}` | {shown} | {k.meaning}{bound} |")
    return rows


def render_tables() -> str:
    """The engine-configuration tables of ``docs/configuration.md`` (Markdown), rendered from the catalogues."""
    fmt = {"default": f"`{DEFAULT_VLLM_VERSION}`", "supported": ", ".join(f"`{v}`" for v in SUPPORTED_VLLM_VERSIONS)}
    lines = _table(ENGINE_KEYS, fmt)
    lines += ["", "`time_model` keys (a key of another kind than `kind` is refused, not ignored):", ""]
    lines += _table(TIME_MODEL_KEYS)
    lines += ["", "`speculative` keys:", ""] + _table(SPECULATIVE_KEYS)
    lines += ["", "`speculative.acceptance` keys:", ""] + _table(ACCEPTANCE_KEYS)
    lines += ["", "`speculative.drafter_cost` keys (given as a mapping):", ""] + _table(DRAFTER_COST_KEYS)
    lines += ["", "`kv_offload` keys (the model: `docs/kv-offload.md`):", ""] + _table(OFFLOAD_KEYS)
    lines += ["", "GPUs of the roofline (vendor datasheets: dense tensor FLOP/s, interconnect both directions "
              "together; in brackets the measured achievable matmul FLOP/s the efficiencies apply to, "
              "`aisim/config/gpus.py`):", "",
              "| `gpu` | BF16 TFLOP/s | FP8 TFLOP/s | memory TB/s | memory GB | interconnect GB/s |",
              "|---|---|---|---|---|---|"]

    def rate(peak, mamf):
        return f"{peak / 1e12:g}" + (f" ({mamf / 1e12:g})" if mamf else "")

    for g in GPUS.values():
        names = ", ".join(f"`{n}`" for n in (g.name, *g.aliases))
        fp8 = rate(g.fp8_flops, g.fp8_mamf) if g.fp8_flops else "— (FP8 weights at the BF16 rate)"
        lines.append(f"| {names} | {rate(g.bf16_flops, g.bf16_mamf)} | {fp8} | {g.hbm_bytes_per_s / 1e12:g} | "
                     f"{g.memory_gib:g} | {g.link_bytes_per_s / 1e9:g} |")
    lines += ["", "Models of the catalog (`model`, `time_model.model`, `aisim plan --model`; or the path of a Hugging "
              "Face `config.json`):", "", "| model | layers | parameters | per token (without embeddings) | weights | context |",
              "|---|---|---|---|---|---|"]
    for m in MODELS.values():
        kinds = " + ".join(f"{layer.count} {layer.kind}" + (f" ({layer.sliding_window})" if layer.sliding_window
                                                             else " (MLA)" if layer.latent_dim else "")
                           for layer in m.layers)
        active = f"{(m.active_params or m.params) / 1e9:.1f} B" + (
            f" ({m.experts_per_token} of {m.num_experts} experts)" if m.num_experts else "")
        context = f"{m.context_len:,}" if m.context_len else "—"
        lines.append(f"| `{m.name}` | {kinds} | {m.params / 1e9:.1f} B | {active} | {m.dtype} | {context} |")
    lines += ["", "`kv_cache_groups` keys (one table per group):", ""] + _table(GROUP_KEYS)
    lines += ["", "Group kinds:", "", "| type | holds | requires | `prefix_cacheable` default |", "|---|---|---|---|"]
    for k in KINDS:
        lines.append(f"| `{k.name}` | {k.meaning} | {f'`{k.required}`' if k.required else '—'} | "
                     f"{'true' if k.prefix_cacheable else 'false'} |")
    return "\n".join(lines) + "\n"


def render_deployment_tables() -> str:
    """The deployment-file tables of ``docs/deployments.md`` (Markdown), rendered from the key catalogues."""
    lines = ["`deployment` keys:", ""] + _table(DEPLOYMENT_KEYS)
    lines += ["", "`deployment.router` keys (given as a mapping; an option its `kind` does not act on is refused, "
              "not ignored):", ""] + _table(ROUTER_KEYS)
    lines += ["", "`deployment.prefill` and `deployment.decode` keys:", ""] + _table(POOL_KEYS)
    lines += ["", "`deployment.link` keys:", ""] + _table(LINK_KEYS)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render_tables(), end="")
    print()
    print(render_deployment_tables(), end="")
