"""A LoRA-aware wrapper around a column- or row-parallel linear: every slot's A/B stacked, one batched delta.

For ``S`` slots and ``n`` packed slices (q/k/v -> 3) of rank ``r`` each, ``lora_a`` is ``[S*n*r, in]`` and
``lora_b`` is ``[out, S*n*r]`` (block-diagonal over the slices). Per step the model runner sets one adapter
index per token; the manager turns it into ``scales [T, S]`` (the slot's scaling on the token's own slot,
zero elsewhere), so ``delta = ((x @ A.T) * scales) @ B.T`` picks each token's adapter without a loop.
A and B are sharded like the base weight: column layers split B's rows; row layers split A's columns, so
their ``x @ A.T`` is a partial sum, all-reduced (a [T, S*n*r] tensor) before the replicated B.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from kernelcore.distributed import get_tp_group
from kernelcore.layers.linear import LinearBase, RowParallelLinear


class LoRALinear(nn.Module):
    def __init__(self, base: LinearBase, shard_ids: list[Any], num_slots: int, max_rank: int,
                 token_scales: Callable[[], torch.Tensor | None]) -> None:
        super().__init__()
        self.base, self.shard_ids, self.token_scales = base, shard_ids, token_scales
        self.is_row = isinstance(base, RowParallelLinear)
        self.num_slots, self.max_rank = num_slots, max_rank
        self.slot_width = len(shard_ids) * max_rank
        dtype = base.weight.dtype
        self.register_buffer("lora_a", torch.zeros(num_slots * self.slot_width, base.input_size, dtype=dtype),
                             persistent=False)
        self.register_buffer("lora_b", torch.zeros(base.output_size, num_slots * self.slot_width, dtype=dtype),
                             persistent=False)
        self.is_slot_set = [False] * num_slots

    def set_slot(self, slot: int, pairs: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Load one adapter's (A, B) per slice (None: slice not targeted) into ``slot``, sharded for this rank."""
        width, base = self.slot_width, self.base
        a = self.lora_a[slot * width:(slot + 1) * width]
        b = self.lora_b[:, slot * width:(slot + 1) * width]
        a.zero_()
        b.zero_()
        for i, (shard_id, pair) in enumerate(zip(self.shard_ids, pairs)):
            if pair is None:
                continue
            lora_a, lora_b = pair
            rank = lora_a.shape[0]
            cols = slice(i * self.max_rank, i * self.max_rank + rank)
            if self.is_row:  # A split along the input features like the weight; B replicated
                shard = torch.empty(rank, base.input_size, dtype=a.dtype)
                base.weight_loader(shard, lora_a.to(a.dtype))
                a[cols] = shard
                b[:, cols] = lora_b
            else:  # A replicated; B's rows placed and split exactly as the weight's (q/k/v, gate/up offsets)
                shard = torch.zeros(base.output_size, rank, dtype=b.dtype)
                args = () if shard_id is None else (shard_id,)
                base.weight_loader(shard, lora_b.to(b.dtype), *args)
                a[cols] = lora_a
                b[:, cols] = shard
        self.is_slot_set[slot] = any(p is not None for p in pairs)

    def clear_slot(self, slot: int) -> None:
        width = self.slot_width
        self.lora_a[slot * width:(slot + 1) * width].zero_()
        self.lora_b[:, slot * width:(slot + 1) * width].zero_()
        self.is_slot_set[slot] = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scales = self.token_scales()
        base = self.base
        if scales is None or not any(self.is_slot_set):
            return base(x)
        num_tokens = x.shape[0]
        shrink = F.linear(x, self.lora_a)
        if self.is_row and base.tp_size > 1:
            shrink = get_tp_group().all_reduce(shrink)
        shrink = (shrink.view(num_tokens, self.num_slots, self.slot_width) * scales.unsqueeze(-1)).view(num_tokens, -1)
        return base(x).addmm_(shrink, self.lora_b.t())
