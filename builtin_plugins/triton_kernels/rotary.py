"""Neox-style rotary embedding, in place on q and k: one program per token rotates all its heads."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate(x_ptr, num_heads, cos, sin, HEAD_SIZE: tl.constexpr, HALF: tl.constexpr, HALF_PADDED: tl.constexpr,
            HEADS_PADDED: tl.constexpr):
    h = tl.arange(0, HEADS_PADDED)
    j = tl.arange(0, HALF_PADDED)
    mask = (h < num_heads)[:, None] & (j < HALF)[None, :]
    first = x_ptr + h[:, None] * HEAD_SIZE + j[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, (x1 * cos[None, :] - x2 * sin[None, :]).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(first + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(positions_ptr, q_ptr, k_ptr, cache_ptr, stride_q, stride_k, stride_cache, num_heads, num_kv_heads,
                   HEAD_SIZE: tl.constexpr, HALF: tl.constexpr, HALF_PADDED: tl.constexpr,
                   HEADS_PADDED: tl.constexpr, KV_HEADS_PADDED: tl.constexpr):
    token = tl.program_id(0)
    pos = tl.load(positions_ptr + token)
    j = tl.arange(0, HALF_PADDED)
    cos = tl.load(cache_ptr + pos * stride_cache + j, mask=j < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
    _rotate(q_ptr + token * stride_q, num_heads, cos, sin, HEAD_SIZE, HALF, HALF_PADDED, HEADS_PADDED)
    _rotate(k_ptr + token * stride_k, num_kv_heads, cos, sin, HEAD_SIZE, HALF, HALF_PADDED, KV_HEADS_PADDED)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
                     head_size: int, rotary_dim: int):
    """query [T, H*D], key [T, Hkv*D] (column slices of the qkv output are fine): rotated in place."""
    if query.stride(-1) != 1:
        query = query.contiguous()
    if key.stride(-1) != 1:
        key = key.contiguous()
    num_tokens = positions.numel()
    if num_tokens == 0:
        return query, key
    num_heads, num_kv_heads = query.shape[-1] // head_size, key.shape[-1] // head_size
    half = rotary_dim // 2
    _rotary_kernel[(num_tokens,)](
        positions, query, key, cos_sin_cache, query.stride(0), key.stride(0), cos_sin_cache.stride(0), num_heads,
        num_kv_heads, HEAD_SIZE=head_size, HALF=half, HALF_PADDED=triton.next_power_of_2(half),
        HEADS_PADDED=triton.next_power_of_2(num_heads), KV_HEADS_PADDED=triton.next_power_of_2(num_kv_heads),
        num_warps=4)
    return query, key
