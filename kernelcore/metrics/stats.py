"""Per-step engine statistics, fed to the stat loggers."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineStats:
    timestamp: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use
    num_prefix_cache_queries: int = 0  # prompt tokens looked up this step
    num_prefix_cache_hits: int = 0  # of which found in the cache
    num_preemptions: int = 0  # this step
    num_prompt_tokens: int = 0  # prompt tokens computed this step
    num_generation_tokens: int = 0  # tokens sampled this step
    num_finished: int = 0  # this step
    step_time: float = 0.0  # seconds spent in the step
    # tokens computed by each step this report covers (the engine-core process may merge the reports of steps
    # that had nothing to send)
    iteration_tokens: list[int] = field(default_factory=list)
    spec_num_drafts: int = 0  # speculative decoding: verifications (requests with drafts) this step
    spec_num_draft_tokens: int = 0  # draft tokens verified
    spec_num_accepted_tokens: int = 0  # of which accepted
    spec_accepted_per_pos: list[int] = field(default_factory=list)  # accepted drafts by position (0 = first)
    running_lora_adapters: list[str] = field(default_factory=list)  # names of adapters with running requests
    waiting_lora_adapters: list[str] = field(default_factory=list)
