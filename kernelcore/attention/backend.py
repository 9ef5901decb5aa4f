"""The attention backend contract: a named factory of implementations and the KV-cache layout."""

from __future__ import annotations

import torch

from kernelcore.attention.metadata import AttentionMetadata


class AttentionImpl:
    sliding_window: int | None = None  # set by the Attention layer: attend to the last N positions only

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int) -> None:
        self.num_heads, self.head_size, self.scale, self.num_kv_heads = num_heads, head_size, scale, num_kv_heads

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                metadata: AttentionMetadata) -> torch.Tensor:
        """q [T, H*D], k/v [T, Hkv*D] -> [T, H*D]; writes k/v at ``metadata.slot_mapping`` first.

        ``kv_cache`` is [2, num_blocks, block_size, num_kv_heads, head_size], or None when no
        cache is bound (a profiling run: every sequence is then a prefill from position 0).
        """
        raise NotImplementedError


class AttentionBackend:
    supports_sliding_window = False  # True: the impl honours ``sliding_window`` (else such models are refused)
    # KV-cache element types (CacheConfig.kv_cache_dtype) the impl reads and writes besides the model's dtype
    supported_kv_cache_dtypes: tuple[str, ...] = ()

    @staticmethod
    def get_name() -> str:
        raise NotImplementedError

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        raise NotImplementedError

    @classmethod
    def make_impl(cls, num_heads: int, head_size: int, scale: float, num_kv_heads: int) -> AttentionImpl:
        return cls.get_impl_cls()(num_heads, head_size, scale, num_kv_heads)

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)
