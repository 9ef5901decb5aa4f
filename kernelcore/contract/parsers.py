"""The tool-call and reasoning parser contracts and their registries (what ``register_tool_parsers`` and
``register_reasoning_parsers`` receive).

A tool-call parser (``tool_choice="auto"``) turns a model's output text into content and complete calls.
``parse(text, is_final)`` is called on every growing prefix while streaming and once on the whole text: the
content it returns and its list of calls may only grow from one call to the next, so streamed deltas always add
up to the non-streamed message. A call that does not parse stays in the content; a parser never raises for bad
model output.

A reasoning parser splits a reasoning model's thinking from its answer: ``split(text, is_final)`` returns
``(reasoning, content)`` for a growing prefix of the output; both may only grow from one call to the next, so
``delta.reasoning_content`` and ``delta.content`` add up to the final message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kernelcore.contract.targets import resolve_target


@dataclass
class ParsedOutput:
    content: str = ""  # text for message.content (so far)
    calls: list[tuple[str, str]] = field(default_factory=list)  # complete calls: (name, arguments as JSON text)


class ToolParser:
    """Base class; subclasses implement :meth:`parse`. Constructed as ``cls(tokenizer)``."""

    name = "?"
    skip_special_tokens = True  # False when the format's markers are special tokens the text must keep

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def parse(self, text: str, is_final: bool) -> ParsedOutput:
        raise NotImplementedError


def hold_back(text: str, marker: str) -> str:
    """``text`` without a trailing partial ``marker`` (it may still become one)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return text[:-n]
    return text


def call_from_json(obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> tuple[str, str] | None:
    """(name, arguments JSON) from ``{"name": ..., "arguments": {...}}``; None if it is not that shape."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args: Any = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def json_values(text: str) -> list[Any] | None:
    """Every JSON value in ``text``, separated by whitespace or ``;``; None if anything else is there."""
    decoder, pos = json.JSONDecoder(), 0
    values: list[Any] = []
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
            pos += 1
        if pos == len(text):
            return values
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        values.append(value)


class ToolParserRegistry:
    def __init__(self) -> None:
        self._classes: dict[str, Any] = {}

    def register(self, name: str, cls: Any) -> None:
        if name in self._classes:
            raise ValueError(f"tool-call parser {name!r} is registered twice")
        self._classes[name] = cls

    def names(self) -> list[str]:
        return sorted(self._classes)

    def get(self, name: str) -> type[ToolParser]:
        if name not in self._classes:
            raise ValueError(f"unknown tool-call parser {name!r}; installed: {', '.join(self.names()) or 'none'}")
        return resolve_target(self._classes[name])


class ReasoningParser:
    """Base class for ``<think>``-style formats. Constructed as ``cls(tokenizer)``."""

    name = "?"
    start = "<think>"
    end = "</think>"
    starts_inside = False  # the chat template opened the thinking block itself (the output may lack ``start``)

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def split(self, text: str, is_final: bool) -> tuple[str, str]:
        stripped = text.lstrip()
        if stripped.startswith(self.start):
            body = stripped[len(self.start):]
        elif not is_final and self.start.startswith(stripped):
            return "", ""  # may still open a thinking block
        elif self.starts_inside:
            body = text
        else:
            return "", text
        index = body.find(self.end)
        if index < 0:
            return (body if is_final else hold_back(body, self.end)), ""
        return body[:index], body[index + len(self.end):]

    def end_token_ids(self) -> list[int]:
        """The tokens that end the thinking: constraints start after them."""
        return list(self.tokenizer.encode(self.end, add_special_tokens=False))


class ReasoningParserRegistry(ToolParserRegistry):
    def register(self, name: str, cls: Any) -> None:
        if name in self._classes:
            raise ValueError(f"reasoning parser {name!r} is registered twice")
        self._classes[name] = cls
