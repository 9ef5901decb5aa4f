"""Plain-data (msgspec) messages: scheduler -> worker, worker -> engine core, engine core -> front end, and
the user-facing RequestOutput."""

from __future__ import annotations

import msgspec

from kernelcore.engine.sampling_params import SamplingParams
from kernelcore.metrics.stats import EngineStats


# -- scheduler -> workers (broadcast to every TP rank) --------------------------------------------------------


class NewRequestData(msgspec.Struct, array_like=True):
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    lora_id: int = 0
    eos_token_id: int | None = None


class CachedRequestData(msgspec.Struct, array_like=True):
    req_id: str
    new_token_ids: list[int]  # tokens sampled since the workers last saw this request
    new_block_ids: list[int]  # appended, or the whole table when is_resumed
    num_computed_tokens: int
    is_resumed: bool = False  # back from preemption: the block table is replaced


class SchedulerOutput(msgspec.Struct):
    new_reqs: list[NewRequestData]
    cached_reqs: list[CachedRequestData]
    num_scheduled_tokens: dict[str, int]  # in batch order
    total_num_scheduled_tokens: int
    finished_req_ids: list[str]  # finished or aborted since the last step: workers drop their state


# -- worker (rank 0) -> engine core ----------------------------------------------------------------------------


class TokenLogprobs(msgspec.Struct, array_like=True):
    token_ids: list[int]  # the sampled (or prompt) token first, then the top-k
    logprobs: list[float]
    rank: int  # rank of the first token (1 = most likely)


class ModelRunnerOutput(msgspec.Struct):
    req_ids: list[str]  # requests that got a new token this step
    sampled_token_ids: list[int]
    logprobs: dict[str, TokenLogprobs] = {}
    prompt_logprobs: dict[str, list[TokenLogprobs]] = {}  # per computed chunk, in prompt order
    # Requests left out of this step because of their own state; the scheduler fails them alone (reason for the client)
    failed: dict[str, str] = {}
    failed_loras: dict[int, str] = {}  # LoRA id -> reason: every request of the step using it failed


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
