"""Per-step state the model reads without threading it through every forward (nano-vllm's context)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from kernelcore.attention.metadata import AttentionMetadata


@dataclass
class ForwardContext:
    attn_metadata: AttentionMetadata | None = None
    token_lora_ids: torch.Tensor | None = None  # [num_tokens] adapter index per token; None = no LoRA


_context = ForwardContext()


def get_forward_context() -> ForwardContext:
    return _context


@contextlib.contextmanager
def set_forward_context(attn_metadata: AttentionMetadata | None,
                        token_lora_ids: torch.Tensor | None = None) -> Iterator[ForwardContext]:
    global _context
    previous, _context = _context, ForwardContext(attn_metadata, token_lora_ids)
    try:
        yield _context
    finally:
        _context = previous
