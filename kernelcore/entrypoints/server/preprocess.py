"""Turning request text into token ids without stalling the event loop or trusting message content.

Large inputs are tokenized (and chat templates rendered) on one worker thread, so /health and
small requests keep being answered meanwhile; memory the tokenizer used is handed back afterwards.
A text that cannot fit the context whatever it tokenizes to is refused before any work is done.
Special-token text inside chat message content is tokenized as plain text, so a message cannot
forge role markers or end-of-sequence tokens (unless the operator allows it).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import re
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kernelcore.entrypoints.server.errors import bad_request

INLINE_CHARS = 1 << 16  # below this, tokenizing on the event loop costs less than a thread hop
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kc-preprocess")


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


async def run_preprocess(num_chars: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``: inline when small, else on the preprocessing thread, then memory handed back."""
    if num_chars < INLINE_CHARS:
        return fn(*args)
    try:
        return await asyncio.get_running_loop().run_in_executor(_executor, fn, *args)
    finally:
        trim = _malloc_trim()
        if trim is not None:
            await asyncio.get_running_loop().run_in_executor(_executor, trim, 0)


@functools.lru_cache(maxsize=4)
def _longest_token_chars(tokenizer: Any) -> int:
    return max((len(token) for token in tokenizer.get_vocab()), default=1) or 1


def check_text_fits(tokenizer: Any, num_chars: int, max_model_len: int) -> None:
    """400 for a text so long that even its longest possible tokens overflow the context."""
    if num_chars <= INLINE_CHARS:
        return
    min_tokens = num_chars // _longest_token_chars(tokenizer)
    if min_tokens >= max_model_len:
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens. However, your request has "
                          f"at least {min_tokens} input tokens ({num_chars} characters). Please reduce the length of "
                          "the input.", "input_tokens")


@functools.lru_cache(maxsize=4)
def _special_texts(tokenizer: Any) -> tuple[str, ...]:
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    texts.update(t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special)
    return tuple(sorted((t for t in texts if t), key=len, reverse=True))


def _has_special_text(tokenizer: Any, messages: list[dict[str, Any]]) -> bool:
    specials = _special_texts(tokenizer)
    return any(isinstance(m.get("content"), str) and any(s in m["content"] for s in specials) for m in messages)


def encode_chat(tokenizer: Any, messages: list[dict[str, Any]], render: Callable[[list[dict[str, Any]]], str],
                add_special_tokens: bool, allow_special_in_content: bool) -> tuple[str, list[int]]:
    """(rendered text, token ids). Content holding special-token text is tokenized as plain text.

    Such content is swapped for a placeholder while the template renders; the pieces around the
    placeholders are tokenized as usual and each message's own text with special tokens split.
    """
    if allow_special_in_content or not _has_special_text(tokenizer, messages):
        text = render(messages)
        return text, list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    tag = f"kcmsg{uuid.uuid4().hex}x"
    contents: dict[str, str] = {}
    placeheld = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, str) and content:
            contents[f"{tag}{index}{tag}"] = content
            message = {**message, "content": f"{tag}{index}{tag}"}
        placeheld.append(message)
    rendered = render(placeheld)
    ids = list(tokenizer.encode("", add_special_tokens=True)) if add_special_tokens else []
    pieces = re.split(f"({tag}\\d+{tag})", rendered)
    texts = []
    for piece in pieces:
        if piece in contents:
            content = contents[piece]
            ids += tokenizer(content, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            texts.append(content)
        elif piece:
            ids += tokenizer.encode(piece, add_special_tokens=False)
            texts.append(piece)
    return "".join(texts), ids
