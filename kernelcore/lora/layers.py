"""A LoRA-aware wrapper around a column- or row-parallel linear: every slot's A/B stacked, one batched delta.

For ``S`` slots and ``n`` packed slices (q/k/v -> 3, gate/up -> 2) of rank ``r`` each, ``lora_a`` is
``[n*S*r, in]``, slice-major (one shrink matmul for every slot and slice), and slice ``i`` has its own
``lora_b_i`` ``[out_i, S*r]``: the expand reads slice ``i`` of the shrink as a strided view, no copy. Per
step the model runner sets one adapter index per token; the manager turns it into ``scales [T, S]`` (the
slot's scaling on the token's own slot, zero elsewhere), so
``delta_i = ((x @ A.T) * scales)_i @ B_i.T`` picks each token's adapter without a loop over requests.
A and B are sharded like the base weight: column layers split B's rows (the layer's own ``weight_loader``
places q/k/v and gate/up rows); row layers split A's columns, so their ``x @ A.T`` is a partial sum,
all-reduced (a small ``[T, S*n*r]`` tensor) before the replicated B.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from kernelcore.distributed import get_tp_group
from kernelcore.layers.linear import LinearBase, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear


def slice_rows(base: LinearBase, num_slices: int) -> list[tuple[int, int]]:
    """This rank's output rows of each packed slice."""
    if num_slices == 1:
        return [(0, base.output_size)]
    if isinstance(base, QKVParallelLinear):
        sizes = [base.q_size, base.kv_size, base.kv_size]
    else:  # MergedColumnParallelLinear
        sizes = [size // base.tp_size for size in cast(MergedColumnParallelLinear, base).output_sizes]
    ends = list(accumulate(sizes))
    return [(end - size, end) for size, end in zip(sizes, ends, strict=True)]


def full_features(base: LinearBase, index: int) -> tuple[int, int]:
    """(in_features, out_features) of packed slice ``index`` before tensor-parallel sharding: the shape of
    the checkpoint's weight, hence of a PEFT adapter's A [r, in] and B [out, r] for that module."""
    in_features, out_features = base.input_size, base.output_size
    if base.tp_dim == 1:  # row parallel: the input features are split
        return in_features * base.tp_size, out_features
    if base.tp_dim is None:  # replicated
        return in_features, out_features
    if isinstance(base, QKVParallelLinear):
        heads = base.total_num_heads if index == 0 else base.total_num_kv_heads
        return in_features, heads * base.head_size
    sizes = getattr(base, "output_sizes", None)  # MergedColumnParallelLinear: unsharded sizes
    return in_features, sizes[index] if sizes is not None else out_features * base.tp_size


class LoRALinear(nn.Module):
    lora_a: torch.Tensor  # a registered buffer

    def __init__(self, base: LinearBase, shard_ids: list[Any], num_slots: int, max_rank: int,
                 token_scales: Callable[[], torch.Tensor | None]) -> None:
        super().__init__()
        self.base, self.shard_ids, self.token_scales = base, shard_ids, token_scales
        self.is_row = isinstance(base, RowParallelLinear)
        self.num_slots, self.max_rank, self.num_slices = num_slots, max_rank, len(shard_ids)
        self.rows = slice_rows(base, self.num_slices)
        like: dict[str, Any] = dict(dtype=getattr(base, "params_dtype", base.weight.dtype), device=base.weight.device)
        self.register_buffer("lora_a", torch.zeros(num_slots * self.num_slices * max_rank, base.input_size, **like),
                             persistent=False)
        self.lora_b = [torch.zeros(end - start, num_slots * max_rank, **like) for start, end in self.rows]
        for i, b in enumerate(self.lora_b):
            self.register_buffer(f"lora_b_{i}", b, persistent=False)
        self.is_slot_set = [False] * num_slots

    def set_slot(self, slot: int, pairs: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Load one adapter's (A, B) per slice (None: slice not targeted) into ``slot``, sharded for this rank."""
        self.clear_slot(slot)
        base, r = self.base, self.max_rank
        for i, (shard_id, pair, (start, end)) in enumerate(zip(self.shard_ids, pairs, self.rows, strict=True)):
            if pair is None:
                continue
            lora_a, lora_b = (t.to(self.lora_a.dtype) for t in pair)
            rank = lora_a.shape[0]
            a_rows = slice((i * self.num_slots + slot) * r, (i * self.num_slots + slot) * r + rank)
            b_cols = slice(slot * r, slot * r + rank)
            if self.is_row:  # A split along the input features like the weight; B replicated
                shard = torch.empty(rank, base.input_size, dtype=lora_a.dtype)
                base.weight_loader(shard, lora_a)
                self.lora_a[a_rows] = shard
                self.lora_b[i][:, b_cols] = lora_b
            else:  # A replicated; B's rows placed and split exactly as the weight's
                shard = torch.zeros(base.output_size, rank, dtype=lora_b.dtype)
                base.weight_loader(shard, lora_b, *(() if shard_id is None else (shard_id,)))
                self.lora_a[a_rows] = lora_a
                self.lora_b[i][:, b_cols] = shard[start:end]
        self.is_slot_set[slot] = any(p is not None for p in pairs)

    def clear_slot(self, slot: int) -> None:
        r = self.max_rank
        for i, b in enumerate(self.lora_b):
            self.lora_a[(i * self.num_slots + slot) * r:(i * self.num_slots + slot + 1) * r].zero_()
            b[:, slot * r:(slot + 1) * r].zero_()
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
        shrink = shrink.view(num_tokens, self.num_slices, self.num_slots, self.max_rank) * scales[:, None, :, None]
        y = base(x)
        for i, (start, end) in enumerate(self.rows):  # q/k/v or gate/up: at most three slices
            y[:, start:end].addmm_(shrink[:, i].flatten(1), self.lora_b[i].t())
        return y
