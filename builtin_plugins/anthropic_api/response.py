"""A finished chat choice -> an Anthropic ``message``: content blocks, ``stop_reason``, ``usage``.

The streaming path (events.py) uses the same pieces, so a streamed answer accumulates (in the anthropic SDK) to
the message the non-streamed request returns.
"""

from __future__ import annotations

import json
from typing import Any

from builtin_plugins.anthropic_api.partial_json import partial_json
from builtin_plugins.anthropic_api.translate import MessagesRequest
from kernelcore.entrypoints.server.tools import new_call_id


def message_id(request_id: str) -> str:
    """``msg_<hex>`` from the run's request id (``msg-<X-Request-Id or hex>``)."""
    return "msg_" + request_id.split("-", 1)[-1]


def tool_use_id(call_id: str) -> str:
    """``toolu_<hex>`` for the shared path's ``call_<hex>``."""
    return "toolu_" + call_id.removeprefix("call_")


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's JSON-text arguments as the ``input`` object. Arguments that are not a complete JSON object (cut by
    max_tokens) give what they hold so far, as the SDK's stream accumulator reads them."""
    try:
        value = json.loads(arguments)
    except ValueError:
        try:
            value = partial_json(arguments)
        except ValueError:
            value = None
    return value if isinstance(value, dict) else {}


def cut_calls(req: MessagesRequest, text: str, finish_reason: str | None) -> list[tuple[str, dict[str, Any]]]:
    """The calls of a forced tool choice whose output max_tokens cut before its JSON was complete.

    The shared path gives such an output back as text; they stay tool_use blocks here (name and partial
    input, stop_reason max_tokens), so a client sees which tool was being called. Other outputs: [].
    """
    if finish_reason != "length" or req.tool_choice not in ("tool", "any"):
        return []
    try:
        value = partial_json(text)
    except ValueError:
        return []
    if req.tool_choice == "tool":
        return [(req.tool_name or "", value if isinstance(value, dict) else {})]
    items = value if isinstance(value, list) else []
    return [(item["name"], item["parameters"] if isinstance(item.get("parameters"), dict) else {})
            for item in items if isinstance(item, dict) and isinstance(item.get("name"), str)]


def stop_reason(req: MessagesRequest, finish_reason: str | None, stop: Any) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for the engine's finish reason and the stop string or token that ended it."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(stop, str) and stop in req.stop_sequences:
        return "stop_sequence", stop
    return "end_turn", None


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def message(req: MessagesRequest, run: Any, choice: Any) -> dict[str, Any]:
    """The non-streamed response body for the run's one choice."""
    content: list[dict[str, Any]] = []
    if choice.reasoning:
        content.append({"type": "thinking", "thinking": choice.reasoning, "signature": ""})
    calls = [(tool_use_id(c["id"]), c["function"]["name"], tool_input(c["function"]["arguments"]))
             for c in choice.tool_calls]
    cut = cut_calls(req, choice.content or "", choice.finish_reason) if not calls else []
    if choice.content and not cut:
        content.append({"type": "text", "text": choice.content})
    calls += [(tool_use_id(new_call_id()), name, value) for name, value in cut]
    content += [{"type": "tool_use", "id": call_id, "name": name, "input": value} for call_id, name, value in calls]
    reason, sequence = stop_reason(req, choice.finish_reason, choice.stop_reason)
    return {"id": message_id(run.request_id), "type": "message", "role": "assistant", "model": run.model,
            "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": usage(run.num_prompt_tokens, run.num_completion_tokens)}
