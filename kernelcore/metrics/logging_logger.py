"""The built-in logging stat logger: one line every few seconds while the engine works."""

from __future__ import annotations

import logging
import time
from typing import Any

from kernelcore.contract.stat_logger import StatLoggerBase

logger = logging.getLogger("kernelcore.metrics")


class LoggingStatLogger(StatLoggerBase):
    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self._reset(time.monotonic())
        self.last = None
        self.num_preemptions_total = 0

    def _reset(self, now: float) -> None:
        self.since = now
        self.num_prompt_tokens = self.num_generation_tokens = 0
        self.num_queries = self.num_hits = 0

    def record(self, stats: Any) -> None:
        self.last = stats
        self.num_prompt_tokens += stats.num_prompt_tokens
        self.num_generation_tokens += stats.num_generation_tokens
        self.num_queries += stats.num_prefix_cache_queries
        self.num_hits += stats.num_prefix_cache_hits
        self.num_preemptions_total += stats.num_preemptions

    def format_line(self, now: float) -> str | None:
        if self.last is None or (self.num_prompt_tokens == 0 and self.num_generation_tokens == 0
                                 and self.last.num_running == 0):
            return None  # idle: stay quiet
        elapsed = max(now - self.since, 1e-9)
        hit_rate = 100.0 * self.num_hits / self.num_queries if self.num_queries else 0.0
        return (f"Avg prompt throughput: {self.num_prompt_tokens / elapsed:.1f} tokens/s, "
                f"Avg generation throughput: {self.num_generation_tokens / elapsed:.1f} tokens/s, "
                f"Running: {self.last.num_running} reqs, Waiting: {self.last.num_waiting} reqs, "
                f"KV cache usage: {100.0 * self.last.kv_cache_usage:.1f}%, Prefix cache hit rate: {hit_rate:.1f}%, "
                f"Preemptions: {self.num_preemptions_total}")

    def log(self) -> None:
        now = time.monotonic()
        line = self.format_line(now)
        if line is not None:
            logger.info(line)
        self._reset(now)
