"""What the scheduler sends the workers each step (broadcast to every tensor-parallel rank)."""

from __future__ import annotations

import msgspec

from kernelcore.core_types.sampling_params import SamplingParams


class NewRequestData(msgspec.Struct, array_like=True):
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    lora_id: int = 0
    eos_token_id: int | None = None
    num_prompt_tokens: int = -1  # of prompt_token_ids; the rest were produced before (a resumed request); -1: all


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
    # sampling requests under a grammar constraint, in bitmask row order; a request with drafts has one row per
    # position it samples at (1 + its drafts), consecutively
    grammar_req_ids: list[str] = []
    grammar_bitmask: bytes = b""  # int32 [len(grammar_req_ids), ceil(vocab / 32)]; bit set = token allowed
    # speculative decoding: draft tokens to verify after a request's last token (counted in num_scheduled_tokens);
    # the worker computes them with it and samples at each of the 1 + len(drafts) positions
    draft_token_ids: dict[str, list[int]] = {}
