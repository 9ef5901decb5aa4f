"""POST /v1/chat/completions: chat-template resolution and rendering (transformers), chat logprobs, role chunks."""

from __future__ import annotations

import inspect
import os
import time
from typing import Any, AsyncGenerator

from aiohttp import web

from kernelcore.entrypoints.server.chat_output import prepare_chat_output
from kernelcore.entrypoints.server.state import ServerState, base_request_id, get_state, read_json
from kernelcore.entrypoints.server.completions import engine_prompt, usage
from kernelcore.entrypoints.server.errors import bad_request
from kernelcore.entrypoints.server.logprobs import chat_logprobs
from kernelcore.entrypoints.server.preprocess import check_text_fits, encode_chat, run_preprocess
from kernelcore.entrypoints.server.protocol import GenerateRequest, parse_chat_request
from kernelcore.entrypoints.server.streaming import (ChoiceState, EnginePrompt, check_not_aborted, engine_error,
                                                     final_outputs, merged, stream_events)
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
    state = get_state(request)
    engine = state.engine
    body = await read_json(request)
    req = parse_chat_request(body, state.options.limits, engine.vocab_size)
    model, lora_id = await state.resolve_model(req.model)
    if engine.tokenizer is None:
        raise bad_request("This model has no tokenizer: chat needs one (send token ids to /v1/completions)")
    new_output = await prepare_chat_output(state, req, body)
    num_chars = sum(len(m["content"]) for m in req.messages if isinstance(m.get("content"), str))
    check_text_fits(engine.tokenizer, num_chars, engine.max_model_len)
    text, token_ids = await run_preprocess(num_chars, chat_prompt_ids, state, req)
    prompt = engine_prompt(engine, req, text, token_ids, state.options.default_max_tokens)
    prompt.lora_id = lora_id
    last = req.messages[-1]
    role = state.options.response_role if req.chat["add_generation_prompt"] else last["role"]
    echo = (last.get("content") or "") if req.echo and last["role"] == role else ""
    response_id = f"chatcmpl-{base_request_id(request)}"
    header = {"id": response_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    headers = {"X-Request-Id": request.headers.get("X-Request-Id", response_id)}
    if req.stream:
        return await stream_events(request, headers, _events(engine, req, prompt, role, echo, response_id, header,
                                                             new_output))
    try:
        (output,) = await final_outputs(engine, response_id, [prompt])
    except Exception as exc:
        raise engine_error(exc) from exc
    choices, num_completion_tokens = [], 0
    for choice in sorted(output.outputs, key=lambda c: c.index):
        check_not_aborted(choice)
        num_completion_tokens += len(choice.token_ids)
        logprobs = None
        if req.logprobs is not None:
            logprobs = chat_logprobs(engine.tokenizer, choice.token_ids, choice.logprobs or [], req.logprobs,
                                     req.return_tokens_as_token_ids)
        message, finish_reason = new_output().message(choice.text, choice.finish_reason)
        if echo and message["content"] is not None:
            message["content"] = echo + message["content"]
        choices.append({"index": choice.index, "message": {"role": role, **message},
                        "logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": choice.stop_reason})
    return web.json_response({**header, "object": "chat.completion", "choices": choices,
                              "usage": usage(len(prompt.token_ids), num_completion_tokens)}, headers=headers)


async def _events(engine: Any, req: GenerateRequest, prompt: EnginePrompt, role: str, echo: str, response_id: str,
                  header: dict[str, Any], new_output: Any) -> AsyncGenerator[dict[str, Any], None]:
    num_prompt_tokens = len(prompt.token_ids)
    num_completion_tokens: dict[int, int] = {}

    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None, **finish: Any) -> dict[str, Any]:
        event = {**header, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                        "finish_reason": None, **finish}]}
        if req.continuous_usage:
            event["usage"] = usage(num_prompt_tokens, sum(num_completion_tokens.values()))
        return event

    states = [ChoiceState() for _ in range(req.n)]
    outputs = [new_output() for _ in range(req.n)]
    is_started = False
    async for _, output in merged(engine, response_id, [prompt]):
        if not is_started:  # role chunks once the engine has answered, so engine errors stay plain HTTP errors
            is_started = True
            for index in range(req.n):
                yield chunk(index, {"role": role, "content": ""})
                if echo:
                    yield chunk(index, {"content": echo})
        for choice in output.outputs:
            state = states[choice.index]
            if state.is_finished:
                continue
            check_not_aborted(choice)
            _, start = state.advance(choice)
            deltas = outputs[choice.index].deltas(choice.text, state.is_finished)
            token_ids = choice.token_ids[start:]
            num_completion_tokens[choice.index] = len(choice.token_ids)
            logprobs = None
            if req.logprobs is not None and token_ids:
                logprobs = chat_logprobs(engine.tokenizer, token_ids, (choice.logprobs or [])[start:], req.logprobs,
                                         req.return_tokens_as_token_ids)
            for delta in deltas[:-1]:
                yield chunk(choice.index, delta, logprobs)
                logprobs = None
            last = deltas[-1] if deltas else {}
            if state.is_finished:
                finish_reason = choice.finish_reason
                if outputs[choice.index].has_calls and finish_reason == "stop":
                    finish_reason = "tool_calls"
                yield chunk(choice.index, last, logprobs, finish_reason=finish_reason, stop_reason=choice.stop_reason)
            elif last or logprobs is not None:
                yield chunk(choice.index, last, logprobs)
    if req.include_usage:
        yield {**header, "choices": [], "usage": usage(num_prompt_tokens, sum(num_completion_tokens.values()))}
