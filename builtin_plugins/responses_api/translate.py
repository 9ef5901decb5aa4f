"""The shared request path's two ends for Responses: the chat-completions body to run, and the response object.

A Responses request runs as the chat completion this module writes (:func:`chat_body`), so validation,
limits, the chat template, tools, structured outputs and the reasoning parser are exactly those of
``/v1/chat/completions``. The answer comes back as a ``response`` object (:class:`ResponseBuilder`).
"""

from __future__ import annotations

import time
from typing import Any

from builtin_plugins.responses_api.items import new_id, to_messages
from builtin_plugins.responses_api.protocol import ResponsesRequest
from kernelcore.entrypoints.server.errors import APIError

FINAL = ("completed", "incomplete", "failed", "cancelled")


def chat_body(req: ResponsesRequest, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions body that asks the model what ``req`` asks, over the input ``items``."""
    body: dict[str, Any] = {"messages": to_messages(req.instructions, items), **req.sampling}
    if req.model is not None:
        body["model"] = req.model
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    if req.tools:
        body["tools"] = [{"type": "function", "function": {
            k: v for k, v in (("name", t["name"]), ("description", t["description"]), ("parameters", t["parameters"]))
            if v is not None}} for t in req.tools]
        body["parallel_tool_calls"] = req.parallel_tool_calls
        choice = req.tool_choice
        if isinstance(choice, dict):
            choice = {"type": "function", "function": {"name": choice["name"]}}
        if choice is not None:
            body["tool_choice"] = choice
    elif req.tool_choice == "required" or isinstance(req.tool_choice, dict):
        body["tool_choice"] = req.tool_choice  # the chat path refuses it: there are no tools to call
    fmt = req.text_format
    if fmt["type"] == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt["type"] == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt["name"], "schema": fmt["schema"], "strict": fmt["strict"]}}
    if req.reasoning["effort"] is not None:
        body["reasoning_effort"] = req.reasoning["effort"]  # refused unless the server has a reasoning parser
    return body


def usage(input_tokens: int, output_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens}


def count_tokens(tokenizer: Any, text: str | None) -> int:
    if not text or tokenizer is None:
        return 0
    try:
        return len(tokenizer.encode(text, add_special_tokens=False))
    except Exception:  # a tokenizer without that keyword; the count is informational
        return 0


class ResponseBuilder:
    """The ``response`` object of one request, at each status it goes through."""

    def __init__(self, req: ResponsesRequest, model: str, response_id: str | None = None) -> None:
        self.req, self.model = req, model
        self.id = response_id or new_id("resp")
        self.created_at = int(time.time())

    def snapshot(self, status: str, output: list[dict[str, Any]] | None = None, usage: dict[str, Any] | None = None,
                 error: dict[str, Any] | None = None, is_cut: bool = False) -> dict[str, Any]:
        req = self.req
        tool_choice = req.tool_choice if req.tool_choice is not None else ("auto" if req.tools else "none")
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "background": req.background, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if is_cut else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "max_tool_calls": None,
            "metadata": req.metadata, "model": self.model, "output": output or [],
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "reasoning": req.reasoning, "service_tier": req.informational.get("service_tier", "default"),
            "store": req.store, "temperature": req.sampling.get("temperature"),
            "text": {"format": req.text_format, "verbosity": req.verbosity or "medium"},
            "tool_choice": tool_choice, "tools": req.tools, "top_logprobs": 0, "top_p": req.sampling.get("top_p"),
            "truncation": "disabled", "usage": usage, "user": req.informational.get("user"),
            "safety_identifier": req.informational.get("safety_identifier"),
            "prompt_cache_key": req.informational.get("prompt_cache_key"),
        }

    def finished(self, output: list[dict[str, Any]], usage: dict[str, Any],
                 finish_reason: str | None) -> dict[str, Any]:
        is_cut = finish_reason == "length"
        return self.snapshot("incomplete" if is_cut else "completed", output, usage, is_cut=is_cut)

    def failed(self, error: APIError) -> dict[str, Any]:
        code = "server_error" if error.status >= 500 else "invalid_prompt"
        return self.snapshot("failed", error={"code": code, "message": error.message})
