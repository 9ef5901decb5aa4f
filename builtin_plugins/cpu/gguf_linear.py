"""GGUF quantized parts on the CPU: the native kernels of gguf_native.py over the stored blocks.

Registered over the portable ``gguf_<type>`` methods (``register_quantization_methods``, override=True). Per call
the kernel's ``choose`` picks, from the row count, the type and the CPU: the float kernel (blocks dequantized in
registers, dotted with the activations in float32), the integer one (activations quantized per block to int8 the
way llama.cpp does, integer dot products), or for prefill-sized calls a dequantization of the weight into a reused
buffer and oneDNN's GEMM. Where the kernel cannot be built, the pure-torch reference runs.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from builtin_plugins.cpu.gguf_native import GGUFKernel, load_gguf_kernel
from builtin_plugins.cpu.linear import _PACKED_DTYPES, _scratch_like
from builtin_plugins.quantization.gguf import GGUFBlocksMethod


def _dequant_linear(kernel: GGUFKernel, x: torch.Tensor, layer: nn.Module, bias: torch.Tensor | None) -> torch.Tensor:
    """Prefill-sized: the whole part dequantized (bf16 where oneDNN has a bf16 GEMM and x is bf16, else
    float32) into a buffer kept per thread, then one GEMM."""
    dtype = torch.bfloat16 if x.dtype == torch.bfloat16 and torch.bfloat16 in _PACKED_DTYPES else torch.float32
    weight = _scratch_like(torch.empty(layer.output_size, layer.input_size, device="meta"), dtype)
    kernel.dequantize(cast(torch.Tensor, layer.qweight), layer.gguf_type, weight)
    y = F.linear(x.to(dtype), weight, None if bias is None else bias.to(dtype))
    return y.to(x.dtype)


class CpuGGUFMethod(GGUFBlocksMethod):
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        kernel = load_gguf_kernel()
        self.kernel = kernel if kernel is not None and kernel.supports(layer.gguf_type) else None

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        kernel = self.kernel
        if kernel is None or x.dtype not in (torch.float32, torch.bfloat16) or x.device.type != "cpu":
            return super().apply(layer, x, bias)
        x2 = x.reshape(-1, x.shape[-1])
        choose = getattr(kernel, "choose", None)  # TEMP until gguf_native has it
        how = choose(layer.gguf_type, x2.shape[0], layer.output_size, layer.input_size) if choose else \
            ("float" if x2.shape[0] <= 16 else "dequant")
        if how == "dequant":
            y = _dequant_linear(kernel, x2, layer, bias)
        else:
            y = kernel.matmul(x2, cast(torch.Tensor, layer.qweight), layer.gguf_type, bias, int_dot=how == "int")
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        kernel = self.kernel
        if kernel is None or layer.params_dtype not in (torch.float32, torch.bfloat16):
            return super().embedding(layer, ids)
        rows = cast(torch.Tensor, layer.qweight)[ids.reshape(-1)]
        out = torch.empty(rows.shape[0], layer.input_size, dtype=layer.params_dtype)
        kernel.dequantize(rows, layer.gguf_type, out)
        return out.reshape(*ids.shape, layer.input_size)
