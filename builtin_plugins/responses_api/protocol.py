"""A Responses request body -> :class:`ResponsesRequest`: every field checked, each refusal a 400 naming the field.

What the request asks of the model is translated into a chat-completions body by :mod:`.translate`; this module
only decides what the request means. Fields that would change the answer and that this server does not serve
(built-in tools, prompts, conversations, images and files) are refused, never silently dropped; informational
ones (metadata, user, service_tier, ...) are accepted and echoed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builtin_plugins.responses_api.items import normalize_input
from kernelcore.entrypoints.server.errors import APIError, bad_request

# Sampling fields the chat path reads under the same name: the Responses API's own two, and the extensions
# vLLM also accepts on /v1/responses.
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty", "presence_penalty",
            "frequency_penalty", "ignore_eos")
INFORMATIONAL = {"user": str, "service_tier": str, "safety_identifier": str, "prompt_cache_key": str,
                 "prompt_cache_retention": str, "prompt_cache_options": dict, "stream_options": dict}
# Meaningful fields this server does not serve: any value but null/empty is a 400.
REFUSED = {
    "conversation": "conversations are not served; chain responses with `previous_response_id`",
    "prompt": "prompt templates are not served; send `instructions` and `input`",
    "context_management": "context management (compaction) is not served",
    "max_tool_calls": "`max_tool_calls` limits built-in tool calls, which this server does not serve",
}
KNOWN = {"model", "input", "instructions", "tools", "tool_choice", "text", "reasoning", "max_output_tokens",
         "parallel_tool_calls", "stream", "store", "previous_response_id", "background", "metadata", "truncation",
         "include", "top_logprobs", *SAMPLING, *INFORMATIONAL, *REFUSED}
# `include` values naming outputs of tools this server refuses anyway are harmless; logprobs are not served.
REFUSED_INCLUDES = {"message.output_text.logprobs": "output logprobs are not served on /v1/responses"}
EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh")
SUMMARIES = (None, "auto", "concise", "detailed")


@dataclass
class ResponsesRequest:
    """The checked request. ``items`` are this request's input items in canonical form (see :mod:`.items`)."""

    items: list[dict[str, Any]]
    instructions: str | None = None
    model: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)  # Responses shape, as echoed
    tool_choice: Any = None  # as given (None: not given)
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    verbosity: str | None = None
    reasoning: dict[str, Any] = field(default_factory=lambda: {"effort": None, "summary": None})
    max_output_tokens: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    parallel_tool_calls: bool = True
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    informational: dict[str, Any] = field(default_factory=dict)


def _typed(body: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise bad_request(f"Invalid type for '{name}': expected {what}, but got {type(value).__name__}.", name)
    return value


def parse_request(body: Any) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    for name in body:
        if name not in KNOWN:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name)
    for name, why in REFUSED.items():
        if body.get(name) not in (None, [], {}, ""):
            raise bad_request(f"`{name}` is not supported by this server: {why}", name)
    if "input" not in body or body["input"] is None:
        raise bad_request("Missing required parameter: 'input'.", "input")
    req = ResponsesRequest(items=normalize_input(body["input"]))
    req.instructions = _typed(body, "instructions", str, "a string")
    req.model = _typed(body, "model", str, "a string") or None
    req.previous_response_id = _typed(body, "previous_response_id", str, "a string") or None
    for name in ("stream", "store", "background", "parallel_tool_calls"):
        value = _typed(body, name, bool, "a boolean")
        if value is not None:
            setattr(req, name, value)
    if req.background and not req.store:
        raise bad_request("Background responses must be stored: `background: true` needs `store: true`", "store")
    if req.background and req.stream:
        raise bad_request("Streaming a background response is not supported: poll GET /v1/responses/{id}",
                          "stream")
    max_output_tokens = body.get("max_output_tokens")
    if max_output_tokens is not None:
        if not isinstance(max_output_tokens, int) or isinstance(max_output_tokens, bool) or max_output_tokens < 1:
            raise bad_request(f"Invalid 'max_output_tokens': expected an integer of at least 1, got "
                              f"{max_output_tokens!r:.40}", "max_output_tokens")
        req.max_output_tokens = max_output_tokens
    req.sampling = {name: body[name] for name in SAMPLING if body.get(name) is not None}
    req.tools = _parse_tools(_typed(body, "tools", list, "an array") or [])
    req.tool_choice = _parse_tool_choice(body.get("tool_choice"))
    _parse_text(req, _typed(body, "text", dict, "an object") or {})
    _parse_reasoning(req, _typed(body, "reasoning", dict, "an object") or {})
    _parse_metadata(req, _typed(body, "metadata", dict, "an object") or {})
    truncation = body.get("truncation")
    if truncation not in (None, "disabled"):
        raise bad_request(f"`truncation` {truncation!r:.40} is not supported: only 'disabled' (an input too long for "
                          "the context is a 400)", "truncation")
    _check_include(_typed(body, "include", list, "an array") or [])
    top_logprobs = body.get("top_logprobs")
    if top_logprobs not in (None, 0):
        raise bad_request("`top_logprobs` is not supported on /v1/responses", "top_logprobs")
    for name, kind in INFORMATIONAL.items():
        value = _typed(body, name, kind, "a string" if kind is str else "an object")
        if value is not None:
            req.informational[name] = value
    return req


def _parse_tools(tools: list[Any]) -> list[dict[str, Any]]:
    parsed = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise bad_request(f"`{param}` must be an object with a string `type`", param)
        if tool["type"] != "function":
            raise bad_request(f"Tool type {tool['type']!r:.40} is not supported by this server: only 'function' "
                              "tools (built-in tools such as web_search or file_search are not served)",
                              f"{param}.type")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"`{param}.name` must be a non-empty string", f"{param}.name")
        parameters = tool.get("parameters")
        if parameters is not None and (not isinstance(parameters, dict)
                                       or parameters.get("type", "object") != "object"):
            raise bad_request(f"`{param}.parameters` must be a JSON Schema of type object", f"{param}.parameters")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request(f"`{param}.description` must be a string", f"{param}.description")
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request(f"`{param}.strict` must be a boolean", f"{param}.strict")
        parsed.append({"type": "function", "name": name, "description": description, "parameters": parameters,
                       "strict": strict})
    return parsed


def _parse_tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        if not isinstance(choice.get("name"), str) or not choice["name"]:
            raise bad_request("`tool_choice.name` must name a function tool", "tool_choice.name")
        return {"type": "function", "name": choice["name"]}
    if isinstance(choice, dict) and isinstance(choice.get("type"), str):
        raise bad_request(f"tool_choice type {choice['type']!r:.40} is not supported by this server: use 'auto', "
                          "'none', 'required' or {\"type\": \"function\", \"name\": ...}", "tool_choice.type")
    raise bad_request(f"Invalid 'tool_choice': {choice!r:.60}", "tool_choice")


def _parse_text(req: ResponsesRequest, text: dict[str, Any]) -> None:
    verbosity = text.get("verbosity")
    if verbosity not in (None, "low", "medium", "high"):
        raise bad_request("`text.verbosity` must be 'low', 'medium' or 'high'", "text.verbosity")
    req.verbosity = verbosity
    fmt = text.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise bad_request("`text.format` must be an object with a string `type`", "text.format")
    kind = fmt["type"]
    if kind in ("text", "json_object"):
        req.text_format = {"type": kind}
        return
    if kind != "json_schema":
        raise bad_request(f"`text.format.type` {kind!r:.40} is not supported: use 'text', 'json_object' or "
                          "'json_schema'", "text.format.type")
    if not isinstance(fmt.get("name"), str) or not fmt["name"]:
        raise bad_request("Missing required parameter: 'text.format.name'.", "text.format.name")
    if not isinstance(fmt.get("schema"), dict):
        raise bad_request("`text.format.schema` must be a JSON Schema object", "text.format.schema")
    for name, kind_ in (("strict", bool), ("description", str)):
        if fmt.get(name) is not None and not isinstance(fmt[name], kind_):
            raise bad_request(f"Invalid type for 'text.format.{name}'", f"text.format.{name}")
    req.text_format = {"type": "json_schema", "name": fmt["name"], "schema": fmt["schema"],
                       "strict": fmt.get("strict"), "description": fmt.get("description")}


def _parse_reasoning(req: ResponsesRequest, reasoning: dict[str, Any]) -> None:
    effort, summary = reasoning.get("effort"), reasoning.get("summary", reasoning.get("generate_summary"))
    if effort not in EFFORTS:
        raise bad_request(f"Invalid 'reasoning.effort': {effort!r:.40}", "reasoning.effort")
    if summary not in SUMMARIES:
        raise bad_request(f"Invalid 'reasoning.summary': {summary!r:.40}", "reasoning.summary")
    req.reasoning = {"effort": effort, "summary": summary}


def _parse_metadata(req: ResponsesRequest, metadata: dict[str, Any]) -> None:
    if len(metadata) > 16:
        raise bad_request("`metadata` may hold at most 16 keys", "metadata")
    for key, value in metadata.items():
        if len(key) > 64 or not isinstance(value, str) or len(value) > 512:
            raise bad_request("`metadata` maps keys of at most 64 characters to strings of at most 512", "metadata")
    req.metadata = dict(metadata)


def _check_include(include: list[Any]) -> None:
    for value in include:
        if not isinstance(value, str):
            raise bad_request("`include` must be an array of strings", "include")
        if value in REFUSED_INCLUDES:
            raise bad_request(f"`include` {value!r} is not supported: {REFUSED_INCLUDES[value]}", "include")


# The chat path names its own fields in errors; a Responses client sent these instead.
CHAT_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
               "response_format": "text.format", "response_format.json_schema": "text.format",
               "response_format.json_schema.schema": "text.format.schema", "reasoning_effort": "reasoning.effort"}


def renamed(error: APIError) -> APIError:
    """``error`` with its chat-completions field name replaced by the Responses one."""
    if error.param in CHAT_PARAMS:
        error.param = CHAT_PARAMS[error.param]
    for chat, ours in (("`reasoning_effort`", "`reasoning.effort`"), ("'max_tokens' or 'max_completion_tokens'",
                                                                     "'max_output_tokens'")):
        error.message = error.message.replace(chat, ours)
    return error
