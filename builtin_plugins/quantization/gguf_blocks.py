"""Pure-PyTorch reference for GGUF (llama.cpp) block quantization: dequantize rows of stored blocks, and a
matmul against them that never holds the whole weight in float.

The portable implementation for platforms without a native kernel, and the reference native kernels are tested
against. Results equal gguf-py's numpy ``gguf.quants.dequantize`` bit for bit in float32: every float operation
below is the one gguf-py does, in its order (integer unpacking is exact either way, so only the float multiplies
and adds need to line up). Only vectorised torch ops, so it runs on any device the input lives on.
"""

from __future__ import annotations

from collections.abc import Callable

import gguf
import torch

QUANTIZED_TYPES: tuple[str, ...] = (
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
)
_FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

# ggml's non-linear 4-bit codebook (kvalues_iq4nl), shared by IQ4_NL and IQ4_XS.
_IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

# Output elements per internal chunk: bounds the uint8/int temporaries (a few times the output) on big weights.
_CHUNK_ELEMS = 1 << 21
_LINEAR_ROWS = 256


def block_size(type_name: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of a GGUF type."""
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]


def row_bytes(type_name: str, cols: int) -> int:
    """Bytes of one stored row of ``cols`` elements."""
    elems, nbytes = block_size(type_name)
    if cols % elems:
        raise ValueError(f"{type_name} rows hold multiples of {elems} elements, not {cols}")
    return cols // elems * nbytes


def _view(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Reinterpreting bytes needs strides/offset divisible by the new item size; copy the (small) field if not.
    try:
        return t.view(dtype)
    except RuntimeError:
        return t.contiguous().view(dtype)


def _f16(b: torch.Tensor, off: int) -> torch.Tensor:
    """The float16 field at byte ``off`` of each block, as float32 [..., 1] (exact, like numpy's astype)."""
    return _view(b[..., off:off + 2], torch.float16).float()


def _bits(x: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """[..., k] -> [..., count, k]: the ``count`` ``width``-bit fields of each byte, lowest first."""
    shifts = torch.arange(0, width * count, width, dtype=torch.uint8, device=x.device).view(count, 1)
    return (x.unsqueeze(-2) >> shifts) & ((1 << width) - 1)


def _codebook(q: torch.Tensor) -> torch.Tensor:
    # Index with int64: a uint8 index tensor would be read as a boolean mask.
    values = torch.tensor(_IQ4_VALUES, dtype=torch.float32, device=q.device)
    return values[q.long()]


def _nibbles32(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 values: low nibbles first, then high nibbles (the 32-element block layout)."""
    return _bits(qs, 4, 2).flatten(-2)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """4 bytes (one little-endian uint32) -> its 32 bits, bit i at position i."""
    return _bits(qh, 1, 8).transpose(-1, -2).flatten(-2)


def _k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins (gguf-py's Q4_K.get_scale_min)."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], -1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], -1)
    return sc, mn


# Each takes blocks [..., bytes per block] (uint8) and returns [..., elements per block] float32.
def _q4_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * (_nibbles32(b[..., 2:]).to(torch.int8) - 8).float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _nibbles32(b[..., 4:]).float() + _f16(b, 2)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles32(b[..., 6:]) | (_bits32(b[..., 2:6]) << 4)
    return _f16(b, 0) * (q.to(torch.int8) - 16).float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles32(b[..., 8:]) | (_bits32(b[..., 4:8]) << 4)
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return _view(b[..., 2:], torch.int8).float() * _f16(b, 0)


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    # [scales 16][qs 64][d][dmin]; 16 sub-blocks of 16, each a 4-bit scale and 4-bit min.
    scales = b[..., :16]
    dl = (_f16(b, 80) * (scales & 0x0F).float()).unsqueeze(-1)
    ml = (_f16(b, 82) * (scales >> 4).float()).unsqueeze(-1)
    q = _bits(b[..., 16:80].unflatten(-1, (2, 32)), 2, 4).flatten(-3).unflatten(-1, (16, 16))
    return (dl * q.float() - ml).flatten(-2)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    # [hmask 32][qs 64][scales 12][d]; 6-bit signed scales split as 4 low bits + 2 high bits.
    s = b[..., 96:108]
    lo = _bits(s[..., :8], 4, 2).flatten(-2)
    hi = _bits(s[..., 8:], 2, 4).flatten(-2)
    scales = ((lo | (hi << 4)).to(torch.int8) - 32).float()
    dl = (_f16(b, 108) * scales).unsqueeze(-1)
    ql = _bits(b[..., 32:96].unflatten(-1, (2, 32)), 2, 4).flatten(-3)
    qh = _bits(b[..., :32], 1, 8).flatten(-2) ^ 1  # a set hmask bit means no -4 offset
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).float().unflatten(-1, (16, 16))
    return (dl * q).flatten(-2)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    # [d][dmin][scales 12][qs 128]; 8 sub-blocks of 32.
    sc, mn = _k_scale_min(b[..., 4:16])
    d = (_f16(b, 0) * sc.float()).unsqueeze(-1)
    dm = (_f16(b, 2) * mn.float()).unsqueeze(-1)
    q = _bits(b[..., 16:].unflatten(-1, (4, 32)), 4, 2).flatten(-3, -2)
    return (d * q.float() - dm).flatten(-2)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    # [d][dmin][scales 12][qh 32][qs 128]
    sc, mn = _k_scale_min(b[..., 4:16])
    d = (_f16(b, 0) * sc.float()).unsqueeze(-1)
    dm = (_f16(b, 2) * mn.float()).unsqueeze(-1)
    ql = _bits(b[..., 48:].unflatten(-1, (4, 32)), 4, 2).flatten(-3, -2)
    qh = _bits(b[..., 16:48], 1, 8)
    return (d * (ql | (qh << 4)).float() - dm).flatten(-2)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    # [ql 128][qh 64][scales 16 int8][d]; 16 sub-blocks of 16.
    d = (_f16(b, 208) * _view(b[..., 192:208], torch.int8).float()).unsqueeze(-1)
    ql = _bits(b[..., :128].unflatten(-1, (2, 64)), 4, 2).flatten(-3)
    qh = _bits(b[..., 128:192].unflatten(-1, (2, 32)), 2, 4).flatten(-3)
    q = ((ql | (qh << 4)).to(torch.int8) - 32).float().unflatten(-1, (16, 16))
    return (d * q).flatten(-2)


def _iq4_nl(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _codebook(_nibbles32(b[..., 2:]))


def _iq4_xs(b: torch.Tensor) -> torch.Tensor:
    # [d][scales_h 2 (uint16, 2 bits per sub-block)][scales_l 4 (nibbles)][qs 128]; 8 sub-blocks of 32.
    lo = _bits(b[..., 4:8], 4, 2).transpose(-1, -2).flatten(-2)
    hi = _bits(b[..., 2:4], 2, 4).transpose(-1, -2).flatten(-2)
    dl = (_f16(b, 0) * ((lo | (hi << 4)).to(torch.int8) - 32).float()).unsqueeze(-1)
    q = _bits(b[..., 8:].unflatten(-1, (8, 16)), 4, 2).flatten(-2)
    return (dl * _codebook(q)).flatten(-2)


_DEQUANT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0, "Q2_K": _q2_k, "Q3_K": _q3_k,
    "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs,
}


def _check(raw: torch.Tensor, type_name: str, cols: int | None) -> int:
    if raw.dtype != torch.uint8 or raw.dim() != 2:
        raise ValueError(f"expected uint8 [rows, row_bytes], got {raw.dtype} {tuple(raw.shape)}")
    if type_name not in _DEQUANT and type_name not in _FLOAT_TYPES:
        raise NotImplementedError(f"GGUF type {type_name} is not supported")
    elems, nbytes = block_size(type_name)
    if raw.shape[1] % nbytes:
        raise ValueError(f"{raw.shape[1]} bytes per row is not a whole number of {type_name} blocks ({nbytes})")
    inferred = raw.shape[1] // nbytes * elems
    if cols is not None and cols != inferred:
        raise ValueError(f"{raw.shape[1]} bytes of {type_name} hold {inferred} columns, not {cols}")
    return inferred


def _dequant_chunk(raw: torch.Tensor, type_name: str) -> torch.Tensor:
    """[rows, row_bytes] -> float32 [rows, cols] (float types: the bytes reinterpreted, then widened)."""
    if type_name in _FLOAT_TYPES:
        return _view(raw, _FLOAT_TYPES[type_name]).float()
    nbytes = block_size(type_name)[1]
    # [rows, blocks, bytes]: a view even for a strided row slice, so no copy of the input.
    return _DEQUANT[type_name](raw.unflatten(1, (-1, nbytes))).flatten(1)


def dequantize_rows_into(raw: torch.Tensor, type_name: str, out: torch.Tensor) -> torch.Tensor:
    """Dequantize ``raw`` [rows, row_bytes] into the preallocated float tensor ``out`` [rows, cols]; returns it."""
    cols = _check(raw, type_name, out.shape[-1])
    if tuple(out.shape) != (raw.shape[0], cols):
        raise ValueError(f"out is {tuple(out.shape)}, expected {(raw.shape[0], cols)}")
    step = max(1, _CHUNK_ELEMS // max(cols, 1))
    for start in range(0, raw.shape[0], step):
        out[start:start + step].copy_(_dequant_chunk(raw[start:start + step], type_name))
    return out


def dequantize(raw: torch.Tensor, type_name: str, cols: int | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Stored GGUF rows ``raw`` (uint8 [rows, row_bytes]) -> ``dtype`` [rows, cols]; exact in float32."""
    cols = _check(raw, type_name, cols)
    out = torch.empty(raw.shape[0], cols, dtype=dtype, device=raw.device)
    return dequantize_rows_into(raw, type_name, out)


def linear(x: torch.Tensor, raw: torch.Tensor, type_name: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequantize(raw).T + bias`` in x's dtype, dequantizing ``_LINEAR_ROWS`` output rows at a time into
    one reused buffer, so a large weight never exists in float all at once. x: [..., cols] -> [..., rows]."""
    rows = raw.shape[0]
    cols = _check(raw, type_name, x.shape[-1])
    x2 = x.reshape(-1, cols)
    out = torch.empty(x2.shape[0], rows, dtype=x.dtype, device=x.device)
    buf = torch.empty(min(rows, _LINEAR_ROWS), cols, dtype=x.dtype, device=x.device)
    for start in range(0, rows, _LINEAR_ROWS):
        w = dequantize_rows_into(raw[start:start + _LINEAR_ROWS], type_name, buf[:min(_LINEAR_ROWS, rows - start)])
        out[:, start:start + w.shape[0]] = x2 @ w.t()
    if bias is not None:
        out += bias.to(x.dtype)
    return out.reshape(*x.shape[:-1], rows)
