"""What a cut JSON text (a prefix of a valid document, e.g. tool arguments cut by max_tokens) holds so far.

Incomplete strings, keys and literals are dropped and open objects and arrays closed, as the anthropic SDK's
stream accumulator reads a tool's partial ``input_json_delta`` text, so a streamed and a non-streamed answer
show the same partial input.
"""

from __future__ import annotations

import json
import re
from typing import Any

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_NUMBER_TAIL = re.compile(r"[-+.eE0-9]*\Z")
_LITERALS = {"true": True, "false": False, "null": None}
_MISSING = object()


def _ws(s: str, i: int) -> int:
    return _WS.match(s, i).end()  # type: ignore[union-attr]


def _value(s: str, i: int) -> tuple[Any, int, bool]:
    """(value or _MISSING, end, complete) of the value at ``i``; ValueError when ``s`` is not a JSON prefix."""
    i = _ws(s, i)
    if i == len(s):
        return _MISSING, i, False
    c = s[i]
    if c == "{":
        return _container(s, i + 1, {})
    if c == "[":
        return _container(s, i + 1, [])
    if c == '"':
        try:
            text, end = json.decoder.scanstring(s, i + 1)  # type: ignore[attr-defined]
        except ValueError:
            return _MISSING, len(s), False  # unterminated (or cut inside an escape)
        return text, end, True
    number = _NUMBER.match(s, i)
    if number is not None or c == "-":
        end = number.end() if number is not None else i
        if _NUMBER_TAIL.match(s, end) and (end == len(s) or s[end] in "-+.eE"):
            # the text ends inside the number: keep it if what is there is a number already
            return (json.loads(s[i:end]) if number is not None and end == len(s) else _MISSING), len(s), False
        if number is None:
            raise ValueError(f"not JSON at {i}")
        return json.loads(number.group()), end, True
    for word, literal in _LITERALS.items():
        if s.startswith(word, i):
            return literal, i + len(word), True
        if word.startswith(s[i:]):
            return _MISSING, len(s), False
    raise ValueError(f"not JSON at {i}")


def _container(s: str, i: int, into: Any) -> tuple[Any, int, bool]:
    is_object, close = isinstance(into, dict), "}" if isinstance(into, dict) else "]"
    first = True
    while True:
        i = _ws(s, i)
        if i == len(s):
            return into, i, False
        if s[i] == close:
            return into, i + 1, True
        if not first:
            if s[i] != ",":
                raise ValueError(f"not JSON at {i}")
            i = _ws(s, i + 1)
            if i == len(s):
                return into, i, False
        first = False
        key = None
        if is_object:
            if s[i] != '"':
                raise ValueError(f"not JSON at {i}")
            try:
                key, i = json.decoder.scanstring(s, i + 1)  # type: ignore[attr-defined]
            except ValueError:
                return into, len(s), False
            i = _ws(s, i)
            if i == len(s):
                return into, i, False
            if s[i] != ":":
                raise ValueError(f"not JSON at {i}")
            i += 1
        value, i, complete = _value(s, i)
        if value is not _MISSING:
            if is_object:
                into[key] = value
            else:
                into.append(value)
        if not complete:
            return into, i, False


def partial_json(text: str) -> Any:
    """The value a JSON prefix holds so far (None for an empty text); ValueError when it is no JSON prefix."""
    value, end, complete = _value(text, 0)
    if complete and _ws(text, end) != len(text):
        raise ValueError(f"extra data at {end}")
    return None if value is _MISSING else value
