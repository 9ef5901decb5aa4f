"""Ollama request fields -> an OpenAI chat-completions (or completions) body, and answers back to Ollama's shapes.

Only the shape is translated here; the values are validated where ``/v1/chat/completions`` validates them
(``start_chat``), so a bad ``temperature`` is the same 400 on both APIs.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kernelcore.entrypoints.server.errors import APIError

logger = logging.getLogger("kernelcore.server")

OPTIONS = {  # Ollama option -> the OpenAI body field it sets
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
    "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "stop": "stop",
}
# Ollama options with no effect here: load-time settings of Ollama's runner (num_ctx: the context is
# --max-model-len) and samplers this engine does not have. Accepted so that existing clients keep working.
IGNORED_OPTIONS = {"num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
                   "use_mmap", "use_mlock", "embedding_only", "num_thread", "numa", "num_keep", "tfs_z", "typical_p",
                   "repeat_last_n", "mirostat", "mirostat_tau", "mirostat_eta", "penalize_newline"}
THINK_LEVELS = ("high", "medium", "low")
IMAGES_REFUSED = "images are not supported: this server serves text-only models"
_logged: set[str] = set()


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(message, 400, param)


def not_found(model: str) -> APIError:
    return APIError(f"model '{model}' not found", 404, "model")


def sampling_fields(options: Any) -> dict[str, Any]:
    """``options`` -> sampling fields of the OpenAI body; ``num_predict`` -1 (or absent) is until the context is
    full."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise bad_request("options must be an object", "options")
    fields = {OPTIONS[k]: v for k, v in options.items() if k in OPTIONS and v is not None}
    num_predict = options.get("num_predict")
    if num_predict is not None:
        if not isinstance(num_predict, int) or isinstance(num_predict, bool):
            raise bad_request(f"options.num_predict must be an integer, got {num_predict!r:.40}", "num_predict")
        if num_predict == 0:
            raise bad_request("options.num_predict must be positive, or -1 for as many tokens as the context holds",
                              "num_predict")
        if num_predict > 0:
            fields["max_tokens"] = num_predict
    unknown = sorted(set(options) - set(OPTIONS) - IGNORED_OPTIONS - {"num_predict"} - _logged)
    if unknown:
        _logged.update(unknown)
        logger.info("Ollama API: ignoring unknown option(s) %s (logged once each)", ", ".join(unknown))
    return fields


def response_format(fmt: Any) -> dict[str, Any] | None:
    """``format``: "json" is any JSON object, a JSON schema object is that schema."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise bad_request('format must be "json" or a JSON schema object', "format")


def thinking_fields(think: Any, has_parser: bool, model: str) -> dict[str, Any]:
    """``think`` (true/false or a level) -> chat-template switches; thinking needs a reasoning parser."""
    if think is None:
        return {}
    if not isinstance(think, (bool, str)) or (isinstance(think, str) and think not in THINK_LEVELS):
        raise bad_request(f"think must be true, false or one of {', '.join(THINK_LEVELS)}", "think")
    if not has_parser:
        if think is False:
            return {}
        raise bad_request(f"model '{model}' does not support thinking: this server has no reasoning parser "
                          "(kc serve --reasoning-parser NAME)", "think")
    fields: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": bool(think)}}
    if isinstance(think, str):
        fields["reasoning_effort"] = think
    return fields


def _call_arguments(value: Any, where: str) -> str:
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    raise bad_request(f"{where}.function.arguments must be an object", "messages")


def _openai_calls(calls: Any, where: str, i: int) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad_request(f"{where}.tool_calls must be an array", "messages")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise bad_request(f'{where}.tool_calls[{j}] must be {{"function": {{"name": ..., "arguments": {{...}}}}}}',
                              "messages")
        call_id = call.get("id") if isinstance(call.get("id"), str) and call["id"] else f"call_{i}_{j}"
        out.append({"id": call_id, "type": "function",
                    "function": {"name": function["name"],
                                 "arguments": _call_arguments(function.get("arguments"), f"{where}.tool_calls[{j}]")}})
    return out


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """Ollama messages -> OpenAI ones: tool-call arguments as JSON text, ``tool_name`` as the tool message's name,
    each tool message linked to the assistant call it answers (in order)."""
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise bad_request("messages must be an array", "messages")
    out, pending = [], []  # pending: ids of the last assistant turn's calls not answered yet
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"{where} must be an object with a string role", "messages")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise bad_request(f"{where}.content must be a string", "messages")
        if message.get("images"):
            raise bad_request(IMAGES_REFUSED, "images")
        converted: dict[str, Any] = {"role": message["role"], "content": content or ""}
        if message.get("tool_calls"):
            converted["tool_calls"] = _openai_calls(message["tool_calls"], where, i)
            pending = [call["id"] for call in converted["tool_calls"]]
        if message["role"] == "tool":
            name = message.get("tool_name", message.get("name"))
            if name is not None and not isinstance(name, str):
                raise bad_request(f"{where}.tool_name must be a string", "messages")
            if name:
                converted["name"] = name
            call_id = message.get("tool_call_id")
            converted["tool_call_id"] = call_id if isinstance(call_id, str) else (pending.pop(0) if pending else
                                                                                  f"call_{i}")
        out.append(converted)
    return out


def ollama_call(call: dict[str, Any], index: int) -> dict[str, Any]:
    """An OpenAI tool call (arguments as JSON text) -> Ollama's, whose arguments are an object."""
    function = call.get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):  # Ollama's clients require an object; the parsers only emit objects
        logger.warning("Ollama API: tool call %r has arguments that are not a JSON object", function.get("name"))
        arguments = {}
    return {"id": call.get("id"), "function": {"index": index, "name": function.get("name"), "arguments": arguments}}


def ollama_logprobs(tokenizer: Any, token_ids: list[int], entries: list[Any] | None, top: int) -> list[dict[str, Any]]:
    """The engine's per-token entries in Ollama's shape: [{token, logprob, bytes, top_logprobs: [...]}]."""
    from kernelcore.entrypoints.server.logprobs import chat_logprobs

    if not token_ids or entries is None:
        return []
    return chat_logprobs(tokenizer, token_ids, entries, top, False)["content"]
