"""Paged attention for a flattened batch of prefill chunks and decodes, in one launch.

Grid: (query tiles, kv heads). A query tile is BLOCK_Q consecutive query tokens of one sequence times the
NUM_QUERIES_PER_KV query heads sharing a kv head (GQA packed into the M dimension, so decodes still
feed tl.dot 16 rows). Tiles are numbered ``query_start_loc[i] // BLOCK_Q + i + j``: an upper bound of
``num_tokens // BLOCK_Q + num_seqs`` programs, each finding its sequence by binary search, no host sync.
Keys are read TILE_N at a time through the block table (any block size), with an online softmax in fp32
(exp2), fp32 accumulation, and the causal limit ``key position <= context_len + query index``. With a
sliding window W (a compile-time constant) a query at p also needs ``key position > p - W``, and the key loop
starts at the tile's first visible key: the blocks behind the window are never read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _find_seq(query_start_loc_ptr, q_tile, num_seqs, BLOCK_Q: tl.constexpr):
    left = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_tile:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit
def _paged_attention_kernel(
        out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, scale,
        num_seqs, stride_q_tok, stride_q_head, stride_o_tok, stride_o_head, stride_k_block, stride_k_slot,
        stride_k_head, stride_v_block, stride_v_slot, stride_v_head, stride_bt,
        NUM_QUERIES_PER_KV: tl.constexpr, HEAD_SIZE: tl.constexpr, HEAD_SIZE_PADDED: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, TILE_N: tl.constexpr,
        SLIDING_WINDOW: tl.constexpr):
    q_tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_seq(query_start_loc_ptr, q_tile, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tile_in_seq = q_tile - (q_start // BLOCK_Q + seq)
    if tile_in_seq * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    q_idx = tile_in_seq * BLOCK_Q + rows // NUM_QUERIES_PER_KV
    head = kv_head * NUM_QUERIES_PER_KV + rows % NUM_QUERIES_PER_KV
    row_ok = (rows // NUM_QUERIES_PER_KV < BLOCK_Q) & (q_idx < q_len)
    d = tl.arange(0, HEAD_SIZE_PADDED)
    d_ok = d < HEAD_SIZE
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + (q_start + q_idx)[:, None] * stride_q_tok + head[:, None] * stride_q_head + d[None, :],
                mask=q_mask, other=0.0)
    q_pos = context_len + q_idx

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_SIZE_PADDED], tl.float32)
    qk_scale = scale * 1.4426950408889634  # softmax in base 2
    num_keys = tl.minimum(context_len + (tile_in_seq + 1) * BLOCK_Q, seq_len)  # the tile's last row sees these
    first_key = 0
    if SLIDING_WINDOW > 0:  # the tile's first row sees keys after context_len + tile_in_seq * BLOCK_Q - W
        first_key = tl.maximum(context_len + tile_in_seq * BLOCK_Q - SLIDING_WINDOW + 1, 0)
    for start in range(first_key, num_keys, TILE_N):
        n = start + tl.arange(0, TILE_N)
        n_ok = n < num_keys
        block = tl.load(block_tables_ptr + seq * stride_bt + n // BLOCK_SIZE, mask=n_ok, other=0)
        slot = n % BLOCK_SIZE
        k = tl.load(k_cache_ptr + (block * stride_k_block + slot * stride_k_slot + kv_head * stride_k_head)[None, :]
                    + d[:, None], mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        s = tl.dot(q, k) * qk_scale
        visible = (n[None, :] <= q_pos[:, None]) & n_ok[None, :]
        if SLIDING_WINDOW > 0:
            visible = visible & (n[None, :] > q_pos[:, None] - SLIDING_WINDOW)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m - m_safe)
        row_sum = row_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + (block * stride_v_block + slot * stride_v_slot + kv_head * stride_v_head)[:, None]
                    + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = acc / tl.where(row_sum > 0.0, row_sum, 1.0)[:, None]
    tl.store(out_ptr + (q_start + q_idx)[:, None] * stride_o_tok + head[:, None] * stride_o_head + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, max_query_len,
                    max_seq_len, scale, out=None, sliding_window=None):
    """query [T, H, D]; caches [num_blocks, block_size, Hkv, D] -> out [T, H, D] (see kernelcore.kernels)."""
    num_tokens, num_heads, head_size = query.shape
    num_seqs, block_size, num_kv_heads = seq_lens.shape[0], key_cache.shape[1], key_cache.shape[2]
    out = torch.empty_like(query) if out is None else out
    if num_tokens == 0:
        return out
    assert query.stride(-1) == 1 and key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1
    queries_per_kv = num_heads // num_kv_heads
    # Decodes: as few rows as tl.dot takes; prefill chunks: taller tiles, so each K/V tile serves more queries.
    block_m = max(16, triton.next_power_of_2(queries_per_kv)) if max_query_len == 1 else \
        max(64, triton.next_power_of_2(queries_per_kv))
    block_q = block_m // queries_per_kv
    head_size_padded = max(16, triton.next_power_of_2(head_size))
    tile_n = 32 if head_size_padded > 128 else 64
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _paged_attention_kernel[grid](
        out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, num_seqs,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), key_cache.stride(0), key_cache.stride(1),
        key_cache.stride(2), value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0), NUM_QUERIES_PER_KV=queries_per_kv, HEAD_SIZE=head_size,
        HEAD_SIZE_PADDED=head_size_padded, BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_Q=block_q,
        TILE_N=tile_n, SLIDING_WINDOW=sliding_window or 0, num_warps=4, num_stages=2)
    return out
