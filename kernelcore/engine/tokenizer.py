"""Tokenizer loading and chat templates (transformers' own machinery)."""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=4)
def get_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    # kernelcore checks every prompt against max_model_len itself (a clear 400); transformers' "Token indices
    # sequence length is longer than the specified maximum" warning would be false here. This is the flag
    # transformers sets once it has warned, so it stays quiet without touching any logger.
    tokenizer.deprecation_warnings["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tokenizer


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])


def apply_chat_template(tokenizer, messages: list[dict[str, Any]], chat_template: str | None = None,
                        add_generation_prompt: bool = True, **kwargs: Any) -> str:
    if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("The tokenizer has no chat template and none was given; pass chat_template=... "
                         "(a Jinja template string)")
    return tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kwargs)


def encode_chat(tokenizer, messages: list[dict[str, Any]], chat_template: str | None = None,
                add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
    text = apply_chat_template(tokenizer, messages, chat_template, add_generation_prompt, **kwargs)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def eos_token_id(tokenizer, hf_config=None) -> int | None:
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if eos is None and hf_config is not None:
        eos = getattr(hf_config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return eos


def try_get_tokenizer(path: str):
    """The tokenizer, or None for a checkpoint without tokenizer files (token-id prompts only, no text)."""
    import logging

    try:
        return get_tokenizer(path)
    except Exception as exc:
        logging.getLogger("kernelcore.engine").warning(
            "No tokenizer loaded from %s (%s): only token-id prompts work and outputs have no text",
            path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None
