"""Request bodies -> validated requests carrying :class:`SamplingParams`; every violation is a 400 with a clear message."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from kernelcore.core_types.sampling_params import MAX_SEED, SamplingParams
from kernelcore.entrypoints.server.errors import APIError, bad_request
from kernelcore.entrypoints.server.tools import parse_tools
from kernelcore.entrypoints.server.structured import (INFORMATIONAL_FIELDS, STRUCTURED_FIELDS, check_refused_fields,
                                                      parse_constraint)

logger = logging.getLogger("kernelcore.server")

INT64_MIN = -MAX_SEED - 1


@dataclass
class Limits:
    """Caps on what one request may ask for (each a `kc serve` flag)."""

    max_n: int = 16
    max_logprobs: int = 20
    max_stop_strings: int = 16
    max_stop_string_length: int = 256
    max_prompts: int = 64
    max_choices: int = 64  # prompts x n: sequences one request may start


SAMPLING_FIELDS = {  # name -> kind
    "temperature": "number", "top_p": "number", "top_k": "int", "min_p": "number", "seed": "int",
    "presence_penalty": "number", "frequency_penalty": "number", "repetition_penalty": "number",
    "min_tokens": "int", "ignore_eos": "bool", "include_stop_str_in_output": "bool", "skip_special_tokens": "bool",
}
COMMON_FIELDS = {
    "model", "stream", "stream_options", "n", "stop", "stop_token_ids", "max_tokens", "echo", "logit_bias", "user",
    "allowed_token_ids", "truncate_prompt_tokens", "return_tokens_as_token_ids", "add_special_tokens", "logprobs",
    "prompt_logprobs", *SAMPLING_FIELDS, *STRUCTURED_FIELDS, *INFORMATIONAL_FIELDS,
}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "suffix", "best_of"}
CHAT_FIELDS = COMMON_FIELDS | {
    "messages", "max_completion_tokens", "top_logprobs", "add_generation_prompt", "continue_final_message",
    "chat_template", "chat_template_kwargs", "tools", "tool_choice", "documents", "parallel_tool_calls",
}
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_warned_fields: set[str] = set()


@dataclass
class GenerateRequest:
    """The validated, engine-independent part of a completion or chat request."""

    is_chat: bool
    model: str | None
    params: dict[str, Any]  # SamplingParams keyword arguments, max_tokens resolved later per prompt
    max_tokens: int | None  # as requested; None = the default (16 for completions, the rest of the context for chat)
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    echo: bool = False
    logprobs: int | None = None  # top-k per sampled token; None = no logprobs
    prompt_logprobs: int | None = None
    return_tokens_as_token_ids: bool = False
    truncate_prompt_tokens: int | None = None
    add_special_tokens: bool = True
    prompts: list[str | list[int]] = field(default_factory=list)  # completions
    messages: list[dict[str, Any]] = field(default_factory=list)  # chat
    chat: dict[str, Any] = field(default_factory=dict)  # chat template options
    structured: Any = None  # StructuredOutputsParams: the output constraint, if any
    tools: Any = None  # ToolRequest (chat): the tools and how the model may call them

    @property
    def n(self) -> int:
        return self.params.get("n", 1)


def _type_error(name: str, expected: str, value: Any) -> APIError:
    return bad_request(f"Invalid value for `{name}`: expected {expected}, got {type(value).__name__} {value!r:.60}", name)


def _get(body: dict[str, Any], name: str, kind: str, default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise _type_error(name, "an integer", value)
    elif kind == "number":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise _type_error(name, "a number", value)
        value = float(value)
        if not math.isfinite(value):
            raise _type_error(name, "a finite number", value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise _type_error(name, "a boolean", value)
    elif kind == "str":
        if not isinstance(value, str):
            raise _type_error(name, "a string", value)
    elif kind == "dict":
        if not isinstance(value, dict):
            raise _type_error(name, "an object", value)
    elif kind == "list":
        if not isinstance(value, list):
            raise _type_error(name, "an array", value)
    return value


def _int_list(body: dict[str, Any], name: str) -> list[int] | None:
    value = _get(body, name, "list")
    if value is not None and not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _type_error(name, "an array of integers", value)
    return value


def check_token_ids(token_ids: list[int], vocab_size: int, param: str) -> None:
    for token_id in token_ids:
        if not 0 <= token_id < vocab_size:
            raise bad_request(f"Token id {token_id} is out of vocabulary (vocab size {vocab_size})", param)


def _warn_unknown(body: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(body) - known - _warned_fields)
    if unknown:
        _warned_fields.update(unknown)
        logger.warning("Ignoring unknown request field(s) %s (logged once per field)", ", ".join(unknown))


def _check_logprobs(value: int | None, limits: Limits, what: str, param: str) -> None:
    if value is None:
        return
    if value < 0:
        raise bad_request(f"{param} must be non-negative, got {value}", param)
    if value > limits.max_logprobs:
        raise bad_request(f"Requested {what} logprobs of {value}, which is greater than max allowed: "
                          f"{limits.max_logprobs}", param)


def _parse_common(body: Any, limits: Limits, vocab_size: int, is_chat: bool) -> GenerateRequest:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    _warn_unknown(body, CHAT_FIELDS if is_chat else COMPLETION_FIELDS)
    check_refused_fields(body)
    model = _get(body, "model", "str") or None
    stream = _get(body, "stream", "bool", False)
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not stream:
            raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
        _get(body, "stream_options", "dict")
    stream_options = stream_options or {}

    params: dict[str, Any] = {}
    for name, kind in SAMPLING_FIELDS.items():
        value = _get(body, name, kind)
        if value is not None:
            params[name] = value
    seed = params.get("seed")
    if seed is not None and seed > MAX_SEED:
        raise bad_request(f"seed: Input should be less than or equal to {MAX_SEED} [type=less_than_equal]", "seed")
    if seed is not None and seed < INT64_MIN:
        raise bad_request(f"seed: Input should be greater than or equal to {INT64_MIN} [type=greater_than_equal]", "seed")
    n = _get(body, "n", "int", 1)
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}", "n")
    if n > limits.max_n:
        raise bad_request(f"n must be at most {limits.max_n} on this server, got {n}", "n")
    params["n"] = n

    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _type_error("stop", "a string or an array of strings", stop)
        if len(stop) > limits.max_stop_strings:
            raise bad_request(f"Too many stop strings: {len(stop)} (at most {limits.max_stop_strings})", "stop")
        if any(len(s) > limits.max_stop_string_length for s in stop):
            raise bad_request(f"Stop strings may be at most {limits.max_stop_string_length} characters long", "stop")
        params["stop"] = stop
    stop_token_ids = _int_list(body, "stop_token_ids")
    if stop_token_ids:
        check_token_ids(stop_token_ids, vocab_size, "stop_token_ids")
        params["stop_token_ids"] = stop_token_ids
    logit_bias = _get(body, "logit_bias", "dict")
    if logit_bias:
        params["logit_bias"] = _parse_logit_bias(logit_bias, vocab_size)
    allowed = _int_list(body, "allowed_token_ids")
    if allowed is not None:
        if not allowed:
            raise bad_request("allowed_token_ids must not be empty (omit it to allow every token)",
                              "allowed_token_ids")
        check_token_ids(allowed, vocab_size, "allowed_token_ids")
        params["allowed_token_ids"] = allowed

    request = GenerateRequest(
        is_chat=is_chat, model=model, params=params, max_tokens=None, stream=stream,
        include_usage=bool(stream_options.get("include_usage")),
        continuous_usage=bool(stream_options.get("continuous_usage_stats")),
        echo=_get(body, "echo", "bool", False),
        return_tokens_as_token_ids=_get(body, "return_tokens_as_token_ids", "bool", False),
        truncate_prompt_tokens=_get(body, "truncate_prompt_tokens", "int"),
        add_special_tokens=_get(body, "add_special_tokens", "bool", not is_chat),
    )
    if request.truncate_prompt_tokens is not None and request.truncate_prompt_tokens < 1:
        raise bad_request("truncate_prompt_tokens must be at least 1", "truncate_prompt_tokens")
    request.prompt_logprobs = _get(body, "prompt_logprobs", "int")
    _check_logprobs(request.prompt_logprobs, limits, "prompt", "prompt_logprobs")
    request.structured = parse_constraint(body)
    return request


def _parse_logit_bias(value: dict[str, Any], vocab_size: int) -> dict[int, float]:
    """Token id (a decimal string key) -> a finite bias, clamped to [-100, 100] as OpenAI does."""
    bias = {}
    for key, amount in value.items():
        try:
            token_id = int(key)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids, got {key!r:.40}", "logit_bias") from None
        if not isinstance(amount, (int, float)) or isinstance(amount, bool) or not math.isfinite(amount):
            raise bad_request(f"logit_bias values must be finite numbers, got {amount!r:.40} for token {token_id}",
                              "logit_bias")
        bias[token_id] = min(max(float(amount), -100.0), 100.0)
    check_token_ids(list(bias), vocab_size, "logit_bias")
    return bias


def _check_max_tokens(value: int | None, echo: bool, param: str) -> int | None:
    if value is not None and (value < 0 or (value == 0 and not echo)):
        raise bad_request(f"{param} must be at least 1, got {value}", param)
    return value


def parse_completion_request(body: Any, limits: Limits, vocab_size: int) -> GenerateRequest:
    request = _parse_common(body, limits, vocab_size, is_chat=False)
    if body.get("suffix") is not None:
        raise bad_request("suffix is not currently supported", "suffix")
    best_of = _get(body, "best_of", "int")
    if best_of is not None and best_of != request.n:
        raise bad_request(f"best_of={best_of} is not supported: it must equal n ({request.n}) or be omitted", "best_of")
    request.max_tokens = _check_max_tokens(_get(body, "max_tokens", "int"), request.echo, "max_tokens")
    request.logprobs = _get(body, "logprobs", "int")
    _check_logprobs(request.logprobs, limits, "sample", "logprobs")
    request.prompts = _parse_prompt(body.get("prompt"), vocab_size)
    if len(request.prompts) > limits.max_prompts:
        raise bad_request(f"Too many prompts: {len(request.prompts)} (at most {limits.max_prompts})", "prompt")
    if len(request.prompts) * request.n > limits.max_choices:
        raise bad_request(f"Too many choices requested: {len(request.prompts)} prompts x n={request.n} (at most "
                          f"{limits.max_choices} on this server)", "n")
    return request


def _parse_prompt(prompt: Any, vocab_size: int) -> list[str | list[int]]:
    if prompt is None:
        raise bad_request("`prompt` is required", "prompt")
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        prompts = prompt
    elif isinstance(prompt, list) and not prompt:
        raise bad_request("The prompt cannot be empty", "prompt")
    else:
        raise _type_error("prompt", "a string, an array of strings, or an array of token ids", prompt)
    for p in prompts:
        if isinstance(p, list) and not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            raise _type_error("prompt", "an array of token ids", p)
        if len(p) == 0:
            raise bad_request("The prompt cannot be empty", "prompt")
        if isinstance(p, list):
            check_token_ids(p, vocab_size, "prompt")
    return prompts


def parse_chat_request(body: Any, limits: Limits, vocab_size: int) -> GenerateRequest:
    request = _parse_common(body, limits, vocab_size, is_chat=True)
    max_tokens = _get(body, "max_completion_tokens", "int")
    param = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, param = _get(body, "max_tokens", "int"), "max_tokens"
    request.max_tokens = _check_max_tokens(max_tokens, False, param)
    logprobs = _get(body, "logprobs", "bool", False)
    top_logprobs = _get(body, "top_logprobs", "int")
    if top_logprobs and not logprobs:
        raise bad_request("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    if logprobs:
        request.logprobs = top_logprobs or 0
        _check_logprobs(request.logprobs, limits, "sample", "top_logprobs")
    request.messages = _parse_messages(body.get("messages"))
    add_generation_prompt = _get(body, "add_generation_prompt", "bool", True)
    continue_final_message = _get(body, "continue_final_message", "bool", False)
    if add_generation_prompt and continue_final_message:
        raise bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    tools = _get(body, "tools", "list")
    _check_tools(tools)
    _check_tool_choice(body.get("tool_choice"), tools)
    request.tools = parse_tools(body)
    request.chat = {
        "add_generation_prompt": add_generation_prompt, "continue_final_message": continue_final_message,
        "chat_template": _get(body, "chat_template", "str"), "chat_template_kwargs": _get(body, "chat_template_kwargs", "dict", {}),
        "tools": tools, "documents": _get(body, "documents", "list"),
    }
    return request


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
            name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice.get("function"), dict) else None
            if not name:
                raise bad_request("`tool_choice` must name a function: {\"type\": \"function\", \"function\": "
                                  "{\"name\": ...}}", "tool_choice")
            names = {(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)}
            if name not in names:
                raise bad_request(f"Tool '{name}' has not been passed in `tools`.", "tool_choice")
        return
    raise bad_request(f"Invalid `tool_choice`: {tool_choice!r}", "tool_choice")


def check_length(num_input_tokens: int, max_tokens: int | None, max_model_len: int, param: str = "max_tokens") -> None:
    if num_input_tokens >= max_model_len:
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens. However, your request has "
                          f"{num_input_tokens} input tokens. Please reduce the length of the input messages.",
                          "input_tokens")
    if max_tokens is not None and num_input_tokens + max_tokens > max_model_len:
        raise bad_request(f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                          f"context length is {max_model_len} tokens and your request has {num_input_tokens} input "
                          f"tokens ({max_tokens} > {max_model_len} - {num_input_tokens}).", param)


def make_sampling_params(request: GenerateRequest, num_input_tokens: int, max_model_len: int,
                         default_max_tokens: int | None) -> SamplingParams:
    """Apply the request-size limits (``Limits``) and build the engine's SamplingParams."""
    requested = request.max_tokens
    check_length(num_input_tokens, requested, max_model_len)
    room = max_model_len - num_input_tokens
    max_tokens = min(requested if requested is not None else (default_max_tokens or room), room)
    kwargs = dict(request.params, max_tokens=max(max_tokens, 1), logprobs=request.logprobs)
    if request.structured is not None:
        kwargs["structured_outputs"] = request.structured
    if request.prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = request.prompt_logprobs
    elif request.echo and request.logprobs is not None and not request.is_chat:
        kwargs["prompt_logprobs"] = request.logprobs
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        param = message.split(" ", 1)[0] if message.split(" ", 1)[0] in kwargs else None
        raise bad_request(message, param) from None
