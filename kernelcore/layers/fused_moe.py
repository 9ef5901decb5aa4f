"""Mixture-of-experts: top-k routing and the experts' SwiGLU MLPs as one custom op.

Each rank holds every expert's slice of the intermediate dimension (gate/up column-split, down row-split,
the partial outputs all-reduced), so tensor parallelism splits the expert work evenly whatever the routing.
On CPU the token-expert assignments are grouped by expert (one sort), each active expert runs one batched
matmul pair over its tokens, and the weighted rows are summed back per token: a loop over the experts that
received tokens, never over tokens. On CPU and CUDA the platform's ``fused_moe`` kernel-table entry runs (the CPU
platform's prepacks the expert weights for oneDNN); ``forward_native`` is the reference."""

from __future__ import annotations

import torch
from torch import nn

from kernelcore.custom_op import CustomOp
from kernelcore.distributed import get_tp_group
from kernelcore.kernels import kernel_table
from kernelcore.kernels import torch_fused_moe as grouped_experts  # the math lives with the kernel table
from kernelcore.layers.linear import copy_checked, divide


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] in the logits' dtype, expert ids [T, k] int64): softmax over all experts in float32, the
    top k, renormalised to sum to 1 when the checkpoint asks (Mixtral always, Qwen3-MoE by norm_topk_prob)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


@CustomOp.register("fused_moe")
class FusedMoE(CustomOp):
    """``forward(x [T, H], router_logits [T, E]) -> [T, H]``; parameters w13_weight [E, 2I/tp, H] (gate rows,
    then up rows) and w2_weight [E, H, I/tp], loaded per expert by ``weight_loader(param, w, expert, shard)``
    with shard "w1" (gate), "w3" (up) or "w2" (down)."""

    kernel_names = ("fused_moe",)

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool) -> None:
        super().__init__()
        tp = get_tp_group()
        self.tp_rank, self.tp_size = tp.rank, tp.world_size
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.intermediate_per_rank = divide(intermediate_size, self.tp_size)
        inter = self.intermediate_per_rank
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, inter), requires_grad=False)
        setattr(self.w13_weight, "weight_loader", self.weight_loader)
        setattr(self.w2_weight, "weight_loader", self.weight_loader)
        self.loaded_shards: set[tuple[int, str]] = set()

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, expert: int, shard: str) -> None:
        inter = self.intermediate_per_rank
        if shard == "w2":  # [H, I]: this rank's columns
            copy_checked(param.data[expert], loaded_weight.narrow(1, self.tp_rank * inter, inter))
        else:  # [I, H]: this rank's rows, into the gate (w1) or up (w3) half
            dst = param.data[expert].narrow(0, 0 if shard == "w1" else inter, inter)
            copy_checked(dst, loaded_weight.narrow(0, self.tp_rank * inter, inter))
        self.loaded_shards.add((expert, shard))

    @property
    def is_fully_loaded(self) -> bool:
        return len(self.loaded_shards) == 3 * self.num_experts

    def _reduce(self, out: torch.Tensor) -> torch.Tensor:
        return get_tp_group().all_reduce(out) if self.tp_size > 1 else out

    def forward_native(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(router_logits, self.top_k, self.renormalize)
        return self._reduce(grouped_experts(x, self.w13_weight, self.w2_weight, weights, ids))

    def forward_cuda(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(router_logits, self.top_k, self.renormalize)
        return self._reduce(kernel_table.get("fused_moe")(x, self.w13_weight, self.w2_weight, weights, ids))

    def forward_cpu(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        # the CPU platform's kernel-table entry (prepacked expert weights) once the platform has installed it
        if self._uses_overridden_kernels():
            return self.forward_cuda(x, router_logits)
        return self.forward_native(x, router_logits)
