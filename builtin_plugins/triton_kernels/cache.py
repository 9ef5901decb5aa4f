"""reshape_and_cache: write each new token's K and V rows into its paged-cache slot."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
                              stride_key, stride_value, stride_kc_block, stride_kc_slot, stride_vc_block,
                              stride_vc_slot, row_size, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    for start in range(0, row_size, TILE):
        i = start + tl.arange(0, TILE)
        mask = i < row_size
        k = tl.load(key_ptr + token * stride_key + i, mask=mask)
        v = tl.load(value_ptr + token * stride_value + i, mask=mask)
        tl.store(key_cache_ptr + block * stride_kc_block + offset * stride_kc_slot + i,
                 k.to(key_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(value_cache_ptr + block * stride_vc_block + offset * stride_vc_slot + i,
                 v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[T, Hkv, D] with each token's Hkv*D values contiguous (a column slice of the qkv output is)."""
    if x.stride(-1) != 1 or x.stride(-2) != x.shape[-1]:
        x = x.contiguous()
    return x


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    key, value = _rows(key), _rows(value)
    row_size = key.shape[1] * key.shape[2]
    assert key_cache.stride(1) == row_size and key_cache.stride(-1) == 1, "cache slots must be contiguous"
    tile = min(triton.next_power_of_2(row_size), 4096)
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping, key.stride(0), value.stride(0), key_cache.stride(0),
        key_cache.stride(1), value_cache.stride(0), value_cache.stride(1), row_size,
        BLOCK_SIZE=key_cache.shape[1], TILE=tile, num_warps=4)
