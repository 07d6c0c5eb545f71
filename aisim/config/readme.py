"""The README's engine-configuration tables, rendered from the key and kind catalogues.

``python -m aisim.config.readme`` prints them; a test checks that README.md
contains exactly this text, so the documented keys, defaults, supported
versions and group kinds cannot drift from the code.
"""

from __future__ import annotations

from aisim.config.keys import (ACCEPTANCE_KEYS, DRAFTER_COST_KEYS, ENGINE_KEYS, GROUP_KEYS, SPECULATIVE_KEYS,
                               TIME_MODEL_KEYS)
from aisim.config.kvgroups import KINDS
from aisim.config.versions import DEFAULT_VLLM_VERSION, SUPPORTED_VLLM_VERSIONS


def _table(keys, fmt=None) -> list[str]:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for k in keys:
        shown = k.default_text()
        for name, value in (fmt or {}).items():
            shown = shown.replace("{" + name + "}", value)
        rows.append(f"| `{k.name}` | {shown} | {k.meaning} |")
    return rows


def render_tables() -> str:
    """The README's engine-configuration tables (Markdown), rendered from the catalogues."""
    fmt = {"default": f"`{DEFAULT_VLLM_VERSION}`", "supported": ", ".join(f"`{v}`" for v in SUPPORTED_VLLM_VERSIONS)}
    lines = _table(ENGINE_KEYS, fmt)
    lines += ["", "`time_model` keys:", ""] + _table(TIME_MODEL_KEYS)
    lines += ["", "`speculative` keys:", ""] + _table(SPECULATIVE_KEYS)
    lines += ["", "`speculative.acceptance` keys:", ""] + _table(ACCEPTANCE_KEYS)
    lines += ["", "`speculative.drafter_cost` keys (given as a mapping):", ""] + _table(DRAFTER_COST_KEYS)
    lines += ["", "`kv_cache_groups` keys (one table per group):", ""] + _table(GROUP_KEYS)
    lines += ["", "Group kinds:", "", "| type | holds | requires | `prefix_cacheable` default |", "|---|---|---|---|"]
    for k in KINDS:
        lines.append(f"| `{k.name}` | {k.meaning} | {f'`{k.required}`' if k.required else '—'} | "
                     f"{'true' if k.prefix_cacheable else 'false'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render_tables(), end="")
