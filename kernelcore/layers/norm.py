"""RMSNorm (with an optional fused residual add), Gemma's (1 + w) RMSNorm and LayerNorm as custom ops."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernelcore.custom_op import CustomOp
from kernelcore.kernels import kernel_table


@CustomOp.register("rms_norm")
class RMSNorm(CustomOp):
    """``norm(x)``, or ``norm(x + residual), x + residual`` when a residual is given.

    With a residual the result's second element is the updated residual stream; paths may update
    ``residual`` in place, so a model must not reuse the tensor it passed.
    """

    kernel_names = ("rms_norm", "fused_add_rms_norm")

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is not None:
            x = x + residual
            residual = x
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)

    def forward_cpu(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        # A CPU platform's kernels, when it put them in the table (the built-in one does).
        if kernel_table.is_overridden("fused_add_rms_norm" if residual is not None else "rms_norm"):
            return self.forward_cuda(x, residual)
        return self.forward_native(x, residual)

    def forward_cuda(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return kernel_table.get("rms_norm")(x, self.weight, self.eps)
        return kernel_table.get("fused_add_rms_norm")(x, residual, self.weight, self.eps)


@CustomOp.register("gemma_rms_norm")
class GemmaRMSNorm(CustomOp):
    """Gemma's RMSNorm: the weight is stored as an offset from 1, and the product is taken in float32 before
    the cast (``(x * (1 + w)).to(dtype)``, where Llama's casts first)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and kernel_table.is_overridden("rms_norm"):
            # The platform's kernel (one call instead of six torch ops, which a decode step replays 6 times per
            # layer): x * rsqrt(mean(x^2) + eps) * (1 + w), all in float32 as below.
            return kernel_table.get("rms_norm")(x, self._one_plus_weight(), self.eps)
        h = F.rms_norm(x.float(), (self.hidden_size,), None, self.eps)
        return h.mul_(1.0 + self.weight.float()).to(x.dtype)

    def _one_plus_weight(self) -> torch.Tensor:
        key = (self.weight.data_ptr(), self.weight._version)
        if getattr(self, "_one_plus_key", None) != key:  # made again if the weight is (re)loaded
            self._one_plus = (1.0 + self.weight.float()).contiguous()
            self._one_plus_key = key
        return self._one_plus

    def forward_cuda(self, x: torch.Tensor) -> torch.Tensor:
        # The rms_norm kernel multiplies after its cast: equal in float32, within rounding in bfloat16.
        return kernel_table.get("rms_norm")(x, 1.0 + self.weight, self.eps)


@CustomOp.register("layer_norm")
class LayerNorm(CustomOp):
    def __init__(self, hidden_size: int, eps: float = 1e-5, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(hidden_size), requires_grad=False) if elementwise_affine else None

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        mean = h.mean(-1, keepdim=True)
        var = (h - mean).pow(2).mean(-1, keepdim=True)
        h = (h - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            h = h * self.weight.float()
        if self.bias is not None:
            h = h + self.bias.float()
        return h.to(x.dtype)

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.hidden_size,), self.weight, self.bias, self.eps)
