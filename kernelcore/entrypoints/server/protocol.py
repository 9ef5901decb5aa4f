"""Request bodies -> validated requests carrying :class:`SamplingParams`; every violation is a 400 with a clear message.

The shapes of a completions and a chat request live here; their parts in the modules beside it:
:mod:`~kernelcore.entrypoints.server.fields` (typed field readers), :mod:`~kernelcore.entrypoints.server.sampling`
(the sampling fields), :mod:`~kernelcore.entrypoints.server.chat_messages` (messages and tools) and
:mod:`~kernelcore.entrypoints.server.limits` (the server's caps and the context length).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.entrypoints.server.chat_messages import ROLES, _check_tool_choice, _check_tools, _parse_messages
from kernelcore.entrypoints.server.errors import bad_request
from kernelcore.entrypoints.server.fields import _get, _type_error, check_token_ids
from kernelcore.entrypoints.server.limits import Limits, _check_logprobs, _check_max_tokens, check_length
from kernelcore.entrypoints.server.sampling import INT64_MIN, SAMPLING_FIELDS, parse_sampling_fields
from kernelcore.entrypoints.server.structured import (
    INFORMATIONAL_FIELDS,
    STRUCTURED_FIELDS,
    check_refused_fields,
    parse_constraint,
)
from kernelcore.entrypoints.server.tools import parse_tools

__all__ = ["CHAT_FIELDS", "COMMON_FIELDS", "COMPLETION_FIELDS", "INT64_MIN", "ROLES", "SAMPLING_FIELDS",
           "GenerateRequest", "Limits", "check_length", "check_token_ids", "make_sampling_params",
           "parse_chat_request", "parse_completion_request"]

logger = logging.getLogger("kernelcore.server")

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


def _warn_unknown(body: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(body) - known - _warned_fields)
    if unknown:
        _warned_fields.update(unknown)
        logger.warning("Ignoring unknown request field(s) %s (logged once per field)", ", ".join(unknown))


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

    params = parse_sampling_fields(body, limits, vocab_size)
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
        "chat_template": _get(body, "chat_template", "str"),
        "chat_template_kwargs": _get(body, "chat_template_kwargs", "dict", {}),
        "tools": tools, "documents": _get(body, "documents", "list"),
    }
    return request


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
