"""The CPU attention backend: paged KV cache, batched decode, causal prefill chunks from any offset."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelcore.attention.backend import AttentionBackend, AttentionImpl
from kernelcore.attention.metadata import AttentionMetadata


class CpuAttentionImpl(AttentionImpl):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                metadata: AttentionMetadata) -> torch.Tensor:
        num_tokens, num_kv_heads, head_size = q.shape[0], self.num_kv_heads, self.head_size
        q = q.reshape(num_tokens, self.num_heads, head_size)
        k = k.reshape(num_tokens, num_kv_heads, head_size)
        v = v.reshape(num_tokens, num_kv_heads, head_size)
        if kv_cache is None:
            return self._prefill_no_cache(q, k, v, metadata)
        k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, Hkv, D]
        k_cache.view(-1, num_kv_heads, head_size).index_copy_(0, metadata.slot_mapping, k)
        v_cache.view(-1, num_kv_heads, head_size).index_copy_(0, metadata.slot_mapping, v)
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
        block_size = k_cache.shape[1]
        for i, num_q in enumerate(query_lens):
            if num_q == 1:
                continue
            s, seq_len = starts[i], seq_lens[i]
            context_len = seq_len - num_q
            if context_len == 0:
                out[s:s + num_q] = self._causal(q[s:s + num_q], k[s:s + num_q], v[s:s + num_q])
                continue
            blocks = metadata.block_tables[i, : -(-seq_len // block_size)]
            keys = k_cache[blocks].flatten(0, 1)[:seq_len]
            values = v_cache[blocks].flatten(0, 1)[:seq_len]
            pos = torch.arange(context_len, seq_len)
            mask = torch.arange(seq_len)[None, :] <= pos[:, None]
            out[s:s + num_q] = self._attend(q[s:s + num_q], keys, values, mask)
        return out.view(num_tokens, -1)

    def _attend(self, q, k, v, mask=None, is_causal=False):
        """q [Lq, H, D], k/v [Lk, Hkv, D] -> [Lq, H, D]."""
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                           is_causal=is_causal, scale=self.scale,
                                           enable_gqa=self.num_heads != self.num_kv_heads)
        return o.transpose(0, 1)

    def _causal(self, q, k, v):
        return self._attend(q, k, v, is_causal=True)

    def _prefill_no_cache(self, q, k, v, metadata):
        out = torch.empty_like(q)
        starts = metadata.query_start_loc.tolist()
        for s, e in zip(starts[:-1], starts[1:]):
            out[s:e] = self._causal(q[s:e], k[s:e], v[s:e])
        return out.view(q.shape[0], -1)

    def _decode(self, q, k_cache, v_cache, block_tables, seq_lens, max_seq_len, scratch):
        """One query per sequence. K/V rows are gathered straight into [B, Hkv, L, D] (one copy, rows
        indexed once per step for all layers), then a masked matmul-softmax-matmul over the padded length."""
        num_seqs, block_size = q.shape[0], k_cache.shape[1]
        num_kv_heads, head_size = self.num_kv_heads, self.head_size
        key = ("decode", num_kv_heads, max_seq_len, block_tables.data_ptr())
        if key not in scratch:
            num_blocks = -(-max_seq_len // block_size)
            length = num_blocks * block_size
            pos = torch.arange(length)
            slots = block_tables[:, :num_blocks].repeat_interleave(block_size, dim=1) * block_size + pos % block_size
            rows = slots[:, None, :] * num_kv_heads + torch.arange(num_kv_heads)[None, :, None]  # [B, Hkv, L]
            bias = torch.zeros(num_seqs, 1, 1, length, dtype=q.dtype)
            bias.masked_fill_((pos[None, :] >= seq_lens[:, None])[:, None, None, :], float("-inf"))
            scratch[key] = (rows.flatten(), bias, length)
        rows, bias, length = scratch[key]
        qg = q.view(num_seqs, num_kv_heads, -1, head_size)  # GQA: a kv head's query group shares its keys
        out = torch.empty_like(qg)
        # Sequences in groups whose gathered K/V stay in cache (~2 MiB) between the gather and the matmuls.
        group = max(1, (2 << 20) // (2 * num_kv_heads * length * head_size * q.element_size()))
        rows = rows.view(num_seqs, -1)
        for s in range(0, num_seqs, group):
            e = min(s + group, num_seqs)
            shape = (e - s, num_kv_heads, length, head_size)
            keys = k_cache.view(-1, head_size).index_select(0, rows[s:e].flatten()).view(shape)
            values = v_cache.view(-1, head_size).index_select(0, rows[s:e].flatten()).view(shape)
            scores = torch.matmul(qg[s:e], keys.transpose(-1, -2)).mul_(self.scale).add_(bias[s:e])
            torch.matmul(torch.softmax(scores, dim=-1), values, out=out[s:e])
        return out.view(num_seqs, self.num_heads, head_size)


class CpuAttentionBackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "CPU_SDPA"

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return CpuAttentionImpl
