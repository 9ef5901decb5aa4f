"""Per-request timings, recorded by the front end when a request finishes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FinishedRequestStats:
    finish_reason: str  # "stop" | "length" | "abort"
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0  # summed over the request's n choices
    max_tokens: int | None = None
    n: int = 1
    e2e_latency: float = 0.0  # seconds, arrival to finish
    queue_time: float = 0.0  # arrival to first scheduled
    time_to_first_token: float = 0.0
    prefill_time: float = 0.0  # first scheduled to first token
    decode_time: float = 0.0  # first token to finish
    inter_token_latencies: list[float] = field(default_factory=list)
