"""The Attention layer: the platform picks the backend, the layer owns its slice of the paged KV cache."""

from __future__ import annotations

import torch
from torch import nn

from kernelcore.attention.selector import AttentionSelector, get_attn_backend
from kernelcore.contract.config import get_current_config
from kernelcore.forward_context import get_forward_context


class Attention(nn.Module):
    """``sliding_window``: each query sees only the keys of its last ``sliding_window`` positions (itself
    included), as transformers' sliding-window mask; a backend that cannot do that refuses the model."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 prefix: str = "", sliding_window: int | None = None) -> None:
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.layer_name = prefix
        self.sliding_window = sliding_window
        dtype = str(torch.get_default_dtype()).removeprefix("torch.")
        self.selector = AttentionSelector(head_size, num_heads, self.num_kv_heads, dtype,
                                          get_current_config().cache.block_size, sliding_window=sliding_window)
        self.backend = get_attn_backend(self.selector)
        if sliding_window is not None and not getattr(self.backend, "supports_sliding_window", False):
            raise ValueError(
                f"layer {prefix or '?'} uses sliding-window attention (window {sliding_window} tokens), which the "
                f"{self.backend.get_name()} attention backend cannot compute: refusing to serve the model "
                "inexactly (use a platform whose attention backend sets supports_sliding_window)")
        self.impl = self.backend.make_impl(num_heads, head_size, scale, self.num_kv_heads)
        self.impl.sliding_window = sliding_window
        self.kv_cache: torch.Tensor | None = None  # bound by the model runner

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        metadata = get_forward_context().attn_metadata
        if metadata is None:
            raise RuntimeError(f"attention layer {self.layer_name!r} ran outside a model-runner forward (no metadata)")
        return self.impl.forward(q, k, v, self.kv_cache, metadata)
