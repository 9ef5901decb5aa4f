"""Typed readers of a request body's fields: a missing field is its default, a wrong type a 400 naming the field."""

from __future__ import annotations

import math
from typing import Any

from kernelcore.entrypoints.server.errors import APIError, bad_request


def _type_error(name: str, expected: str, value: Any) -> APIError:
    return bad_request(f"Invalid value for `{name}`: expected {expected}, got {type(value).__name__} {value!r:.60}",
                       name)


def _get(body: dict[str, Any], name: str, kind: str, default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise _type_error(name, "an integer", value)
    elif kind == "number":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise _type_error(name, "a number", value)
        value = float(value)
        if not math.isfinite(value):
            raise _type_error(name, "a finite number", value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise _type_error(name, "a boolean", value)
    elif kind == "str":
        if not isinstance(value, str):
            raise _type_error(name, "a string", value)
    elif kind == "dict":
        if not isinstance(value, dict):
            raise _type_error(name, "an object", value)
    elif kind == "list":
        if not isinstance(value, list):
            raise _type_error(name, "an array", value)
    return value


def _int_list(body: dict[str, Any], name: str) -> list[int] | None:
    value = _get(body, name, "list")
    if value is not None and not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _type_error(name, "an array of integers", value)
    return value


def check_token_ids(token_ids: list[int], vocab_size: int, param: str) -> None:
    for token_id in token_ids:
        if not 0 <= token_id < vocab_size:
            raise bad_request(f"Token id {token_id} is out of vocabulary (vocab size {vocab_size})", param)
