"""POST /v1/chat/completions: the OpenAI chat format around the shared request path (chat logprobs, role chunks)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Any

from aiohttp import web

from kernelcore.entrypoints.server.completions import usage
from kernelcore.entrypoints.server.generate import start_chat
from kernelcore.entrypoints.server.logprobs import chat_logprobs
from kernelcore.entrypoints.server.state import get_state, read_json
from kernelcore.entrypoints.server.streaming import stream_events


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
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
