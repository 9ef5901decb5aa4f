"""Small endpoints: /v1/models, /health, /ping, /version, /metrics, /load."""

from __future__ import annotations

import time
import uuid

from aiohttp import web

from kernelcore import __version__
from kernelcore.entrypoints.server.state import get_state

CREATED = int(time.time())


async def list_models(request: web.Request) -> web.Response:
    state = get_state(request)
    engine = state.engine
    cards = [{
        "id": name, "object": "model", "created": CREATED, "owned_by": "kernelcore", "root": engine.config.model.model,
        "parent": None, "max_model_len": engine.max_model_len,
        "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": CREATED,
                        "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                        "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                        "organization": "*", "group": None, "is_blocking": False}],
    } for name in state.options.served_model_names]
    if state.lora is not None:  # adapters after the bases: root = adapter path, parent = base name
        cards += [{**cards[0], "id": lora.name, "root": lora.path, "parent": state.model_name}
                  for lora in state.lora.adapters.values()]
    return web.json_response({"object": "list", "data": cards})


async def health(request: web.Request) -> web.Response:
    """200 while requests can be served (a lost data-parallel replica is named in the body: the others serve);
    503 once none can, naming what was lost."""
    engine = get_state(request).engine
    if engine.is_dead:
        return web.Response(status=503, text=f"{getattr(engine, 'dead_error', None) or 'the engine is not running'}\n")
    lost = getattr(engine, "lost_replicas", None)
    return web.Response(text="".join(f"{why}\n" for why in lost.values())) if lost else web.Response()


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": __version__})


async def metrics(request: web.Request) -> web.Response:
    stat_logger = get_state(request).stat_logger
    body = stat_logger.generate_latest() if stat_logger is not None else b""
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def server_load(request: web.Request) -> web.Response:
    return web.json_response({"server_load": get_state(request).num_in_flight})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)
    app.router.add_post("/ping", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/load", server_load)
