"""Decoding request bodies: strict JSON (no NaN/Infinity, valid UTF-8, no lone surrogates), bounded nesting."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec

from kernelcore.entrypoints.server.errors import bad_request

MAX_DEPTH = 64  # deeper than any real request; jinja, jsonschema and friends recurse over the body later
MIN_INT, MAX_INT = -(2**63), 2**64 - 1  # what msgpack carries to the engine core; fields check their own range

_decoder = msgspec.json.Decoder()
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def decode_json(raw: bytes) -> Any:
    """The body as Python values, or a 400 that says what is wrong with it."""
    try:
        value = _decoder.decode(raw)
    except RecursionError:
        raise bad_request(f"Invalid JSON body: nested more than {MAX_DEPTH} levels deep") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        hint = ""
        if _SURROGATE_ESCAPE.search(raw):
            hint = " (strings must be valid Unicode: a UTF-16 surrogate escape must be one of a pair)"
        raise bad_request(f"Invalid JSON body: {exc}{hint}") from None
    _check_shape(value)
    return value


def _check_shape(value: Any) -> None:
    """Nesting depth and integer range, walked iteratively (no recursion on hostile input)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            raise bad_request(f"Invalid JSON body: nested more than {MAX_DEPTH} levels deep")
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
            elif isinstance(child, int) and not MIN_INT <= child <= MAX_INT:
                raise bad_request("Invalid JSON body: an integer is out of the 64-bit range")
