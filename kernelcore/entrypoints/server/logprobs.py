"""Logprobs in the two OpenAI shapes: chat ``{"content": [...]}`` and legacy completions ``{"tokens", ...}``."""

from __future__ import annotations

import math
from typing import Any

from kernelcore.engine.outputs import Logprob

FLOOR = -9999.0  # what OpenAI sends instead of -inf (JSON has no infinity)


def _value(logprob: float) -> float:
    return FLOOR if math.isinf(logprob) or math.isnan(logprob) else max(logprob, FLOOR)


def token_str(tokenizer: Any, token_id: int, entry: Logprob | None, as_ids: bool) -> str:
    if as_ids or tokenizer is None:  # a checkpoint without a tokenizer: ids are all there is
        return f"token_id:{token_id}"
    if entry is not None and entry.decoded_token is not None:
        return entry.decoded_token
    return tokenizer.decode([token_id])


def _ranked(entries: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
    return sorted(entries.items(), key=lambda item: -item[1].logprob)


def chat_logprobs(tokenizer: Any, token_ids: list[int], entries: list[dict[int, Logprob]], k: int,
                  as_ids: bool) -> dict[str, Any]:
    content = []
    for token_id, by_id in zip(token_ids, entries, strict=False):
        token = token_str(tokenizer, token_id, by_id.get(token_id), as_ids)
        sampled = by_id.get(token_id)
        content.append({
            "token": token, "logprob": _value(sampled.logprob if sampled else -math.inf),
            "bytes": list(token.encode("utf-8")),
            "top_logprobs": [{"token": (t := token_str(tokenizer, tid, lp, as_ids)), "logprob": _value(lp.logprob),
                              "bytes": list(t.encode("utf-8"))} for tid, lp in _ranked(by_id)[:k]],
        })
    return {"content": content}


def completion_logprobs(tokenizer: Any, token_ids: list[int], entries: list[dict[int, Logprob] | None], k: int,
                        offset: int, as_ids: bool) -> dict[str, Any]:
    """``entries[i]`` None (the first prompt token with echo) gives null logprob and top_logprobs."""
    result: dict[str, list] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for token_id, by_id in zip(token_ids, entries, strict=False):
        sampled = by_id.get(token_id) if by_id else None
        token = token_str(tokenizer, token_id, sampled, as_ids)
        result["text_offset"].append(offset)
        result["tokens"].append(token)
        offset += len(token)
        if by_id is None:
            result["token_logprobs"].append(None)
            result["top_logprobs"].append(None)
            continue
        result["token_logprobs"].append(_value(sampled.logprob) if sampled else FLOOR)
        top = {token_str(tokenizer, tid, lp, as_ids): _value(lp.logprob) for tid, lp in _ranked(by_id)[:k]}
        top.setdefault(token, result["token_logprobs"][-1])
        result["top_logprobs"].append(top)
    return result


def merge_completion_logprobs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    return {key: first[key] + second[key] for key in first}
