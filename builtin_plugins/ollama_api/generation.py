"""POST /api/chat and /api/generate on the shared request path, answered as Ollama's NDJSON lines or one object.

Both read the run's deltas (``ChatRun.stream``), streamed or not, so the timings Ollama reports are measured:
``prompt_eval_duration`` until the first token, ``eval_duration`` after it. The model is always loaded, so
``load_duration`` is 0.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from aiohttp import web

from builtin_plugins.ollama_api import translate
from builtin_plugins.ollama_api.protocol import now, read_body, render_error, requested_model, resolve_name
from builtin_plugins.ollama_api.translate import bad_request
from kernelcore.entrypoints.server.errors import APIError
from kernelcore.entrypoints.server.generate import ChatRun, ChoiceDelta, start_chat, start_completion
from kernelcore.entrypoints.server.state import get_state
from kernelcore.entrypoints.server.streaming import engine_error, ndjson_line, stream_response

NDJSON = "application/x-ndjson"
Shape = Callable[[str, str, list[dict[str, Any]]], dict[str, Any]]  # (content, thinking, calls) -> answer fields


def chat_fields(content: str, thinking: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = calls
    return {"message": message}


def generate_fields(content: str, thinking: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"response": content, **({"thinking": thinking} if thinking else {})}


class Answer:
    """One choice's deltas gathered; ``add`` returns what is new for the next line. A tool call is sent whole,
    once its arguments are a complete JSON object (or when the choice ends)."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}  # OpenAI shape, arguments as JSON text
        self.sent: list[dict[str, Any]] = []  # the calls sent, Ollama's shape
        self.finish_reason: str | None = None

    def add(self, delta: ChoiceDelta) -> tuple[str, str, list[dict[str, Any]]]:
        self.content.append(delta.content)
        self.thinking.append(delta.reasoning)
        for item in delta.tool_calls:
            function = item.get("function") or {}
            call = self.calls.setdefault(item.get("index", len(self.calls)),
                                         {"id": item.get("id"), "function": {"name": function.get("name"),
                                                                             "arguments": ""}})
            call["function"]["arguments"] += function.get("arguments") or ""
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        new = []
        for index in sorted(self.calls)[len(self.sent):]:
            if delta.finish_reason is None and not _is_object(self.calls[index]["function"]["arguments"]):
                break
            new.append(translate.ollama_call(self.calls[index], index))
        self.sent += new
        return delta.content, delta.reasoning, new

    @property
    def done_reason(self) -> str:
        # Ollama ends a turn with tool calls as "stop"
        return "stop" if self.finish_reason in (None, "tool_calls") else self.finish_reason


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


class Clock:
    def __init__(self) -> None:
        self.start = time.monotonic_ns()
        self.ready = self.first = 0

    def counts(self, run: ChatRun) -> dict[str, int]:
        end = time.monotonic_ns()
        first = self.first or end
        return {"total_duration": end - self.start, "load_duration": 0,
                "prompt_eval_count": run.num_prompt_tokens, "prompt_eval_duration": first - (self.ready or self.start),
                "eval_count": run.num_completion_tokens, "eval_duration": end - first}


async def _lines(run: ChatRun, name: str, stream: bool, shape: Shape, show_thinking: bool, top_logprobs: int | None,
                 clock: Clock) -> AsyncGenerator[dict[str, Any], None]:
    """The NDJSON lines (streamed), or only the last one with the whole answer (not streamed)."""
    answer, all_logprobs = Answer(), []
    tokenizer = run.state.engine.tokenizer
    async for delta in run.stream():
        clock.first = clock.first or time.monotonic_ns()
        content, thinking, calls = answer.add(delta)
        logprobs = (translate.ollama_logprobs(tokenizer, delta.token_ids, delta.logprobs, top_logprobs)
                    if top_logprobs is not None else [])
        all_logprobs += logprobs
        thinking = thinking if show_thinking else ""
        if stream and (content or thinking or calls or logprobs):
            line = {"model": name, "created_at": now(), **shape(content, thinking, calls), "done": False}
            yield {**line, "logprobs": logprobs} if logprobs else line
    if stream:
        last = shape("", "", [])
    else:
        last = shape("".join(answer.content), "".join(answer.thinking) if show_thinking else "", answer.sent)
    line = {"model": name, "created_at": now(), **last, "done": True, "done_reason": answer.done_reason,
            **clock.counts(run)}
    if top_logprobs is not None and not stream:
        line["logprobs"] = all_logprobs
    yield line


async def _answer(request: web.Request, run: ChatRun, name: str, stream: bool, shape: Shape, show_thinking: bool,
                  top_logprobs: int | None, clock: Clock) -> web.StreamResponse:
    lines = _lines(run, name, stream, shape, show_thinking, top_logprobs, clock)
    if stream:
        return await stream_response(request, lines, ndjson_line, content_type=NDJSON,
                                     error_event=render_error)
    last: dict[str, Any] = {}
    try:
        async for line in lines:
            last = line
    except APIError:
        raise
    except Exception as exc:
        raise engine_error(exc) from exc
    finally:
        await lines.aclose()
    return web.json_response(last)


def _stream_flag(body: dict[str, Any]) -> bool:
    stream = body.get("stream")
    if stream is None:
        return True  # Ollama streams unless told not to
    if not isinstance(stream, bool):
        raise bad_request("stream must be a boolean", "stream")
    return stream


def _logprobs(body: dict[str, Any], openai: dict[str, Any], is_chat: bool) -> int | None:
    """Ollama's ``logprobs``/``top_logprobs`` onto the OpenAI body; the number of alternatives, None for none."""
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is None or wanted is False:
        return None
    if not isinstance(wanted, bool):
        raise bad_request("logprobs must be a boolean", "logprobs")
    top = 0 if top is None else top
    if is_chat:
        openai.update(logprobs=True, top_logprobs=top)
    else:
        openai["logprobs"] = top
    return top if isinstance(top, int) else 0


async def _loaded(request: web.Request, name: str, body: dict[str, Any], shape: Shape) -> web.Response:
    """A request without messages or prompt: Ollama's way to load (or, keep_alive 0, unload) a model."""
    if resolve_name(get_state(request), name) is None:
        raise translate.not_found(name)
    reason = "unload" if body.get("keep_alive") in (0, "0", "0s") else "load"
    return web.json_response({"model": name, "created_at": now(), **shape("", "", []), "done": True,
                              "done_reason": reason},
                             content_type=NDJSON if _stream_flag(body) else "application/json")


async def _start(request: web.Request, name: str, openai: dict[str, Any], starter: Any) -> ChatRun:
    state = get_state(request)
    served = resolve_name(state, name)
    if served is None and state.lora is None:
        raise translate.not_found(name)
    openai["model"] = served or name  # an adapter a LoRA resolver may still find
    try:
        return await starter(request, openai)
    except APIError as exc:
        if exc.status == 404 and exc.param == "model":
            raise translate.not_found(name) from None
        raise


def _common(body: dict[str, Any]) -> dict[str, Any]:
    openai = translate.sampling_fields(body.get("options"))
    fmt = translate.response_format(body.get("format"))
    if fmt is not None:
        openai["response_format"] = fmt
    return openai


async def chat(request: web.Request) -> web.StreamResponse:
    clock, state = Clock(), get_state(request)
    body = await read_body(request)
    name = requested_model(body)
    stream = _stream_flag(body)
    messages = translate.chat_messages(body.get("messages"))
    if not messages:
        return await _loaded(request, name, body, chat_fields)
    has_parser = state.reasoning_parser_cls is not None
    openai = {"messages": messages, **_common(body),
              **translate.thinking_fields(body.get("think"), has_parser, name)}
    if body.get("tools"):
        openai["tools"] = body["tools"]  # Ollama's tools are OpenAI's function tools
    top_logprobs = _logprobs(body, openai, is_chat=True)
    run = await _start(request, name, openai, start_chat)
    clock.ready = time.monotonic_ns()
    return await _answer(request, run, name, stream, chat_fields, body.get("think") is not False, top_logprobs, clock)


async def generate(request: web.Request) -> web.StreamResponse:
    clock, state = Clock(), get_state(request)
    body = await read_body(request)
    name = requested_model(body)
    stream = _stream_flag(body)
    refused = {"images": translate.IMAGES_REFUSED,
               "suffix": "suffix (fill-in-the-middle) is not supported by this server",
               "template": "template is not supported: prompts are formatted with the model's chat template "
                           "(kc serve --chat-template FILE changes it), or send raw: true with a formatted prompt",
               "context": "context is not supported: send the conversation as messages to /api/chat"}
    for field, message in refused.items():
        if body.get(field):
            raise bad_request(message, field)
    prompt, system, raw = body.get("prompt"), body.get("system"), body.get("raw")
    for field, value in (("prompt", prompt), ("system", system)):
        if value is not None and not isinstance(value, str):
            raise bad_request(f"{field} must be a string", field)
    if raw is not None and not isinstance(raw, bool):
        raise bad_request("raw must be a boolean", "raw")
    if not prompt:
        return await _loaded(request, name, body, generate_fields)
    has_parser = state.reasoning_parser_cls is not None
    openai = _common(body)
    if raw:  # the prompt as given, no template (system and think do not apply)
        openai["prompt"] = prompt
        starter: Any = start_completion
        show_thinking = False
    else:
        openai["messages"] = [*([{"role": "system", "content": system}] if system else []),
                              {"role": "user", "content": prompt}]
        openai.update(translate.thinking_fields(body.get("think"), has_parser, name))
        starter, show_thinking = start_chat, body.get("think") is not False
    top_logprobs = _logprobs(body, openai, is_chat=not raw)
    run = await _start(request, name, openai, starter)
    clock.ready = time.monotonic_ns()
    return await _answer(request, run, name, stream, generate_fields, show_thinking, top_logprobs, clock)
