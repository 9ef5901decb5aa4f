"""The shared path's deltas -> Anthropic's stream: ``message_start``, ``ping``, then per content block
``content_block_start`` / ``content_block_delta`` (text_delta, thinking_delta, input_json_delta) /
``content_block_stop``, then ``message_delta`` (stop_reason, usage.output_tokens) and ``message_stop``.

Each event goes out as ``event: <type>`` plus ``data: <json>``, the framing the anthropic SDK parses.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from builtin_plugins.anthropic_api.response import cut_calls, message_id, stop_reason, tool_use_id, usage
from builtin_plugins.anthropic_api.translate import MessagesRequest
from kernelcore.entrypoints.server.streaming import sse_event
from kernelcore.entrypoints.server.tools import new_call_id


def encode(event: dict[str, Any]) -> bytes:
    return sse_event(event["type"], event)


class _Blocks:
    """The content block being written: one at a time, each stopped before the next starts."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None
        self.has_tool_use = False
        self.pending = ""  # tool input text held back while it is only whitespace (the SDK parses each prefix)

    def start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.stop()
        self.index += 1
        self.kind = block["type"]
        self.has_tool_use |= self.kind == "tool_use"
        return events + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def stop(self) -> list[dict[str, Any]]:
        if self.kind is None:
            return []
        self.kind, self.pending = None, ""
        return [{"type": "content_block_stop", "index": self.index}]

    def delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def text(self, kind: str, delta: dict[str, Any], empty: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.start(empty) if self.kind != kind else []
        return events + [self.delta(delta)]

    def tool_input(self, text: str) -> list[dict[str, Any]]:
        self.pending += text
        if not self.pending.strip():
            return []
        text, self.pending = self.pending, ""
        return [self.delta({"type": "input_json_delta", "partial_json": text})]


def _tool_events(blocks: _Blocks, item: dict[str, Any]) -> list[dict[str, Any]]:
    """One OpenAI streamed tool-call item: an ``id`` opens a tool_use block, arguments continue it."""
    function = item.get("function") or {}
    events = []
    if item.get("id"):
        events += blocks.start({"type": "tool_use", "id": tool_use_id(item["id"]), "name": function.get("name", ""),
                                "input": {}})
    if function.get("arguments") and blocks.kind == "tool_use":
        events += blocks.tool_input(function["arguments"])
    return events


async def message_events(req: MessagesRequest, run: Any) -> AsyncGenerator[dict[str, Any], None]:
    """The events of one streamed message (the run has one choice)."""
    blocks = _Blocks()
    is_started = False
    async for delta in run.stream():
        if not is_started:  # once the engine has answered, so its errors stay plain HTTP errors
            is_started = True
            yield {"type": "message_start", "message": {
                "id": message_id(run.request_id), "type": "message", "role": "assistant", "model": run.model,
                "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage(run.num_prompt_tokens, 0)}}
            yield {"type": "ping"}
        events: list[dict[str, Any]] = []
        if delta.reasoning:
            events += blocks.text("thinking", {"type": "thinking_delta", "thinking": delta.reasoning},
                                  {"type": "thinking", "thinking": "", "signature": ""})
        cut = cut_calls(req, delta.content, delta.finish_reason) if delta.content and not blocks.has_tool_use else []
        if delta.content and not cut:
            events += blocks.text("text", {"type": "text_delta", "text": delta.content}, {"type": "text", "text": ""})
        for name, value in cut:  # a forced choice cut by max_tokens: its calls, as the non-streamed answer has them
            events += blocks.start({"type": "tool_use", "id": tool_use_id(new_call_id()), "name": name, "input": {}})
            events += blocks.tool_input(json.dumps(value, ensure_ascii=False))
        for item in delta.tool_calls:
            events += _tool_events(blocks, item)
        for event in events:
            yield event
        if delta.finish_reason is not None:
            for event in blocks.stop():
                yield event
            reason, sequence = stop_reason(req, delta.finish_reason, delta.stop_reason)
            yield {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": {"output_tokens": run.num_completion_tokens}}
            yield {"type": "message_stop"}
