"""The CPU platform's kernel-table entries for a decoder layer's pointwise ops: RMSNorm (and its fused
residual add), the rotary embedding and SwiGLU's silu-and-mul.

Each runs the native kernel (csrc/pointwise.cpp: one pass, no temporaries) on float32/bfloat16 tensors with
contiguous rows, and torch ops otherwise (other dtypes, odd layouts, no compiler, ``KC_CPU_NATIVE_KERNELS=0``).
At batch 1 torch's several ops per call cost more than the arithmetic; these run once per layer per step.
The signatures are the kernel table's (kernelcore.kernels): rotary_embedding and fused_add_rms_norm work in
place, as the CUDA kernels do.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from builtin_plugins.cpu.launch import launch, replay_in_c
from builtin_plugins.cpu.native import CURRENT_THREADS, load_native
from kernelcore.kernels import torch_rotary_embedding

SOURCE = Path(__file__).parent / "csrc" / "pointwise.cpp"
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


class PointwiseKernels:
    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        self.rms_norm = library.kc_rms_norm
        self.rms_norm.argtypes = [i32, ptr, i64, ptr, i64, ptr, ptr, i64, i64, i64, ctypes.c_float, i32]
        self.rotary = library.kc_rotary
        self.rotary.argtypes = [i32, i32, ptr, ptr, i64, i64, i64, i64, i64, ptr, i64, i32]
        self.silu_and_mul = library.kc_silu_and_mul
        self.silu_and_mul.argtypes = [i32, ptr, i64, ptr, i64, i64, i64, i32]
        for fn in (self.rms_norm, self.rotary, self.silu_and_mul):
            fn.restype = ctypes.c_int
            replay_in_c(library, fn)
        self.run_packed = library.kc_run_packed  # a decode tape's runs of launches (graphs.py)
        self.run_packed.argtypes = [i64, ptr, ptr, ptr, ptr]
        self.run_packed.restype = i64


@functools.cache
def load_pointwise_kernels() -> PointwiseKernels | None:
    """The compiled kernels, or None (logged once) when they cannot be built here."""
    return load_native(SOURCE, PointwiseKernels, "pointwise kernels")


def _rows(x: torch.Tensor) -> bool:
    """A 2-D CPU tensor of a supported dtype whose rows are contiguous."""
    return x.dim() == 2 and x.is_cpu and x.dtype in DTYPE_CODES and x.stride(1) == 1


def _check(status: int, op: str) -> None:
    if status != 0:
        raise ValueError(f"CPU {op} kernel refused its arguments")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    kernels = load_pointwise_kernels()
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if kernels is None or not _rows(x2) or weight.dtype != x.dtype or not weight.is_contiguous() \
            or weight.shape != (x.shape[-1],):
        return _torch_rms_norm(x, weight, eps)
    out = torch.empty(x2.shape, dtype=x.dtype)
    _check(launch(kernels.rms_norm, DTYPE_CODES[x.dtype], x2.data_ptr(), x2.stride(0), None, 0, weight.data_ptr(),
                            out.data_ptr(), out.stride(0), x2.shape[0], x2.shape[1], eps,
                            CURRENT_THREADS), "rms_norm")
    return out.view(x.shape)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += x`` (in place), then ``(rms_norm(residual), residual)``."""
    kernels = load_pointwise_kernels()
    if kernels is None or not _rows(x) or not _rows(residual) or residual.dtype != x.dtype \
            or residual.shape != x.shape or weight.dtype != x.dtype or not weight.is_contiguous() \
            or weight.shape != (x.shape[-1],):
        residual.add_(x)
        return _torch_rms_norm(residual, weight, eps), residual
    out = torch.empty(x.shape, dtype=x.dtype)
    _check(launch(kernels.rms_norm, DTYPE_CODES[x.dtype], x.data_ptr(), x.stride(0), residual.data_ptr(),
                            residual.stride(0), weight.data_ptr(), out.data_ptr(), out.stride(0), x.shape[0],
                            x.shape[1], eps, CURRENT_THREADS), "rms_norm")
    return out, residual


def _torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
                     head_size: int, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``rotary_dim`` dims of each head of query [T, H*D] and key [T, Hkv*D] in place."""
    kernels = load_pointwise_kernels()
    num_tokens = query.shape[0]
    if (kernels is None or not _rows(query) or not _rows(key) or query.dtype != key.dtype
            or cos_sin_cache.dtype not in DTYPE_CODES or not cos_sin_cache.is_contiguous()
            or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != rotary_dim or positions.dtype != torch.int64
            or not positions.is_contiguous() or positions.shape != (num_tokens,) or key.shape[0] != num_tokens
            or query.shape[1] % head_size or key.shape[1] % head_size):
        return torch_rotary_embedding(positions, query, key, cos_sin_cache, head_size, rotary_dim)
    code, cache_code, threads = DTYPE_CODES[query.dtype], DTYPE_CODES[cos_sin_cache.dtype], CURRENT_THREADS
    # q and k are usually adjacent column slices of one qkv row: one pass over both.
    if key.data_ptr() == query.data_ptr() + query.shape[1] * query.element_size() and key.stride(0) == query.stride(0):
        parts = [(query, (query.shape[1] + key.shape[1]) // head_size)]
    else:
        parts = [(query, query.shape[1] // head_size), (key, key.shape[1] // head_size)]
    for x, heads in parts:
        if launch(kernels.rotary, code, cache_code, positions.data_ptr(), x.data_ptr(), x.stride(0), num_tokens, heads,
                          head_size, rotary_dim, cos_sin_cache.data_ptr(), cos_sin_cache.shape[0], threads) != 0:
            raise ValueError(f"rotary embedding: a position is outside the cache's {cos_sin_cache.shape[0]} rows")
    return query, key


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    kernels = load_pointwise_kernels()
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    d = x.shape[-1] // 2
    if kernels is None or not _rows(x2) or x.shape[-1] % 2:
        return F.silu(x[..., :d]).mul_(x[..., d:])
    out = torch.empty(x2.shape[0], d, dtype=x.dtype)
    _check(launch(kernels.silu_and_mul, DTYPE_CODES[x.dtype], x2.data_ptr(), x2.stride(0), out.data_ptr(),
                  out.stride(0), x2.shape[0], d, CURRENT_THREADS), "silu_and_mul")
    return out.view(*x.shape[:-1], d)


KERNELS = {"rms_norm": rms_norm, "fused_add_rms_norm": fused_add_rms_norm, "rotary_embedding": rotary_embedding,
           "silu_and_mul": silu_and_mul}
