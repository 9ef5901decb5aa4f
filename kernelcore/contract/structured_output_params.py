"""What a request asks to be constrained to: plain data (msgspec) that crosses process boundaries."""

from __future__ import annotations

import json
from typing import Any

import msgspec

KINDS = ("json", "json_object", "regex", "choice", "grammar")
# Whitespace characters allowed in one gap of constrained JSON: room for any indentation a model uses, and a
# bound on a model that would otherwise emit whitespace until max_tokens.
MAX_JSON_WHITESPACE = 16


class StructuredOutputsParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Exactly one constraint. ``json`` is the JSON Schema as JSON text (so it hashes and crosses processes)."""

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # a Lark grammar (or whatever the chosen backend documents)
    whitespace_pattern: str | None = None
    # JSON with no whitespace between tokens; by default a model may put up to MAX_JSON_WHITESPACE whitespace
    # characters wherever JSON allows them (compact output degrades many models' answers).
    compact_whitespace: bool = False
    backend: str | None = None  # the backend that validated it (set by the front end); None = choose again
    # Constraint starts after these tokens appear in the output (a reasoning model's end-of-thinking marker).
    start_after_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.json, (dict, list, bool)):
            self.json = json.dumps(self.json)  # key order kept: properties come out in schema order
        kinds = [k for k in KINDS if getattr(self, k)]
        if len(kinds) != 1:
            raise ValueError("structured_outputs needs exactly one of json, json_object, regex, choice, grammar; "
                             f"got {kinds or 'none'}")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) for c in self.choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of strings")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k))

    @property
    def source(self) -> Any:
        value = getattr(self, self.kind)
        return tuple(value) if isinstance(value, list) else value

    @property
    def cache_key(self) -> tuple:
        """Equal keys compile to the same grammar: the cache is keyed by it."""
        return (self.kind, self.source, self.whitespace_pattern, self.compact_whitespace)

    def text(self, kind: str) -> str:
        """The constraint text of ``kind`` ("json", "regex" or "grammar"), which must be this constraint's kind."""
        value = getattr(self, kind)
        if not isinstance(value, str):
            raise ValueError(f"structured_outputs.{kind} is not set")
        return value

    @property
    def choices(self) -> list[str]:
        """The ``choice`` strings (empty unless this is a choice constraint)."""
        return list(self.choice or [])

    def schema(self) -> dict[str, Any] | None:
        return json.loads(self.json) if self.json is not None else None
