"""RMSNorm, optionally fused with the residual add: one program per row, fp32 statistics.

Rounding follows the torch reference: the sum x + residual is rounded to the input dtype before the
norm, and the normalised row is rounded before the weight multiply.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, stride_x, stride_residual, stride_out, n, eps,
                     HAS_RESIDUAL: tl.constexpr, TILE: tl.constexpr):
    row = tl.program_id(0)
    i = tl.arange(0, TILE)
    mask = i < n
    x = tl.load(x_ptr + row * stride_x + i, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + i, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(residual_ptr + row * stride_residual + i, x, mask=mask)
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=0) / n + eps)
    w = tl.load(weight_ptr + i, mask=mask, other=0.0).to(tl.float32)
    out = h.to(x.dtype).to(tl.float32) * w
    tl.store(out_ptr + row * stride_out + i, out.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    r2 = x2 if residual is None else residual.view(-1, n)
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if x2.shape[0]:
        tile = triton.next_power_of_2(n)
        _rms_norm_kernel[(x2.shape[0],)](x2, r2, weight, out, x2.stride(0), r2.stride(0), out.stride(0), n, eps,
                                         HAS_RESIDUAL=residual is not None, TILE=tile,
                                         num_warps=min(max(tile // 256, 1), 16))
    return out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch(x, None, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    assert residual.is_contiguous(), "the residual stream is updated in place"
    return _launch(x, residual, weight, eps), residual
