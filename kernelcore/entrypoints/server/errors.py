"""The OpenAI error envelope: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

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
