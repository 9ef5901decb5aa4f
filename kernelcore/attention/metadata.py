"""Per-step attention metadata for a flattened batch (no padding).

Sequence i owns query rows ``query_start_loc[i]:query_start_loc[i+1]``: a prefill chunk
(possibly starting mid-sequence) or one decode token. Its keys are positions
``0 .. seq_lens[i]-1``; the first ``context_lens[i]`` of them are already in the paged cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot written by each new token
    query_start_loc: torch.Tensor  # [num_seqs + 1] int64
    seq_lens: torch.Tensor  # [num_seqs] int64: context + new tokens
    context_lens: torch.Tensor  # [num_seqs] int64: tokens already cached before this step
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int64, padded with 0
    query_lens_list: list[int]  # host copies: backends loop over prefills without a device sync
    seq_lens_list: list[int]
    max_query_len: int
    max_seq_len: int
    scratch: dict = field(default_factory=dict)  # per-step values a backend computes once and reuses in every layer

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.numel())

    @property
    def is_all_decode(self) -> bool:
        return self.max_query_len == 1
