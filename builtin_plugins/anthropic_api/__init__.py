"""Built-in endpoint plugin (entry point ``anthropic_messages``): the Anthropic Messages API.

``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, translated onto the shared chat path
(:func:`kernelcore.entrypoints.server.generate.start_chat`), with Anthropic's response, stream and error shapes.
General plugins are imported in every process, so the routes are imported only when the server asks for them.
"""

from __future__ import annotations

from typing import Any

from kernelcore.contract.hookspecs import hookimpl


@hookimpl
def register_endpoints(app: Any, engine: Any) -> None:
    from builtin_plugins.anthropic_api.routes import add_routes

    add_routes(app)
