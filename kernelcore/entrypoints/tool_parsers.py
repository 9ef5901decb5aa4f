"""The tool-call parser contract (``tool_choice="auto"``) and its registry.

A parser turns a model's output text into content and complete calls. ``parse(text, is_final)`` is called on
every growing prefix while streaming and once on the whole text: the content it returns and its list of calls
may only grow from one call to the next, so streamed deltas always add up to the non-streamed message. A call
that does not parse stays in the content; a parser never raises for bad model output.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from typing import Any


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
    args = next((obj[k] for k in args_keys if k in obj), {})
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
    decoder, values, pos = json.JSONDecoder(), [], 0
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
        cls = self._classes[name]
        if isinstance(cls, str):
            module, _, attr = cls.partition(":")
            cls = getattr(importlib.import_module(module), attr)
        return cls


def build_registry(hook_name: str, registry: Any) -> Any:
    from kernelcore import platforms, plugins

    platforms.load_general_plugins()
    getattr(plugins.get_plugin_manager().hook, hook_name)(registry=registry)
    return registry


def tool_parser_registry() -> ToolParserRegistry:
    return build_registry("register_tool_parsers", ToolParserRegistry())
