"""Anthropic's error shape: ``{"type": "error", "error": {"type": ..., "message": ...}}``.

The anthropic SDK picks its exception class from the HTTP status; the ``error.type`` names what the status means
in Anthropic's words, so clients that read the body see the same thing.
"""

from __future__ import annotations

from typing import Any

from kernelcore.entrypoints.server.errors import APIError

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def render_error(error: APIError) -> dict[str, Any]:
    """The body of every error on /v1/messages paths (HTTP errors and the stream's ``event: error``)."""
    return {"type": "error", "error": {"type": error_type(error.status), "message": error.message}}
