"""The CPU platform's native pointwise kernels (RMSNorm with and without the residual add, the rotary embedding,
silu-and-mul) against the torch references of the kernel table, float32 and bfloat16, strided rows, decode and
prefill sizes; the fallbacks; and the layers' CPU forwards going through the table."""

from __future__ import annotations

import pytest
import torch

from builtin_plugins.cpu import pointwise
from kernelcore import kernels as ref

pytestmark = pytest.mark.skipif(pointwise.load_pointwise_kernels() is None,
                                reason="no C++ compiler: the torch paths are used")

DTYPES = [torch.float32, torch.bfloat16]
ROWS = [1, 3, 200]  # decode, a few, enough to run in parallel


def close(actual, expected, dtype):
    # Float32: summation order only. Bfloat16: each result rounded where torch rounds; a different float32
    # sum can move a value across a rounding boundary, then the next rounding too.
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(actual.float(), expected.float(), rtol=1.6e-2, atol=1e-5)  # two ulps: two roundings
        assert (actual != expected).float().mean() < 0.01  # nearly all bit-equal


def strided(rows, cols, dtype, generator, pad=24):
    """A [rows, cols] view with row stride cols + pad (as a column slice of a fused output is)."""
    base = torch.randn(rows, cols + pad, generator=generator).to(dtype)
    return base[:, 3:3 + cols] if pad else base


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_rms_norm_matches_the_reference(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    x = strided(rows, 768, dtype, g)
    weight = (1 + 0.1 * torch.randn(768, generator=g)).to(dtype)
    close(pointwise.rms_norm(x, weight, 1e-6), ref.torch_rms_norm(x, weight, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_fused_add_rms_norm_updates_the_residual_in_place(dtype, rows):
    g = torch.Generator().manual_seed(10 + rows)
    x = torch.randn(rows, 512, generator=g).to(dtype)
    residual = torch.randn(rows, 512, generator=g).to(dtype)
    weight = torch.randn(512, generator=g).to(dtype)
    expected_out, expected_residual = ref.torch_fused_add_rms_norm(x.clone(), residual.clone(), weight, 1e-5)
    out, new_residual = pointwise.fused_add_rms_norm(x, residual, weight, 1e-5)
    assert new_residual is residual
    assert torch.equal(residual, expected_residual)  # one add, one rounding: bit-equal
    close(out, expected_out, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache_dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("adjacent", [True, False])
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_rotary_embedding_in_place(dtype, cache_dtype, rows, adjacent, rotary_dim):
    g = torch.Generator().manual_seed(rows + rotary_dim)
    head, heads, kv_heads = 64, 4, 2
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head, generator=g).to(dtype)
    if adjacent:  # column slices of one fused qkv output
        q, k = qkv[:, :heads * head], qkv[:, heads * head:(heads + kv_heads) * head]
    else:
        q, k = qkv[:, :heads * head].clone(), qkv[:, heads * head:(heads + kv_heads) * head].clone()
    v_before = qkv[:, (heads + kv_heads) * head:].clone()
    cache = torch.randn(4096, rotary_dim, generator=g).to(cache_dtype)
    positions = torch.randint(0, 4096, (rows,), generator=g)
    q_ref, k_ref = q.clone(), k.clone()
    ref.torch_rotary_embedding(positions, q_ref, k_ref, cache, head, rotary_dim)
    q_out, k_out = pointwise.rotary_embedding(positions, q, k, cache, head, rotary_dim)
    assert q_out is q and k_out is k
    close(q, q_ref, dtype)
    close(k, k_ref, dtype)
    assert torch.equal(qkv[:, (heads + kv_heads) * head:], v_before)  # values untouched


def test_rotary_position_outside_the_cache_is_refused_before_writing():
    q, k = torch.randn(2, 128), torch.randn(2, 64)
    before = q.clone()
    with pytest.raises(ValueError, match="outside the cache"):
        pointwise.rotary_embedding(torch.tensor([3, 16]), q, k, torch.randn(16, 64), 64, 64)
    assert torch.equal(q, before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_silu_and_mul_matches_the_reference(dtype, rows):
    g = torch.Generator().manual_seed(20 + rows)
    x = strided(rows, 2 * 1024, dtype, g)
    close(pointwise.silu_and_mul(x), ref.torch_silu_and_mul(x), dtype)


def test_other_dtypes_and_layouts_fall_back_to_torch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, generator=g).half()
    w = torch.ones(64).half()
    torch.testing.assert_close(pointwise.rms_norm(x, w, 1e-6), ref.torch_rms_norm(x, w, 1e-6))
    torch.testing.assert_close(pointwise.silu_and_mul(x), ref.torch_silu_and_mul(x))
    cols = torch.randn(64, 4, generator=g).T  # rows not contiguous
    torch.testing.assert_close(pointwise.silu_and_mul(cols), ref.torch_silu_and_mul(cols))
    three_d = torch.randn(2, 3, 64, generator=g)
    torch.testing.assert_close(pointwise.rms_norm(three_d, torch.ones(64), 1e-6),
                               ref.torch_rms_norm(three_d, torch.ones(64), 1e-6))


def test_the_cpu_platform_puts_them_in_the_kernel_table():
    from builtin_plugins.cpu.kernels import override_with_torch
    from kernelcore.kernels import KernelTable

    table = KernelTable()  # an empty table: no Triton plugin registered the names
    override_with_torch(table.owned_by("cpu"))
    for name, fn in pointwise.KERNELS.items():
        assert table.get(name) is fn and table.is_overridden(name)
