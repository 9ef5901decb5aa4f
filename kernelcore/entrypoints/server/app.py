"""The aiohttp application: state, middlewares (request id, errors, auth, body limits), routes, endpoint plugins."""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
from typing import Any

from aiohttp import web

from kernelcore.entrypoints.server.errors import APIError, route_error_response
from kernelcore.entrypoints.server.state import STATE, ServerOptions, ServerState, base_request_id, get_state, read_json  # noqa: F401

logger = logging.getLogger("kernelcore.server")

OPEN_PATHS = frozenset({"/health", "/ping", "/metrics"})  # reachable without the API key


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    headers = {"X-Request-Id": request.headers["X-Request-Id"]} if "X-Request-Id" in request.headers else {}
    try:
        response = await handler(request)
    except APIError as exc:
        return route_error_response(request, exc, headers)
    except web.HTTPRequestEntityTooLarge as exc:
        return route_error_response(request, APIError(f"Request body too large: {exc.text}", 413), headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return route_error_response(request, APIError(exc.reason, exc.status), headers)
    except asyncio.CancelledError:
        raise
    except ConnectionError:
        if request.transport is None or request.transport.is_closing():  # the client left: nobody reads a reply
            logger.debug("client of %s %s went away", request.method, request.path)
            return web.Response(status=499)
        logger.exception("Unhandled error in %s %s", request.method, request.path)
        return route_error_response(request, APIError("Internal server error", 500), headers)
    except Exception:
        logger.exception("Unhandled error in %s %s", request.method, request.path)
        return route_error_response(request, APIError("Internal server error", 500), headers)
    if headers and not response.prepared:
        response.headers.update(headers)
    return response


def is_public_page(state: ServerState, path: str) -> bool:
    """The web console's page and assets (no data in them; its JSON endpoints still need the key)."""
    from kernelcore.entrypoints.server.console import is_public

    return state.options.web_console and is_public(path)


def is_authorized(request: web.Request, key: str) -> bool:
    """``Authorization: Bearer <key>`` (the scheme case-insensitive) or ``x-api-key: <key>`` (Anthropic's
    clients), the key compared in constant time.

    Header values arrive as str with undecodable bytes kept as surrogates; they are compared as the
    bytes they were, so no header value can raise here.
    """
    expected = key.encode("utf-8", "surrogateescape")
    scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
    given_bytes = given.strip().encode("utf-8", "surrogateescape")
    bearer_ok = hmac.compare_digest(given_bytes, expected) and scheme.lower() == "bearer"
    x_api_key = request.headers.get("x-api-key", "").strip().encode("utf-8", "surrogateescape")
    return hmac.compare_digest(x_api_key, expected) or bearer_ok


@web.middleware
async def guard_middleware(request: web.Request, handler) -> web.StreamResponse:
    state = get_state(request)
    key = state.options.api_key
    if (key is not None and request.path not in OPEN_PATHS and not is_public_page(state, request.path)
            and not is_authorized(request, key)):
        return route_error_response(request, APIError("Invalid or missing API key: send 'Authorization: Bearer "
                                                      "<key>' or 'x-api-key: <key>'", 401),
                                    {"WWW-Authenticate": "Bearer"})
    if request.content_length is not None and request.content_length > state.options.max_body_bytes:
        raise APIError(f"Request body too large: {request.content_length} bytes (at most "
                       f"{state.options.max_body_bytes})", 413)
    if request.method != "POST" or request.path in OPEN_PATHS:
        return await handler(request)
    if state.is_shutting_down:
        raise APIError("The server is shutting down", 503)
    state.num_in_flight += 1
    try:
        return await handler(request)
    finally:
        state.num_in_flight -= 1
        state.in_flight_changed.set()


def _builtin_names() -> set[str]:
    from kernelcore import plugins

    return {record.name for record in plugins.records() if record.is_builtin}


async def register_endpoint_plugins(app: web.Application, engine: Any, enabled: bool,
                                   names: list[str] | tuple[str, ...] = (),
                                   disabled: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Call each enabled plugin's ``register_endpoints``; a failing one is logged by name and skipped.

    Plugins shipped with kernelcore are on unless named in ``disabled``; a third party's only when named in
    ``names`` or when ``enabled`` lets every plugin in.
    """
    from kernelcore import envs, plugins

    legacy = set(envs.KC_PLUGINS or [])
    builtin = _builtin_names()
    registered = []
    for impl in plugins.get_plugin_manager().hook.register_endpoints.get_hookimpls():
        name = impl.plugin_name
        if name in disabled:
            logger.info("Endpoint plugin %r is switched off (--disable-endpoint-plugins)", name)
            continue
        if name in builtin:
            pass
        elif name in legacy and not (enabled or name in names):
            logger.warning("Endpoint plugin %r is enabled by KC_PLUGINS, which is deprecated for this and will stop "
                           "in kernelcore 0.3: use KC_ENDPOINT_PLUGINS=%s (KC_PLUGINS also disables every other "
                           "third-party plugin)", name, name)
        elif not (enabled or name in names):
            logger.info("Endpoint plugin %r is off: name it in --endpoint-plugins/KC_ENDPOINT_PLUGINS or pass "
                        "--enable-endpoint-plugins", name)
            continue
        try:
            result = plugins.call_plugin_hook(name, "register_endpoints", app=app, engine=engine)
            for value in result or []:
                if inspect.isawaitable(value):
                    await value
        except Exception as exc:
            logger.error("Endpoint plugin %r failed and is skipped: %s: %s", name, type(exc).__name__, exc)
            continue
        logger.info("Endpoint plugin %r registered its routes", name)
        registered.append(name)
    unknown = sorted(set(disabled) - {impl.plugin_name for impl in
                                      plugins.get_plugin_manager().hook.register_endpoints.get_hookimpls()})
    if unknown:
        logger.warning("--disable-endpoint-plugins names no endpoint plugin: %s", ", ".join(unknown))
    return registered


def _setup_parsers(state: ServerState) -> None:
    from kernelcore.entrypoints.reasoning_parsers import reasoning_parser_registry
    from kernelcore.entrypoints.server.structured import FrontEndGrammars
    from kernelcore.entrypoints.tool_parsers import tool_parser_registry

    options = state.options
    state.grammars = FrontEndGrammars(state.engine)
    backend = getattr(getattr(state.engine.config, "decoding", None), "structured_outputs_backend", "auto")
    if backend != "auto":
        from kernelcore.structured_output.backend import build_registry

        build_registry().factory(backend)  # an unknown name fails at start-up, not on the first request
    if options.enable_auto_tool_choice and not options.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME")
    if options.tool_call_parser:
        state.tool_parser_cls = tool_parser_registry().get(options.tool_call_parser)
    if options.reasoning_parser:
        state.reasoning_parser_cls = reasoning_parser_registry().get(options.reasoning_parser)


async def create_app(engine: Any, options: ServerOptions, stat_logger: Any = None) -> web.Application:
    from kernelcore.entrypoints.server import chat, completions, models, tokenize

    if not options.served_model_names:
        options.served_model_names = [engine.config.model.served_model_name]
    app = web.Application(middlewares=[error_middleware, guard_middleware], client_max_size=options.max_body_bytes)
    app[STATE] = state = ServerState(engine=engine, options=options, stat_logger=stat_logger)
    _setup_parsers(state)
    if getattr(getattr(engine.config, "lora", None), "enable_lora", False):
        from kernelcore.entrypoints.server import lora

        state.lora = await lora.setup(app, state)
    elif options.lora_modules:
        raise ValueError("--lora-modules needs --enable-lora")
    app.router.add_post("/v1/completions", completions.create_completion)
    app.router.add_post("/v1/chat/completions", chat.create_chat_completion)
    models.add_routes(app)
    tokenize.add_routes(app)
    if options.web_console:
        from kernelcore.entrypoints.server import console

        console.add_routes(app)
    await register_endpoint_plugins(app, engine, options.enable_endpoint_plugins, options.endpoint_plugins,
                                   options.disabled_endpoint_plugins)
    return app
