"""Built-in reasoning parsers: deepseek_r1 and qwen3 (``<think>...</think>``)."""

from __future__ import annotations

from kernelcore.entrypoints.reasoning_parsers import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek-R1's template opens ``<think>`` itself: output before ``</think>`` is thinking, tag or not."""

    name = "deepseek_r1"
    starts_inside = True


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3 writes ``<think>...</think>`` itself; an output without ``<think>`` is all answer."""

    name = "qwen3"
