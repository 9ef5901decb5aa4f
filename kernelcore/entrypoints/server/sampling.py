"""A request's sampling fields -> the engine's :class:`SamplingParams` keyword arguments, each checked (a 400 names
the field): the sampling knobs, ``seed``, ``n``, stop strings and tokens, ``logit_bias``, ``allowed_token_ids``."""

from __future__ import annotations

import math
from typing import Any

from kernelcore.core_types.sampling_params import MAX_SEED
from kernelcore.entrypoints.server.errors import bad_request
from kernelcore.entrypoints.server.fields import _get, _int_list, _type_error, check_token_ids
from kernelcore.entrypoints.server.limits import Limits

INT64_MIN = -MAX_SEED - 1

SAMPLING_FIELDS = {  # name -> kind
    "temperature": "number", "top_p": "number", "top_k": "int", "min_p": "number", "seed": "int",
    "presence_penalty": "number", "frequency_penalty": "number", "repetition_penalty": "number",
    "min_tokens": "int", "ignore_eos": "bool", "include_stop_str_in_output": "bool", "skip_special_tokens": "bool",
}


def parse_sampling_fields(body: dict[str, Any], limits: Limits, vocab_size: int) -> dict[str, Any]:
    """The SamplingParams keyword arguments a chat or completion body asks for (``max_tokens`` aside)."""
    params: dict[str, Any] = {}
    for name, kind in SAMPLING_FIELDS.items():
        value = _get(body, name, kind)
        if value is not None:
            params[name] = value
    seed = params.get("seed")
    if seed is not None and seed > MAX_SEED:
        raise bad_request(f"seed: Input should be less than or equal to {MAX_SEED} [type=less_than_equal]", "seed")
    if seed is not None and seed < INT64_MIN:
        raise bad_request(f"seed: Input should be greater than or equal to {INT64_MIN} [type=greater_than_equal]",
                          "seed")
    n = _get(body, "n", "int", 1)
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}", "n")
    if n > limits.max_n:
        raise bad_request(f"n must be at most {limits.max_n} on this server, got {n}", "n")
    params["n"] = n

    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _type_error("stop", "a string or an array of strings", stop)
        if len(stop) > limits.max_stop_strings:
            raise bad_request(f"Too many stop strings: {len(stop)} (at most {limits.max_stop_strings})", "stop")
        if any(len(s) > limits.max_stop_string_length for s in stop):
            raise bad_request(f"Stop strings may be at most {limits.max_stop_string_length} characters long", "stop")
        params["stop"] = stop
    stop_token_ids = _int_list(body, "stop_token_ids")
    if stop_token_ids:
        check_token_ids(stop_token_ids, vocab_size, "stop_token_ids")
        params["stop_token_ids"] = stop_token_ids
    logit_bias = _get(body, "logit_bias", "dict")
    if logit_bias:
        params["logit_bias"] = _parse_logit_bias(logit_bias, vocab_size)
    allowed = _int_list(body, "allowed_token_ids")
    if allowed is not None:
        if not allowed:
            raise bad_request("allowed_token_ids must not be empty (omit it to allow every token)",
                              "allowed_token_ids")
        check_token_ids(allowed, vocab_size, "allowed_token_ids")
        params["allowed_token_ids"] = allowed
    return params


def _parse_logit_bias(value: dict[str, Any], vocab_size: int) -> dict[int, float]:
    """Token id (a decimal string key) -> a finite bias, clamped to [-100, 100] as OpenAI does."""
    bias = {}
    for key, amount in value.items():
        try:
            token_id = int(key)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids, got {key!r:.40}", "logit_bias") from None
        if not isinstance(amount, (int, float)) or isinstance(amount, bool) or not math.isfinite(amount):
            raise bad_request(f"logit_bias values must be finite numbers, got {amount!r:.40} for token {token_id}",
                              "logit_bias")
        bias[token_id] = min(max(float(amount), -100.0), 100.0)
    check_token_ids(list(bias), vocab_size, "logit_bias")
    return bias
