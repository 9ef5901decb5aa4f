"""Ollama's routes: version, tags, show, ps, chat and generate; the model-management routes answer 501.

Every error under ``/api/`` is Ollama's ``{"error": "message"}``. Reading bodies and model names is shared with
chat and generate (:mod:`.generation`), in :mod:`.protocol`.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from aiohttp import web

from builtin_plugins.ollama_api.generation import chat, generate
from builtin_plugins.ollama_api.model_info import ModelFacts, model_facts
from builtin_plugins.ollama_api.protocol import read_body, render_error, requested_model, resolve_name, tagged
from builtin_plugins.ollama_api.translate import not_found
from kernelcore.entrypoints.server.errors import APIError, set_error_format
from kernelcore.entrypoints.server.state import ServerState, get_state

# The Ollama release this API matches: clients gate features on it (tools 0.3, structured outputs 0.5,
# thinking 0.9), so it is a real release that has them all.
OLLAMA_VERSION = "0.12.0"
FOREVER = timedelta(microseconds=(2**63 - 1) // 1000)  # what Ollama adds to now for a model kept loaded

NOT_SERVED = {  # route -> what to do instead
    "pull": "this server does not download models: run `kc pull NAME` (or fetch a GGUF file or a Hugging Face "
            "checkpoint), then restart `kc serve` with the file",
    "push": "this server does not push models: it serves the checkpoint it was started with",
    "create": "this server does not create models: restart `kc serve` with the checkpoint (--chat-template FILE "
              "sets its template, --served-model-name NAME its name)",
    "copy": "this server does not copy models: restart `kc serve` with --served-model-name NAME to serve the model "
            "under another name",
    "delete": "this server does not delete models: stop `kc serve` and remove the file yourself",
    "blobs": "this server does not store blobs: restart `kc serve` with the model file instead of uploading it",
    "embed": "embeddings are not served by this server: it serves generative models only",
}


def _served(state: ServerState, name: str) -> str:
    served = resolve_name(state, name)
    if served is None:
        raise not_found(name)
    return served


def capabilities(state: ServerState) -> list[str]:
    found = ["completion"]
    if state.options.enable_auto_tool_choice and state.tool_parser_cls is not None:
        found.append("tools")
    if state.reasoning_parser_cls is not None:
        found.append("thinking")
    return found


async def _facts(state: ServerState) -> ModelFacts:
    return await asyncio.to_thread(model_facts, state.engine)  # the first call reads file headers


def _names(state: ServerState) -> list[tuple[str, str]]:
    """(listed name, parent) of every model: the served names, then loaded adapters."""
    names = [(tagged(n), "") for n in state.options.served_model_names]
    if state.lora is not None:
        names += [(tagged(n), tagged(state.model_name)) for n in state.lora.adapters]
    return names


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_VERSION})


async def tags(request: web.Request) -> web.Response:
    state = get_state(request)
    facts = await _facts(state)
    return web.json_response({"models": [
        {"name": name, "model": name, "modified_at": facts.modified_at, "size": facts.size, "digest": facts.digest,
         "details": facts.details(parent)} for name, parent in _names(state)]})


async def ps(request: web.Request) -> web.Response:
    state = get_state(request)
    facts = await _facts(state)
    expires = (datetime.now(timezone.utc) + FOREVER).isoformat().replace("+00:00", "Z")
    return web.json_response({"models": [
        {"name": name, "model": name, "size": facts.size, "size_vram": 0, "digest": facts.digest,
         "details": facts.details(parent), "expires_at": expires, "context_length": state.engine.max_model_len}
        for name, parent in _names(state)]})


def chat_template(state: ServerState) -> str:
    tokenizer = state.engine.tokenizer
    template = state.options.chat_template or getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = template.get("default") or ""
    return template


async def show(request: web.Request) -> web.Response:
    state = get_state(request)
    name = requested_model(await read_body(request))
    served = _served(state, name)
    facts = await _facts(state)
    engine, template = state.engine, chat_template(state)
    parameters = [f"num_ctx {engine.max_model_len}"]
    eos = getattr(engine.tokenizer, "eos_token", None)
    if isinstance(eos, str) and eos:
        parameters.append(f'stop "{eos}"')
    source = engine.config.model.model or "(kernelcore's built-in model)"
    if state.lora is not None and served in state.lora.adapters:
        source = state.lora.adapters[served].path
    modelfile = "\n".join([f"# Modelfile of {tagged(served)}, served by kernelcore", f"FROM {source}",
                           f'TEMPLATE """{template}"""', *(f"PARAMETER {p}" for p in parameters)]) + "\n"
    parent = tagged(state.model_name) if served not in state.options.served_model_names else ""
    return web.json_response({
        "license": facts.license, "modelfile": modelfile, "parameters": "\n".join(parameters), "template": template,
        "details": facts.details(parent), "model_info": facts.model_info(engine.max_model_len),
        "capabilities": capabilities(state), "modified_at": facts.modified_at})


def _not_served(what: str):
    async def handler(request: web.Request) -> web.Response:
        raise APIError(NOT_SERVED[what], 501)

    return handler


def add_routes(app: web.Application) -> None:
    set_error_format(app, "/api/", render_error)
    router = app.router
    router.add_get("/api/version", version)
    router.add_get("/api/tags", tags)
    router.add_get("/api/ps", ps)
    router.add_post("/api/show", show)
    router.add_post("/api/chat", chat)
    router.add_post("/api/generate", generate)
    for path in ("pull", "push", "create", "copy"):
        router.add_post(f"/api/{path}", _not_served(path))
    router.add_delete("/api/delete", _not_served("delete"))
    router.add_post("/api/blobs/{digest}", _not_served("blobs"))
    router.add_route("HEAD", "/api/blobs/{digest}", _not_served("blobs"))
    router.add_post("/api/embed", _not_served("embed"))
    router.add_post("/api/embeddings", _not_served("embed"))
