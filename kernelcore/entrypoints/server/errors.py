"""The OpenAI error envelope: ``{"error": {"message", "type", "param", "code"}}``, and per-route error shapes.

An endpoint plugin whose API has its own error shape (Anthropic's, Ollama's) registers a renderer for its path
prefix with :func:`set_error_format`; every error on those paths, the middlewares' own (401, 413, 415) included,
is then answered in that shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    413: "RequestEntityTooLarge",
    415: "Unsupported Media Type",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """An error answered to the client with the envelope and its HTTP status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, type: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param
        self.type = type or ERROR_TYPES.get(status, "BadRequestError")

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(message, 400, param)


def error_response(error: APIError, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error.to_dict(), status=error.status, headers=headers)


ErrorRenderer = Callable[[APIError], dict[str, Any]]
ERROR_FORMATS = web.AppKey("kc_error_formats", dict)  # path prefix -> ErrorRenderer


def set_error_format(app: web.Application, path_prefix: str, render: ErrorRenderer) -> None:
    """Answer every error on paths starting with ``path_prefix`` with ``render(error)`` as the JSON body.

    The longest matching prefix wins; paths no prefix matches keep the OpenAI envelope.
    """
    if ERROR_FORMATS not in app:
        app[ERROR_FORMATS] = {}
    app[ERROR_FORMATS][path_prefix] = render


def error_body(app: web.Application, path: str, error: APIError) -> dict[str, Any]:
    """The error's JSON body in the shape of the API that serves ``path``."""
    formats = app.get(ERROR_FORMATS) or {}
    matches = [prefix for prefix in formats if path.startswith(prefix)]
    if not matches:
        return error.to_dict()
    return formats[max(matches, key=len)](error)


def route_error_response(request: web.Request, error: APIError, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(request.app, request.path, error), status=error.status, headers=headers)
