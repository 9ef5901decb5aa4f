"""silu_and_mul (SwiGLU) and gelu_tanh_and_mul (GeGLU): fp32 math, one program per (row, column tile)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_out, d, TILE: tl.constexpr):
    row, tile = tl.program_id(0), tl.program_id(1)
    i = tile * TILE + tl.arange(0, TILE)
    mask = i < d
    gate = tl.load(x_ptr + row * stride_x + i, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + i, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_out + i, out.to(out_ptr.dtype.element_ty), mask=mask)


def _launch_gated(kernel, x: torch.Tensor) -> torch.Tensor:
    """``act(x[..., :d]) * x[..., d:]`` through one of the gated kernels above: a program per row and tile."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], d, dtype=x.dtype, device=x.device)
    if out.numel():
        tile = min(triton.next_power_of_2(d), 1024)
        kernel[(x2.shape[0], triton.cdiv(d, tile))](x2, out, x2.stride(0), out.stride(0), d, TILE=tile, num_warps=4)
    return out.view(*x.shape[:-1], d)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _launch_gated(_silu_and_mul_kernel, x)


@triton.jit
def _gelu_tanh_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_out, d, TILE: tl.constexpr):
    row, tile = tl.program_id(0), tl.program_id(1)
    i = tile * TILE + tl.arange(0, TILE)
    mask = i < d
    gate = tl.load(x_ptr + row * stride_x + i, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + i, mask=mask, other=0.0).to(tl.float32)
    inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)  # sqrt(2 / pi) * (x + 0.044715 x^3)
    tanh = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
    out = 0.5 * gate * (1.0 + tanh) * up
    tl.store(out_ptr + row * stride_out + i, out.to(out_ptr.dtype.element_ty), mask=mask)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _launch_gated(_gelu_tanh_and_mul_kernel, x)
