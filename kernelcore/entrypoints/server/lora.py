"""LoRA adapters over HTTP: model names -> adapters, /v1/load_lora_adapter and /v1/unload_lora_adapter."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kernelcore import envs
from kernelcore.entrypoints.server.errors import APIError
from kernelcore.entrypoints.server.state import ServerState, get_state, read_json
from kernelcore.lora.adapter import LoRAAdapterError, LoRANotFoundError
from kernelcore.lora.serving import LoRAExistsError, LoRAServing, LoRAUnknownError


async def setup(app: web.Application, state: ServerState) -> LoRAServing:
    """The server's LoRAServing with the static --lora-modules loaded; the endpoints only when runtime updating
    is on."""
    options = state.options
    serving = LoRAServing(state.engine, state.model_name, options.lora_root or envs.KC_LORA_RESOLVER_DIR,
                          options.allow_runtime_lora_updating)
    for name, path in options.lora_modules.items():
        try:
            await serving.load(name, path, is_runtime=False)
        except (OSError, ValueError) as exc:  # the operator's flag: a clear start-up error, not a traceback
            raise LoRAAdapterError(f"{name}={path}: {exc}") from None
    if options.allow_runtime_lora_updating:
        app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
        app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
    return serving


async def _body(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise APIError("The request body must be a JSON object", 400)
    for key in ("lora_name", "lora_path"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise APIError(f"'{key}' must be a string", 400, key)
    return body


async def load_lora_adapter(request: web.Request) -> web.Response:
    serving = get_state(request).lora
    body = await _body(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not name or not path:
        raise APIError("Both 'lora_name' and 'lora_path' must be provided.", 400)
    try:
        await serving.load(name, path)
    except LoRANotFoundError as exc:
        raise APIError(f"Loading lora {name} failed: {exc}", 404, "lora_path") from None
    except LoRAExistsError as exc:
        raise APIError(str(exc), 400, "lora_name") from None
    except (OSError, ValueError) as exc:
        raise APIError(f"Loading lora {name} failed: {exc}", 400, "lora_path") from None
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    serving = get_state(request).lora
    name = (await _body(request)).get("lora_name")
    if not name:
        raise APIError("'lora_name' needs to be provided to unload a LoRA adapter.", 400, "lora_name")
    try:
        await serving.unload(name)
    except LoRAUnknownError:
        raise APIError(f"The lora adapter '{name}' cannot be found.", 404, "lora_name") from None
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
