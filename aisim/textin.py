"""Reading text inputs strictly: UTF-8 with the line of a bad byte, JSON and YAML without duplicate keys.

Every reader of a text trace, engine configuration, probe or spec decodes
through these functions, so a byte that is not UTF-8 and a key given twice are
refused the same way everywhere: with the error class the caller names and a
message naming the file (and line where there is one).  JSON's own parser
keeps the last of two equal keys and PyYAML's does too; aisim refuses them, as
``tomllib`` does for TOML.
"""

from __future__ import annotations

import json


class DuplicateKey(ValueError):
    """A mapping names ``key`` twice; ``line`` is its line when the decoder knows it."""

    def __init__(self, key, line: int | None = None):
        super().__init__(key)
        self.key = key
        self.line = line


def no_duplicates(pairs):
    """``object_pairs_hook`` for :mod:`json`: the pairs as a dict, refusing a key given twice."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out


STRICT_JSON = json.JSONDecoder(object_pairs_hook=no_duplicates)


def duplicate_message(key) -> str:
    """The words every reader uses for a key given twice."""
    return f"key '{key}' appears twice"


def read_bytes(path, error, what: str = "", by: str = "") -> bytes:
    """The bytes of the file at ``path``; one that cannot be read raises ``error`` naming it.

    ``what`` names the kind of file and ``by`` who named it, in the message
    (``cannot read engine configuration PATH (named by 'base'): ...``).
    """
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise error(f"cannot read {what + ' ' if what else ''}{path}{by}: {exc.strerror}") from None


def decode_utf8(data: bytes, where: str, error, first_line: int = 1) -> str:
    """``data`` decoded as UTF-8 (a leading byte-order mark dropped).

    Parameters
    ----------
    data : bytes
        The bytes of a file, or of one line of it.
    where : str
        The file (``path``), or the line (``path:line``) when ``data`` is one line.
    error : type
        The exception class to raise.
    first_line : int
        The line ``data`` starts on; 0 when ``where`` already names the line.

    Raises
    ------
    error
        A byte sequence that is not UTF-8, naming the file, line and byte.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start)
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        at = f"{where}:{line}" if first_line else where
        raise error(f"{at}: not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column})") from None
    return text[1:] if text.startswith("\ufeff") else text


def loads_json(text, where: str, error):
    """JSON ``text`` decoded, refusing a key given twice; other errors are ``json.JSONDecodeError``."""
    try:
        return STRICT_JSON.decode(text)
    except DuplicateKey as exc:
        raise error(f"{where}: {duplicate_message(exc.key)}") from None


def loads_yaml(data, where: str, error):
    """YAML ``data`` decoded safely, refusing a mapping key given twice (naming its line).

    Raises
    ------
    ImportError
        PyYAML is not installed.
    """
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                continue  # an unhashable key: construct_mapping names it
            if key in seen:
                raise error(f"{where}:{key_node.start_mark.line + 1}: {duplicate_message(key)}")
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(data, Loader=_Loader)


def check_decoded(text: str, where: str, error) -> str:
    """``text`` read with ``errors="surrogateescape"``, refused when it held a byte that is not UTF-8.

    Streaming readers decode that way so one bad line does not stop the file;
    the message is :func:`decode_utf8`'s (``where`` names the line).
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = ord(text[exc.start]) - 0xDC00
        raise error(f"{where}: not UTF-8 text (byte 0x{byte:02x} at column {exc.start + 1})") from None
    return text
