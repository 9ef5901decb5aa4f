"""SiluAndMul: the SwiGLU gate, ``silu(x[:, :d]) * x[:, d:]``; GeluAndMul: GeGLU, with tanh-approximated GELU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelcore.custom_op import CustomOp
from kernelcore.kernels import kernel_table


@CustomOp.register("silu_and_mul")
class SiluAndMul(CustomOp):
    kernel_names = ("silu_and_mul",)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        # A CPU platform's kernel, when it put one in the table (the built-in one does).
        if kernel_table.is_overridden("silu_and_mul"):
            return kernel_table.get("silu_and_mul")(x)
        return self.forward_native(x)

    def forward_cuda(self, x: torch.Tensor) -> torch.Tensor:
        return kernel_table.get("silu_and_mul")(x)


@CustomOp.register("gelu_tanh_and_mul")
class GeluAndMul(CustomOp):
    """``gelu_tanh(x[:, :d]) * x[:, d:]`` (Gemma's ``gelu_pytorch_tanh`` gate)."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate="tanh").mul_(x[..., d:])

    def forward_cuda(self, x: torch.Tensor) -> torch.Tensor:
        return kernel_table.get("gelu_tanh_and_mul")(x)
