"""Built-in endpoint plugin (entry point ``ollama_api``): Ollama's REST API under ``/api/``.

Chat and generate are translated onto the shared request path (``start_chat`` / ``start_completion``), so
validation, templates, tools, structured outputs and parsers are exactly those of ``/v1/chat/completions``.
The model-management routes answer 501 with what to do instead. ``--disable-endpoint-plugins ollama_api``
switches the routes off.
"""

from __future__ import annotations

from kernelcore.contract.hookspecs import hookimpl


@hookimpl
def register_endpoints(app, engine) -> None:
    from builtin_plugins.ollama_api.routes import add_routes  # lazily: general plugins load in every process

    add_routes(app)
