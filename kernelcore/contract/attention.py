"""What a platform is asked to choose an attention backend for (``get_attn_backend_cls``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionSelector:
    head_size: int
    num_heads: int
    num_kv_heads: int
    dtype: str  # "float32", "bfloat16", ...
    block_size: int
    kv_cache_dtype: str = "auto"
    sliding_window: int | None = None  # the layer attends to its last N positions only
