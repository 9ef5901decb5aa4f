"""Start-up notices that explain a first run: what the server can and cannot answer before a request fails."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("kernelcore.serve")

NO_TEMPLATE_WARNING = ("The tokenizer of %s has no chat template: /v1/chat/completions will answer 400 until the "
                       "server runs with --chat-template FILE (or an inline Jinja template); /v1/completions works.")


def has_chat_template(tokenizer: Any, server_template: str | None) -> bool:
    return bool(server_template or getattr(tokenizer, "chat_template", None))


def startup_warnings(engine: Any, options: Any) -> None:
    tokenizer = engine.tokenizer
    if tokenizer is not None and not has_chat_template(tokenizer, options.chat_template):
        logger.warning(NO_TEMPLATE_WARNING, options.served_model_names[0] if options.served_model_names
                       else engine.config.model.served_model_name)
    if options.default_max_tokens is None:
        logger.info("Requests without max_tokens: chat runs until the model stops or the context (%d tokens) is "
                    "full, completions stop after 16 tokens; --default-max-tokens N changes both",
                    engine.max_model_len)
