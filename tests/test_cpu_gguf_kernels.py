"""The native GGUF kernels (builtin_plugins/cpu/gguf_native.py) against gguf-py's numpy reference.

Every supported type: dequantize bit-exact in float32 (bfloat16: those values rounded), the float matmul within a
float32-accumulation bound of a float64 product of the dequantized weight, and the integer-dot matmul within the
bound of its int8 activations (llama.cpp's Q8_0 / Q8_K scheme: one scale amax / 127 per 32 or 256 values).
Blocks are valid: quantized from random floats by gguf.quants.quantize where gguf-py can, else random bytes with
finite float16 scale fields; plus a few tensors of each type of two real GGUF files (the kc pull cache,
tests/real_models.py: fetched once, a failure without them).

The bounds, for y = sum_k x_k w_k over K values, S = sum_k |x_k| |w_k| and u = 2^-24:
  float:  |err| <= (K / 16 + 32) u S. Each of 16 lanes sums K / 16 exact-input products with FMAs, then the
          lanes and the bias are added: first order (K / 16 + 17) u S; 15 more u of slack.
  int:    |err| <= sum_k |w_k| 0.501 step_k + (K / 16 + 32) u S'. Each activation becomes step_k * q_k with
          q_k = round(x_k / step_k), step_k its block's amax / 127, so it moves by at most step_k / 2 (0.501:
          the rounding of x_k / step_k itself); the integer dots are exact, their float scaling and accumulation
          are bounded as above with S' = sum_k |x_k| (|d-part_k| + |min-part_k|), the two parts of the weight the
          kernel accumulates separately (Q4_1 d * q + m, Q4_K d * sc * q - dmin * m: |w| when the block has no min).
  bfloat16 output: additionally 2^-8 |y| (one rounding of the float32 result), bfloat16 x is exact in float32.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
import gguf.quants as gq  # noqa: E402

from builtin_plugins.cpu.gguf_native import INT_DOT_TYPES, TYPES, GGUFKernel, load_gguf_kernel  # noqa: E402

_loaded = load_gguf_kernel()
pytestmark = pytest.mark.skipif(_loaded is None, reason="no C++ compiler: the GGUF kernels cannot be built")
kernel = cast(GGUFKernel, _loaded)

U = 2.0 ** -24
# Byte offsets of each block's float16 fields: random bytes there could be inf/nan.
FP16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
               "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,)}
# The float16 field of the min / offset part (zeroed: the d part alone; the d field zeroed: the min part alone).
MIN_FIELD = {"Q4_1": (2, 0), "Q5_1": (2, 0), "Q2_K": (82, 80), "Q4_K": (2, 0), "Q5_K": (2, 0)}
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf.quants.quantize has these (the rest: dequantize only)
REAL_FILES = ("smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m")  # kc pull names (tests/real_models.py)


@pytest.fixture(autouse=True)
def one_thread(request):
    """One torch (and kernel) thread, except where a test sets its own: the checks are small, and on a machine
    shared with other work every parallel region of a second thread waits out that thread's time slice (a 2-core
    machine under load ran this file 100x slower). test_threads_and_determinism covers several threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def qtype(type_name: str):
    return gguf.GGMLQuantizationType[type_name]


def random_blocks(type_name: str, rows: int, num_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, num_blocks * block_bytes], valid blocks. gguf-py-quantized rows of random floats (every
    other row, where it can quantize the type) and random bytes with the fp16 scales set to finite values from
    subnormal to 2^3 (any sign; Q8_0's int8 -128 appears only this way)."""
    _, block_values, block_bytes = TYPES[type_name]
    raw = rng.integers(0, 256, size=(rows, num_blocks, block_bytes), dtype=np.uint8)
    for offset in FP16_FIELDS[type_name]:
        scale = rng.standard_normal((rows, num_blocks)) * np.exp2(rng.integers(-18, 3, size=(rows, num_blocks)))
        raw[:, :, offset:offset + 2] = scale.astype(np.float16).view(np.uint8).reshape(rows, num_blocks, 2)
    raw = raw.reshape(rows, num_blocks * block_bytes)
    if type_name in QUANTIZABLE:
        values = rng.standard_normal((rows // 2, num_blocks * block_values)).astype(np.float32)
        values *= np.exp2(rng.integers(-6, 4, size=(rows // 2, 1))).astype(np.float32)
        raw[::2][:rows // 2] = gq.quantize(values, qtype(type_name))
    return raw


def reference(raw: torch.Tensor | np.ndarray, type_name: str) -> np.ndarray:
    array = raw.numpy() if isinstance(raw, torch.Tensor) else raw
    out = gq.dequantize(np.ascontiguousarray(array), qtype(type_name))
    assert np.isfinite(out).all()
    return out


def parts(raw: torch.Tensor, type_name: str, weight: np.ndarray) -> torch.Tensor:
    """|d part| + |min part| of each weight (|w| for types without a min field): see the module docstring."""
    if type_name not in MIN_FIELD:
        return torch.from_numpy(np.abs(weight)).double()
    block_bytes = TYPES[type_name][2]
    blocks = np.ascontiguousarray(raw.numpy()).reshape(raw.shape[0], -1, block_bytes)
    total = np.zeros_like(weight, dtype=np.float64)
    for zeroed in MIN_FIELD[type_name]:
        b = blocks.copy()
        b[:, :, zeroed:zeroed + 2] = 0
        total += np.abs(reference(b.reshape(raw.shape[0], -1), type_name))
    return torch.from_numpy(total)


def check_dequantize(raw: torch.Tensor, type_name: str, ref: np.ndarray) -> None:
    out = torch.full(ref.shape, float("nan"))
    kernel.dequantize(raw, type_name, out)
    # bit for bit (torch.equal would let -0.0 stand for 0.0)
    assert torch.equal(out.view(torch.int32), torch.from_numpy(ref.view(np.int32))), type_name
    out16 = torch.empty(ref.shape, dtype=torch.bfloat16)
    kernel.dequantize(raw, type_name, out16)
    assert torch.equal(out16.view(torch.int16), torch.from_numpy(ref).to(torch.bfloat16).view(torch.int16)), type_name


def act_step(x: torch.Tensor, block: int) -> torch.Tensor:
    """Each activation's int8 step: its block's amax / 127 (32 values, or 256 for the K-quants)."""
    rows, k = x.shape
    amax = x.double().reshape(rows, k // block, block).abs().amax(-1, keepdim=True) / 127
    return amax.expand(rows, k // block, block).reshape(rows, k)


class Worst:
    """The largest error / bound ratio seen per (type, path): the bounds' tightness (printed with -s)."""

    ratios: dict[tuple[str, str], float] = {}

    @classmethod
    def note(cls, type_name: str, path: str, ratio: float) -> None:
        key = (type_name, path)
        cls.ratios[key] = max(cls.ratios.get(key, 0.0), ratio)


def check_matmul(x: torch.Tensor, raw: torch.Tensor, type_name: str, weight: torch.Tensor, absparts: torch.Tensor,
                 bias: torch.Tensor | None = None, int_dot: bool = False) -> torch.Tensor:
    y = kernel.matmul(x, raw, type_name, bias, int_dot=int_dot)
    assert y.dtype == x.dtype and y.shape == (x.shape[0], raw.shape[0])
    xd = x.double()
    num_in = x.shape[1]
    want = xd @ weight.T
    gamma = (num_in / 16 + 32) * U
    if int_dot:
        step = act_step(x, TYPES[type_name][1])
        bound = 0.501 * (step @ weight.abs().T) + gamma * ((xd.abs() + step) @ absparts.T)
    else:
        bound = gamma * (xd.abs() @ weight.abs().T)
    if bias is not None:
        want = want + bias.double()
        bound = bound + gamma * bias.double().abs()
    if x.dtype == torch.bfloat16:
        bound = bound + 2.0 ** -8 * (want.abs() + bound)
    err = (y.double() - want).abs()
    assert torch.isfinite(y).all()
    excess = (err - bound).max().item()
    assert excess <= 0, (f"{type_name} M={x.shape[0]} {x.dtype} int_dot={int_dot}: error {err.max().item():.3g} "
                         f"exceeds the bound by {excess:.3g}")
    path = f"{'int' if int_dot else 'float'} {str(x.dtype).removeprefix('torch.')}"
    Worst.note(type_name, path, (err / bound.clamp_min(1e-300)).max().item())
    return y


def paths(type_name: str) -> list[bool]:
    return [False, True] if kernel.supports(type_name, int_dot=True) else [False]


@pytest.mark.parametrize("type_name", sorted(TYPES))
def test_random_blocks(type_name: str) -> None:
    rng = np.random.default_rng(sum(map(ord, type_name)))
    _, block_values, block_bytes = TYPES[type_name]
    # 32-value types: 25 blocks (an odd last block, a partial 256-value tile); 37 rows: a partial group of 4.
    num_blocks = 25 if block_values == 32 else 3
    num_in, num_out = num_blocks * block_values, 37
    # Strided rows: every other row of a wider buffer, from its second block on.
    big = torch.from_numpy(random_blocks(type_name, 2 * num_out, num_blocks + 1, rng))
    raw = big[1::2, block_bytes:]
    assert not raw.is_contiguous() and raw.stride(1) == 1
    ref = reference(raw, type_name)
    check_dequantize(raw, type_name, ref)
    weight = torch.from_numpy(ref).double()
    absparts = parts(raw, type_name, ref)
    gen = torch.Generator().manual_seed(0)
    bias = torch.randn(num_out, generator=gen)
    for rows in (1, 2, 3, 4, 5, 6, 7, 8, 17):  # every tail of the kernels' 1/2/3/4-row groups
        # activations over a few orders of magnitude, some blocks all zero
        x = torch.randn(rows, num_in, generator=gen) * torch.exp2(torch.randint(-4, 5, (rows, 1), generator=gen))
        x[:, :32] = 0
        for int_dot in paths(type_name):
            check_matmul(x, raw, type_name, weight, absparts, bias if rows % 2 else None, int_dot)
            if rows in (1, 3, 5):
                check_matmul(x.bfloat16(), raw, type_name, weight, absparts, bias, int_dot)
    check_matmul(x, raw.contiguous(), type_name, weight, absparts)  # a contiguous weight


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS"])
def test_many_rows_and_shapes(type_name: str) -> None:
    """M up to a few hundred; the smallest K (one block); a non-contiguous x (strided rows, or transposed)."""
    rng = np.random.default_rng(7)
    block_values = TYPES[type_name][1]
    gen = torch.Generator().manual_seed(3)
    for num_out, num_blocks, rows in ((20, 1, 1), (5, 1, 130), (33, 2, 64), (24, 512 // block_values, 300)):
        raw = torch.from_numpy(random_blocks(type_name, num_out, num_blocks, rng))
        ref = reference(raw, type_name)
        weight, absparts = torch.from_numpy(ref).double(), parts(raw, type_name, ref)
        num_in = num_blocks * block_values
        x = torch.randn(rows, num_in + 3, generator=gen)[:, 1:num_in + 1]  # rows num_in + 3 apart
        for int_dot in paths(type_name):
            check_matmul(x, raw, type_name, weight, absparts, None, int_dot)
        xt = torch.randn(num_in, rows, generator=gen).T  # stride (1, rows): copied
        check_matmul(xt, raw, type_name, weight, absparts)


def test_threads_and_determinism() -> None:
    """Each output is one thread's fixed-order sum: the same bits at 1 or 2 threads, and with several Python
    threads calling at once."""
    rng = np.random.default_rng(11)
    cases = []
    for type_name, rows in (("Q4_1", 1), ("Q5_0", 3), ("Q8_0", 9), ("Q4_K", 2), ("Q6_K", 5), ("Q2_K", 4)):
        num_in = 1024
        raw = torch.from_numpy(random_blocks(type_name, 67, num_in // TYPES[type_name][1], rng))
        x = torch.randn(rows, num_in, generator=torch.Generator().manual_seed(rows))
        for int_dot in paths(type_name):
            cases.append((x, raw, type_name, int_dot))
    single = [kernel.matmul(x, raw, t, int_dot=i) for x, raw, t, i in cases]
    torch.set_num_threads(2)  # (the fixture restores the count)
    double = [kernel.matmul(x, raw, t, int_dot=i) for x, raw, t, i in cases]
    assert all(torch.equal(a, b) for a, b in zip(single, double, strict=True))
    failures: list[str] = []

    def worker(offset: int) -> None:
        for j in range(3 * len(cases)):
            x, raw, t, i = cases[(j + offset) % len(cases)]
            if not torch.equal(kernel.matmul(x, raw, t, int_dot=i), single[(j + offset) % len(cases)]):
                failures.append(f"{t} int_dot={i}")

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not failures


def test_one_openmp_runtime() -> None:
    """The library's OpenMP is the libgomp torch loaded (one thread pool, sized by torch.get_num_threads()): it
    needs libgomp.so.1, which the loader resolves to the object of that name already loaded. (Wheels that vendor
    a renamed copy, e.g. sentencepiece's libgomp-<hash>.so, cannot be matched that way.)"""
    maps = Path("/proc/self/maps")
    if not maps.exists() or "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("needs Linux and a torch built with OpenMP")
    kernel.matmul(torch.zeros(1, 32), torch.zeros(1, 18, dtype=torch.uint8), "Q4_0")
    paths = {line.split()[-1] for line in maps.read_text().splitlines() if "/" in line}
    runtimes = {p for p in paths if Path(p).name.startswith("libgomp.so")}
    assert len(runtimes) == 1, runtimes
    assert any(Path(p).name.startswith("gguf_matmul-") for p in paths)


def test_rejects_bad_arguments() -> None:
    raw = torch.zeros(4, 18, dtype=torch.uint8)
    x = torch.zeros(1, 32)
    bad_matmuls: list[tuple[torch.Tensor, torch.Tensor, str, dict[str, Any]]] = [
        (torch.zeros(1, 64), raw, "Q4_0", {}),  # K does not match the row's 32 values
        (torch.zeros(32), raw, "Q4_0", {}),  # x not 2-D
        (torch.zeros(1, 1, 32), raw, "Q4_0", {}),
        (torch.zeros(1, 32, dtype=torch.float16), raw, "Q4_0", {}),
        (torch.zeros(1, 32, dtype=torch.int32), raw, "Q4_0", {}),
        (x, raw[:, :17], "Q4_0", {}),  # not whole blocks
        (x, raw.view(torch.int8), "Q4_0", {}),
        (x, raw.flatten(), "Q4_0", {}),
        (x, torch.zeros(18, 4, dtype=torch.uint8).T, "Q4_0", {}),  # bytes of a row not contiguous
        (x, raw, "Q4_0", {"bias": torch.zeros(3)}),
        (x, raw, "Q4_0", {"bias": torch.zeros(1, 4)}),
        (x, raw, "TQ1_0", {}),
        (x, raw, "F16", {}),
        (x, torch.zeros(4, 84, dtype=torch.uint8), "Q2_K", {"int_dot": True}),  # no integer kernel for Q2_K
        (torch.zeros(1, 256), torch.zeros(4, 144, dtype=torch.uint8), "Q4_0", {}),  # 144 bytes: 8 Q4_0 blocks = 256
    ]
    for i, (xx, w, t, kw) in enumerate(bad_matmuls):
        if i == len(bad_matmuls) - 1:
            kernel.matmul(xx, w, t, **kw)  # the last one is fine (8 Q4_0 blocks), as a control
            continue
        with pytest.raises(ValueError):
            kernel.matmul(xx, w, t, **kw)
    for out in (torch.empty(4, 16), torch.empty(4, 32, dtype=torch.float16), torch.empty(32, 4).T,
                torch.empty(3, 32)):
        with pytest.raises(ValueError):
            kernel.dequantize(raw, "Q4_0", out)
    assert kernel.matmul(torch.zeros(0, 32), raw, "Q4_0").shape == (0, 4)
    assert kernel.matmul(x, raw[:0], "Q4_0").shape == (1, 0)
    assert kernel.supports("Q4_K") and not kernel.supports("F16") and not kernel.supports("Q2_K", int_dot=True)
    assert set(INT_DOT_TYPES) <= set(TYPES)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_row_does_not_depend_on_its_batch(type_name: str) -> None:
    """A decode step (one activation row; its own kernel on AVX2) gives the bits the same row gets in a batch:
    speculative verification and batched decoding must reproduce plain decoding's greedy choices. 4k + 3 output
    rows: the last group of four is partial. 5 rows: one register pass; 9 and 17: passes of 4-8 rows; 60: the
    tile path."""
    rng = np.random.default_rng(13)
    raw = torch.from_numpy(random_blocks(type_name, 4 * 9 + 3, 1024 // TYPES[type_name][1], rng))
    x = torch.randn(60, 1024, generator=torch.Generator().manual_seed(13))
    single = [kernel.matmul(x[m:m + 1], raw, type_name)[0] for m in range(60)]
    for rows in (5, 9, 17, 60):
        batch = kernel.matmul(x[:rows], raw, type_name)
        for m in range(rows):
            assert torch.equal(single[m], batch[m]), (rows, m)
    bias = torch.randn(39, generator=torch.Generator().manual_seed(14))
    for rows in (5, 9, 60):
        assert torch.equal(kernel.matmul(x[2:3], raw, type_name, bias)[0], kernel.matmul(x[:rows], raw, type_name,
                                                                                          bias)[2]), rows


def test_linear_and_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    """linear() by each of options(): [..., K] activations, bias, the dequant path in row chunks; choose()."""
    import builtin_plugins.cpu.gguf_native as native

    rng = np.random.default_rng(5)
    gen = torch.Generator().manual_seed(5)
    for type_name in ("Q4_1", "Q6_K", "Q3_K"):
        raw = torch.from_numpy(random_blocks(type_name, 45, 512 // TYPES[type_name][1], rng))
        ref = reference(raw, type_name)
        weight, absparts = torch.from_numpy(ref).double(), parts(raw, type_name, ref)
        x = torch.randn(2, 3, 512, generator=gen)
        bias = torch.randn(45, generator=gen)
        want = x.double() @ weight.T + bias.double()
        assert kernel.options(type_name) == (("float", "int", "dequant") if type_name in INT_DOT_TYPES
                                             else ("float", "dequant"))
        for how in kernel.options(type_name):
            for whole in (native.DEQUANT_WHOLE_BYTES, 0):  # whole, and 7-row chunks
                monkeypatch.setattr(native, "DEQUANT_WHOLE_BYTES", whole)
                monkeypatch.setattr(native, "DEQUANT_CHUNK_BYTES", 7 * 512 * 4)
                y = kernel.linear(x, raw, type_name, bias, how)
                assert y.shape == (2, 3, 45) and y.dtype == torch.float32
                if how == "dequant":  # F.linear over the exact weight: float32 accumulation
                    assert ((y.double() - want).abs() <= (512 / 16 + 32) * U * (x.double().abs() @ weight.abs().T
                                                                               + bias.double().abs())).all()
                else:  # exactly matmul's result, which check_matmul bounds
                    direct = check_matmul(x.reshape(6, 512), raw, type_name, weight, absparts, bias, how == "int")
                    assert torch.equal(y.reshape(6, 45), direct)
        y16 = kernel.linear(x.bfloat16(), raw, type_name, bias, "dequant")
        assert y16.dtype == torch.bfloat16
        with pytest.raises(ValueError):
            kernel.linear(x, raw, type_name, bias[:3], "dequant")
        with pytest.raises(ValueError):
            kernel.linear(x, raw, type_name, None, "fast")
    with pytest.raises(ValueError):
        kernel.linear(torch.zeros(2, 64), torch.zeros(2, 18, dtype=torch.uint8), "Q4_0")
    # choose: int at few rows, dequant at many (bfloat16); float32 activations keep int; no int -> float
    assert kernel.choose("Q4_1", 1, 1536, 576) == "int"
    assert kernel.choose("Q4_1", 256, 1536, 576) == "dequant"
    assert kernel.choose("Q4_1", 256, 1536, 576, dtype=torch.float32) == "int"
    assert kernel.choose("Q8_0", 16, 262144, 640) == "int" and kernel.choose("Q8_0", 64, 262144, 640) == "dequant"
    assert kernel.choose("Q3_K", 1, 2048, 2048) == "float"
    assert kernel.choose("Q3_K", 512, 2048, 2048) == "dequant"
    assert kernel.choose("Q4_K", 1, 640, 1024, allow_int=False) == "float"
    for type_name in TYPES:
        for dtype in (torch.float32, torch.bfloat16):
            picks = [kernel.choose(type_name, m, 1024, 1024, dtype=dtype) for m in range(1, 600)]
            assert set(picks) <= set(kernel.options(type_name))
            # one switch at most, towards dequant
            assert picks == sorted(picks, key=("int", "float", "dequant").index)
    with pytest.raises(ValueError):
        kernel.choose("F16", 1, 1, 1)


# --- real GGUF files ------------------------------------------------------------------------------------------

class _Reader(gguf.GGUFReader):  # type: ignore[name-defined,misc]
    """gguf.GGUFReader over a plain ndarray view of its memmap: slicing an np.memmap makes memmap objects, whose
    __array_finalize__ was two thirds of parsing gemma-3's 262144-token vocabulary (13 s -> 4.4 s here)."""

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain = value.view(np.ndarray)  # still the file's read-only mapping (its base keeps it open)


@functools.cache
def reader(name: str) -> Any:
    """One reader per file for the whole session."""
    import real_models

    return _Reader(real_models.real_model(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_FILES)
def test_real_file_tensors(name: str) -> None:
    by_type: dict[str, list] = {}
    for tensor in reader(name).tensors:
        type_name = tensor.tensor_type.name
        if type_name in ("F32", "F16", "BF16"):
            continue
        assert type_name in TYPES, f"{name}: {tensor.name} has a type the kernels do not support: {type_name}"
        by_type.setdefault(type_name, []).append(tensor)
    assert by_type, f"{name}: no quantized tensors"
    gen = torch.Generator().manual_seed(1)
    for type_name, tensors in sorted(by_type.items()):
        # the first, a middle and the last tensor of the type; 40 rows of each (its first or last rows)
        for j, tensor in enumerate({id(t): t for t in (tensors[0], tensors[len(tensors) // 2], tensors[-1])}.values()):
            data = tensor.data
            assert data.dtype == np.uint8 and data.ndim == 2, (tensor.name, data.dtype, data.shape)
            raw = torch.from_numpy(np.array(data[:40] if j % 2 == 0 else data[-40:]))  # a copy: the memmap is read-only
            ref = reference(raw, type_name)
            check_dequantize(raw, type_name, ref)
            weight, absparts = torch.from_numpy(ref).double(), parts(raw, type_name, ref)
            for rows in (1, 4, 7):
                x = torch.randn(rows, weight.shape[1], generator=gen)
                for int_dot in paths(type_name):
                    check_matmul(x, raw, type_name, weight, absparts, None, int_dot)
                    check_matmul(x.bfloat16(), raw, type_name, weight, absparts, None, int_dot)


def test_report_bounds() -> None:
    """Not a check: the worst error / bound ratios above (run with -s to see them)."""
    for (type_name, path), ratio in sorted(Worst.ratios.items()):
        print(f"{type_name:7} {path:14} worst error / bound {ratio:.3f}")
