"""Decode a JSON document keeping the line of every element of its ``requests`` arrays.

The agentic traces are one (often single-line) JSON document a file; a bad
request must still be named by file, line and position.  :func:`load_with_lines`
walks objects and ``requests`` arrays by hand and hands every other value to
the C decoder, so large ``hash_ids`` lists cost no Python per item.
"""

from __future__ import annotations

import bisect
import json
from json.decoder import scanstring

from aisim.textin import STRICT_JSON, DuplicateKey

_DECODER = STRICT_JSON
_WS = " \t\n\r"


class Located:
    """One element of a ``requests`` array: its decoded ``value`` and its 1-based ``line``."""

    __slots__ = ("value", "line")

    def __init__(self, value, line):
        self.value, self.line = value, line


class _Walker:
    def __init__(self, text: str, nested_key: str):
        self.text = text
        self.key = nested_key
        self.newlines = []
        at = text.find("\n")
        while at >= 0:
            self.newlines.append(at)
            at = text.find("\n", at + 1)

    def line(self, idx: int) -> int:
        return bisect.bisect_right(self.newlines, idx - 1) + 1

    def fail(self, idx: int, msg: str):
        raise json.JSONDecodeError(msg, self.text, min(idx, len(self.text)))

    def ws(self, i: int) -> int:
        text = self.text
        while i < len(text) and text[i] in _WS:
            i += 1
        return i

    def peek(self, i: int) -> str:
        if i >= len(self.text):
            self.fail(i, "Unexpected end of document")
        return self.text[i]

    def value(self, i: int):
        c = self.peek(i)
        if c == "{":
            return self.obj(i)
        try:
            return _DECODER.raw_decode(self.text, i)
        except DuplicateKey as exc:
            exc.line = self.line(i)  # the line the value starts on; the key may be further down
            raise

    def obj(self, i: int):
        out = {}
        i = self.ws(i + 1)
        if self.peek(i) == "}":
            return out, i + 1
        while True:
            if self.peek(i) != '"':
                self.fail(i, "Expecting property name enclosed in double quotes")
            at = i
            key, i = scanstring(self.text, i + 1)
            if key in out:
                raise DuplicateKey(key, self.line(at))
            i = self.ws(i)
            if self.peek(i) != ":":
                self.fail(i, "Expecting ':' delimiter")
            i = self.ws(i + 1)
            if key == self.key and self.peek(i) == "[":
                out[key], i = self.located_array(i)
            else:
                out[key], i = self.value(i)
            i = self.ws(i)
            c = self.peek(i)
            if c == ",":
                i = self.ws(i + 1)
            elif c == "}":
                return out, i + 1
            else:
                self.fail(i, "Expecting ',' delimiter")

    def located_array(self, i: int):
        items = []
        i = self.ws(i + 1)
        if self.peek(i) == "]":
            return items, i + 1
        while True:
            start = i
            val, i = self.value(i)
            items.append(Located(val, self.line(start)))
            i = self.ws(i)
            c = self.peek(i)
            if c == ",":
                i = self.ws(i + 1)
            elif c == "]":
                return items, i + 1
            else:
                self.fail(i, "Expecting ',' delimiter")


def load_with_lines(text: str, nested_key: str = "requests"):
    """Decode ``text``; every ``nested_key`` array (at any depth) becomes a list of :class:`Located`.

    Raises
    ------
    json.JSONDecodeError
        Invalid JSON (its ``lineno`` names the line).
    aisim.textin.DuplicateKey
        An object names a key twice (its ``line`` attribute is set).
    """
    w = _Walker(text, nested_key)
    i = w.ws(0)
    val, i = w.value(i)
    i = w.ws(i)
    if i != len(text):
        w.fail(i, "Extra data")
    return val
