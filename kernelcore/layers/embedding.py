"""Vocabulary-parallel embedding and LM head: each rank holds a contiguous slice of the vocabulary."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from kernelcore.distributed import get_tp_group
from kernelcore.layers.linear import LinearMethodBase, copy_checked, make_linear_method


class VocabParallelEmbedding(nn.Module):
    weight: nn.Parameter

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        tp = get_tp_group()
        self.tp_rank, self.tp_size = tp.rank, tp.world_size
        self.num_embeddings = num_embeddings
        self.num_embeddings_per_partition = -(-num_embeddings // self.tp_size)  # padded when not divisible
        self.vocab_start_idx = self.num_embeddings_per_partition * self.tp_rank
        self.vocab_end_idx = min(self.vocab_start_idx + self.num_embeddings_per_partition, num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.num_embeddings_per_partition, embedding_dim), requires_grad=False)
        setattr(self.weight, "weight_loader", self.weight_loader)
        self.params_dtype = torch.get_default_dtype()
        method = make_linear_method()  # a method that stores embeddings its own way looks their rows up too
        self.quant_method: LinearMethodBase | None = method if method.quantizes_embeddings else None

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        if self.tp_size == 1:
            copy_checked(param.data, loaded_weight)
            return
        if loaded_weight.size(0) != self.num_embeddings:
            raise ValueError(f"shape mismatch: checkpoint {tuple(loaded_weight.shape)} vs vocab {self.num_embeddings}")
        size = self.vocab_end_idx - self.vocab_start_idx
        param.data[size:].zero_()
        copy_checked(param.data[:size], loaded_weight.narrow(0, self.vocab_start_idx, size))

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of this rank's slice of the vocabulary."""
        method = self.quant_method
        return F.embedding(ids, self.weight) if method is None else method.embedding(self, ids)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.lookup(x)
        mask = (x >= self.vocab_start_idx) & (x < self.vocab_end_idx)
        y = self.lookup((x - self.vocab_start_idx) * mask)
        y.mul_(mask.unsqueeze(-1).to(y.dtype))
        return get_tp_group().all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.params_dtype = torch.get_default_dtype()
        self.quant_method = make_linear_method()
        self.is_tied = False
        if bias:
            self.bias = nn.Parameter(torch.empty(self.num_embeddings_per_partition), requires_grad=False)
            setattr(self.bias, "weight_loader", self.weight_loader)
        else:
            self.register_parameter("bias", None)

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight
        self.is_tied = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = cast(LinearMethodBase, self.quant_method).apply(self, x, self.bias)
        if self.tp_size > 1:
            logits = get_tp_group().all_gather(logits, dim=-1)[..., : self.num_embeddings]
        return logits
