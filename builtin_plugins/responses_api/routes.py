"""The routes: ``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``
and ``GET /v1/responses/{id}/input_items``. Errors keep the OpenAI envelope (the server's default)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from builtin_plugins.responses_api.events import ResponseEvents
from builtin_plugins.responses_api.items import output_items
from builtin_plugins.responses_api.protocol import ResponsesRequest, parse_request, renamed
from builtin_plugins.responses_api.store import MAX_STORED, ResponseStore, StoredResponse
from builtin_plugins.responses_api.translate import FINAL, ResponseBuilder, chat_body, count_tokens, usage
from kernelcore.entrypoints.server.errors import APIError, bad_request
from kernelcore.entrypoints.server.generate import ChatRun, start_chat
from kernelcore.entrypoints.server.state import read_json
from kernelcore.entrypoints.server.streaming import engine_error, sse_event, stream_response

logger = logging.getLogger("kernelcore.server")
STORE = web.AppKey("kc_responses_store", ResponseStore)


def add_routes(app: web.Application, max_stored: int = MAX_STORED) -> None:
    app[STORE] = ResponseStore(max_stored)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", retrieve_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items)
    app.on_shutdown.append(_cancel_background)


def _store(request: web.Request) -> ResponseStore:
    return request.app[STORE]


def _stored(request: web.Request) -> StoredResponse:
    response_id = request.match_info["response_id"]
    entry = _store(request).get(response_id)
    if entry is None:
        raise APIError(f"Response with id '{response_id:.100}' not found.", 404, "response_id")
    return entry


async def create_response(request: web.Request) -> web.StreamResponse:
    req = parse_request(await read_json(request))
    items = _context(request, req) + req.items
    try:
        run = await start_chat(request, chat_body(req, items), id_prefix="resp")
    except APIError as exc:
        raise renamed(exc) from None
    builder = ResponseBuilder(req, run.model)
    if req.background:
        entry = StoredResponse(builder.snapshot("queued"), items)
        _store(request).put(entry)
        entry.task = asyncio.create_task(_run_background(entry, run, builder))
        return web.json_response(entry.response)
    if req.stream:
        events = ResponseEvents(builder)
        response = await stream_response(request, _streamed(request, req, events, run, items),
                                         lambda event: sse_event(event["type"], event), error_event=events.error)
        return response
    response_object = await _answer(run, builder)
    if req.store:
        _store(request).put(StoredResponse(response_object, items))
    return web.json_response(response_object)


def _context(request: web.Request, req: ResponsesRequest) -> list[dict[str, Any]]:
    """The previous response's input and output items, which come before this request's input."""
    if req.previous_response_id is None:
        return []
    entry = _store(request).get(req.previous_response_id)
    if entry is None:
        raise APIError(f"Previous response with id '{req.previous_response_id:.100}' not found.", 404,
                       "previous_response_id")
    if entry.response["status"] not in FINAL:
        raise bad_request(f"Previous response '{req.previous_response_id}' is still {entry.response['status']}",
                          "previous_response_id")
    return entry.context + entry.response["output"]


async def _answer(run: ChatRun, builder: ResponseBuilder) -> dict[str, Any]:
    (choice,) = await run.result()
    reasoning = min(count_tokens(run.state.engine.tokenizer, choice.reasoning), run.num_completion_tokens)
    output = output_items(choice.content, choice.reasoning, choice.tool_calls, choice.finish_reason == "length")
    return builder.finished(output, usage(run.num_prompt_tokens, run.num_completion_tokens, reasoning),
                            choice.finish_reason)


async def _streamed(request: web.Request, req: ResponsesRequest, events: ResponseEvents, run: ChatRun,
                    items: list[dict[str, Any]]):
    async for event in events.stream(run):
        if event["type"] in ("response.completed", "response.incomplete") and req.store:
            _store(request).put(StoredResponse(event["response"], items))
        yield event


async def _run_background(entry: StoredResponse, run: ChatRun, builder: ResponseBuilder) -> None:
    """Run a background response, streaming, so that GET shows its output while it grows."""
    entry.events = ResponseEvents(builder)
    entry.response = builder.snapshot("in_progress")
    try:
        async for event in entry.events.stream(run):
            if event["type"] in ("response.completed", "response.incomplete"):
                entry.response = event["response"]
    except asyncio.CancelledError:
        entry.response = builder.snapshot("cancelled", _partial(entry.events.output))
        raise
    except Exception as exc:  # an engine error: the response failed; the poller reads why
        error = engine_error(exc)
        if error.status >= 500:
            logger.error("background response %s failed: %s", builder.id, error.message)
        entry.response = builder.failed(error)
    finally:
        entry.events = None


def _partial(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items of an unfinished response, as they stand (not yet finished ones marked incomplete)."""
    items = [{**item, "content": [dict(p) for p in item["content"]]} if "content" in item else dict(item)
             for item in output]
    for item in items:
        if item.get("status") == "in_progress":
            item["status"] = "incomplete"
    return items


def _current(entry: StoredResponse) -> dict[str, Any]:
    if entry.events is not None and entry.is_running:
        return {**entry.response, "output": _partial(entry.events.output)}
    return entry.response


async def retrieve_response(request: web.Request) -> web.Response:
    if request.query.get("stream") not in (None, "false"):
        raise bad_request("Streaming a stored response again is not supported", "stream")
    return web.json_response(_current(_stored(request)))


async def cancel_response(request: web.Request) -> web.Response:
    entry = _stored(request)
    if not entry.response.get("background"):
        raise bad_request("Only background responses can be cancelled", "response_id")
    if entry.is_running:
        assert entry.task is not None
        entry.task.cancel()
        await asyncio.gather(entry.task, return_exceptions=True)  # the engine request is aborted by then
        entry.response = {**entry.response, "status": "cancelled"}
    elif entry.response["status"] != "cancelled":
        raise bad_request(f"Cannot cancel a response with status '{entry.response['status']}'", "response_id")
    return web.json_response(entry.response)


async def delete_response(request: web.Request) -> web.Response:
    entry = _stored(request)
    if entry.is_running:
        assert entry.task is not None
        entry.task.cancel()
        await asyncio.gather(entry.task, return_exceptions=True)
    _store(request).pop(entry.response["id"])
    return web.json_response({"id": entry.response["id"], "object": "response.deleted", "deleted": True})


async def list_input_items(request: web.Request) -> web.Response:
    entry = _stored(request)
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("`order` must be 'asc' or 'desc'", "order")
    try:
        limit = int(request.query.get("limit", "20"))
    except ValueError:
        raise bad_request("`limit` must be an integer from 1 to 100", "limit") from None
    if not 1 <= limit <= 100:
        raise bad_request("`limit` must be an integer from 1 to 100", "limit")
    items = entry.context if order == "asc" else entry.context[::-1]
    after = request.query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise bad_request(f"No input item with id '{after:.100}' in this response", "after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return web.json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                              "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})


async def _cancel_background(app: web.Application) -> None:
    running = app[STORE].running()
    for entry in running:
        assert entry.task is not None
        entry.task.cancel()
    await asyncio.gather(*(entry.task for entry in running if entry.task is not None), return_exceptions=True)
