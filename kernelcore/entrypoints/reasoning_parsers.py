"""The reasoning-parser contract: split a reasoning model's thinking from its answer, and its registry.

``split(text, is_final)`` returns ``(reasoning, content)`` for a growing prefix of the output; both may only
grow from one call to the next, so ``delta.reasoning_content`` and ``delta.content`` add up to the final message.
"""

from __future__ import annotations

from typing import Any

from kernelcore.entrypoints.tool_parsers import ToolParserRegistry, build_registry, hold_back


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


def reasoning_parser_registry() -> ReasoningParserRegistry:
    return build_registry("register_reasoning_parsers", ReasoningParserRegistry())
