"""The CPU platform's native small-M matmul against a float64 reference: float32/bfloat16/int8 weights, float32
and bfloat16 activations (bfloat16 pair dot products where the CPU has them), 1-8 rows (batches of up to 300
over low-precision weights, in several L2-sized passes), bias, strided rows; and the CPU linear methods that
route decode-sized calls through it (int8 against its dequantized reference)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from builtin_plugins.cpu.linear import _PACKED_DTYPES, CpuInt8LinearMethod, OneDnnLinearMethod, prepack_linears
from builtin_plugins.cpu.small_gemm import load_small_gemm_kernel

kernel = load_small_gemm_kernel()
if kernel is not None:  # the kernel itself at every batch size, whatever the routing sends it on this CPU
    unlimited = copy.copy(kernel)
    unlimited.max_rows_by_dtype = dict.fromkeys(kernel.max_rows_by_dtype, 1 << 20)
pytestmark = pytest.mark.skipif(kernel is None, reason="no C++ compiler: the torch paths are used")

# Float32 accumulation: about K * 2^-24 relative to sum |x w|. Bfloat16 outputs are also rounded once (2^-8).
RELATIVE = {torch.float32: 1e-5, torch.bfloat16: 8e-3}


def reference(x, weight, scale, bias):
    w = weight.double() if scale is None else weight.double() * scale.double()[:, None]
    y = x.double() @ w.T
    magnitude = x.double().abs() @ w.abs().T
    if bias is not None:
        y = y + bias.double()
        magnitude = magnitude + bias.double().abs()
    return y, magnitude


def random_weight(num_out, num_in, dtype, generator):
    w = torch.randn(num_out, num_in, generator=generator) * 0.05
    if dtype != torch.int8:
        return w.to(dtype), None
    scale = w.abs().amax(dim=1) / 127
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


@pytest.mark.parametrize("seed", range(9))
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_matches_float64_reference(seed, w_dtype, x_dtype):
    g = torch.Generator().manual_seed(seed)
    rows = 1 + seed % 8 if seed < 5 else 8
    if seed > 5 and w_dtype != torch.float32:  # batches: the 6-row tiles, each remainder, several passes
        rows = (13, 37, 300)[seed - 6]
    num_in = 8 * int(torch.randint(1, 200, (1,), generator=g))
    if rows == 300:  # 60 rows of 1024 fill the kernel's 256 KiB pass: five passes, the last one short
        num_in = 1024
    num_out = int(torch.randint(1, 300, (1,), generator=g))  # blocks of 4 and a remainder
    weight, scale = random_weight(num_out, num_in, w_dtype, g)
    bias = (torch.randn(num_out, generator=g) if seed % 2 else None)
    bias = bias.to(x_dtype) if bias is not None else None
    wide = torch.randn(rows, num_in + 24, generator=g).to(x_dtype)
    x = wide[:, 8:8 + num_in] if seed % 3 == 0 else wide[:, :num_in].contiguous()  # strided rows too
    y = unlimited(x, weight, scale, bias)
    assert y is not None and y.dtype == x_dtype and y.shape == (rows, num_out)
    expected, magnitude = reference(x, weight, scale, bias)
    error = (y.double() - expected).abs()
    assert (error <= RELATIVE[x_dtype] * magnitude + 1e-6).all(), error.max()


@pytest.mark.parametrize("options", range(8))
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_every_option_matches_float64_reference(options, w_dtype, x_dtype):
    """What the start-up tuning may pick (float lanes, far prefetch, float32 one row at a time) computes the
    same product: one row (where the options change the walk), a few, and a batch of tiles."""
    g = torch.Generator().manual_seed(options)
    for rows in (1, 3, 13):
        num_in, num_out = (8 * int(torch.randint(1, 120, (1,), generator=g)),
                           int(torch.randint(1, 90, (1,), generator=g)))
        weight, scale = random_weight(num_out, num_in, w_dtype, g)
        bias = torch.randn(num_out, generator=g).to(x_dtype)
        x = torch.randn(rows, num_in, generator=g).to(x_dtype)
        y = kernel.run(x, weight, scale, bias, float_lanes=bool(options & 1), far_prefetch=bool(options & 2),
                       single_stream=bool(options & 4))
        assert y is not None and y.dtype == x_dtype and y.shape == (rows, num_out)
        expected, magnitude = reference(x, weight, scale, bias)
        error = (y.double() - expected).abs()
        assert (error <= RELATIVE[x_dtype] * magnitude + 1e-6).all(), (rows, error.max())


def test_leading_dims_and_fallbacks():
    g = torch.Generator().manual_seed(0)
    weight, _ = random_weight(40, 64, torch.float32, g)
    x = torch.randn(2, 3, 64, generator=g)
    y = kernel(x, weight)
    assert y.shape == (2, 3, 40)
    torch.testing.assert_close(y, x @ weight.T, rtol=1e-5, atol=1e-5)
    assert kernel(torch.randn(kernel.max_rows_by_dtype[torch.float32, torch.float32] + 1, 64),
                  weight) is None  # oneDNN's
    assert kernel(torch.randn(kernel.max_rows_by_dtype[torch.int8, torch.float32] + 1, 64), weight.to(torch.int8),
                  torch.ones(40)) is None  # prefill-sized int8: torch's path
    # float32 activations over int8 keep the native batches on every CPU (the bf16 GEMM serves bf16 ones only)
    assert kernel(torch.randn(100, 64), weight.to(torch.int8), torch.ones(40)) is not None
    assert kernel(torch.randn(1, 60), torch.randn(40, 60)) is None  # K not a multiple of 8
    assert kernel(torch.randn(1, 64, dtype=torch.float16), weight.half()) is None
    assert kernel(torch.randn(1, 64), weight.t().contiguous().t()) is None  # not row-major
    assert kernel(torch.randn(1, 64), weight, None, torch.randn(40, dtype=torch.bfloat16)) is None


def _layer(weight, bias=None):
    layer = nn.Module()
    layer.weight = nn.Parameter(weight, requires_grad=False)
    layer.bias = bias
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 8, 20, 600, 2100])
def test_int8_method_matches_dequantized_reference(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    layer = _layer(torch.randn(96, 256, generator=g).to(dtype) * 0.05)
    method = CpuInt8LinearMethod()
    method.process_weights_after_loading(layer)
    assert layer.weight.dtype == torch.int8
    x = torch.randn(rows, 256, generator=g).to(dtype)
    bias = torch.randn(96, generator=g).to(dtype)
    reference_weight = method.dequantized_weight(layer, torch.float64)
    expected = x.double() @ reference_weight.T + bias.double()
    magnitude = x.double().abs() @ reference_weight.abs().T + bias.double().abs()
    y = method.apply(layer, x, bias)  # up to the kernel's row limit natively; then widened, then oneDNN/MKL
    assert y.dtype == dtype
    # bfloat16: the reference's scale is rounded to bfloat16 (2^-8) and so is the output.
    bound = (1e-5 if dtype == torch.float32 else 1.6e-2) * magnitude + 1e-6
    assert ((y.double() - expected).abs() <= bound).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unquantized_method_native_and_torch_agree(dtype):
    g = torch.Generator().manual_seed(1)
    layer = _layer(torch.randn(64, 128, generator=g).to(dtype))
    method = OneDnnLinearMethod()
    method.process_weights_after_loading(layer)
    x = torch.randn(4, 128, generator=g).to(dtype)
    native = method.apply(layer, x, None)
    torch.testing.assert_close(native.float(), torch.nn.functional.linear(x.float(), layer.weight.float()),
                               rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-2 if dtype == torch.bfloat16
                               else 1e-5)
    layer.weight.data.mul_(2)  # weights updated in place: same pointer, the kernel reads the new values
    torch.testing.assert_close(method.apply(layer, x, None).float(), 2 * native.float(),
                               rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-2 if dtype == torch.bfloat16
                               else 1e-5)


def test_unquantized_bf16_prefill_rows_match_fp32_reference():
    g = torch.Generator().manual_seed(2)
    layer = _layer(torch.randn(48, 64, generator=g).bfloat16())
    method = OneDnnLinearMethod()
    method.process_weights_after_loading(layer)
    # past the native kernel
    x = torch.randn(kernel.max_rows_by_dtype[torch.bfloat16, torch.bfloat16] + 1, 64, generator=g).bfloat16()
    bias = torch.randn(48, generator=g).bfloat16()
    expected = (x.double() @ layer.weight.double().T + bias.double())
    magnitude = x.double().abs() @ layer.weight.double().abs().T + bias.double().abs()
    y = method.apply(layer, x, bias)
    assert y.dtype == torch.bfloat16 and ((y.double() - expected).abs() <= 8e-3 * magnitude + 1e-6).all()


@pytest.mark.skipif(torch.float32 not in _PACKED_DTYPES, reason="oneDNN linear prepacking is not available")
def test_prepack_linears_packs_at_start_up_and_batches_reuse_it():
    g = torch.Generator().manual_seed(3)
    model = nn.Sequential(_layer(torch.randn(48, 64, generator=g)))
    model[0].quant_method = method = OneDnnLinearMethod()
    method.process_weights_after_loading(model[0])
    prepack_linears(model)
    packed = model[0].__dict__["_onednn_weight"]
    x = torch.randn(kernel.max_rows_by_dtype[torch.float32, torch.float32] + 1, 64, generator=g)  # a batch for oneDNN
    with torch.inference_mode():
        y = method.apply(model[0], x, None)
    assert model[0].__dict__["_onednn_weight"] is packed
    torch.testing.assert_close(y, x @ model[0].weight.T, rtol=1e-5, atol=1e-5)
