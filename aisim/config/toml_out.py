"""Writing TOML: engine configurations shown, planned and chosen by sweeps.

The standard library only reads TOML (``tomllib``); ``tomli_w`` writes it, quoting keys and
strings (dots, non-ASCII text) and nesting tables as TOML requires.
"""

from __future__ import annotations


def _without_none(value):
    """``value`` with ``None`` left out of every table, at any depth (TOML has no null)."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_without_none(v) for v in value]
    return value


def dumps(doc: dict, header_comments=()) -> str:
    """TOML text of ``doc``, keys in their order, after ``header_comments`` as ``#`` lines.

    Parameters
    ----------
    doc : dict
        The document: scalars, lists, tables and lists of tables, nested to any depth.
        ``None`` values are left out.
    header_comments : iterable of str
        Comment lines written before the document (a multi-line note becomes several
        comment lines).

    Returns
    -------
    str
        TOML that ``tomllib.loads`` reads back to ``doc`` without its ``None`` values.
    """
    import tomli_w

    lines = [f"# {line}".rstrip() for c in header_comments for line in str(c).splitlines() or [""]]
    head = "\n".join(lines) + "\n\n" if lines else ""
    return head + tomli_w.dumps(_without_none(doc))
