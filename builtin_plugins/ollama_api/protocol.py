"""What every Ollama route shares: its error body, its timestamps, the request body and the model name.

Bodies are read whatever their Content-Type, as Ollama does (``curl -d`` sends form-encoded), and a model
name without a tag is the same as ``NAME:latest``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from builtin_plugins.ollama_api.translate import bad_request
from kernelcore.entrypoints.server.errors import APIError
from kernelcore.entrypoints.server.jsonbody import decode_json
from kernelcore.entrypoints.server.state import ServerState
from kernelcore.entrypoints.server.state import read_body as raw_body


def render_error(error: APIError) -> dict[str, Any]:
    """Ollama's error body: the message alone."""
    return {"error": error.message}


def now() -> str:
    """UTC now as Ollama writes ``created_at``."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


async def read_body(request: web.Request) -> dict[str, Any]:
    """The JSON object body, any Content-Type; an empty body is ``{}``."""
    raw = await raw_body(request)
    if not raw.strip():
        return {}
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    return body


def requested_model(body: dict[str, Any]) -> str:
    """The ``model`` field (``name`` from older clients)."""
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name:
        raise bad_request("model is required", "model")
    return name


def tagged(name: str) -> str:
    """``name`` as Ollama lists it: with its tag, ``:latest`` when it has none."""
    return name if ":" in name else f"{name}:latest"


def resolve_name(state: ServerState, name: str) -> str | None:
    """The served name (or loaded adapter) ``name`` means, ``NAME`` and ``NAME:latest`` alike; None if none."""
    names = list(state.options.served_model_names)
    if state.lora is not None:
        names += list(state.lora.adapters)
    candidates = [name, name[:-len(":latest")] if name.endswith(":latest") else f"{name}:latest"]
    return next((c for c in candidates if c in names), None)
