"""An Anthropic Messages request -> the OpenAI chat-completions body the shared path validates and runs.

Only what is Anthropic-specific is checked here (block shapes, `tools`, `tool_choice`, `thinking`, required
`max_tokens`); sampling values, limits, the model name and the chat template are checked by ``start_chat``
exactly as for /v1/chat/completions. What this server cannot do is a 400 naming the field, never a silent 200.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kernelcore.entrypoints.server.errors import bad_request

PASSED_FIELDS = {"model", "messages", "max_tokens", "system", "tools", "tool_choice", "stop_sequences",
                 "temperature", "top_p", "top_k", "stream", "thinking", "output_config"}
# Accepted and ignored: they change billing, routing or caching on Anthropic's side, not the answer.
IGNORED_FIELDS = {"metadata", "service_tier", "cache_control", "inference_geo", "speed", "diagnostics",
                  "user_profile_id", "workspace_id"}
REFUSED_FIELDS = {"container": "containers (server-side code execution)", "mcp_servers": "MCP servers",
                  "context_management": "context management"}
USER_BLOCKS = {"text", "tool_result"}
ASSISTANT_BLOCKS = {"text", "tool_use", "thinking", "redacted_thinking"}


@dataclass
class MessagesRequest:
    """The translated body plus what the answer needs to be put back into Anthropic's shape."""

    body: dict[str, Any]  # an OpenAI chat-completions body
    stream: bool
    stop_sequences: list[str]
    tool_choice: str  # "auto" | "any" | "tool" | "none": how the answer's tool calls came about
    tool_name: str | None  # the forced tool of {"type": "tool"}


def _object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(f"`{name}`: expected an object, got {type(value).__name__}", name)
    return value


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise bad_request(f"`{name}`: expected a string, got {type(value).__name__}", name)
    return value


def _text_blocks(value: Any, name: str) -> str:
    """A string, or text blocks joined by newlines (`system`, tool_result content)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"`{name}`: expected a string or an array of text blocks", name)
    texts = []
    for i, block in enumerate(value):
        block = _object(block, f"{name}[{i}]")
        if block.get("type") != "text":
            raise bad_request(f"`{name}[{i}]`: only text blocks are supported here, got type "
                              f"{block.get('type')!r:.40}", name)
        texts.append(_string(block.get("text"), f"{name}[{i}].text"))
    return "\n".join(texts)


def _blocks(message: dict[str, Any], name: str) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"`{name}.content`: expected a string or an array of content blocks", name)
    role = message["role"]
    allowed = USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS if role == "assistant" else {"text"}
    for j, block in enumerate(content):
        kind = _object(block, f"{name}.content[{j}]").get("type")
        if kind not in allowed:
            supported = ", ".join(sorted(allowed))
            raise bad_request(f"`{name}.content[{j}]`: content blocks of type {kind!r:.40} are not supported in "
                              f"{role} messages by this server (supported: {supported})", name)
    return content


def _tool_result(block: dict[str, Any], name: str) -> dict[str, Any]:
    call_id = _string(block.get("tool_use_id"), f"{name}.tool_use_id")
    content = _text_blocks(block.get("content", ""), f"{name}.content")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise bad_request(f"`{name}.is_error`: expected a boolean", name)
    if is_error:  # the chat format has no error flag: say it in the text the model reads
        content = f"Error: {content}" if content else "Error"
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _tool_use(block: dict[str, Any], name: str) -> dict[str, Any]:
    call_id = _string(block.get("id"), f"{name}.id")
    tool = _string(block.get("name"), f"{name}.name")
    arguments = json.dumps(_object(block.get("input"), f"{name}.input"), ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}


def _chat_messages(role: str, blocks: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """One Anthropic turn -> chat messages: tool results become `tool` messages, in order; tool uses `tool_calls`."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        where = f"{name}.content[{j}]"
        if block["type"] == "text":
            texts.append(_string(block.get("text"), f"{where}.text"))
        elif block["type"] == "tool_result":
            if texts:
                out.append({"role": role, "content": "\n".join(texts)})
                texts = []
            out.append(_tool_result(block, where))
        elif block["type"] == "tool_use":
            calls.append(_tool_use(block, where))
        # thinking / redacted_thinking from earlier turns: dropped (chat templates drop past reasoning too)
    if calls:  # "" rather than None: templates that know nothing of tools print None as text
        out.append({"role": role, "content": "\n".join(texts), "tool_calls": calls})
    elif texts or not out:
        out.append({"role": role, "content": "\n".join(texts)})
    return out


def _messages(value: Any) -> tuple[list[dict[str, Any]], bool]:
    """The chat messages and whether the last one is an assistant prefill the answer continues."""
    if not isinstance(value, list) or not value:
        raise bad_request("`messages`: expected a non-empty array of messages", "messages")
    turns: list[tuple[str, list[dict[str, Any]], str]] = []
    for i, message in enumerate(value):
        name = f"messages[{i}]"
        role = _object(message, name).get("role")
        if role not in ("user", "assistant", "system"):
            raise bad_request(f"`{name}.role`: expected 'user' or 'assistant', got {role!r:.40}", name)
        blocks = _blocks(message, name)
        if turns and turns[-1][0] == role:  # Anthropic combines consecutive turns of one role
            turns[-1] = (role, turns[-1][1] + blocks, turns[-1][2])
        else:
            turns.append((role, blocks, name))
    out = [m for role, blocks, name in turns for m in _chat_messages(role, blocks, name)]
    last = out[-1]
    return out, last["role"] == "assistant" and not last.get("tool_calls")


def _tools(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise bad_request("`tools`: expected an array of tools", "tools")
    tools = []
    for i, tool in enumerate(value):
        name = f"tools[{i}]"
        tool = _object(tool, name)
        if tool.get("type") not in (None, "custom"):
            raise bad_request(f"`{name}.type`: the server tool {tool['type']!r:.60} is not supported by this server; "
                              "only client tools (name, description, input_schema) are", name)
        function: dict[str, Any] = {"name": _string(tool.get("name"), f"{name}.name")}
        if tool.get("description") is not None:
            function["description"] = _string(tool["description"], f"{name}.description")
        function["parameters"] = _object(tool.get("input_schema"), f"{name}.input_schema")
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: Any, body: dict[str, Any]) -> tuple[str, str | None]:
    """Sets the chat body's `tool_choice` / `parallel_tool_calls`; returns (kind, forced tool name)."""
    if value is None:
        return ("auto" if body.get("tools") else "none"), None
    choice = _object(value, "tool_choice")
    kind, tool_name = choice.get("type"), None
    if kind == "auto":
        body["tool_choice"] = "auto"
    elif kind == "any":
        body["tool_choice"] = "required"
    elif kind == "tool":
        tool_name = _string(choice.get("name"), "tool_choice.name")
        body["tool_choice"] = {"type": "function", "function": {"name": tool_name}}
    elif kind == "none":
        body["tool_choice"] = "none"
    else:
        raise bad_request(f"`tool_choice.type`: expected 'auto', 'any', 'tool' or 'none', got {kind!r:.40}",
                          "tool_choice")
    disable_parallel = choice.get("disable_parallel_tool_use", False)
    if not isinstance(disable_parallel, bool):
        raise bad_request("`tool_choice.disable_parallel_tool_use`: expected a boolean", "tool_choice")
    if disable_parallel:
        body["parallel_tool_calls"] = False
    if not body.get("tools") and kind in ("auto", "none"):
        body.pop("tool_choice")  # nothing to choose from: harmless, as Anthropic treats it
    return kind, tool_name


def _thinking(value: Any, has_reasoning_parser: bool) -> dict[str, Any]:
    """`thinking` -> chat_template_kwargs (templates such as Qwen3's switch thinking with `enable_thinking`)."""
    if value is None:
        return {}
    kind = _object(value, "thinking").get("type")
    if kind == "disabled":
        return {"enable_thinking": False} if has_reasoning_parser else {}
    if kind not in ("enabled", "adaptive"):
        raise bad_request(f"`thinking.type`: expected 'enabled', 'adaptive' or 'disabled', got {kind!r:.40}",
                          "thinking")
    if not has_reasoning_parser:
        raise bad_request("`thinking` needs a reasoning model: this server has no reasoning parser (kc serve "
                          "--reasoning-parser NAME); omit `thinking` or send {\"type\": \"disabled\"}", "thinking")
    return {"enable_thinking": True}


def _output_format(value: Any) -> dict[str, Any] | None:
    config = _object(value, "output_config")
    unknown = sorted(set(config) - {"format", "effort"})
    if unknown:
        raise bad_request(f"`output_config.{unknown[0]}` is not supported by this server", "output_config")
    if config.get("format") is None:
        return None  # `effort` only: advisory, ignored
    fmt = _object(config["format"], "output_config.format")
    if fmt.get("type") != "json_schema":
        raise bad_request("`output_config.format.type`: expected 'json_schema'", "output_config")
    schema = _object(fmt.get("schema"), "output_config.format.schema")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def translate(body: Any, *, has_reasoning_parser: bool, count_only: bool = False) -> MessagesRequest:
    """Validate an Anthropic Messages body and build the chat-completions body. ``count_only``: /count_tokens,
    where `max_tokens` is not required."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    for name in body:
        if name in REFUSED_FIELDS and body[name] is not None:
            raise bad_request(f"`{name}`: {REFUSED_FIELDS[name]} are not supported by this server", name)
        if name not in PASSED_FIELDS and name not in IGNORED_FIELDS and name not in REFUSED_FIELDS:
            raise bad_request(f"`{name}`: unknown field (Extra inputs are not permitted)", name)
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise bad_request("`metadata`: expected an object", "metadata")
    model = _string(body.get("model"), "model")
    max_tokens = body.get("max_tokens")
    if max_tokens is None and not count_only:
        raise bad_request("`max_tokens` is required", "max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise bad_request(f"`max_tokens`: expected an integer of at least 1, got {max_tokens!r:.40}", "max_tokens")
    messages, is_prefill = _messages(body.get("messages"))
    if body.get("system") is not None:
        system = _text_blocks(body["system"], "system")
        if system:
            messages.insert(0, {"role": "system", "content": system})
    chat: dict[str, Any] = {"model": model, "messages": messages}
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise bad_request("`stop_sequences`: expected an array of strings", "stop_sequences")
        if stop:
            chat["stop"] = stop
    if body.get("tools") is not None:
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    kind, tool_name = _tool_choice(body.get("tool_choice"), chat)
    kwargs = _thinking(body.get("thinking"), has_reasoning_parser)
    if kwargs:
        chat["chat_template_kwargs"] = kwargs
    if body.get("output_config") is not None:
        response_format = _output_format(body["output_config"])
        if response_format is not None:
            chat["response_format"] = response_format
    if is_prefill:  # the answer continues the final assistant turn, as Anthropic's does
        chat["add_generation_prompt"], chat["continue_final_message"] = False, True
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise bad_request("`stream`: expected a boolean", "stream")
    return MessagesRequest(chat, stream, stop or [], kind, tool_name)
