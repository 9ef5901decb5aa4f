"""A chat request's conversation and tools, checked: ``messages`` (roles, text content), ``tools``, ``tool_choice``."""

from __future__ import annotations

from typing import Any

from kernelcore.entrypoints.server.errors import bad_request
from kernelcore.entrypoints.server.fields import _type_error

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _parse_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty array of messages", "messages")
    parsed = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request("Each message must be an object with a string `role`", "messages")
        if message["role"] not in ROLES:
            raise bad_request(f"Invalid message role {message['role']!r:.40}: expected one of "
                              f"{', '.join(sorted(ROLES))}", "messages")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise bad_request(f"Only text content parts are supported, got {kind!r}", "messages")
                texts.append(part["text"])
            content = "\n".join(texts)
        elif content is not None and not isinstance(content, str):
            raise _type_error("messages", "string or text-part content", content)
        parsed.append({**message, "content": content})
    return parsed


def _check_tools(tools: list | None) -> None:
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]
                and tool.get("type", "function") == "function"):
            raise bad_request("Each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                              "\"parameters\": {...}}}", "tools")
        if not isinstance(function.get("parameters", {}), dict):
            raise _type_error("tools", "a JSON Schema object for `function.parameters`", function["parameters"])


def _check_tool_choice(tool_choice: Any, tools: list | None) -> None:
    if tool_choice is None or tool_choice in ("none", "auto"):
        return
    if tool_choice == "required" or isinstance(tool_choice, dict):
        if not tools:
            raise bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice")
        if isinstance(tool_choice, dict):
            function = tool_choice.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if not name:
                raise bad_request("`tool_choice` must name a function: {\"type\": \"function\", \"function\": "
                                  "{\"name\": ...}}", "tool_choice")
            names = {(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)}
            if name not in names:
                raise bad_request(f"Tool '{name}' has not been passed in `tools`.", "tool_choice")
        return
    raise bad_request(f"Invalid `tool_choice`: {tool_choice!r}", "tool_choice")
