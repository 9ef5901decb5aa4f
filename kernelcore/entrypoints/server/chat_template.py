"""Chat templates: resolving the template (flag, tokenizer, request) and rendering messages with transformers."""

from __future__ import annotations

import inspect
import os
from typing import Any

from kernelcore.entrypoints.server.errors import bad_request
from kernelcore.entrypoints.server.preprocess import encode_chat
from kernelcore.entrypoints.server.protocol import GenerateRequest
from kernelcore.entrypoints.server.state import ServerState
from kernelcore.entrypoints.server.tools import template_messages

NO_TEMPLATE = ("This model's tokenizer has no chat template, so /v1/chat/completions cannot format messages. "
               "Restart the server with --chat-template FILE (or an inline Jinja template), or use /v1/completions "
               "with a plain prompt.")
UNTRUSTED_TEMPLATE = ("Chat template is passed with request, but --trust-request-chat-template is not set. "
                      "Refused request with untrusted chat template.")


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a file path or an inline Jinja template."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template {value!r} is neither a readable file nor an inline Jinja template")


def resolve_template(state: ServerState, tokenizer: Any, request_template: str | None) -> str:
    if request_template is not None:
        if not state.options.trust_request_chat_template:
            raise bad_request(UNTRUSTED_TEMPLATE, "chat_template")
        return request_template
    template = state.options.chat_template or getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: use the default one
        template = template.get("default")
    if not template:
        raise bad_request(NO_TEMPLATE, "chat_template")
    return template


def _reserved_kwargs(tokenizer: Any) -> set[str]:
    return set(inspect.signature(tokenizer.apply_chat_template).parameters) | {"messages"}


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], template: str, chat: dict[str, Any]) -> str:
    """Render with transformers' own chat-template machinery (sandboxed Jinja)."""
    reserved = _reserved_kwargs(tokenizer)
    kwargs = {k: v for k, v in (chat.get("chat_template_kwargs") or {}).items() if k not in reserved}
    try:
        return tokenizer.apply_chat_template(
            messages, tools=chat.get("tools"), documents=chat.get("documents"), chat_template=template,
            add_generation_prompt=chat["add_generation_prompt"], continue_final_message=chat["continue_final_message"],
            tokenize=False, return_dict=False, **kwargs)
    except Exception as exc:  # jinja errors, raise_exception() in the template, bad message shapes
        raise bad_request(f"Error rendering the chat template: {type(exc).__name__}: {exc}", "messages") from None


def chat_prompt_ids(state: ServerState, req: GenerateRequest) -> tuple[str, list[int]]:
    tokenizer = state.engine.tokenizer
    template = resolve_template(state, tokenizer, req.chat.get("chat_template"))
    return encode_chat(tokenizer, template_messages(req.messages),
                       lambda messages: render_chat(tokenizer, messages, template, req.chat),
                       req.add_special_tokens, state.options.allow_special_tokens_in_content)
