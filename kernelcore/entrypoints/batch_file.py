"""The OpenAI batch-file format: parse input lines into requests (or per-line errors), format output lines.

A line that cannot be sent (not JSON, no custom_id, an unsupported method or url, a streaming body, a repeated
custom_id) becomes a :class:`LineError`; it fails alone and the others still run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

URLS = ("/v1/chat/completions", "/v1/completions")  # the routes a batch line may name


@dataclass
class BatchRequest:
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass
class LineError:
    custom_id: str | None  # echoed when the line had one, so the caller can still match it
    code: str
    message: str


def parse_line(text: str, seen: set[str]) -> BatchRequest | LineError:
    """One input line; ``seen`` holds the custom_ids taken by earlier lines and gains this line's."""
    try:
        line = json.loads(text)
    except ValueError as exc:
        return LineError(None, "invalid_json_line", f"This line is not valid JSON: {exc}")
    if not isinstance(line, dict):
        return LineError(None, "invalid_json_line", "This line is not a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(None, "missing_required_parameter", "custom_id must be a non-empty string")
    if custom_id in seen:  # the first line with an id keeps it; later ones fail, so ids in the output stay unique
        return LineError(custom_id, "duplicate_custom_id",
                         f"custom_id {custom_id!r} is already used by an earlier line of this file")
    seen.add(custom_id)
    method = line.get("method", "POST")
    if not isinstance(method, str) or method.upper() != "POST":
        return LineError(custom_id, "invalid_method", f"method must be POST, got {method!r}")
    url = line.get("url")
    if url not in URLS:
        return LineError(custom_id, "invalid_url", f"url must be one of {', '.join(URLS)}, got {url!r}")
    body = line.get("body")
    if not isinstance(body, dict):
        return LineError(custom_id, "invalid_body", "body must be a JSON object (the request's body)")
    if body.get("stream"):  # each output line holds one complete response, never a stream of events
        return LineError(custom_id, "invalid_body", "stream: true is not supported in a batch file")
    return BatchRequest(custom_id, url, body)


def parse_lines(lines: Iterable[str]) -> list[BatchRequest | LineError]:
    """Every non-blank line, in order (blank lines are skipped and produce no output line)."""
    seen: set[str] = set()
    return [parse_line(text, seen) for text in lines if text.strip()]


def new_request_id() -> str:
    return uuid.uuid4().hex


def output_line(request_id: str, custom_id: str | None, status: int | None = None, body: Any = None,
                error: LineError | None = None) -> str:
    """One output line: ``response`` when the server answered (any status), else ``error``."""
    response = None if status is None else {"status_code": status, "request_id": request_id, "body": body}
    return json.dumps({"id": f"batch_req_{request_id}", "custom_id": custom_id, "response": response,
                       "error": None if error is None else {"code": error.code, "message": error.message}},
                      ensure_ascii=False)
