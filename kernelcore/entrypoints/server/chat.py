"""POST /v1/chat/completions: chat-template resolution and rendering (transformers), chat logprobs, role chunks."""

from __future__ import annotations

import inspect
import os
import time
from typing import Any, AsyncGenerator

from aiohttp import web

from kernelcore.entrypoints.server.state import ServerState, get_state, read_json
from kernelcore.entrypoints.server.completions import usage
from kernelcore.entrypoints.server.errors import bad_request
from kernelcore.entrypoints.server.logprobs import chat_logprobs
from kernelcore.entrypoints.server.preprocess import encode_chat
from kernelcore.entrypoints.server.protocol import GenerateRequest
from kernelcore.entrypoints.server.streaming import stream_events
from kernelcore.entrypoints.server.tools import template_messages

NO_TEMPLATE = ("This model's tokenizer has no chat template, so /v1/chat/completions cannot format messages. "
               "Restart the server with --chat-template FILE (or an inline Jinja template), or use /v1/completions "
               "with a plain prompt.")
UNTRUSTED_TEMPLATE = ("Chat template is passed with request, but --trust-request-chat-template is not set. "
                      "Refused request with untrusted chat template.")


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a file path or an inline Jinja template."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template {value!r} is neither a readable file nor an inline Jinja template")


def resolve_template(state: ServerState, tokenizer: Any, request_template: str | None) -> str:
    if request_template is not None:
        if not state.options.trust_request_chat_template:
            raise bad_request(UNTRUSTED_TEMPLATE, "chat_template")
        return request_template
    template = state.options.chat_template or getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: use the default one
        template = template.get("default")
    if not template:
        raise bad_request(NO_TEMPLATE, "chat_template")
    return template


def _reserved_kwargs(tokenizer: Any) -> set[str]:
    return set(inspect.signature(tokenizer.apply_chat_template).parameters) | {"messages"}


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], template: str, chat: dict[str, Any]) -> str:
    """Render with transformers' own chat-template machinery (sandboxed Jinja)."""
    reserved = _reserved_kwargs(tokenizer)
    kwargs = {k: v for k, v in (chat.get("chat_template_kwargs") or {}).items() if k not in reserved}
    try:
        return tokenizer.apply_chat_template(
            messages, tools=chat.get("tools"), documents=chat.get("documents"), chat_template=template,
            add_generation_prompt=chat["add_generation_prompt"], continue_final_message=chat["continue_final_message"],
            tokenize=False, return_dict=False, **kwargs)
    except Exception as exc:  # jinja errors, raise_exception() in the template, bad message shapes
        raise bad_request(f"Error rendering the chat template: {type(exc).__name__}: {exc}", "messages") from None


def chat_prompt_ids(state: ServerState, req: GenerateRequest) -> tuple[str, list[int]]:
    tokenizer = state.engine.tokenizer
    template = resolve_template(state, tokenizer, req.chat.get("chat_template"))
    return encode_chat(tokenizer, template_messages(req.messages),
                       lambda messages: render_chat(tokenizer, messages, template, req.chat),
                       req.add_special_tokens, state.options.allow_special_tokens_in_content)


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    from kernelcore.entrypoints.server.generate import start_chat

    state = get_state(request)
    run = await start_chat(request, await read_json(request))
    req = run.req
    last = req.messages[-1]
    role = state.options.response_role if req.chat["add_generation_prompt"] else last["role"]
    echo = (last.get("content") or "") if req.echo and last["role"] == role else ""
    header = {"id": run.request_id, "object": "chat.completion.chunk", "created": int(time.time()),
              "model": run.model}
    headers = {"X-Request-Id": request.headers.get("X-Request-Id", run.request_id)}
    if req.stream:
        return await stream_events(request, headers, _events(run, role, echo, header))
    choices = []
    for choice in await run.result():
        logprobs = None
        if req.logprobs is not None:
            logprobs = chat_logprobs(state.engine.tokenizer, choice.token_ids, choice.logprobs or [], req.logprobs,
                                     req.return_tokens_as_token_ids)
        message: dict[str, Any] = {"role": role, "content": choice.content, "tool_calls": choice.tool_calls}
        if state.reasoning_parser_cls is not None:
            message["reasoning_content"] = choice.reasoning
        if echo and message["content"] is not None:
            message["content"] = echo + message["content"]
        choices.append({"index": choice.index, "message": message, "logprobs": logprobs,
                        "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason})
    return web.json_response({**header, "object": "chat.completion", "choices": choices,
                              "usage": usage(run.num_prompt_tokens, run.num_completion_tokens)}, headers=headers)


async def _events(run: Any, role: str, echo: str, header: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
    req, tokenizer = run.req, run.state.engine.tokenizer

    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None, **finish: Any) -> dict[str, Any]:
        event = {**header, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                        "finish_reason": None, **finish}]}
        if req.continuous_usage:
            event["usage"] = usage(run.num_prompt_tokens, run.num_completion_tokens)
        return event

    is_started = False
    async for delta in run.stream():
        if not is_started:  # role chunks once the engine has answered, so engine errors stay plain HTTP errors
            is_started = True
            for index in range(req.n):
                yield chunk(index, {"role": role, "content": ""})
                if echo:
                    yield chunk(index, {"content": echo})
        logprobs = None
        if req.logprobs is not None and delta.token_ids:
            logprobs = chat_logprobs(tokenizer, delta.token_ids, delta.logprobs or [], req.logprobs,
                                     req.return_tokens_as_token_ids)
        fields: dict[str, Any] = {}
        if delta.reasoning:
            fields["reasoning_content"] = delta.reasoning
        if delta.content:
            fields["content"] = delta.content
        if delta.tool_calls:
            fields["tool_calls"] = delta.tool_calls
        if delta.finish_reason is not None:
            yield chunk(delta.index, fields, logprobs, finish_reason=delta.finish_reason,
                        stop_reason=delta.stop_reason)
        elif fields or logprobs is not None:
            yield chunk(delta.index, fields, logprobs)
    if req.include_usage:
        yield {**header, "choices": [], "usage": usage(run.num_prompt_tokens, run.num_completion_tokens)}
