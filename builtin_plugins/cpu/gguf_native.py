"""Native CPU kernels over GGUF (llama.cpp) quantized weights as the file stores them (csrc/gguf_matmul.cpp),
built with the machine's compiler at first use (native.py).

The weight stays a uint8 tensor [N, row_bytes] of ggml blocks, at the file's size. ``matmul`` dequantizes each
block in registers / an L1 tile and dots it with the (few) activation rows in float32; ``matmul(int_dot=True)``
quantizes the activations to int8 once per call and uses llama.cpp-style integer dot products instead
(VNNI / AVX2; faster where the float path is arithmetic bound, at an int8 rounding of the activations).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from builtin_plugins.cpu.graphs import launch, replay_in_c
from builtin_plugins.cpu.native import load_native

SOURCE = Path(__file__).parent / "csrc" / "gguf_matmul.cpp"
# name: (ggml type id, values per block, bytes per block)
TYPES: dict[str, tuple[int, int, int]] = {
    "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34),
    "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210), "IQ4_NL": (20, 32, 18), "IQ4_XS": (23, 256, 136),
}
INT_DOT_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q4_K", "Q6_K"})
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


class GGUFKernel:
    def __init__(self, library: ctypes.CDLL):
        i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        self._dequant = library.kc_gguf_dequantize
        self._dequant.argtypes = [c_int, ptr, i64, i64, i64, c_int, ptr, c_int]
        self._matmul = library.kc_gguf_matmul
        self._matmul_int = library.kc_gguf_matmul_int
        for fn in (self._matmul, self._matmul_int):
            fn.argtypes = [c_int, c_int, ptr, i64, ptr, i64, ptr, ptr, i64, i64, i64, c_int]
        for fn in (self._dequant, self._matmul, self._matmul_int):
            fn.restype = c_int
            replay_in_c(library, fn)
        features = library.kc_gguf_features()
        self.vnni = bool(features & 1)  # the integer dot products use vpdpbusd (else vpmaddubsw or scalar)

    @staticmethod
    def supports(type_name: str, int_dot: bool = False) -> bool:
        return type_name in (INT_DOT_TYPES if int_dot else TYPES)

    @staticmethod
    def _weight(raw: torch.Tensor, type_name: str) -> tuple[int, int]:
        """(ggml type id, values per row) of a [rows, row_bytes] block tensor. Raw pointers cross into C++: a
        row's bytes must be contiguous and whole blocks (the row stride may be anything torch allows)."""
        if type_name not in TYPES:
            raise ValueError(f"gguf kernel: unsupported type {type_name}")
        type_id, block_values, block_bytes = TYPES[type_name]
        if not (raw.dtype == torch.uint8 and raw.dim() == 2 and raw.device.type == "cpu"
                and (raw.shape[1] <= 1 or raw.stride(1) == 1) and raw.shape[1] % block_bytes == 0):
            raise ValueError(f"gguf kernel: {type_name} weight must be uint8 [rows, k * {block_bytes}] with "
                             f"contiguous rows, got {raw.dtype} {tuple(raw.shape)} strides {raw.stride()}")
        return type_id, raw.shape[1] // block_bytes * block_values

    def dequantize(self, raw: torch.Tensor, type_name: str, out: torch.Tensor) -> None:
        """raw uint8 [rows, row_bytes] -> out float32/bfloat16 [rows, cols] (contiguous), exactly the values of
        gguf-py's ``gguf.quants.dequantize`` (bfloat16: those rounded to nearest even)."""
        type_id, cols = self._weight(raw, type_name)
        if not (out.dtype in DTYPE_CODES and out.shape == (raw.shape[0], cols) and out.is_contiguous()
                and out.device.type == "cpu"):
            raise ValueError(f"gguf dequantize: out must be float32/bfloat16 {(raw.shape[0], cols)} contiguous")
        if out.numel() == 0:
            return
        status = launch(self._dequant, type_id, raw.data_ptr(), raw.stride(0), raw.shape[0], cols,
                        DTYPE_CODES[out.dtype], out.data_ptr(), torch.get_num_threads())
        if status != 0:
            raise ValueError(f"gguf dequantize: the kernel refused {type_name} {tuple(raw.shape)}")

    def matmul(self, x: torch.Tensor, raw: torch.Tensor, type_name: str, bias: torch.Tensor | None = None,
               int_dot: bool = False) -> torch.Tensor:
        """``x [M, K] @ W.T (+ bias)`` for W the [N, K] weight that ``raw`` [N, row_bytes] quantizes; [M, N] in
        x's dtype (float32 or bfloat16), float32 accumulation. ``int_dot``: activations quantized to int8 per
        32 values (per 256 for K-quants) and integer dot products (``supports(type_name, int_dot=True)``)."""
        type_id, num_in = self._weight(raw, type_name)
        if int_dot and type_name not in INT_DOT_TYPES:
            raise ValueError(f"gguf matmul: no integer dot product kernel for {type_name}")
        if not (x.dtype in DTYPE_CODES and x.dim() == 2 and x.shape[1] == num_in and x.device.type == "cpu"):
            raise ValueError(f"gguf matmul: x must be float32/bfloat16 [M, {num_in}], got {x.dtype} {tuple(x.shape)}")
        if x.stride(1) != 1 or x.stride(0) < num_in:
            x = x.contiguous()
        rows, num_out = x.shape[0], raw.shape[0]
        if bias is not None:
            if bias.shape != (num_out,):
                raise ValueError(f"gguf matmul: bias must be [{num_out}], got {tuple(bias.shape)}")
            bias = bias.to(torch.float32).contiguous()
        y = torch.empty(rows, num_out, dtype=x.dtype)
        if rows == 0 or num_out == 0:
            return y
        if num_in == 0:
            return y.zero_() if bias is None else y.copy_(bias.expand_as(y))
        fn = self._matmul_int if int_dot else self._matmul
        status = launch(fn, type_id, DTYPE_CODES[x.dtype], x.data_ptr(), x.stride(0), raw.data_ptr(), raw.stride(0),
                        None if bias is None else bias.data_ptr(), y.data_ptr(), rows, num_out, num_in,
                        torch.get_num_threads())
        if status != 0:
            raise ValueError(f"gguf matmul: the kernel refused {type_name} x {tuple(x.shape)} w {tuple(raw.shape)}")
        return y


@functools.cache
def load_gguf_kernel() -> GGUFKernel | None:
    """The compiled kernels, or None (logged once) when they cannot be built here."""
    return load_native(SOURCE, GGUFKernel, "GGUF matmul kernel")
