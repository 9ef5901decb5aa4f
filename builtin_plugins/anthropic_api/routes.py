"""The routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, every error in Anthropic's shape."""

from __future__ import annotations

from aiohttp import web

from builtin_plugins.anthropic_api.errors import render_error
from builtin_plugins.anthropic_api.events import encode, message_events
from builtin_plugins.anthropic_api.response import message, message_id
from builtin_plugins.anthropic_api.translate import translate
from kernelcore.entrypoints.server.errors import set_error_format
from kernelcore.entrypoints.server.generate import start_chat
from kernelcore.entrypoints.server.state import get_state, read_json
from kernelcore.entrypoints.server.streaming import stream_response


async def create_message(request: web.Request) -> web.StreamResponse:
    state = get_state(request)
    req = translate(await read_json(request), has_reasoning_parser=state.reasoning_parser_cls is not None)
    run = await start_chat(request, req.body, id_prefix="msg")
    headers = {"request-id": message_id(run.request_id)}
    if req.stream:
        return await stream_response(request, message_events(req, run), encode, headers=headers,
                                     error_event=render_error)
    (choice,) = await run.result()
    return web.json_response(message(req, run, choice), headers=headers)


async def count_tokens(request: web.Request) -> web.Response:
    state = get_state(request)
    req = translate(await read_json(request), has_reasoning_parser=state.reasoning_parser_cls is not None,
                    count_only=True)
    run = await start_chat(request, req.body, id_prefix="msg", count_only=True)
    return web.json_response({"input_tokens": run.num_prompt_tokens})


def add_routes(app: web.Application) -> None:
    set_error_format(app, "/v1/messages", render_error)
    app.router.add_post("/v1/messages", create_message)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
