"""The OpenAI Responses API (entry point ``openai_responses``): ``/v1/responses`` on the shared request path.

Modules: :mod:`.protocol` (the request's fields), :mod:`.items` (input and output items), :mod:`.translate`
(the chat-completions body to run, the response object), :mod:`.events` (the streamed event sequence),
:mod:`.store` (stored responses) and :mod:`.routes`. General plugins are imported in every process, workers
included, so nothing is imported here until the server registers the routes.
"""

from typing import Any

from kernelcore import hookimpl


@hookimpl
def register_endpoints(app: Any, engine: Any) -> None:
    from builtin_plugins.responses_api.routes import add_routes

    add_routes(app)
