"""The web console: the static page at / (chat playground, operator console) and its JSON endpoints.

The page and its assets load without the API key (they hold no data); everything under /console/api/ sits
behind --api-key like the rest of the API, and the page asks for the key when a call answers 401.

The page shows text from the server (model output, model and plugin names, error messages) as text only, and
is served with a Content-Security-Policy that allows no inline script, so markup in that text cannot run even
if a later edit of app.js slipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

from aiohttp import web

from kernelcore import __version__
from kernelcore.entrypoints.server.state import get_state

STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")
STATIC_PREFIX = "/console/static/"
MAX_TRACE_EVENTS = 2000  # per call; the page asks again from the returned offset

# What the page needs and nothing more: its own script, stylesheet and JSON calls, and the empty data: favicon.
# No 'unsafe-inline' and no 'unsafe-eval': index.html has no inline script, style or event handler; keep it so.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src data:; "
                           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def is_public(path: str) -> bool:
    """The page and its assets: no data in them, so a browser can load them before it knows the key."""
    return path == "/" or (path.startswith(STATIC_PREFIX) and ".." not in path.split("/"))


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """On every answer for the page and its assets (200, 304, 404, HEAD alike), set just before it is sent."""
    if request.path == "/" or request.path.startswith(STATIC_PREFIX):
        response.headers.update(SECURITY_HEADERS)


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(os.path.join(STATIC_DIR, "index.html"), headers={"Cache-Control": "no-cache"})


def _platform() -> dict[str, Any] | None:
    from kernelcore import platforms

    if not platforms.is_resolved():
        return None
    p = platforms.current_platform
    decision = p.decision or {}
    return {"name": p.plugin_name, "class": f"{type(p).__module__}.{type(p).__qualname__}",
            "device_name": p.device_name, "device_type": p.device_type, "is_builtin": p.is_builtin,
            "why": decision.get("why"), "detections": decision.get("detections", [])}


def _processes() -> list[dict[str, Any]]:
    from kernelcore import hostproc
    from kernelcore.hostproc.inventory import flatten

    return flatten(hostproc.describe_process())


async def overview(request: web.Request) -> web.Response:
    from kernelcore import envs, plugins
    from kernelcore.models.registry import model_registry

    state = get_state(request)
    config = state.engine.config
    return web.json_response({
        "version": __version__,
        "model": {"name": state.model_name, "path": config.model.model, "architecture": config.model.architecture,
                  "dtype": config.model.dtype, "max_model_len": state.engine.max_model_len},
        "platform": _platform(),
        "plugins": [dataclasses.asdict(r) for r in plugins.records()],
        "models": model_registry.owners(),
        "processes": _processes(),
        "trace_enabled": bool(envs.KC_TRACE_PLUGINS),
        "metrics_prefix": state.options.metrics_prefix,
        "config": {"tensor_parallel_size": config.parallel.tensor_parallel_size, "block_size": config.cache.block_size,
                   "num_blocks": getattr(state.engine, "num_blocks", config.cache.num_blocks),
                   "max_num_seqs": config.scheduler.max_num_seqs,
                   "enable_prefix_caching": config.cache.enable_prefix_caching,
                   "enable_lora": getattr(config.lora, "enable_lora", False)},
    }, dumps=lambda obj: json.dumps(obj, default=str))


def read_trace(path: str, offset: int, limit: int = MAX_TRACE_EVENTS) -> tuple[list[dict[str, Any]], int]:
    """Whole JSON lines of the KC_TRACE_PLUGINS file from byte ``offset``: (events, offset to ask from next)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            events: list[dict[str, Any]] = []
            while len(events) < limit:
                line = f.readline()
                if not line.endswith(b"\n"):  # end of file, or a line still being written
                    break
                offset += len(line)
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        return [], 0
    return events, offset


async def trace(request: web.Request) -> web.Response:
    from kernelcore import envs

    path = envs.KC_TRACE_PLUGINS
    if not path:
        return web.json_response({"enabled": False, "events": [], "offset": 0})
    try:
        offset = max(int(request.query.get("offset", "0")), 0)
    except ValueError:
        offset = 0
    events, offset = read_trace(path, offset)
    return web.json_response({"enabled": True, "events": events, "offset": offset},
                             dumps=lambda obj: json.dumps(obj, default=str))


def stats_snapshot(stat_logger: Any) -> dict[str, Any]:
    """The values the console charts, read from the Prometheus registry (whatever the prefix)."""
    out: dict[str, Any] = {"time": time.time()}
    if stat_logger is None:
        return out
    registry, prefix = stat_logger.registry, stat_logger.prefix

    def total(name: str) -> float:
        return sum(s.value for m in registry.collect() for s in m.samples if s.name == f"{prefix}:{name}")

    for key, name in (("running", "num_requests_running"), ("waiting", "num_requests_waiting"),
                      ("kv_cache_usage", "kv_cache_usage_perc"), ("prompt_tokens", "prompt_tokens_total"),
                      ("generation_tokens", "generation_tokens_total"),
                      ("ttft_sum", "time_to_first_token_seconds_sum"),
                      ("ttft_count", "time_to_first_token_seconds_count"), ("finished", "request_success_total")):
        out[key] = total(name)
    return out


async def stats(request: web.Request) -> web.Response:
    state = get_state(request)
    return web.json_response({**stats_snapshot(state.stat_logger), "in_flight": state.num_in_flight})


def add_routes(app: web.Application) -> None:
    app.on_response_prepare.append(add_security_headers)
    app.router.add_get("/", index)
    app.router.add_static(STATIC_PREFIX, STATIC_DIR, append_version=False)
    app.router.add_get("/console/api/overview", overview)
    app.router.add_get("/console/api/trace", trace)
    app.router.add_get("/console/api/stats", stats)
