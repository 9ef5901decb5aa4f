"""The CPU platform's native small-M matmul (csrc/small_gemm.cpp): decode-sized linears over float32, bfloat16
or int8 (per-output-channel scale) weights, built with the machine's compiler at first use (native.py).

Batch-1 decode is memory bound: an int8 weight read as int8 moves half of bfloat16's bytes, which
``torch._weight_int8pack_mm`` does not turn into speed on AVX2 CPUs (it is about bfloat16's speed there); nor
is torch's bfloat16 ``F.linear`` fast there. The kernel takes float32 linears of up to ``KC_CPU_SMALL_GEMM_ROWS``
rows (default 8; larger float32 batches go to oneDNN/MKL, which are faster there). bfloat16 and int8 weights have
no fast torch path on AVX2 (their weight is upcast per call), so the kernel also takes their batches and most
prefill chunks, up to ``LOW_PRECISION_ROWS``. Where the CPU has bfloat16 dot products (AVX512-BF16) oneDNN's
bfloat16 GEMM is fast, and the kernel keeps only the batches it is faster at (``PAIR_DOT_ROWS``).

These fixed limits are the fallback routing: by default the CPU worker times the kernel against the other
implementations per layer shape and batch size at start-up (linear_tuning.py) and calls ``run``, which has no
row limit, where it measured fastest.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from builtin_plugins.cpu.launch import launch, replay_in_c
from builtin_plugins.cpu.native import CURRENT_THREADS, load_native
from kernelcore import envs

SOURCE = Path(__file__).parent / "csrc" / "small_gemm.cpp"
WEIGHT_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}
ACT_CODES = {torch.float32: 0, torch.bfloat16: 1}
LOW_PRECISION_ROWS = (512, 1024)  # bfloat16, int8 weights: the largest batches measured faster than torch's paths
# With bfloat16 pair dot products (AVX512-BF16), bfloat16 activations: above 16 rows oneDNN's bf16 GEMM is faster,
# and above 64 an int8 weight dequantized to bfloat16 for it (docs/performance.md).
PAIR_DOT_ROWS = (16, 64)


class SmallGemmKernel:
    def __init__(self, library: ctypes.CDLL):
        self._fn = library.kc_small_gemm
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self._fn.argtypes = [ctypes.c_int, ctypes.c_int, ptr, i64, ptr, ptr, ptr, ptr, i64, i64, i64, i64,
                             ctypes.c_int, ctypes.c_int]
        self._fn.restype = ctypes.c_int
        replay_in_c(library, self._fn)
        self.pair_dot = bool(library.kc_small_gemm_features() & 1)  # compiled for AVX512-BF16
        # Read once: this runs on every decode-step linear. bfloat16/int8 weights have no fast torch path on
        # AVX2 (an upcast per call, or _weight_int8pack_mm), so the kernel takes their batches too, up to
        # where it measured faster (docs/performance.md); float32 weights go to oneDNN above a few rows.
        # Keyed by (weight dtype, activation dtype): pair dot products serve bfloat16 activations only.
        rows = envs.KC_CPU_SMALL_GEMM_ROWS
        self.max_rows_by_dtype: dict[tuple[torch.dtype, torch.dtype], int] = {}
        for act in ACT_CODES:
            low = PAIR_DOT_ROWS if self.pair_dot and act == torch.bfloat16 else LOW_PRECISION_ROWS
            self.max_rows_by_dtype.update({(torch.float32, act): rows,
                                           (torch.bfloat16, act): rows and max(rows, low[0]),
                                           (torch.int8, act): rows and max(rows, low[1])})

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None, owner: object | None = None) -> torch.Tensor | None:
        """``x [..., K] @ weight[N, K].T * scale[N] + bias[N]`` in x's dtype (float32 accumulation), or None
        where the kernel does not apply (more rows than ``max_rows_by_dtype`` allows, another dtype or
        layout): the caller keeps its torch path. ``scale`` float32 [N] (int8 weights). ``owner``: an object
        (the layer) to cache the checked weight pointers on; its per-call cost is then a few microseconds."""
        num_in = weight.shape[-1]
        rows = x.numel() // num_in if num_in else 0
        if not 0 < rows <= self.max_rows_by_dtype.get((weight.dtype, x.dtype), 0):
            return None
        return self.run(x, weight, scale, bias, owner)

    def run(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
            bias: torch.Tensor | None = None, owner: object | None = None,
            float_lanes: bool = False, far_prefetch: bool = False,
            single_stream: bool = False) -> torch.Tensor | None:
        """As calling the kernel, at any number of rows (the caller measured it faster there). ``float_lanes``:
        float32 multiplies even where bf16 pair dot products apply (bf16 activations over bf16/int8 weights).
        ``far_prefetch``: weights prefetched tens of rows ahead into L2 instead of a few tiles ahead.
        ``single_stream``: a float32 weight at one row read one weight row at a time, not four interleaved
        (bfloat16/int8 weights always are)."""
        num_in = weight.shape[-1]
        rows = x.numel() // num_in if num_in else 0
        if rows == 0:
            return None
        plan = owner.__dict__.get("_small_gemm") if owner is not None else None
        key = (weight.data_ptr(), None if scale is None else scale.data_ptr(),
               None if bias is None else bias.data_ptr(), x.dtype)
        if plan is None or plan[0] != key:
            plan = (key, self._plan(x, weight, scale, bias))
            if owner is not None:
                owner.__dict__["_small_gemm"] = plan
        args = plan[1]
        if args is None or x.shape[-1] != num_in:
            return None
        x2 = x.reshape(rows, num_in)
        if x2.stride(1) != 1:
            x2 = x2.contiguous()
        w_code, x_code, w_ptr, s_ptr, b_ptr, num_out = args
        y = torch.empty(rows, num_out, dtype=x.dtype)
        if launch(self._fn, w_code, x_code, x2.data_ptr(), x2.stride(0), w_ptr, s_ptr, b_ptr, y.data_ptr(), num_out,
                  rows, num_out, num_in, CURRENT_THREADS,
                  int(float_lanes) | int(far_prefetch) << 1 | int(single_stream) << 2) != 0:
            raise ValueError("small gemm: the kernel refused the shapes")
        return y.view(*x.shape[:-1], num_out)

    @staticmethod
    def _plan(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None):
        """The raw arguments for this weight, or None where it is not supported. Raw pointers cross into C++:
        everything the kernel would otherwise read out of bounds is checked here, once per weight."""
        num_out = weight.shape[0] if weight.dim() == 2 else 0
        if not (weight.dtype in WEIGHT_CODES and weight.dim() == 2 and weight.is_contiguous()
                and weight.shape[1] % 8 == 0 and weight.device.type == x.device.type == "cpu"
                and not (weight.requires_grad and torch.is_grad_enabled())):
            return None
        if (weight.dtype == torch.int8) != (scale is not None):
            return None
        if scale is not None and (scale.dtype != torch.float32 or scale.shape != (num_out,)
                                  or not scale.is_contiguous()):
            return None
        if bias is not None and (bias.dtype != x.dtype or bias.shape != (num_out,) or not bias.is_contiguous()):
            return None
        return (WEIGHT_CODES[weight.dtype], ACT_CODES[x.dtype], weight.data_ptr(),
                None if scale is None else scale.data_ptr(), None if bias is None else bias.data_ptr(), num_out)


@functools.cache
def load_small_gemm_kernel() -> SmallGemmKernel | None:
    """The compiled kernel, or None (logged once) when it cannot be built here."""
    return load_native(SOURCE, SmallGemmKernel, "small-matmul kernel")
