"""SiluAndMul: the SwiGLU gate, ``silu(x[:, :d]) * x[:, d:]``."""

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
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]).mul_(x[..., d:])

    def forward_cuda(self, x: torch.Tensor) -> torch.Tensor:
        return kernel_table.get("silu_and_mul")(x)
