"""The CPU attention backend: paged KV cache, batched decode, causal prefill chunks from any offset.

Cache layout (get_kv_cache_shape): [2, num_blocks, num_kv_heads, block_size, head_size], the keys of each
(block, kv head) stored transposed as [head_size, block_size]. Decode runs the native kernel
(builtin_plugins/cpu/native.py) when it could be built, torch ops otherwise; prefill runs torch's flash kernel.
A sliding-window layer reads only the blocks its window reaches (the engine frees the ones behind it).
"""

from __future__ import annotations

import itertools
from typing import cast

import torch

from builtin_plugins.cpu.native import load_paged_decode_kernel
from kernelcore.attention.backend import AttentionBackend, AttentionImpl
from kernelcore.attention.metadata import AttentionMetadata

_flash_attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # returns (out, logsumexp)


class CpuAttentionImpl(AttentionImpl):
    group_bytes = 2 << 20

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int) -> None:
        super().__init__(num_heads, head_size, scale, num_kv_heads)
        kernel = load_paged_decode_kernel()  # None: no compiler here, the torch paths below run
        self.native_decode = kernel if kernel is not None and kernel.supports_heads(num_heads, num_kv_heads) else None

    def _native(self, dtype: torch.dtype, cache_dtype: torch.dtype):
        """The native kernel when it handles this layer, its activations' dtype and its cache's, else None."""
        kernel = self.native_decode
        return kernel if kernel is not None and kernel.supports_dtype(dtype, cache_dtype) else None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                metadata: AttentionMetadata) -> torch.Tensor:
        num_tokens, num_kv_heads, head_size = q.shape[0], self.num_kv_heads, self.head_size
        q = q.reshape(num_tokens, self.num_heads, head_size)
        k = k.reshape(num_tokens, num_kv_heads, head_size)
        v = v.reshape(num_tokens, num_kv_heads, head_size)
        if kv_cache is None:
            return self._prefill_no_cache(q, k, v, metadata)
        k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, Hkv, block_size, D]; keys stored transposed
        self._write_kv(k, v, k_cache, v_cache, metadata)
        if metadata.is_all_decode:
            return self._decode(q, k_cache, v_cache, metadata.block_tables, metadata.seq_lens,
                                metadata.max_seq_len, metadata.scratch).view(num_tokens, -1)
        out = torch.empty_like(q)
        query_lens, seq_lens = metadata.query_lens_list, metadata.seq_lens_list
        starts = metadata.query_start_loc.tolist()
        decodes = [i for i, n in enumerate(query_lens) if n == 1]
        if decodes:
            idx = torch.tensor(decodes)
            rows = metadata.query_start_loc[idx]
            max_len = max(seq_lens[i] for i in decodes)
            if "decode_idx" not in metadata.scratch:
                metadata.scratch["decode_idx"] = (metadata.block_tables[idx], metadata.seq_lens[idx])
            block_tables, decode_seq_lens = metadata.scratch["decode_idx"]
            out[rows] = self._decode(q[rows], k_cache, v_cache, block_tables, decode_seq_lens, max_len,
                                     metadata.scratch)
        block_size = k_cache.shape[2]
        keys_t = _keys_transposed(k_cache)
        for i, num_q in enumerate(query_lens):
            if num_q == 1:
                continue
            s, seq_len = starts[i], seq_lens[i]
            context_len = seq_len - num_q
            if self.sliding_window is not None:
                out[s:s + num_q] = self._windowed_chunk(q[s:s + num_q], k[s:s + num_q], v[s:s + num_q], keys_t,
                                                        v_cache, metadata.block_tables[i], context_len)
                continue
            if context_len == 0:
                out[s:s + num_q] = self._causal(q[s:s + num_q], k[s:s + num_q], v[s:s + num_q])
                continue
            # A chunk after cached tokens (chunked prefill, prefix-cache hit): only the cached prefix is gathered.
            blocks = metadata.block_tables[i, : -(-context_len // block_size)]
            # [Hkv, C, D], made contiguous: the flash kernel misreads a last dimension with stride != 1
            k_prefix = keys_t[blocks].permute(1, 0, 3, 2).flatten(1, 2)[:, :context_len].to(q.dtype).contiguous()
            v_prefix = v_cache[blocks].transpose(0, 1).flatten(1, 2)[:, :context_len].to(q.dtype)
            out[s:s + num_q] = self._chunk_after_prefix(q[s:s + num_q], k[s:s + num_q], v[s:s + num_q],
                                                        k_prefix, v_prefix)
        return out.view(num_tokens, -1)

    def _write_kv(self, k, v, k_cache, v_cache, metadata) -> None:
        """Each new token's key into column ``offset`` of its block's [D, block_size] key slab, its value
        into row ``offset`` of the [block_size, D] value slab."""
        kernel = self._native(k.dtype, k_cache.dtype)
        if kernel is not None:
            return kernel.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        if "slot_block" not in metadata.scratch:  # once per step, shared by every layer
            block_size = k_cache.shape[2]
            metadata.scratch["slot_block"] = (metadata.slot_mapping // block_size, metadata.slot_mapping % block_size)
        blocks, offsets = metadata.scratch["slot_block"]
        _keys_transposed(k_cache)[blocks, :, :, offsets] = k.to(k_cache.dtype)
        v_cache[blocks, :, offsets] = v.to(v_cache.dtype)

    # Prefill goes through torch's flash-attention CPU kernel without a mask: an explicit mask (or 3-D inputs,
    # or enable_gqa) sends scaled_dot_product_attention to its slow math path (2-3x slower at 512 tokens).
    def _flash(self, q, k, v, is_causal: bool):
        """q [H', Lq, D], k/v [H', Lk, D] (same heads) -> (out [H', Lq, D], log-sum-exp [H', Lq] float32)."""
        out, lse = _flash_attention(q[None], k[None], v[None], 0.0, is_causal, scale=self.scale)
        return out[0], lse[0]

    def _heads_first(self, x):
        """[L, Hkv, D] -> [H, L, D], each kv head repeated for its query group (the new tokens only: small)."""
        x = x.transpose(0, 1)
        group = self.num_heads // self.num_kv_heads
        return x if group == 1 else x.repeat_interleave(group, dim=0)

    def _causal(self, q, k, v):
        """A chunk starting at position 0: q [L, H, D], k/v [L, Hkv, D] -> [L, H, D]."""
        return self._flash(q.transpose(0, 1), self._heads_first(k), self._heads_first(v), True)[0].transpose(0, 1)

    def _chunk_after_prefix(self, q, k, v, k_prefix, v_prefix):
        """New tokens q/k/v [Lq, ...] after C cached ones (k/v_prefix [Hkv, C, D]) -> [Lq, H, D].

        Split in two maskless flash calls merged by their log-sum-exps: every query sees the whole prefix
        (no mask; the GQA group folds into the query rows, so K/V are not repeated), and the new tokens
        attend to each other causally."""
        num_q, num_heads, head_size = q.shape
        num_kv_heads = self.num_kv_heads
        group = num_heads // num_kv_heads
        q_folded = q.view(num_q, num_kv_heads, group, head_size).permute(1, 2, 0, 3).reshape(
            num_kv_heads, group * num_q, head_size)
        out_prefix, lse_prefix = self._flash(q_folded, k_prefix, v_prefix, False)
        out_prefix = out_prefix.reshape(num_heads, num_q, head_size)
        lse_prefix = lse_prefix.reshape(num_heads, num_q)
        out_new, lse_new = self._flash(q.transpose(0, 1), self._heads_first(k), self._heads_first(v), True)
        lse = torch.logaddexp(lse_prefix, lse_new)
        out = out_prefix.float().mul_((lse_prefix - lse).exp_()[..., None])
        out.add_(out_new.float().mul_((lse_new - lse).exp_()[..., None]))
        return out.to(q.dtype).transpose(0, 1)

    def _prefill_no_cache(self, q, k, v, metadata):
        out = torch.empty_like(q)
        starts = metadata.query_start_loc.tolist()
        for s, e in itertools.pairwise(starts):
            if self.sliding_window is not None:
                out[s:e] = self._windowed(q[s:e], k[s:e], v[s:e])
            else:
                out[s:e] = self._causal(q[s:e], k[s:e], v[s:e])
        return out.view(q.shape[0], -1)

    def _windowed_chunk(self, q, k, v, keys_t, v_cache, block_table, context_len):
        """A prefill chunk of a sliding-window layer: the cached keys its first query still sees (from the
        block holding position context_len - window + 1 on), then the chunk's own."""
        window, block_size = self.sliding_window, v_cache.shape[2]
        first = max(0, context_len - window + 1) // block_size
        num_blocks = -(-context_len // block_size)
        if num_blocks > first:
            blocks = block_table[first:num_blocks]
            length = context_len - first * block_size
            k_prefix = keys_t[blocks].permute(0, 3, 1, 2).flatten(0, 1)[:length].to(k.dtype)  # [C, Hkv, D]
            v_prefix = v_cache[blocks].transpose(1, 2).flatten(0, 1)[:length].to(v.dtype)
            k, v = torch.cat([k_prefix, k]), torch.cat([v_prefix, v])
        return self._windowed(q, k, v)

    def _windowed(self, q, k, v):
        """q [Lq, H, D] over consecutive keys k/v [Lk, Hkv, D] whose last Lq are the queries' own: an explicitly
        masked attention, the query at p seeing keys p - window + 1 .. p. Queries go a window's worth at a time,
        each block against the keys its window reaches (under 2 windows): a prompt of L tokens then costs
        L x 2W scores instead of L x L (Gemma 3's 512-token local layers at 2048 tokens: 2.1 s of a 5.6 s
        prefill before)."""
        num_q, num_k, window = q.shape[0], k.shape[0], cast(int, self.sliding_window)
        if num_q <= window:
            return self._windowed_block(q, k, v, num_k - num_q)
        out = torch.empty_like(q)
        offset = num_k - num_q  # the position of the first query
        for s in range(0, num_q, window):
            e = min(s + window, num_q)
            first = max(0, offset + s - window + 1)  # the first key the block's first query sees
            out[s:e] = self._windowed_block(q[s:e], k[first:offset + e], v[first:offset + e], offset + s - first)
        return out

    def _windowed_block(self, q, k, v, first_query: int):
        """q [Lq, H, D], the queries at positions first_query .. first_query + Lq - 1 of the keys k/v [Lk, Hkv, D]
        (Lk = first_query + Lq)."""
        window = cast(int, self.sliding_window)
        q_pos = torch.arange(first_query, first_query + q.shape[0])[:, None]
        k_pos = torch.arange(k.shape[0])[None, :]
        mask = (k_pos <= q_pos) & (k_pos > q_pos - window)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), self._heads_first(k), self._heads_first(v), attn_mask=mask, scale=self.scale)
        return out.transpose(0, 1)

    def _decode(self, q, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scratch):
        """One query per sequence: the native kernel reads each cached K/V row once, in place."""
        kernel = self._native(q.dtype, k_cache.dtype)
        if kernel is not None:
            return kernel(q, k_cache, v_cache, block_tables, seq_lens, self.scale, self.sliding_window)
        return self._decode_torch(q, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scratch)

    def _decode_torch(self, q, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scratch):
        """The path without the native kernel: each sequence's blocks gathered into [B, Hkv, D, L] keys and
        [B, Hkv, L, D] values, then a masked matmul-softmax-matmul over the padded length."""
        num_seqs, (_, num_kv_heads, block_size, head_size) = q.shape[0], v_cache.shape
        num_blocks = -(-max_seq_len // block_size)
        window = self.sliding_window
        if window is not None:  # only the blocks the window reaches, from each sequence's first visible one
            num_blocks = min(num_blocks, -(-window // block_size) + 1)
        length = num_blocks * block_size
        key = ("decode_bias", max_seq_len, block_tables.data_ptr(), window)
        if key not in scratch:  # the tables and the length (and window) mask, once per step for all layers
            if window is None:
                tables, positions = block_tables[:, :num_blocks], torch.arange(length)[None, :]
            else:
                first = (seq_lens - window).clamp_(min=0) // block_size
                index = (first[:, None] + torch.arange(num_blocks)).clamp_(max=block_tables.shape[1] - 1)
                tables = block_tables.gather(1, index)
                positions = first[:, None] * block_size + torch.arange(length)
            hidden = positions >= seq_lens[:, None]
            if window is not None:
                hidden |= positions < seq_lens[:, None] - window
            bias = torch.zeros(num_seqs, 1, 1, length, dtype=q.dtype)
            bias.masked_fill_(hidden[:, None, None, :], float("-inf"))
            scratch[key] = (tables, bias)
        (tables, bias), keys_t = scratch[key], _keys_transposed(k_cache)
        qg = q.view(num_seqs, num_kv_heads, -1, head_size)  # GQA: a kv head's query group shares its keys
        out = torch.empty_like(qg)
        # Sequences in groups whose gathered K/V stay in cache (~2 MiB) between the gather and the matmuls.
        group = max(1, self.group_bytes // (2 * num_kv_heads * length * head_size * q.element_size()))
        for s in range(0, num_seqs, group):
            e = min(s + group, num_seqs)
            blocks = tables[s:e]
            keys = keys_t[blocks].permute(0, 2, 3, 1, 4).reshape(e - s, num_kv_heads, head_size, length).to(q.dtype)
            values = v_cache[blocks].transpose(1, 2).reshape(e - s, num_kv_heads, length, head_size).to(q.dtype)
            scores = torch.matmul(qg[s:e], keys).mul_(self.scale).add_(bias[s:e])
            torch.matmul(torch.softmax(scores, dim=-1), values, out=out[s:e])
        return out.view(num_seqs, self.num_heads, head_size)


def _keys_transposed(k_cache: torch.Tensor) -> torch.Tensor:
    """The key cache as stored: [num_blocks, Hkv, D, block_size]."""
    num_blocks, num_kv_heads, block_size, head_size = k_cache.shape
    return k_cache.view(num_blocks, num_kv_heads, head_size, block_size)


class CpuAttentionBackend(AttentionBackend):
    supports_sliding_window = True
    supported_kv_cache_dtypes = ("float32", "bfloat16")  # (bfloat16 under float32 activations: the native kernel)

    @staticmethod
    def get_name() -> str:
        return "CPU_SDPA"

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return CpuAttentionImpl

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """Head-major blocks: values [block_size, D] per (block, kv head); keys use the same memory as
        [D, block_size] (a decode query then meets a whole block of keys per vector step)."""
        return (2, num_blocks, num_kv_heads, block_size, head_size)
