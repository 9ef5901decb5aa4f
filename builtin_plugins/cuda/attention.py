"""The Triton attention backend: one kernel-table launch writes the new K/V rows, one attends.

It runs whatever the kernel table holds under ``reshape_and_cache`` and ``paged_attention``: the Triton
kernels on a GPU (or under TRITON_INTERPRET=1), the torch references where a platform overrode them.
"""

from __future__ import annotations

import torch

from kernelcore.attention.backend import AttentionBackend, AttentionImpl
from kernelcore.attention.metadata import AttentionMetadata
from kernelcore.kernels import kernel_table


class TritonAttentionImpl(AttentionImpl):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor | None,
                metadata: AttentionMetadata) -> torch.Tensor:
        num_tokens = q.shape[0]
        q = q.view(num_tokens, self.num_heads, self.head_size)
        k = k.view(num_tokens, self.num_kv_heads, self.head_size)
        v = v.view(num_tokens, self.num_kv_heads, self.head_size)
        if kv_cache is None:
            key_cache, value_cache = k.unsqueeze(1), v.unsqueeze(1)  # each token its own block of one slot
            block_tables, seq_lens = self._contiguous_tables(metadata)
        else:
            key_cache, value_cache = kv_cache[0], kv_cache[1]
            kernel_table.get("reshape_and_cache")(k, v, key_cache, value_cache, metadata.slot_mapping)
            block_tables, seq_lens = metadata.block_tables, metadata.seq_lens
        out = torch.empty(num_tokens, self.num_heads, self.head_size, dtype=q.dtype, device=q.device)
        window = {} if self.sliding_window is None else {"sliding_window": self.sliding_window}
        kernel_table.get("paged_attention")(q, key_cache, value_cache, block_tables, seq_lens,
                                            metadata.query_start_loc, metadata.max_query_len, metadata.max_seq_len,
                                            self.scale, out=out, **window)
        return out.view(num_tokens, -1)

    @staticmethod
    def _contiguous_tables(metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """No cache bound (a profiling run): every sequence is a prefill whose keys are its own rows."""
        if "triton_no_cache" not in metadata.scratch:
            starts = metadata.query_start_loc
            offsets = torch.arange(metadata.max_query_len, device=starts.device)
            block_tables = (starts[:-1, None] + offsets[None, :]).clamp_(max=max(metadata.num_tokens - 1, 0))
            metadata.scratch["triton_no_cache"] = (block_tables, starts[1:] - starts[:-1])
        return metadata.scratch["triton_no_cache"]


class TritonAttentionBackend(AttentionBackend):
    supports_sliding_window = True

    @staticmethod
    def get_name() -> str:
        return "TRITON_PAGED"

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return TritonAttentionImpl
