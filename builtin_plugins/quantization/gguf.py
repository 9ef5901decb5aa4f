"""Linear methods for GGUF checkpoints: every layer computes with its weight as the file stores it.

``gguf`` (the default for a .gguf model) takes each quantized tensor as its stored blocks (``loads_gguf_blocks``:
kernelcore/models/gguf_params.py), cuts the layer's weight into row ranges of one GGUF type each (a fused qkv
may hold Q5_0 q/k and Q8_0 v), and hands each part to the method registered as ``gguf_<type>``. A vendor adds a
type, or a faster kernel for one, by registering ``gguf_<type>`` from its own ``register_quantization_methods``
(a platform with ``override=True``).

Built in: float types use the registry's ``none`` (the platform's float matmul); every quantized type uses
:class:`GGUFBlocksMethod`, the portable pure-torch reference (gguf_blocks.py), which platforms replace with
native kernels. The token embedding is a GGUF layer too (``quantizes_embeddings``): rows are looked up in the
blocks and dequantized, so a tied LM head and the embedding share one quantized copy.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from kernelcore.layers.linear import LinearMethodBase
from kernelcore.models.gguf_params import GGUFPart


def _registered(name: str) -> LinearMethodBase:
    from kernelcore.quantization import get_quantization_registry

    return get_quantization_registry().get(name)()


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


class GGUFLinearMethod(LinearMethodBase):
    """``--quantization gguf``: per row range of the layer's weight, the method of its stored type."""

    loads_gguf_blocks = True
    quantizes_embeddings = True

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        from kernelcore.models.gguf_checkpoint import method_name
        from kernelcore.models.gguf_params import parts

        self.parts: list[GGUFPart] | None = parts(cast(nn.Parameter, layer.weight))
        if self.parts is None:  # stored in float throughout: the plain float method on the layer itself
            self.float_method = _registered("none")
            self.float_method.process_weights_after_loading(layer)
            return
        # submodules of the layer: the model's parameters and buffers include the blocks (a platform may move them)
        layer.gguf_parts = nn.ModuleList(self.parts)
        for part in self.parts:  # a tied LM head shares the embedding's parts: process each once
            if "quant_method" not in part.__dict__:
                part.params_dtype = cast(torch.dtype, getattr(layer, "params_dtype", None) or
                                         cast(torch.Tensor, layer.weight).dtype)
                part.__dict__["quant_method"] = _registered(method_name(part.gguf_type))
                part.quant_method.process_weights_after_loading(part)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.parts is None:
            return self.float_method.apply(layer, x, bias)
        if len(self.parts) == 1:
            part = self.parts[0]
            return part.quant_method.apply(part, x, bias)
        y = torch.cat([part.quant_method.apply(part, x, None) for part in self.parts], dim=-1)
        return y if bias is None else y + bias

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        if self.parts is None:
            return self.float_method.embedding(layer, ids)
        if len(self.parts) == 1:
            part = self.parts[0]
            return part.quant_method.embedding(part, ids)
        # rows stored in several types (unusual for an embedding): each part fills the ids it holds
        out = None
        for part in self.parts:
            inside = (ids >= part.start) & (ids < part.stop)
            rows = part.quant_method.embedding(part, (ids - part.start).clamp(0, part.output_size - 1))
            rows = rows * inside.unsqueeze(-1).to(rows.dtype)
            out = rows if out is None else out + rows
        return cast(torch.Tensor, out)


class GGUFFloatMethod(LinearMethodBase):
    """F32/F16/BF16 parts: the registry's unquantized method (the platform's float matmul)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.inner = _registered("none")
        self.inner.process_weights_after_loading(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.inner.apply(layer, x, bias)


class GGUFBlocksMethod(LinearMethodBase):
    """A quantized GGUF part (``layer.qweight`` uint8 [rows, row_bytes] of ``layer.gguf_type`` blocks), computed
    by the pure-torch reference: dequantize a few hundred rows at a time and multiply, never the whole weight."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        from builtin_plugins.quantization.gguf_blocks import linear

        part = cast(GGUFPart, layer)
        y = linear(_flat(x), part.qweight, part.gguf_type, bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        from builtin_plugins.quantization.gguf_blocks import dequantize

        part = cast(GGUFPart, layer)
        out = dequantize(part.qweight[ids.reshape(-1)], part.gguf_type, dtype=part.params_dtype)
        return out.reshape(*ids.shape, out.shape[-1])
