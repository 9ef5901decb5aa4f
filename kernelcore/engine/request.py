"""Requests: the plain-data message a front end sends, and the engine core's live state."""

from __future__ import annotations

import enum
import time

import msgspec

from kernelcore.core_types.sampling_params import SamplingParams


class EngineCoreRequest(msgspec.Struct, kw_only=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    arrival_time: float = 0.0
    lora_id: int = 0
    parent_id: str | None = None  # parallel samples (n > 1) of one prompt share it
    # A request carried over from a lost data-parallel replica: the tokens it had produced there. It continues
    # after them (they count as output: max_tokens, min_tokens, penalties, the grammar, the seeded draws).
    output_token_ids: list[int] = []


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6  # failed alone (its adapter, ...): reported as an error, not as a finish reason

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


FINISH_REASONS = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
                  RequestStatus.FINISHED_ABORTED: "abort"}


class Request:
    def __init__(self, req: EngineCoreRequest, max_model_len: int) -> None:
        self.request_id = req.request_id
        self.sampling_params = req.sampling_params
        self.eos_token_id = req.eos_token_id
        self.lora_id = req.lora_id
        self.parent_id = req.parent_id
        self.arrival_time = req.arrival_time or time.time()
        self.num_prompt_tokens = len(req.prompt_token_ids)
        self.all_token_ids = [*req.prompt_token_ids, *req.output_token_ids]
        params = req.sampling_params
        self.max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - self.num_prompt_tokens
        self.stop_token_ids = set(params.stop_token_ids or ())
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hit at first admission
        self.num_sent_tokens = 0  # tokens the worker knows about
        self.num_preemptions = 0
        self.num_sent_blocks = 0
        self.is_resumed = False  # preempted after the workers saw it: they get a fresh block table
        self.block_ids: list[int] = []
        self.block_hashes: list[bytes] = []
        self.num_cached_blocks = 0  # leading blocks registered in the prefix cache
        self.num_window_freed = 0  # leading blocks freed behind the sliding window (NULL_BLOCK in block_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={len(self.block_ids)})")
