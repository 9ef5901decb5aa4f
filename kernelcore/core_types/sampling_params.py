"""SamplingParams: plain data (msgspec) so it crosses process boundaries unchanged."""

from __future__ import annotations

import math

import msgspec

from kernelcore.contract.structured_output_params import StructuredOutputsParams

MAX_SEED = 2**63 - 1


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # top-k logprobs of each sampled token (0 = the sampled token only)
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (clamped to [-100, 100])
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    output_kind: str = "cumulative"  # "cumulative" | "delta" | "final_only"
    structured_outputs: StructuredOutputsParams | None = None  # constrained decoding (JSON schema, regex, ...)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s] or None
        self.stop_token_ids = list(self.stop_token_ids or []) or None
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if self.top_k == 0:
            self.top_k = -1
        self.verify()

    def verify(self) -> None:
        checks = [
            (self.n >= 1, f"n must be at least 1, got {self.n}"),
            (self.temperature >= 0.0, f"temperature must be non-negative, got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= -1, f"top_k must be -1 (disable), or at least 1, got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2.0 <= self.frequency_penalty <= 2.0,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (self.repetition_penalty > 0.0,
             f"repetition_penalty must be greater than zero, got {self.repetition_penalty}"),
            (self.max_tokens is None or self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.min_tokens >= 0, f"min_tokens must be greater than or equal to 0, got {self.min_tokens}"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens,
             f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}"),
            (self.logprobs is None or self.logprobs >= 0, f"logprobs must be non-negative, got {self.logprobs}"),
            (self.prompt_logprobs is None or self.prompt_logprobs >= 0,
             f"prompt_logprobs must be non-negative, got {self.prompt_logprobs}"),
            (self.seed is None or -MAX_SEED - 1 <= self.seed <= MAX_SEED, f"seed must fit in int64, got {self.seed}"),
            (self.output_kind in ("cumulative", "delta", "final_only"), f"unknown output_kind {self.output_kind!r}"),
            (self.allowed_token_ids is None or len(self.allowed_token_ids) > 0, "allowed_token_ids must not be empty"),
        ]
        for is_ok, message in checks:
            if not is_ok:
                raise ValueError(message)
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.logit_bias and not all(math.isfinite(v) for v in self.logit_bias.values()):
            raise ValueError("logit_bias values must be finite numbers")
        for name in ("n", "top_k", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not -MAX_SEED - 1 <= value <= MAX_SEED:
                raise ValueError(f"{name} must fit in a 64-bit integer, got {value}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def stop_buffer_length(self) -> int:
        if not self.stop or self.include_stop_str_in_output:
            return 0
        return max(len(s) for s in self.stop) - 1

    def clone(self, **changes) -> SamplingParams:
        return msgspec.structs.replace(self, **changes)
