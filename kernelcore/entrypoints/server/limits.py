"""What one request may ask for: the server's caps (each a `kc serve` flag) and the model's context length."""

from __future__ import annotations

from dataclasses import dataclass

from kernelcore.entrypoints.server.errors import bad_request


@dataclass
class Limits:
    """Caps on what one request may ask for (each a `kc serve` flag)."""

    max_n: int = 16
    max_logprobs: int = 20
    max_stop_strings: int = 16
    max_stop_string_length: int = 256
    max_prompts: int = 64
    max_choices: int = 64  # prompts x n: sequences one request may start


def _check_logprobs(value: int | None, limits: Limits, what: str, param: str) -> None:
    if value is None:
        return
    if value < 0:
        raise bad_request(f"{param} must be non-negative, got {value}", param)
    if value > limits.max_logprobs:
        raise bad_request(f"Requested {what} logprobs of {value}, which is greater than max allowed: "
                          f"{limits.max_logprobs}", param)


def _check_max_tokens(value: int | None, echo: bool, param: str) -> int | None:
    if value is not None and (value < 0 or (value == 0 and not echo)):
        raise bad_request(f"{param} must be at least 1, got {value}", param)
    return value


def check_length(num_input_tokens: int, max_tokens: int | None, max_model_len: int, param: str = "max_tokens") -> None:
    if num_input_tokens >= max_model_len:
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens. However, your request has "
                          f"{num_input_tokens} input tokens. Please reduce the length of the input messages.",
                          "input_tokens")
    if max_tokens is not None and num_input_tokens + max_tokens > max_model_len:
        raise bad_request(f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                          f"context length is {max_model_len} tokens and your request has {num_input_tokens} input "
                          f"tokens ({max_tokens} > {max_model_len} - {num_input_tokens}).", param)
