"""Writing an engine configuration as TOML (the standard library only reads TOML)."""

from __future__ import annotations

import json


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def dumps(doc: dict, header_comments=()) -> str:
    """TOML text of ``doc``: scalars and lists, one level of tables, arrays of tables.

    ``None`` values are left out (TOML has no null).
    """
    lines = [f"# {c}" for c in header_comments]
    if lines:
        lines.append("")
    tables, arrays = {}, {}
    for k, v in doc.items():
        if v is None:
            continue
        if isinstance(v, dict):
            tables[k] = v
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, dict) for x in v):
            arrays[k] = v
        else:
            lines.append(f"{k} = {_value(v)}")
    for k, t in tables.items():
        lines += ["", f"[{k}]"] + [f"{kk} = {_value(vv)}" for kk, vv in t.items() if vv is not None]
    for k, items in arrays.items():
        for t in items:
            lines += ["", f"[[{k}]]"] + [f"{kk} = {_value(vv)}" for kk, vv in t.items() if vv is not None]
    return "\n".join(lines) + "\n"
