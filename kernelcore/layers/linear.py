"""Linear layers that shard over the tensor-parallel group; with one rank they are plain linears.

Each parameter carries a ``weight_loader(param, loaded_weight[, shard_id])`` that
copies this rank's slice of a full checkpoint tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernelcore.distributed import get_tp_group


def copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"shape mismatch: checkpoint slice {tuple(src.shape)} vs parameter {tuple(dst.shape)}")
    dst.copy_(src)


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
    copy_checked(param.data, loaded_weight)


_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
# oneDNN's bf16 linear needs avx512bw/vl/dq or avx_ne_convert; other CPUs keep bf16 on F.linear
_PREPACK_DTYPES = (torch.float32, torch.bfloat16) if _ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported() \
    else (torch.float32,)


def fast_linear(module: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear``; on CPU (fp32/bf16, no autograd) through oneDNN with the weight prepacked once per module.

    Prepacking skips MKL's per-call repacking of the weight: 1.5-2x the GFLOP/s of ``F.linear`` at decode
    batch sizes (8-128 rows), equal numerics within fp32 rounding (docs/performance.md). The packed copy is
    rebuilt when the weight changes (version counter / storage), and is not part of the state dict."""
    if (not _ONEDNN or x.device.type != "cpu" or weight.dtype not in _PREPACK_DTYPES
            or x.dtype != weight.dtype or (weight.requires_grad and torch.is_grad_enabled())):
        return F.linear(x, weight, bias)
    key = (weight.data_ptr(), None if weight.is_inference() else weight._version, weight.shape)
    packed = module.__dict__.get("_onednn_weight")
    if packed is None or packed[0] != key:
        with torch.no_grad():
            packed = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach()))
        module.__dict__["_onednn_weight"] = packed
    return torch.ops.mkldnn._linear_pointwise(x, packed[1], bias, "none", [], "")


def divide(a: int, b: int) -> int:
    assert a % b == 0, f"{a} is not divisible by {b}"
    return a // b


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool = False, tp_dim: int | None = None) -> None:
        super().__init__()
        tp = get_tp_group()
        self.tp_dim, self.tp_rank, self.tp_size = tp_dim, tp.rank, tp.world_size
        self.input_size, self.output_size = input_size, output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, *args) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fast_linear(self, x, self.weight, self.bias)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        copy_checked(param.data, loaded_weight)


class ColumnParallelLinear(LinearBase):
    """Output features split over ranks; each rank returns its slice (no gather)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        tp_size = get_tp_group().world_size
        super().__init__(input_size, divide(output_size, tp_size), bias, tp_dim=0)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        shard = param.data.size(self.tp_dim)
        if self.tp_size > 1:
            loaded_weight = loaded_weight.narrow(self.tp_dim, self.tp_rank * shard, shard)
        copy_checked(param.data, loaded_weight)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused in one matmul (gate_up_proj); shard_id indexes them."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: int) -> None:
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        dst = param.data.narrow(self.tp_dim, offset, size)
        if self.tp_size > 1:
            loaded_weight = loaded_weight.narrow(self.tp_dim, self.tp_rank * size, size)
        copy_checked(dst, loaded_weight)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections fused; heads split over ranks, kv heads replicated when fewer than ranks."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: int | None = None, bias: bool = False) -> None:
        tp_size = get_tp_group().world_size
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.head_size, self.total_num_heads, self.total_num_kv_heads = head_size, total_num_heads, total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp_size)
        if total_num_kv_heads >= tp_size:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size)
        else:
            assert tp_size % total_num_kv_heads == 0
            self.num_kv_heads = 1
        self.q_size, self.kv_size = self.num_heads * head_size, self.num_kv_heads * head_size
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp_size
        super().__init__(hidden_size, output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str) -> None:
        if shard_id == "q":
            offset, size, rank = 0, self.q_size, self.tp_rank
        else:
            offset = self.q_size + (self.kv_size if shard_id == "v" else 0)
            size = self.kv_size
            rank = self.tp_rank * self.total_num_kv_heads // self.tp_size if self.total_num_kv_heads < self.tp_size \
                else self.tp_rank
        dst = param.data.narrow(self.tp_dim, offset, size)
        if self.tp_size > 1:
            loaded_weight = loaded_weight.narrow(self.tp_dim, rank * size, size)
        copy_checked(dst, loaded_weight)


class RowParallelLinear(LinearBase):
    """Input features split over ranks; partial products are all-reduced (bias added once)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        tp_size = get_tp_group().world_size
        super().__init__(divide(input_size, tp_size), output_size, bias, tp_dim=1)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        if param.dim() == 2 and self.tp_size > 1:
            shard = param.data.size(1)
            loaded_weight = loaded_weight.narrow(1, self.tp_rank * shard, shard)
        copy_checked(param.data, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return fast_linear(self, x, self.weight, self.bias)
        y = fast_linear(self, x, self.weight, self.bias if self.tp_rank == 0 else None)
        return get_tp_group().all_reduce(y)
