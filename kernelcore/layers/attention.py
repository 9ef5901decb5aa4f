"""The Attention layer: the platform picks the backend, the layer owns its slice of the paged KV cache."""

from __future__ import annotations

import torch
from torch import nn

from kernelcore.attention.selector import AttentionSelector, get_attn_backend
from kernelcore.config import get_current_config
from kernelcore.forward_context import get_forward_context


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 prefix: str = "") -> None:
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.layer_name = prefix
        dtype = str(torch.get_default_dtype()).removeprefix("torch.")
        self.selector = AttentionSelector(head_size, num_heads, self.num_kv_heads, dtype,
                                          get_current_config().cache.block_size)
        self.backend = get_attn_backend(self.selector)
        self.impl = self.backend.make_impl(num_heads, head_size, scale, self.num_kv_heads)
        self.kv_cache: torch.Tensor | None = None  # bound by the model runner

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.impl.forward(q, k, v, self.kv_cache, get_forward_context().attn_metadata)
