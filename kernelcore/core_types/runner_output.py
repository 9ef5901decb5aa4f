"""What the workers' rank 0 returns to the engine core each step."""

from __future__ import annotations

import msgspec


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
    # speculative decoding: the drafts each request accepted this step, in order; they come before its sampled token
    accepted_draft_ids: dict[str, list[int]] = {}
    accepted_draft_logprobs: dict[str, list[TokenLogprobs]] = {}  # per accepted draft, when logprobs are asked
