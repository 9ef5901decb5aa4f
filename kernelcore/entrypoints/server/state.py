"""The server's shared state and request helpers: what every handler module needs from the app."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kernelcore.entrypoints.server.errors import APIError
from kernelcore.entrypoints.server.jsonbody import decode_json
from kernelcore.entrypoints.server.protocol import Limits


@dataclass
class ServerOptions:
    served_model_names: list[str] = field(default_factory=list)
    api_key: str | None = None
    limits: Limits = field(default_factory=Limits)
    max_body_bytes: int = 8 << 20
    read_timeout: float = 30.0  # seconds a client may take to send its headers, and its body
    chat_template: str | None = None  # --chat-template, already read from its file
    trust_request_chat_template: bool = False
    allow_special_tokens_in_content: bool = False  # else special-token text in messages is plain text
    response_role: str = "assistant"
    enable_endpoint_plugins: bool = False  # every plugin's register_endpoints runs
    endpoint_plugins: list[str] = field(default_factory=list)  # plugin names whose register_endpoints runs
    disabled_endpoint_plugins: list[str] = field(default_factory=list)  # never run, built-in ones included
    lora_modules: dict[str, str] = field(default_factory=dict)  # --lora-modules name=path (needs enable_lora)
    allow_runtime_lora_updating: bool = False  # load/unload endpoints and resolver lookups
    lora_root: str | None = None  # where runtime lora_path may point (--lora-root, else KC_LORA_RESOLVER_DIR)
    enable_auto_tool_choice: bool = False  # tool_choice "auto" parses calls with tool_call_parser
    tool_call_parser: str | None = None  # a registered tool-call parser name
    reasoning_parser: str | None = None  # a registered reasoning parser name
    default_max_tokens: int | None = None  # --default-max-tokens: for requests without max_tokens
    metrics_prefix: str = "kc"
    web_console: bool = True  # the page at / and its /console/api/* endpoints


@dataclass
class ServerState:
    engine: Any
    options: ServerOptions
    stat_logger: Any = None  # PrometheusStatLogger
    lora: Any = None  # LoRAServing when the engine has LoRA enabled
    num_in_flight: int = 0
    is_shutting_down: bool = False
    in_flight_changed: asyncio.Event = field(default_factory=asyncio.Event)
    grammars: Any = None  # FrontEndGrammars: validates output constraints before the engine sees them
    tool_parser_cls: Any = None
    reasoning_parser_cls: Any = None

    @property
    def model_name(self) -> str:
        return self.options.served_model_names[0]

    def check_model(self, model: str | None) -> str:
        """The name to echo for the requested model; unknown names are a 404."""
        if model is None or model in self.options.served_model_names:
            return self.model_name
        if self.lora is not None and model in self.lora.adapters:
            return model
        raise APIError(f"The model `{model}` does not exist.", 404, "model")

    async def resolve_model(self, model: str | None) -> tuple[str, int]:
        """(name to echo, LoRA id) for the requested model: a base name, a loaded or resolvable adapter, or 404."""
        if model is None or model in self.options.served_model_names or self.lora is None:
            return self.check_model(model), 0
        try:
            lora = await self.lora.get(model)
        except (OSError, ValueError) as exc:  # a resolver raised, or what it found cannot be loaded
            raise APIError(str(exc), 400, "model") from None
        if lora is None:
            raise APIError(f"The model `{model}` does not exist.", 404, "model")
        return model, lora.lora_id


STATE = web.AppKey("kc_state", ServerState)


def get_state(request: web.Request) -> ServerState:
    return request.app[STATE]


def base_request_id(request: web.Request) -> str:
    return request.headers.get("X-Request-Id") or uuid.uuid4().hex


async def read_body(request: web.Request) -> bytes:
    """The raw body, or a 408 when the client takes longer than ``--read-timeout`` to send it."""
    timeout = get_state(request).options.read_timeout
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except asyncio.TimeoutError:
        raise APIError(f"The request body did not arrive within {timeout:g}s", 408) from None


async def read_json(request: web.Request) -> Any:
    if request.content_type != "application/json":
        raise APIError(f"Unsupported Media Type: only 'application/json' is accepted, got '{request.content_type}'",
                       415)
    return decode_json(await read_body(request))
