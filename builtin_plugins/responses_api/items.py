"""Responses items: input items in their canonical form, the chat messages they become, and output items.

Every input item is stored as one canonical dict with an ``id`` (what ``GET .../input_items`` lists and what
``previous_response_id`` replays): ``message`` (role, content parts of type input_text / output_text),
``function_call`` (call_id, name, arguments) and ``function_call_output`` (call_id, output), plus ``reasoning``
items, which are accepted (clients send back what they received) but not shown to the model again.
"""

from __future__ import annotations

import uuid
from typing import Any

from kernelcore.entrypoints.server.errors import bad_request

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def normalize_input(value: Any) -> list[dict[str, Any]]:
    """``input`` (a string or an array of items) -> canonical items; anything else is a 400 naming its place."""
    if isinstance(value, str):
        return [_message("user", [{"type": "input_text", "text": value}])]
    if not isinstance(value, list):
        raise bad_request("`input` must be a string or an array of input items", "input")
    return [_item(item, f"input[{i}]") for i, item in enumerate(value)]


def _message(role: str, content: list[dict[str, Any]], item_id: str | None = None) -> dict[str, Any]:
    return {"id": item_id or new_id("msg"), "type": "message", "role": role, "content": content,
            "status": "completed"}


def _str_field(item: dict[str, Any], name: str, param: str, required: bool = True) -> Any:
    value = item.get(name)
    if (value is None and required) or (value is not None and not isinstance(value, str)):
        raise bad_request(f"`{param}.{name}` must be a string", f"{param}.{name}")
    return value


def _item(item: Any, param: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise bad_request(f"`{param}` must be an input item object", param)
    kind = item.get("type", "message" if "role" in item else None)
    item_id = item.get("id") if isinstance(item.get("id"), str) and item.get("id") else None
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise bad_request(f"`{param}.role` must be one of {', '.join(ROLES)}, got {role!r:.40}", f"{param}.role")
        return _message(role, _content(item.get("content"), role, f"{param}.content"), item_id)
    if kind == "function_call":
        return {"id": item_id or new_id("fc"), "type": "function_call",
                "call_id": _str_field(item, "call_id", param), "name": _str_field(item, "name", param),
                "arguments": _str_field(item, "arguments", param), "status": "completed"}
    if kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            output = _parts_text(_content(output, "user", f"{param}.output"))
        if not isinstance(output, str):
            raise bad_request(f"`{param}.output` must be a string or an array of input_text parts",
                              f"{param}.output")
        return {"id": item_id or new_id("fco"), "type": "function_call_output",
                "call_id": _str_field(item, "call_id", param), "output": output, "status": "completed"}
    if kind == "reasoning":
        summary = item.get("summary", [])
        if not isinstance(summary, list):
            raise bad_request(f"`{param}.summary` must be an array", f"{param}.summary")
        return {"id": item_id or new_id("rs"), "type": "reasoning", "summary": summary,
                "content": item.get("content") if isinstance(item.get("content"), list) else []}
    if not isinstance(kind, str):
        raise bad_request(f"`{param}` needs a string `type` (or a `role`)", f"{param}.type")
    raise bad_request(f"Input item type {kind!r:.40} is not supported by this server: send message, function_call, "
                      "function_call_output or reasoning items", f"{param}.type")


def _content(content: Any, role: str, param: str) -> list[dict[str, Any]]:
    text_type = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        return [{"type": text_type, "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"`{param}` must be a string or an array of content parts", param)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": text_type, "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": text_type, "text": part["refusal"]})
        elif isinstance(kind, str) and kind not in TEXT_PARTS:
            raise bad_request(f"Content part type {kind!r:.40} is not supported by this server: only text parts "
                              "(input_text, output_text); images, files and audio are not served",
                              f"{param}[{j}].type")
        else:
            raise bad_request(f"`{param}[{j}]` must be a text part {{\"type\": \"input_text\", \"text\": ...}}",
                              f"{param}[{j}]")
    return parts


def _parts_text(parts: list[dict[str, Any]]) -> str:
    return "".join(part["text"] for part in parts)


def to_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical items -> chat messages. ``instructions`` leads as a system message; ``developer`` is ``system``
    (chat templates know the latter); consecutive function calls are one assistant turn with ``tool_calls``."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    call_ids: set[str] = set()
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _parts_text(item["content"])})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            call_ids.add(item["call_id"])
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if item["call_id"] not in call_ids:
                raise bad_request(f"No tool call found for function call output with call_id {item['call_id']!r:.60}"
                                  " (send the function_call item before its output)", "input")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


# -- output items ------------------------------------------------------------------------------------------------

def message_item(text: str, status: str, item_id: str | None = None) -> dict[str, Any]:
    return {"id": item_id or new_id("msg"), "type": "message", "role": "assistant", "status": status,
            "content": [text_part(text)]}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(call_id: str, name: str, arguments: str, status: str, item_id: str | None = None) -> dict[str, Any]:
    return {"id": item_id or new_id("fc"), "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def reasoning_item(text: str, status: str, item_id: str | None = None) -> dict[str, Any]:
    return {"id": item_id or new_id("rs"), "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def output_items(content: str | None, reasoning: str | None, tool_calls: list[dict[str, Any]],
                 is_cut: bool) -> list[dict[str, Any]]:
    """One finished choice as output items: its reasoning, its text, then its function calls."""
    status = "incomplete" if is_cut else "completed"
    items = []
    if reasoning:
        items.append(reasoning_item(reasoning, status))
    if content or not tool_calls:
        items.append(message_item(content or "", status))
    for call in tool_calls:
        items.append(call_item(call["id"], call["function"]["name"], call["function"]["arguments"], status))
    return items
