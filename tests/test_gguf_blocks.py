"""builtin_plugins.quantization.gguf_blocks against gguf-py's numpy reference (gguf.quants): bit-exact dequantize
of random blocks and of real GGUF files' tensors, the reference linear, and gguf's own quantize round trip."""

from __future__ import annotations

import gguf
import gguf.quants as gq
import numpy as np
import pytest
import torch

from builtin_plugins.quantization import gguf_blocks as gb

pytestmark = pytest.mark.slow  # reads every tensor of the real GGUF files

SMOLLM_Q4_1 = "smollm2-135m-instruct-q4_1"  # kc pull names (tests/real_models.py)
GEMMA_Q4_K_M = "gemma-3-270m-q4_k_m"


def _real_file(name: str) -> str:
    """A real GGUF checkpoint from the kc pull cache (fetched once; fails, never skips, without it)."""
    import real_models

    return real_models.real_model(name)


# Byte offsets of each block's float16 fields (d, and dmin/m where present): random bytes there could be inf/NaN.
FP16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,),
}


def _qtype(name: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[name]


def _random_blocks(type_name: str, rows: int, blocks: int, seed: int = 0) -> np.ndarray:
    """Random stored rows of ``type_name`` whose float16 scales are finite: any sign, exponents up to 2**5 down
    through subnormals and zero, so every product stays finite in float32."""
    rng = np.random.RandomState(seed)
    nbytes = gb.block_size(type_name)[1]
    raw = rng.randint(0, 256, size=(rows, blocks, nbytes), dtype=np.uint8)
    for off in FP16_FIELDS[type_name]:
        bits = (rng.randint(0, 2, size=(rows, blocks)) << 15) | (rng.randint(0, 21, size=(rows, blocks)) << 10)
        bits |= rng.randint(0, 1024, size=(rows, blocks))
        raw[:, :, off:off + 2] = bits.astype(np.uint16)[..., None].view(np.uint8)
    return raw.reshape(rows, blocks * nbytes)


def _reference(raw: np.ndarray, type_name: str) -> np.ndarray:
    ref = gq.dequantize(np.ascontiguousarray(raw), _qtype(type_name))
    assert np.isfinite(ref).all()
    return ref


def _assert_bitwise(ours: torch.Tensor, ref: np.ndarray) -> None:
    assert ours.dtype == torch.float32 and tuple(ours.shape) == ref.shape
    # Compare the bits: torch.equal would let -0.0 stand for 0.0.
    assert torch.equal(ours.contiguous().view(torch.int32), torch.from_numpy(ref.astype(np.float32).view(np.int32)))


def _quantizable() -> list[str]:
    """The types gguf-py can quantize itself (the K and IQ types it can only dequantize)."""
    out = []
    for name in gb.QUANTIZED_TYPES:
        try:
            gq.quantize(np.zeros((1, gb.block_size(name)[0]), np.float32), _qtype(name))
        except NotImplementedError:
            continue
        out.append(name)
    return out


def test_sizes_match_gguf():
    for name in (*gb.QUANTIZED_TYPES, "F32", "F16", "BF16"):
        elems, nbytes = gguf.GGML_QUANT_SIZES[_qtype(name)]
        assert gb.block_size(name) == (elems, nbytes)
        assert gb.row_bytes(name, 3 * elems) == 3 * nbytes
        if elems > 1:
            with pytest.raises(ValueError):
                gb.row_bytes(name, elems + 1)
    assert len(set(gb.QUANTIZED_TYPES)) == 12


@pytest.mark.parametrize("type_name", gb.QUANTIZED_TYPES)
def test_dequantize_exact(type_name):
    raw = _random_blocks(type_name, rows=7, blocks=3)
    ref = _reference(raw, type_name)
    ours = gb.dequantize(torch.from_numpy(raw), type_name)
    _assert_bitwise(ours, ref)
    assert torch.equal(gb.dequantize(torch.from_numpy(raw), type_name, cols=ref.shape[1], dtype=torch.bfloat16),
                       ours.to(torch.bfloat16))


@pytest.mark.parametrize("type_name", gb.QUANTIZED_TYPES)
def test_strided_rows_and_chunks(type_name, monkeypatch):
    raw = _random_blocks(type_name, rows=12, blocks=2, seed=1)
    ref = _reference(raw, type_name)
    full = torch.from_numpy(raw)
    _assert_bitwise(gb.dequantize(full[1::3], type_name), ref[1::3])
    # Rows padded to an odd pitch: no field of a block lands on an aligned address.
    padded = torch.zeros(12, raw.shape[1] + 3, dtype=torch.uint8)
    padded[:, 1:1 + raw.shape[1]] = full
    _assert_bitwise(gb.dequantize(padded[:, 1:1 + raw.shape[1]], type_name), ref)
    # Several internal chunks (a few rows each), written into a preallocated buffer.
    monkeypatch.setattr(gb, "_CHUNK_ELEMS", 5 * ref.shape[1])
    out = torch.full(ref.shape, float("nan"))
    assert gb.dequantize_rows_into(full, type_name, out) is out
    _assert_bitwise(out, ref)


@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16"])
def test_float_types(type_name):
    values = torch.randn(5, 64, generator=torch.Generator().manual_seed(2)).to(gb._FLOAT_TYPES[type_name])
    raw = values.view(torch.uint8)
    _assert_bitwise(gb.dequantize(raw, type_name), _reference(raw.numpy(), type_name))
    assert torch.equal(gb.dequantize(raw[::2], type_name), values[::2].float())


def test_bad_input():
    raw = torch.from_numpy(_random_blocks("Q4_0", rows=2, blocks=2))
    with pytest.raises(ValueError):
        gb.dequantize(raw.view(torch.int8), "Q4_0")
    with pytest.raises(ValueError):
        gb.dequantize(raw[:, :-1], "Q4_0")
    with pytest.raises(ValueError):
        gb.dequantize(raw, "Q4_0", cols=32)
    with pytest.raises(NotImplementedError):
        gb.dequantize(raw, "IQ2_XXS")


@pytest.mark.parametrize("type_name", gb.QUANTIZED_TYPES)
def test_linear(type_name):
    # 300 output rows: more than one 256-row dequantize chunk.
    raw = torch.from_numpy(_random_blocks(type_name, rows=300, blocks=256 // gb.block_size(type_name)[0], seed=3))
    weight = gb.dequantize(raw, type_name)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, weight.shape[1], generator=gen)
    bias = torch.randn(300, generator=gen)
    out = gb.linear(x, raw, type_name, bias)
    ref = x @ weight.T + bias
    assert out.shape == (2, 3, 300) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    out16 = gb.linear(x.bfloat16(), raw, type_name)
    assert out16.dtype == torch.bfloat16
    ref16 = x.bfloat16().float() @ weight.bfloat16().float().T
    torch.testing.assert_close(out16.float(), ref16, rtol=2e-2, atol=2e-2 * ref16.abs().max().item())


@pytest.mark.parametrize("type_name", _quantizable())
def test_gguf_quantize_round_trip(type_name):
    values = np.random.RandomState(5).randn(6, 4 * gb.block_size(type_name)[0]).astype(np.float32)
    raw = gq.quantize(values, _qtype(type_name))
    _assert_bitwise(gb.dequantize(torch.from_numpy(raw), type_name), _reference(raw, type_name))


@pytest.mark.parametrize("name", [SMOLLM_Q4_1, GEMMA_Q4_K_M])
def test_real_file_tensors(name: str) -> None:
    path = _real_file(name)
    seen: set[str] = set()
    for tensor in gguf.GGUFReader(path).tensors:
        type_name = tensor.tensor_type.name
        if type_name in seen or (type_name not in gb.QUANTIZED_TYPES and type_name not in gb._FLOAT_TYPES):
            continue
        seen.add(type_name)
        data = np.asarray(tensor.data)
        data = data.reshape(-1, data.shape[-1])[:64]  # the first rows are enough (token_embd has 262144)
        raw = np.array(data).view(np.uint8)  # a writable copy; float tensors come back typed, quantized ones as bytes
        _assert_bitwise(gb.dequantize(torch.from_numpy(raw), type_name), _reference(raw, type_name))
    assert seen & set(gb.QUANTIZED_TYPES)
