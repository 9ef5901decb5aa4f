"""The one request path every API family shares: an OpenAI-shaped body in, parsed choices or deltas out.

``/v1/chat/completions`` is built on :func:`start_chat`, and so is every endpoint plugin that speaks another
API (Responses, Anthropic Messages, Ollama): it translates its request into a chat-completions body, and the
answer back. Validation, limits, the chat template, structured outputs, tool and reasoning parsers, LoRA,
metrics and engine errors are therefore the same for all of them. Everything that can be refused is refused
by ``start_chat`` (an :class:`~kernelcore.entrypoints.server.errors.APIError`) before the engine sees the
request; the engine runs once :meth:`ChatRun.result` or :meth:`ChatRun.stream` is iterated, and a consumer
that stops early (a client gone, a cancelled response) aborts the engine request.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kernelcore.entrypoints.server.chat_output import ChoiceOutput, prepare_chat_output
from kernelcore.entrypoints.server.chat_template import chat_prompt_ids
from kernelcore.entrypoints.server.completions import engine_prompt
from kernelcore.entrypoints.server.errors import APIError, bad_request
from kernelcore.entrypoints.server.preprocess import check_text_fits, run_preprocess
from kernelcore.entrypoints.server.protocol import GenerateRequest, parse_chat_request, parse_completion_request
from kernelcore.entrypoints.server.state import ServerState, get_state
from kernelcore.entrypoints.server.streaming import (
    ChoiceState,
    EnginePrompt,
    check_not_aborted,
    engine_error,
    final_outputs,
    merged,
)


@dataclass
class ChoiceResult:
    """One finished choice, parsed as the chat message it becomes."""

    index: int
    content: str | None  # None when the answer is only tool calls
    reasoning: str | None  # the thinking split off by the reasoning parser, if one is configured
    tool_calls: list[dict[str, Any]]  # {"id", "type": "function", "function": {"name", "arguments": JSON text}}
    finish_reason: str | None  # "stop", "length", "tool_calls", ...
    stop_reason: Any  # the stop string or token id that ended the choice, if any
    text: str  # the raw generated text
    token_ids: list[int]
    logprobs: list[Any] | None  # the engine's per-token entries, when the request asked for logprobs


@dataclass
class ChoiceDelta:
    """What is new in one choice. A choice's last delta carries its ``finish_reason``; every choice has one."""

    index: int
    content: str = ""
    reasoning: str = ""
    # OpenAI's streamed tool-call items: {"index", "id", "type", "function": {"name", "arguments"}} opens a
    # call, {"index", "function": {"arguments"}} continues it.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any = None
    token_ids: list[int] = field(default_factory=list)  # the tokens new since the last delta of this choice
    logprobs: list[Any] | None = None  # their engine entries, when asked for


class ChatRun:
    """A validated request, ready to run in the engine once."""

    def __init__(self, state: ServerState, req: GenerateRequest, prompt: EnginePrompt, model: str, request_id: str,
                 new_output: Any) -> None:
        self.state, self.req, self.prompt = state, req, prompt
        self.model = model  # the name to echo: a served name or a LoRA adapter
        self.request_id = request_id
        self._new_output = new_output
        self.num_completion_tokens = 0  # grows while the run streams; final after it

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt.token_ids)

    @property
    def prompt_text(self) -> str | None:
        """The rendered prompt (the chat template's output)."""
        return self.prompt.text

    async def result(self) -> list[ChoiceResult]:
        """Run to the end; the choices by index."""
        try:
            (output,) = await final_outputs(self.state.engine, self.request_id, [self.prompt])
        except Exception as exc:
            raise engine_error(exc) from exc
        results = []
        for choice in sorted(output.outputs, key=lambda c: c.index):
            check_not_aborted(choice)
            message, finish_reason = self._new_output().message(choice.text, choice.finish_reason)
            results.append(ChoiceResult(choice.index, message["content"], message.get("reasoning_content"),
                                        message["tool_calls"], finish_reason, choice.stop_reason, choice.text,
                                        list(choice.token_ids), choice.logprobs))
        self.num_completion_tokens = sum(len(r.token_ids) for r in results)
        return results

    async def stream(self) -> AsyncGenerator[ChoiceDelta, None]:
        """Deltas as the engine produces them. Engine errors raise as the ``APIError`` the client sees."""
        try:
            async for delta in self._stream():
                yield delta
        except APIError:
            raise
        except Exception as exc:
            raise engine_error(exc) from exc

    async def _stream(self) -> AsyncGenerator[ChoiceDelta, None]:
        states = [ChoiceState() for _ in range(self.req.n)]
        outputs = [self._new_output() for _ in range(self.req.n)]
        counts: dict[int, int] = {}
        async for _, output in merged(self.state.engine, self.request_id, [self.prompt]):
            for choice in output.outputs:
                state = states[choice.index]
                if state.is_finished:
                    continue
                check_not_aborted(choice)
                _, start = state.advance(choice)
                counts[choice.index] = len(choice.token_ids)
                self.num_completion_tokens = sum(counts.values())
                deltas = [_delta(choice.index, d) for d in outputs[choice.index].deltas(choice.text, state.is_finished)]
                if not deltas and (state.is_finished or len(choice.token_ids) > start):
                    deltas = [ChoiceDelta(choice.index)]
                if deltas:
                    deltas[0].token_ids = list(choice.token_ids[start:])
                    deltas[0].logprobs = (choice.logprobs or [])[start:] if choice.logprobs is not None else None
                if state.is_finished:
                    finish_reason = choice.finish_reason
                    if outputs[choice.index].has_calls and finish_reason == "stop":
                        finish_reason = "tool_calls"
                    deltas[-1].finish_reason, deltas[-1].stop_reason = finish_reason, choice.stop_reason
                for delta in deltas:
                    yield delta


def _delta(index: int, fields: dict[str, Any]) -> ChoiceDelta:
    return ChoiceDelta(index, content=fields.get("content", ""), reasoning=fields.get("reasoning_content", ""),
                       tool_calls=fields.get("tool_calls", []))


def _request_id(request: web.Request, prefix: str) -> str:
    return f"{prefix}-{request.headers.get('X-Request-Id') or uuid.uuid4().hex}"


async def start_chat(request: web.Request, body: Any, *, id_prefix: str = "chatcmpl",
                     count_only: bool = False) -> ChatRun:
    """Validate an OpenAI chat-completions ``body`` exactly as ``/v1/chat/completions`` does and render its prompt.

    ``count_only``: only the prompt is wanted (token counting): no output constraint is compiled and no
    room for an answer is required. Raises ``APIError`` for anything the request may not ask.
    """
    state = get_state(request)
    engine = state.engine
    req = parse_chat_request(body, state.options.limits, engine.vocab_size)
    model, lora_id = await state.resolve_model(req.model)
    if engine.tokenizer is None:
        raise bad_request("This model has no tokenizer: chat needs one (send token ids to /v1/completions)")
    new_output = (lambda: None) if count_only else await prepare_chat_output(state, req, body)
    num_chars = sum(len(m["content"]) for m in req.messages if isinstance(m.get("content"), str))
    check_text_fits(engine.tokenizer, num_chars, engine.max_model_len)
    text, token_ids = await run_preprocess(num_chars, chat_prompt_ids, state, req)
    if count_only:
        prompt = EnginePrompt(text, token_ids, None)  # type: ignore[arg-type]
    else:
        prompt = engine_prompt(engine, req, text, token_ids, state.options.default_max_tokens)
    prompt.lora_id = lora_id
    return ChatRun(state, req, prompt, model, _request_id(request, id_prefix), new_output)


async def start_completion(request: web.Request, body: Any, *, id_prefix: str = "cmpl") -> ChatRun:
    """A raw-prompt run (no chat template) from an OpenAI completions ``body`` with one string prompt and n=1.

    Without ``max_tokens`` the answer may fill the rest of the context (``--default-max-tokens`` caps it), not
    the completions API's 16. The choices' ``content`` is the generated text.
    """
    state = get_state(request)
    engine = state.engine
    req = parse_completion_request(body, state.options.limits, engine.vocab_size)
    if len(req.prompts) != 1 or not isinstance(req.prompts[0], str) or req.n != 1:
        raise bad_request("A raw prompt must be one string, with n=1", "prompt")
    model, lora_id = await state.resolve_model(req.model)
    if engine.tokenizer is None:
        raise bad_request("This model has no tokenizer: send token ids to /v1/completions", "prompt")
    if req.structured is not None:
        await state.grammars.validate(req.structured, "structured_outputs")
    raw = req.prompts[0]
    check_text_fits(engine.tokenizer, len(raw), engine.max_model_len)
    token_ids = await run_preprocess(len(raw), functools.partial(
        engine.tokenizer.encode, raw, add_special_tokens=req.add_special_tokens))
    prompt = engine_prompt(engine, req, raw, token_ids, state.options.default_max_tokens)
    prompt.lora_id = lora_id
    return ChatRun(state, req, prompt, model, _request_id(request, id_prefix), lambda: ChoiceOutput(None))
