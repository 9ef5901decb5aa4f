"""Driving the engine for one HTTP request (abort on every early exit) and writing Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.engine.outputs import CompletionOutput, RequestOutput
from kernelcore.entrypoints.server.errors import APIError

logger = logging.getLogger("kernelcore.server")


@dataclass
class EnginePrompt:
    text: str | None
    token_ids: list[int]
    params: SamplingParams
    lora_id: int = 0


def engine_error(exc: BaseException) -> APIError:
    """Map what ``AsyncLLM.generate`` raises to the error the client sees.

    Clients get the server's own words; what went wrong inside (tracebacks, tensor shapes, paths)
    goes to the log only.
    """
    from kernelcore.engine.async_llm import EngineDeadError

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ServerShuttingDown):
        return APIError(SHUTTING_DOWN, 503)
    if isinstance(exc, EngineDeadError):
        logger.error("request refused: %s", exc)
        return APIError(f"The engine is not running; this server cannot serve requests now ({dead_reason(exc)})", 503)
    if isinstance(exc, ValueError):  # admission: the request can never be served (our own message)
        return APIError(str(exc), 400)
    logger.error("request failed in the engine: %s: %s", type(exc).__name__, exc)
    return APIError("The request failed inside the engine; the server log has the details", 500)


def dead_reason(exc: BaseException) -> str:
    """Why the engine is dead, in the engine's own words (which replica or process was lost, and how)."""
    text = str(exc)
    return text.removeprefix("the engine is dead: ") or "it stopped"


SHUTTING_DOWN = "The server is shutting down; the request was stopped"


class ServerShuttingDown(RuntimeError):
    """Raised into the requests still running when the shutdown deadline passes."""


async def iterate(engine: Any, request_id: str, prompt: EnginePrompt,
                  final_only: bool = False) -> AsyncIterator[RequestOutput]:
    """``engine.generate`` that aborts the request in the engine unless it finished (disconnect, error, cancel).
    ``final_only``: only the finished output is wanted (a response that is not streamed)."""
    extra: dict[str, Any] = {"lora_id": prompt.lora_id} if prompt.lora_id else {}
    if final_only:
        extra["output_kind"] = "final_only"
    generator = engine.generate(request_id, prompt.token_ids, prompt.params, prompt=prompt.text, **extra)
    is_finished = False
    try:
        async for output in generator:
            is_finished = output.finished
            yield output
    finally:
        if not is_finished:
            try:
                await asyncio.shield(engine.abort(request_id))
            except Exception:  # the engine may be gone; nothing is left to free then
                logger.debug("abort of %s failed", request_id, exc_info=True)
        await generator.aclose()


async def merged(engine: Any, base_id: str, prompts: list[EnginePrompt],
                 final_only: bool = False) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of every prompt as they come, tagged with the prompt index; cancels (and aborts) all on exit."""
    base_id = f"{base_id}-{uuid.uuid4().hex[:8]}"  # clients may reuse X-Request-Id; engine ids must not collide
    if len(prompts) == 1:
        async for output in iterate(engine, f"{base_id}-0", prompts[0], final_only):
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, prompt: EnginePrompt) -> None:
        try:
            async for output in iterate(engine, f"{base_id}-{index}", prompt, final_only):
                await queue.put((index, output, None))
        except Exception as exc:
            await queue.put((index, None, exc))
        else:
            await queue.put((index, None, None))

    tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(prompts)]
    try:
        num_running = len(tasks)
        while num_running:
            index, output, error = await queue.get()
            if error is not None:
                raise error
            if output is None:
                num_running -= 1
            else:
                yield index, output
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def final_outputs(engine: Any, base_id: str, prompts: list[EnginePrompt]) -> list[RequestOutput]:
    finals: list[RequestOutput | None] = [None] * len(prompts)
    async for index, output in merged(engine, base_id, prompts, final_only=True):
        finals[index] = output
    return finals  # type: ignore[return-value]


class ChoiceState:
    """What was already sent for one choice, to turn cumulative outputs into deltas."""

    def __init__(self) -> None:
        self.num_chars = 0
        self.num_tokens = 0
        self.is_finished = False

    def advance(self, output: CompletionOutput) -> tuple[str, int]:
        """The new text and the index of the first new token; marks the choice finished when it is."""
        start = self.num_tokens
        delta = output.text[self.num_chars:]
        self.num_chars, self.num_tokens = len(output.text), len(output.token_ids)
        self.is_finished = output.finish_reason is not None
        return delta, start


def check_not_aborted(output: CompletionOutput) -> None:
    if output.finish_reason == "abort":
        raise APIError("The request was aborted by the engine", 503)


def sse_data(payload: dict[str, Any]) -> bytes:
    """One ``data: <json>`` Server-Sent Event."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def sse_event(name: str, payload: dict[str, Any]) -> bytes:
    """One ``event: <name>`` / ``data: <json>`` Server-Sent Event (Responses and Anthropic streams)."""
    return f"event: {name}\n".encode() + sse_data(payload)


def ndjson_line(payload: dict[str, Any]) -> bytes:
    """One line of newline-delimited JSON (Ollama streams)."""
    return json.dumps(payload, separators=(",", ":")).encode() + b"\n"


async def stream_response(request: web.Request, events: AsyncGenerator[Any, None], encode: Callable[[Any], bytes],
                          *, content_type: str = "text/event-stream", headers: dict[str, str] | None = None,
                          error_event: Callable[[APIError], Any] | None = None,
                          trailer: bytes = b"") -> web.StreamResponse:
    """Send each event as ``encode(event)``; a failure after the first byte becomes ``error_event(error)``.

    The first event is awaited before the headers go out, so a request the engine rejects (or a dead
    engine) still gets a plain HTTP error with its status, in the route's error shape. A client that
    goes away stops the events, whose generators abort their engine requests. ``trailer`` ends the
    body (``data: [DONE]`` for OpenAI streams).
    """
    try:
        first = await events.__anext__()
    except StopAsyncIteration:
        first = None
    except Exception as exc:
        await events.aclose()
        raise engine_error(exc) from exc
    response = web.StreamResponse(headers={"Content-Type": content_type, "Cache-Control": "no-cache",
                                           **(headers or {})})
    try:
        try:
            await response.prepare(request)
            if first is not None:
                await response.write(encode(first))
            async for event in events:
                await response.write(encode(event))
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as exc:
            error = engine_error(exc)
            if error.status >= 500:
                logger.error("request failed mid-stream: %s", error.message)
            if error_event is not None:
                await response.write(encode(error_event(error)))
        finally:
            await events.aclose()  # aborts the engine requests that did not finish
        if trailer:
            await response.write(trailer)
        await response.write_eof()
    except ConnectionError:
        # The client went away: an ordinary end, not a server error (raising it would log a traceback
        # and count a 500). aiohttp finishes the half-sent response quietly.
        logger.debug("client of %s went away mid-stream", request.path)
    return response


async def stream_events(request: web.Request, headers: dict[str, str],
                        events: AsyncGenerator[dict[str, Any], None]) -> web.StreamResponse:
    """An OpenAI stream: ``data: <json>`` events, an error as the envelope, then ``data: [DONE]``."""
    return await stream_response(request, events, sse_data, headers=headers, error_event=APIError.to_dict,
                                 trailer=b"data: [DONE]\n\n")
