"""Linear layers that shard over the tensor-parallel group; with one rank they are plain linears.

Each parameter carries a ``weight_loader(param, loaded_weight[, shard_id])`` that
copies this rank's slice of a full checkpoint tensor.
"""

from __future__ import annotations

from typing import cast

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


class LinearMethodBase:
    """How a linear layer stores and multiplies its weight (one instance per layer, chosen by ``--quantization``).

    Layers are built and loaded in the model dtype (``layer.weight``); ``process_weights_after_loading`` may then
    replace it (quantize, repack). Methods come from the quantization registry (``register_quantization_methods``),
    where a platform may swap in its device's implementation.

    A method that sets ``quantizes_embeddings`` is given the token embeddings too, and looks rows up with
    ``embedding``; one that sets ``loads_gguf_blocks`` receives a GGUF checkpoint's quantized tensors as their
    stored blocks (kernelcore/models/gguf_params.py) instead of dequantized to float."""

    quantizes_embeddings = False
    loads_gguf_blocks = False

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        pass

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of an embedding layer's weight, [*ids.shape, dim] (only with ``quantizes_embeddings``)."""
        return F.embedding(ids, cast(torch.Tensor, layer.weight))

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError


class UnquantizedLinearMethod(LinearMethodBase):
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, cast(torch.Tensor, layer.weight), bias)


def quantize_int8_per_channel(weight: torch.Tensor,
                              amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one float32 scale per output row: (qweight int8 [out, in], scale [out])."""
    w = weight.float()
    if amax is None:
        amax = w.abs().amax(dim=1)
    scale = (amax.float() / 127.0).clamp(min=1e-12)
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


class Int8LinearMethod(LinearMethodBase):
    """Weight-only int8, per-output-channel scales, quantized at load from any fp16/bf16/fp32 checkpoint.

    ``apply`` here is the portable reference (dequantize, then ``F.linear`` in the activation dtype); a platform
    overrides it with an int8 matmul. A row-parallel shard takes each row's max over all ranks, so every TP size
    quantizes exactly as one rank does. A tied LM head keeps the shared float weight for the embedding."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight = cast(torch.Tensor, layer.weight).data
        amax = weight.float().abs().amax(dim=1)
        if getattr(layer, "tp_dim", None) == 1 and getattr(layer, "tp_size", 1) > 1:
            amax = get_tp_group().all_gather(amax.unsqueeze(1).contiguous(), dim=1).amax(dim=1)
        qweight, scale = quantize_int8_per_channel(weight, amax)
        setattr(layer, "params_dtype", weight.dtype)  # a dtype: nn.Module's __setattr__ is typed for tensors/modules
        layer.register_buffer("weight_scale", scale.to(weight.dtype), persistent=False)
        if getattr(layer, "is_tied", False):
            layer.register_buffer("qweight", qweight, persistent=False)
        else:
            layer.weight = nn.Parameter(qweight, requires_grad=False)
            layer.qweight = layer.weight

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        qweight, scale = cast(torch.Tensor, layer.qweight), cast(torch.Tensor, layer.weight_scale)
        return qweight.to(dtype) * scale.to(dtype).unsqueeze(1)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(layer, x.dtype), bias)


def make_linear_method() -> LinearMethodBase:
    """The method of the model being built (``config.model.quantization``; unquantized by default)."""
    from kernelcore.contract.config import get_current_config
    from kernelcore.quantization import make_linear_method as make

    return make(get_current_config().model.quantization)


def divide(a: int, b: int) -> int:
    assert a % b == 0, f"{a} is not divisible by {b}"
    return a // b


class LinearBase(nn.Module):
    weight: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, input_size: int, output_size: int, bias: bool = False, tp_dim: int | None = None) -> None:
        super().__init__()
        tp = get_tp_group()
        self.tp_dim, self.tp_rank, self.tp_size = tp_dim, tp.rank, tp.world_size
        self.input_size, self.output_size = input_size, output_size
        self.params_dtype = torch.get_default_dtype()
        self.quant_method = make_linear_method()
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        setattr(self.weight, "weight_loader", self.weight_loader)
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            setattr(self.bias, "weight_loader", self.weight_loader)
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor, *args) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, output_size, bias)

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        copy_checked(param.data, loaded_weight)


class ColumnParallelLinear(LinearBase):
    """Output features split over ranks; each rank returns its slice (no gather)."""

    tp_dim: int  # always 0 here

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        tp_size = get_tp_group().world_size
        super().__init__(input_size, divide(output_size, tp_size), bias, tp_dim=0)

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        shard = param.data.size(self.tp_dim)
        if self.tp_size > 1:
            loaded_weight = loaded_weight.narrow(self.tp_dim, self.tp_rank * shard, shard)
        copy_checked(param.data, loaded_weight)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused in one matmul (gate_up_proj); shard_id indexes them."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    # Reached through the parameter's weight_loader attribute with a shard id, never as a plain column loader.
    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int) -> None:  # type: ignore[override]
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

    # Reached through the parameter's weight_loader attribute with a shard id, never as a plain column loader.
    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: str) -> None:  # type: ignore[override]
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

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        if param.dim() == 2 and self.tp_size > 1:
            shard = param.data.size(1)
            loaded_weight = loaded_weight.narrow(1, self.tp_rank * shard, shard)
        copy_checked(param.data, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.quant_method.apply(self, x, self.bias)
        y = self.quant_method.apply(self, x, self.bias if self.tp_rank == 0 else None)
        return get_tp_group().all_reduce(y)
