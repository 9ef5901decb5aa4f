"""Native CPU kernels over GGUF (llama.cpp) quantized weights as the file stores them (csrc/gguf_matmul.cpp),
built with the machine's compiler at first use (native.py).

The weight stays a uint8 tensor [N, row_bytes] of ggml blocks, at the file's size. Three ways to compute a linear
layer over it (``linear(..., how=...)``; ``choose`` picks one from measured crossovers):

  float    ``matmul``: each block dequantized in registers / an L1 tile and dotted with the activation rows in
           float32; every supported type; the result is the float32 product of the exact dequantized weight
           (``dequantize`` equals gguf-py's values bit for bit).
  int      ``matmul(int_dot=True)``: the activations quantized to int8 once per call (one scale amax / 127 per
           32 values, or per 256 for the K-quants: llama.cpp's Q8_0 / Q8_K schemes) and integer dot products
           (AVX-512 VNNI two blocks per instruction, or AVX2 / scalar); 2-6x faster than float at few rows, at an
           int8 rounding of the activations (each moves by at most half its block's step amax / 127).
  dequant  the whole weight dequantized into x's dtype, then ``F.linear`` (oneDNN / MKL): the fastest above a
           few dozen rows, at the cost of a scratch copy of the weight per call.

All results are independent of the thread count (each output is one thread's fixed-order sum). The kernels run on
torch's OpenMP runtime (the library needs libgomp.so.1, which resolves to the one torch loaded) with
``torch.get_num_threads()`` threads.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from builtin_plugins.cpu.launch import launch, replay_in_c
from builtin_plugins.cpu.native import CURRENT_THREADS, load_native

SOURCE = Path(__file__).parent / "csrc" / "gguf_matmul.cpp"
# name: (ggml type id, values per block, bytes per block)
TYPES: dict[str, tuple[int, int, int]] = {
    "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34),
    "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210), "IQ4_NL": (20, 32, 18), "IQ4_XS": (23, 256, 136),
}
INT_DOT_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q4_K", "Q5_K", "Q6_K"})
# The int path's quality policy: the types whose int8 activations are the default (the start-up tuner may then pick
# "int" where it is fastest), each measured on a real file with benchmarks/gguf_quality.py --llamacpp, that type alone
# on the int path (KC_CPU_GGUF_INT_DOT=TYPE): perplexity within INT_PPL_BOUND of the file's float32 reference AND
# greedy agreement with the reference at least llama.cpp's own on the same check, AND an instruct file's answer
# to a factual chat question (tests/test_gguf_real.py) staying right. The figures are in docs/quantization.md; a type
# not listed keeps the float kernel (exactly the file's weights) unless asked.
# Measured (the int path forced at every row count, KC_CPU_TUNE_LINEARS=0; llama.cpp 0.3.36 on the same checks:
# SmolLM2 6/8 prompts, Gemma 3 3/8):
#   SmolLM2-135M-Instruct Q4_1: Q4_1 +0.19%, 6/8 holds the first two, but "What is the capital of France?" is then
#   answered "L'Etoile, la Marseillaise, ..." (llama-server's answer from the same file) instead of the exact path's
#   "Paris": Q4_1 stays float; Q8_0 (its LM head) +0.18%, 5/8: fails the greedy bound
#   Gemma 3 270M Q4_K_M: Q5_0 +0.41%, 5/8 and Q4_K +0.48%, 6/8: hold; Q6_K +0.51%: fails the perplexity bound;
#   Q8_0 -0.24%, 6/8 holds here but not on SmolLM2, so it stays float
# The other integer types (Q4_0, Q5_1, IQ4_NL, Q5_K) have no real file measured here and keep the float kernel.
INT_PPL_BOUND = 0.005
INT_DEFAULT_TYPES: frozenset[str] = frozenset({"Q5_0", "Q4_K"})
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
HOWS = ("float", "int", "dequant")

# choose()'s crossovers (activation rows M), measured with benchmarks/gguf_matmul.py on a 2-core Zen 5 EPYC
# (AVX-512 VNNI + BF16), weights streamed from memory, at the shapes of SmolLM2-135M (Q4_1, Q8_0) and Gemma-3-270M
# (Q5_0, Q8_0, Q4_K, Q6_K) and at 2048 x 2048 for the other types; median us per call, 1 thread (2 threads moved
# no crossover by more than one measured step).
# "int" below INT_ROWS_BF16 beats dequantize + bfloat16 GEMM ("dequant"), int / dequant:
#   Q4_1 1536x576  M=12 180 / 212, M=16 216 / 233, M=24 320 / 266;  576x1536 M=12 197 / 222, M=16 295 / 273
#   Q4_0 2048^2    M=8 598 / 986, M=16 1168 / 1104;  Q5_1 2048^2 M=8 628 / 1027, M=16 1168 / 1148
#   IQ4_NL 2048^2  M=8 638 / 951, M=16 1284 / 1279
#   Q5_0 2048x640  M=16 302 / 347, M=24 475 / 410;  1024x640 M=16 176 / 191, M=24 254 / 219
#   Q8_0 256x640   M=16 47 / 71, M=24 93 / 93, M=32 115 / 99;  49152x576 M=16 6475 / 8000, M=24 11505 / 11976
#   Q4_K 640x1024  M=12 170 / 168, M=16 193 / 173;  Q5_K 2048^2 M=8 590 / 935, M=16 1130 / 1119
#   Q6_K 640x2048  M=16 303 / 350, M=24 451 / 396;  2048^2 M=16 1161 / 1267, M=32 2605 / 1695
# With float32 activations dequantize + float32 GEMM (MKL) lost at every M measured (up to 256) for every integer
# type: M=256 Q4_1 1536x576 3646 / 5320, Q5_0 2048x640 5381 / 7894, Q4_K 640x1024 2909 / 3684, Q6_K 4718 / 7471,
# Q8_0 262144x640 0.999 s / 1.414 s.
INT_ROWS_BF16 = {"Q4_0": 16, "Q4_1": 16, "Q5_1": 16, "IQ4_NL": 16, "Q5_0": 20, "Q8_0": 24, "Q4_K": 12, "Q5_K": 12,
                 "Q6_K": 20}
# "float" (when int is not allowed, or for the types without an integer kernel: Q2_K, Q3_K, IQ4_XS) below these
# beats dequantize + GEMM, float / dequant. bfloat16: Q4_1 M=4 173 / 181, M=8 266 / 203; Q4_0 M=4 704 / 917, M=8
# 1097 / 986; Q8_0 256x640 M=8 61 / 65, M=12 73 / 67; Q4_K M=4 114 / 138, M=8 181 / 152; Q6_K M=4 292 / 278;
# Q5_K M=4 735 / 790; Q2_K M=4 730 / 812, M=8 1080 / 859; Q3_K M=4 1001 / 1067, M=8 1202 / 893; IQ4_XS M=4
# 684 / 757, M=8 1058 / 827. Float32: Q4_1 M=24 629 / 647, M=32 855 / 809; Q5_0 M=12 523 / 571, M=24 1000 / 903;
# Q4_K M=32 565 / 572, M=48 822 / 795; Q8_0 262144x640 M=16 88276 / 100394, M=24 123775 / 124997; every type at
# 2048 x 2048: M=32 float ahead by 2-7%, M=64 within 5%, M=128 dequant ahead by 10-20%.
FLOAT_ROWS_BF16 = {"Q4_1": 4, "Q5_K": 4, "Q6_K": 4, "Q8_0": 8, "Q4_0": 6, "Q5_0": 6, "Q5_1": 6, "IQ4_NL": 6,
                   "Q2_K": 6, "Q3_K": 6, "Q4_K": 6, "IQ4_XS": 6}
FLOAT_ROWS_F32 = {"Q4_0": 48, "Q4_1": 32, "Q5_0": 16, "Q5_1": 48, "Q8_0": 24, "IQ4_NL": 48, "Q2_K": 48, "Q3_K": 48,
                  "Q4_K": 32, "Q5_K": 48, "Q6_K": 48, "IQ4_XS": 48}
# "dequant" converts a weight of up to DEQUANT_WHOLE_BYTES (in x's dtype) at once, a larger one DEQUANT_CHUNK_BYTES
# of rows at a time, each chunk multiplied while it is in cache (bf16, 1 thread: Q5_0 2048x640 at M=16 326 us
# whole / 505 us in 1 MiB chunks; Q8_0 49152x576 at M=16 40.3 ms whole / 8.3 ms in 1 MiB chunks).
DEQUANT_WHOLE_BYTES = 8 << 20
DEQUANT_CHUNK_BYTES = 1 << 20


def int_dot_types(setting: tuple[str, ...]) -> frozenset[str]:
    """The types allowed the int path under a ``KC_CPU_GGUF_INT_DOT`` setting (see builtin_plugins/cpu/__init__)."""
    if setting == ("auto",):
        return INT_DEFAULT_TYPES
    if setting == ("all",):
        return INT_DOT_TYPES
    unknown = sorted(set(setting) - INT_DOT_TYPES)
    if unknown:
        raise ValueError(f"KC_CPU_GGUF_INT_DOT: no integer kernel for {', '.join(unknown)} (types with one: "
                         f"{', '.join(sorted(INT_DOT_TYPES))}; or auto, all, none)")
    return frozenset(setting)


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
        self.avx512_int = bool(features & 4)  # the 32-value types' two-blocks-per-instruction AVX-512 path

    def describe(self) -> str:
        """The integer dot product's instructions, for ``kc plugins``."""
        dot = "vpdpbusd (VNNI)" if self.vnni else "vpmaddubsw"
        return f"int8 dots by {dot}" + (", two 32-value blocks per AVX-512 instruction" if self.avx512_int else "")

    @staticmethod
    def supports(type_name: str, int_dot: bool = False) -> bool:
        return type_name in (INT_DOT_TYPES if int_dot else TYPES)

    @staticmethod
    def options(type_name: str) -> tuple[str, ...]:
        """The ``how`` values ``linear`` takes for this type (for a start-up tuner such as linear_tuning's
        Candidates: ``{how: lambda layer, x, bias, how=how: kernel.linear(x, layer.qweight, type_name, bias, how)
        for how in kernel.options(type_name)}``)."""
        if type_name not in TYPES:
            return ()
        return HOWS if type_name in INT_DOT_TYPES else ("float", "dequant")

    @staticmethod
    def choose(type_name: str, M: int, N: int, K: int, *, dtype: torch.dtype = torch.bfloat16,
               allow_int: bool = True) -> str:
        """How to compute ``x [M, K] @ W[N, K].T`` for a ``type_name`` weight: "float", "int" or "dequant"
        (see ``linear``), from crossovers measured on a Zen 5 EPYC (AVX-512 VNNI + BF16; the numbers are above
        INT_ROWS_BF16 in this module). ``dtype``: the activations' (bfloat16: "dequant" is oneDNN's bf16 GEMM;
        float32: MKL's float32 GEMM, which the integer kernel out-ran at every M measured, up to 256).
        ``allow_int=False``: never the int8 rounding of the activations.

          integer-kernel types (all but Q2_K, Q3_K, IQ4_XS), bfloat16: "int" for M below INT_ROWS_BF16 (12 for
              Q4_K, Q5_K; 16 Q4_0, Q4_1, Q5_1, IQ4_NL; 20 Q5_0, Q6_K; 24 Q8_0), else "dequant"; float32: "int".
          otherwise "float" for M below FLOAT_ROWS_BF16 (4-8) or FLOAT_ROWS_F32 (16-48), else "dequant".

        The crossovers did not move by more than one measured step with the shape (192x576 to 262144x640) or
        between 1 and 2 threads, so N and K are not consulted (they are in the signature for callers that tune
        per shape). Another CPU (AMX, AVX2 only) can differ by several times: a start-up tuner timing
        ``options(type_name)`` is exact."""
        if type_name not in TYPES:
            raise ValueError(f"gguf kernel: unsupported type {type_name}")
        del N, K
        if allow_int and type_name in INT_DOT_TYPES and (dtype == torch.float32 or M < INT_ROWS_BF16[type_name]):
            return "int"
        limit = (FLOAT_ROWS_F32 if dtype == torch.float32 else FLOAT_ROWS_BF16)[type_name]
        return "float" if M < limit else "dequant"

    def linear(self, x: torch.Tensor, raw: torch.Tensor, type_name: str, bias: torch.Tensor | None = None,
               how: str = "float") -> torch.Tensor:
        """``x [..., K] @ W.T (+ bias)`` in x's dtype (float32 or bfloat16), by ``how``: "float" / "int" the
        native ``matmul``, "dequant" the weight dequantized into x's dtype (whole, or DEQUANT_CHUNK_BYTES of it at
        a time above DEQUANT_WHOLE_BYTES) and ``F.linear``."""
        if how not in HOWS:
            raise ValueError(f"gguf linear: how must be one of {HOWS}, not {how!r}")
        _, num_in = self._weight(raw, type_name)
        if x.dim() < 1 or x.shape[-1] != num_in:
            raise ValueError(f"gguf linear: x must be [..., {num_in}], got {tuple(x.shape)}")
        x2 = x.reshape(-1, num_in)
        if how != "dequant":
            y = self.matmul(x2, raw, type_name, bias, int_dot=how == "int")
        else:
            if x.dtype not in DTYPE_CODES:
                raise ValueError(f"gguf linear: x must be float32/bfloat16, got {x.dtype}")
            num_out = raw.shape[0]
            if bias is not None and bias.shape != (num_out,):
                raise ValueError(f"gguf linear: bias must be [{num_out}], got {tuple(bias.shape)}")
            row_bytes = max(1, num_in * x.dtype.itemsize)
            step = num_out if num_out * row_bytes <= DEQUANT_WHOLE_BYTES else max(1, DEQUANT_CHUNK_BYTES // row_bytes)
            b = None if bias is None else bias.to(x.dtype)
            if step >= num_out:
                w = torch.empty(num_out, num_in, dtype=x.dtype)
                self.dequantize(raw, type_name, w)
                y = F.linear(x2, w, b)
            else:
                y = torch.empty(x2.shape[0], num_out, dtype=x.dtype)
                w = torch.empty(step, num_in, dtype=x.dtype)
                for r0 in range(0, num_out, step):
                    rows = min(step, num_out - r0)
                    self.dequantize(raw[r0:r0 + rows], type_name, w[:rows])
                    y[:, r0:r0 + rows] = F.linear(x2, w[:rows], None if b is None else b[r0:r0 + rows])
        return y.reshape(*x.shape[:-1], raw.shape[0])

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
                        DTYPE_CODES[out.dtype], out.data_ptr(), CURRENT_THREADS)
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
        rows, num_out = x.shape[0], raw.shape[0]
        if rows > 1 and (x.stride(1) != 1 or x.stride(0) < num_in):
            x = x.contiguous()
        # one row: its stride is whatever torch left (size-1 dimensions' strides are arbitrary, even for "contiguous")
        x_stride = x.stride(0) if rows > 1 else num_in
        if rows == 1 and x.stride(1) != 1:
            x = x.contiguous()
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
        status = launch(fn, type_id, DTYPE_CODES[x.dtype], x.data_ptr(), x_stride, raw.data_ptr(), raw.stride(0),
                        None if bias is None else bias.data_ptr(), y.data_ptr(), rows, num_out, num_in,
                        CURRENT_THREADS)
        if status != 0:
            raise ValueError(f"gguf matmul: the kernel refused {type_name} x {tuple(x.shape)} w {tuple(raw.shape)}")
        return y


@functools.cache
def load_gguf_kernel() -> GGUFKernel | None:
    """The compiled kernels, or None (logged once) when they cannot be built here."""
    return load_native(SOURCE, GGUFKernel, "GGUF matmul kernel")
