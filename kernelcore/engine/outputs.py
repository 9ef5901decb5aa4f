"""Plain-data (msgspec) messages: engine core -> front end, and the user-facing RequestOutput.

The scheduler -> worker and worker -> engine core messages live in kernelcore.core_types."""

from __future__ import annotations

import msgspec

from kernelcore.core_types.runner_output import TokenLogprobs
from kernelcore.metrics.stats import EngineStats

# -- engine core -> front end ----------------------------------------------------------------------------------


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    new_logprobs: list[TokenLogprobs] | None = None
    new_prompt_logprobs: list[TokenLogprobs] | None = None
    num_cached_tokens: int = 0

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


class EngineCoreOutputs(msgspec.Struct):
    outputs: list[EngineCoreOutput]
    stats: EngineStats | None = None
    timestamp: float = 0.0
    errors: dict[str, str] = {}  # requests that failed alone this step (their own state): id -> message


# -- user facing ------------------------------------------------------------------------------------------------


class Logprob(msgspec.Struct, array_like=True):
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


class CompletionOutput(msgspec.Struct, kw_only=True):
    index: int
    text: str
    token_ids: list[int]
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


class RequestOutput(msgspec.Struct, kw_only=True):
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None = None
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
