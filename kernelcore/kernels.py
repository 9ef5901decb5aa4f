"""The named kernel table: kernels contributed by plugins, replaceable by the platform.

General plugins fill it in ``register_kernels``; a worker's platform may then
swap entries in ``register_triton_kernel_overrides`` before any model code
runs. ``kernel_table.get(name)`` is what layers and attention backends call. The table's type is
:class:`kernelcore.contract.kernels.KernelTable`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from kernelcore.contract.kernels import DIRECT, KernelEntry, KernelTable, OwnedView

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("kernelcore.kernels")

__all__ = ["DIRECT", "KernelEntry", "KernelTable", "OwnedView", "kernel_table"]


kernel_table = KernelTable()


# -- the named kernels: their contract and torch reference implementations ------------------------------
#
# paged_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, max_query_len,
#                 max_seq_len, scale, out=None[, sliding_window=W]) -> out
#     query [T, H, D]; caches [num_blocks, block_size, Hkv, D]; sequence i owns query rows
#     query_start_loc[i]:query_start_loc[i+1], the last of its seq_lens[i] positions (a decode token or a
#     prefill chunk starting mid-sequence), and attends causally to the keys the cache holds for it.
#     sliding_window (passed only by sliding-window layers): the query at p sees keys p - W + 1 .. p only,
#     and block-table entries wholly before that must not be read (the engine may have reused them).
# reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None
#     key/value [T, Hkv, D]: row t is written at cache slot slot_mapping[t] (block * block_size + offset);
#     a negative slot is skipped.
# rms_norm(x, weight, eps) -> out
# fused_add_rms_norm(x, residual, weight, eps) -> (out, residual): residual += x in place, then its RMSNorm.
# rotary_embedding(positions, query, key, cos_sin_cache, head_size, rotary_dim) -> (query, key)
#     neox-style rotation in place of query [T, H*D] and key [T, Hkv*D]; cos_sin_cache [max_pos, rotary_dim]
#     holds the cosines of the rotary_dim/2 frequencies, then the sines.
# silu_and_mul(x) -> silu(x[..., :d]) * x[..., d:]
# gelu_tanh_and_mul(x) -> gelu(x[..., :d], approximate="tanh") * x[..., d:]
# fused_moe(x, w13, w2, topk_weights, topk_ids) -> out
#     x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_weights [T, k] (x's dtype) and
#     topk_ids [T, k] int64: out[t] = sum_k topk_weights[t, k] * w2[e] (silu(w13[e, :I] x_t) * w13[e, I:] x_t).


def torch_paged_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, max_query_len,
                          max_seq_len, scale, out=None, sliding_window=None):
    import torch
    import torch.nn.functional as F

    out = torch.empty_like(query) if out is None else out
    block_size, num_heads, num_kv_heads = key_cache.shape[1], query.shape[1], key_cache.shape[2]
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        s, e = starts[i], starts[i + 1]
        if e == s:
            continue
        pos = torch.arange(seq_len - (e - s), seq_len, device=query.device)
        first = 0 if sliding_window is None else max(0, seq_len - (e - s) - sliding_window + 1) // block_size
        blocks = block_tables[i, first: -(-seq_len // block_size)]
        keys = key_cache[blocks].flatten(0, 1)[:seq_len - first * block_size]
        values = value_cache[blocks].flatten(0, 1)[:seq_len - first * block_size]
        key_pos = torch.arange(first * block_size, seq_len, device=query.device)[None, :]
        mask = key_pos <= pos[:, None]
        if sliding_window is not None:
            mask &= key_pos > pos[:, None] - sliding_window
        o = F.scaled_dot_product_attention(query[s:e].transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                                           attn_mask=mask, scale=scale, enable_gqa=num_heads != num_kv_heads)
        out[s:e] = o.transpose(0, 1)
    return out


def torch_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slots, key[keep].to(key_cache.dtype))
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slots, value[keep].to(value_cache.dtype))


def torch_rms_norm(x, weight, eps):
    import torch

    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def torch_fused_add_rms_norm(x, residual, weight, eps):
    residual.add_(x)
    return torch_rms_norm(residual, weight, eps), residual


def torch_rotary_embedding(positions, query, key, cos_sin_cache, head_size, rotary_dim):
    import torch

    cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
    half = rotary_dim // 2
    for x in (query, key):
        x = x.view(x.shape[0], -1, head_size)
        x1, x2 = x[..., :half], x[..., half:rotary_dim]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        x[..., :rotary_dim] = rotated
    return query, key


def torch_silu_and_mul(x):
    import torch.nn.functional as F

    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def torch_gelu_tanh_and_mul(x):
    import torch.nn.functional as F

    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


def _expert_linear(rows: torch.Tensor, weight: torch.Tensor, expert: int) -> torch.Tensor:
    import torch.nn.functional as F

    return F.linear(rows, weight[expert])


def torch_fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor,
                    linear: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] = _expert_linear) -> torch.Tensor:
    """sum_k weight[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = ids[t, k]; w13 [E, 2I, H], w2 [E, H, I].

    ``linear(rows, w, e)`` computes ``rows @ w[e].T``; a platform passes a faster one (prepacked weights)."""
    import torch
    import torch.nn.functional as F

    num_tokens, top_k = topk_ids.shape
    flat_ids = topk_ids.flatten()
    order = torch.argsort(flat_ids, stable=True)  # assignments grouped by expert
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    token_of = order // top_k
    rows = x[token_of]
    out_rows = torch.empty(rows.shape[0], w2.shape[1], dtype=x.dtype, device=x.device)
    inter = w2.shape[2]
    start = 0
    for expert, count in enumerate(counts):
        if count:
            h = linear(rows[start:start + count], w13, expert)
            h = F.silu(h[:, :inter]).mul_(h[:, inter:])
            out_rows[start:start + count] = linear(h, w2, expert)
            start += count
    out_rows.mul_(topk_weights.flatten()[order].unsqueeze(1))
    return torch.zeros(num_tokens, w2.shape[1], dtype=x.dtype, device=x.device).index_add_(0, token_of, out_rows)


TORCH_REFERENCE_KERNELS = {
    "paged_attention": torch_paged_attention,
    "reshape_and_cache": torch_reshape_and_cache,
    "rms_norm": torch_rms_norm,
    "fused_add_rms_norm": torch_fused_add_rms_norm,
    "rotary_embedding": torch_rotary_embedding,
    "silu_and_mul": torch_silu_and_mul,
    "gelu_tanh_and_mul": torch_gelu_tanh_and_mul,
    "fused_moe": torch_fused_moe,
}
"""name -> torch implementation: the CPU platform's overrides, and the reference the Triton kernels are tested
against."""
