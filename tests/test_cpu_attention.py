"""The CPU attention backend against a dense reference: the native decode kernel, the torch fallback, the
cache layout's write path and mixed batches (decodes + chunks after a cached prefix + fresh prefills)."""

from __future__ import annotations

import pytest
import torch

from builtin_plugins.cpu.attention import CpuAttentionBackend, CpuAttentionImpl
from builtin_plugins.cpu.native import load_paged_decode_kernel
from kernelcore.attention.metadata import AttentionMetadata
from tests.helpers import run_python

SHAPES = [  # heads, kv heads, head size, block size
    (12, 4, 64, 16),  # Llama GQA
    (12, 12, 64, 16),  # OPT
    (8, 2, 80, 32),  # a head of 10 vectors (AVX2) taken 5 at a time; two vectors per block of keys
    (16, 8, 128, 16),  # Qwen3 / Llama 3 heads
    (6, 6, 96, 32),
    (4, 1, 128, 8),  # a block size without a specialised build
    (4, 1, 256, 16),  # Gemma 3 270M: one kv head of 16 vectors (AVX-512)
]
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def dense_attention(q, keys, values, scale, causal_from=None, window=None):
    """q [Lq, H, D], keys/values [L, Hkv, D] (float32 math); query j sees keys 0..causal_from + j (the last
    ``window`` of them with a sliding window)."""
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.float().repeat_interleave(group, 1), values.float().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys) * scale
    if causal_from is not None:
        q_pos = causal_from + torch.arange(q.shape[0])[:, None]
        allowed = torch.arange(keys.shape[0])[None, :] <= q_pos
        if window is not None:
            allowed &= torch.arange(keys.shape[0])[None, :] > q_pos - window
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)


def make_cache(num_blocks, block_size, num_kv_heads, head_size, dtype):
    shape = CpuAttentionBackend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
    return torch.zeros(shape, dtype=dtype)


def make_tables(totals, block_size, num_blocks, generator):
    """Shuffled block tables covering each sequence's final length, padded with 0."""
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables = []
    for total in totals:
        need = -(-total // block_size)
        tables.append(order[:need])
        order = order[need:]
    width = max(len(t) for t in tables)
    return [t + [0] * (width - len(t)) for t in tables]


def metadata_for(step, tables, block_size):
    """step: (context_len, query_len) per sequence, slots taken from ``tables``."""
    slots = [tables[i][p // block_size] * block_size + p % block_size
             for i, (context, num_q) in enumerate(step) for p in range(context, context + num_q)]
    query_lens = [n for _, n in step]
    seq_lens = [c + n for c, n in step]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor([0] + query_lens).cumsum(0),
        seq_lens=torch.tensor(seq_lens), context_lens=torch.tensor([c for c, _ in step]),
        block_tables=torch.tensor(tables), query_lens_list=query_lens, seq_lens_list=seq_lens,
        max_query_len=max(query_lens), max_seq_len=max(seq_lens))


def run_steps(impl, steps, block_size, dtype, seed=0, cache_dtype=None):
    """Feed each sequence's tokens through ``impl`` step by step; return (outputs, reference) per step.

    steps: one list of (context_len, query_len) per step, the same sequences in every step, contexts
    continuing where the previous step left them."""
    generator = torch.Generator().manual_seed(seed)
    num_heads, num_kv_heads, head_size = impl.num_heads, impl.num_kv_heads, impl.head_size
    totals = [c + n for c, n in steps[-1]]
    num_blocks = sum(-(-t // block_size) for t in totals) + 3
    kv_cache = make_cache(num_blocks, block_size, num_kv_heads, head_size, cache_dtype or dtype)
    tables = make_tables(totals, block_size, num_blocks, generator)
    history_k = [torch.empty(0, num_kv_heads, head_size, dtype=dtype) for _ in totals]
    history_v = [torch.empty(0, num_kv_heads, head_size, dtype=dtype) for _ in totals]
    results = []
    for step in steps:
        num_tokens = sum(n for _, n in step)
        q = torch.randn(num_tokens, num_heads, head_size, generator=generator).to(dtype)
        k = torch.randn(num_tokens, num_kv_heads, head_size, generator=generator).to(dtype)
        v = torch.randn(num_tokens, num_kv_heads, head_size, generator=generator).to(dtype)
        metadata = metadata_for(step, tables, block_size)
        if impl.sliding_window is not None:  # blocks wholly behind every query's window: huge keys and values
            for i, (context, _) in enumerate(step):
                behind = max(0, context - impl.sliding_window + 1) // block_size
                kv_cache[:, tables[i][:behind]] = 1e3
        out = impl.forward(q.flatten(1), k.flatten(1), v.flatten(1), kv_cache, metadata).view_as(q)
        reference, start = torch.empty(num_tokens, num_heads, head_size), 0
        for i, (context, num_q) in enumerate(step):
            assert history_k[i].shape[0] == context
            history_k[i] = torch.cat([history_k[i], k[start:start + num_q]])
            history_v[i] = torch.cat([history_v[i], v[start:start + num_q]])
            reference[start:start + num_q] = dense_attention(q[start:start + num_q], history_k[i], history_v[i],
                                                             impl.scale, causal_from=context,
                                                             window=impl.sliding_window)
            start += num_q
        results.append((out, reference))
    return results


def make_impl(num_heads, num_kv_heads, head_size, native: bool, sliding_window: int | None = None):
    impl = CpuAttentionImpl(num_heads, head_size, head_size ** -0.5, num_kv_heads)
    impl.sliding_window = sliding_window
    if native:
        assert impl.native_decode is not None, "the native kernel should build on the test machine"
    else:
        impl.native_decode = None
    return impl


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_decode_steps_match_dense_attention(shape, dtype, native):
    num_heads, num_kv_heads, head_size, block_size = shape
    impl = make_impl(num_heads, num_kv_heads, head_size, native)
    prompts = [1, 7, block_size, block_size + 1, 3 * block_size - 1]
    steps = [[(0, n) for n in prompts]] + [[(n + j, 1) for n in prompts] for j in range(3)]
    for out, reference in run_steps(impl, steps, block_size, dtype):
        torch.testing.assert_close(out.float(), reference, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_mixed_steps_decodes_chunks_after_prefix_and_fresh_prefills(native):
    impl = make_impl(12, 4, 64, native)
    steps = [
        [(0, 20), (0, 5), (0, 33)],
        [(20, 1), (5, 17), (33, 1)],  # decode, chunk after a cached prefix, decode
        [(21, 1), (22, 40), (34, 1)],
    ]
    for out, reference in run_steps(impl, steps, 16, torch.float32, seed=3):
        torch.testing.assert_close(out, reference, atol=2e-5, rtol=2e-5)


def test_native_kernel_handles_long_contexts_and_many_heads():
    impl = make_impl(64, 1, 64, native=True)  # a query group of 64 heads on one kv head
    steps = [[(0, 600), (0, 3)], [(600, 1), (3, 1)]]
    for out, reference in run_steps(impl, steps, 16, torch.float32, seed=5):
        torch.testing.assert_close(out, reference, atol=2e-5, rtol=2e-5)


def test_native_kernel_is_cached_and_rejects_unsupported_groups():
    kernel = load_paged_decode_kernel()
    assert kernel is load_paged_decode_kernel()
    assert kernel.supports_dtype(torch.bfloat16) and not kernel.supports_dtype(torch.float16)
    assert CpuAttentionImpl(12, 64, 0.125, 4).native_decode is kernel
    assert CpuAttentionImpl(130, 64, 0.125, 1).native_decode is None  # a query group of 130: torch ops


@pytest.mark.slow
def test_without_a_compiler_the_torch_path_serves_and_says_why(tmp_path):
    code = """
        import logging, torch
        logging.basicConfig(level=logging.INFO)
        from builtin_plugins.cpu.attention import CpuAttentionImpl
        impl = CpuAttentionImpl(4, 64, 0.125, 2)
        print("native:", impl.native_decode)
    """
    broken = run_python(code, CXX=str(tmp_path / "no-such-compiler"), KC_CACHE_DIR=str(tmp_path))
    assert "native: None" in broken.stdout
    assert "CPU decode-attention kernel unavailable" in broken.stderr and "no-such-compiler" in broken.stderr
    disabled = run_python(code, KC_CPU_NATIVE_KERNELS="0", KC_CACHE_DIR=str(tmp_path))
    assert "native: None" in disabled.stdout and "KC_CPU_NATIVE_KERNELS=0" in disabled.stderr
    built = run_python(code, KC_CACHE_DIR=str(tmp_path))
    assert "native: <builtin_plugins.cpu.native.PagedDecodeKernel" in built.stdout
    assert list((tmp_path / "cpu-kernels").glob("paged_attention-*.so"))


def test_native_kernel_refuses_block_tables_outside_the_cache():
    kernel = load_paged_decode_kernel()
    k_cache, v_cache = make_cache(4, 16, 2, 64, torch.float32)
    q = torch.randn(2, 4, 64)
    good = torch.tensor([[0, 1], [2, 3]])
    out = kernel(q, k_cache, v_cache, good, torch.tensor([20, 32]), 0.125)
    assert out.shape == q.shape and torch.isfinite(out).all()
    for tables, seq_lens in ((torch.tensor([[0, 1], [2, 4]]), [20, 32]),  # block 4 of a 4-block cache
                             (torch.tensor([[0, -1], [2, 3]]), [20, 32]),
                             (torch.tensor([[0], [2]]), [20, 16])):  # 20 tokens need two blocks
        with pytest.raises(ValueError, match="outside the KV cache or is too short"):
            kernel(q, k_cache, v_cache, tables, torch.tensor(seq_lens), 0.125)
    with pytest.raises(ValueError, match="slot out of range"):
        kernel.write_kv(torch.randn(1, 2, 64), torch.randn(1, 2, 64), k_cache, v_cache, torch.tensor([64]))


def test_a_kernel_directory_others_can_write_is_refused(tmp_path):
    kernels = tmp_path / "cpu-kernels"
    kernels.mkdir()
    kernels.chmod(0o777)
    proc = run_python("""
        import logging
        logging.basicConfig(level=logging.INFO)
        from builtin_plugins.cpu.native import load_paged_decode_kernel
        print("native:", load_paged_decode_kernel())
    """, KC_CACHE_DIR=str(tmp_path))
    assert "native: None" in proc.stdout
    assert "writable by other users" in proc.stderr and not list(kernels.glob("*.so"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,window", [((12, 4, 64, 16), 20), ((4, 1, 128, 8), 9), ((6, 3, 24, 16), 16)],
                         ids=["vec-block16", "vec-block8-generic", "generic-head24"])
@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_sliding_window_prefill_chunks_and_decodes_past_the_window(shape, window, dtype, native):
    """Fresh prefills longer than the window, chunks after a prefix, then decodes well past the window; the
    blocks wholly behind the window are overwritten with huge values before each step (the engine frees and
    reuses them), so reading any of them would show."""
    num_heads, num_kv_heads, head_size, block_size = shape
    impl = make_impl(num_heads, num_kv_heads, head_size, native, sliding_window=window)
    steps = [[(0, 30), (0, 5), (0, 1), (0, 100)], [(30, 1), (5, 17), (1, 40), (100, 45)]]  # 100: many windows
    lens = [31, 22, 41, 145]
    for _ in range(24):
        steps.append([(n, 1) for n in lens])
        lens = [n + 1 for n in lens]
    results = run_steps(impl, steps, block_size, dtype)
    for out, reference in results:
        torch.testing.assert_close(out.float(), reference, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,window", [((9, 3, 64, 16), None), ((4, 1, 256, 16), None), ((12, 4, 64, 32), None),
                                          ((4, 1, 256, 16), 700)],
                         ids=["smollm2", "gemma3", "block32", "gemma3-window"])
def test_long_sequences_decode_in_spans(shape, window, dtype):
    """Sequences longer than a span (512 positions) are decoded as several work items merged by their softmax
    sums: against dense attention, with a sliding window whose start falls inside a span too."""
    num_heads, num_kv_heads, head_size, block_size = shape
    impl = make_impl(num_heads, num_kv_heads, head_size, native=True, sliding_window=window)
    steps = [[(0, 1100), (0, 520), (0, 3)], [(1100, 1), (520, 1), (3, 1)], [(1101, 1), (521, 1), (4, 1)]]
    for out, reference in run_steps(impl, steps, block_size, dtype, seed=3):
        torch.testing.assert_close(out.float(), reference, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(9, 3, 64, 16), (4, 1, 256, 16)], ids=["smollm2", "gemma3"])
def test_a_sequences_decode_bits_do_not_depend_on_its_batch(shape, dtype):
    """A long sequence decoded alone and inside a batch of nine (where the work items become whole sequences,
    and other sequences' spans run beside its own) gives the same bits: speculative verification's rows must
    equal plain decoding's."""
    num_heads, num_kv_heads, head_size, block_size = shape
    impl = make_impl(num_heads, num_kv_heads, head_size, native=True)
    lengths = [1500, 3, 513, 700, 64, 1030, 2, 900, 1]
    generator = torch.Generator().manual_seed(11)
    num_blocks = sum(-(-n // block_size) for n in lengths) + 1
    cache_shape = CpuAttentionBackend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
    kv_cache = torch.randn(cache_shape, generator=generator).to(dtype)
    tables = make_tables(lengths, block_size, num_blocks, generator)
    q, k, v = (torch.randn(len(lengths), heads, head_size, generator=generator).to(dtype)
               for heads in (num_heads, num_kv_heads, num_kv_heads))

    def decode(which: list[int]) -> torch.Tensor:
        metadata = metadata_for([(lengths[i] - 1, 1) for i in which], [tables[i] for i in which], block_size)
        return impl.forward(q[which].flatten(1), k[which].flatten(1), v[which].flatten(1), kv_cache,
                            metadata).view(len(which), num_heads, head_size)

    batch = decode(list(range(len(lengths))))
    for i in (0, 2, 5, 1):
        assert torch.equal(decode([i])[0], batch[i]), f"sequence {i} (length {lengths[i]})"


@pytest.mark.parametrize("shape", [(9, 3, 64, 16), (4, 1, 256, 16), (8, 2, 80, 32), (4, 1, 128, 8)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_a_bfloat16_cache_under_float32_activations(shape, native):
    """--kv-cache-dtype bfloat16 with a float32 model: the cache holds each key and value rounded to bfloat16 (as
    .to(torch.bfloat16) rounds them), every product stays float32; decodes, a chunk after a cached prefix and fresh
    prefills within bfloat16's rounding of the keys and values."""
    num_heads, num_kv_heads, head_size, block_size = shape
    impl = make_impl(num_heads, num_kv_heads, head_size, native)
    if native:
        assert impl._native(torch.float32, torch.bfloat16) is not None
    prompts = [1, 7, block_size + 1, 3 * block_size - 1]
    steps = [[(0, n) for n in prompts], [(n, 1) for n in prompts], [(n + 1, 2 * block_size) for n in prompts],
             [(n + 1 + 2 * block_size, 1) for n in prompts]]
    for out, reference in run_steps(impl, steps, block_size, torch.float32, seed=5, cache_dtype=torch.bfloat16):
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, reference, atol=2e-2, rtol=2e-2)


def test_the_native_write_rounds_as_torch_does():
    kernel = load_paged_decode_kernel()
    if kernel is None:
        pytest.skip("no compiler")
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(5, 2, 64, generator=g), torch.randn(5, 2, 64, generator=g)
    caches = [make_cache(2, 16, 2, 64, dtype) for dtype in (torch.bfloat16, torch.float32)]
    slots = torch.tensor([0, 3, 16, 17, 31])
    for cache in caches:
        kernel.write_kv(k, v, cache[0], cache[1], slots)
    assert caches[0].dtype == torch.bfloat16
    assert torch.equal(caches[0], caches[1].to(torch.bfloat16))
    with pytest.raises(ValueError):  # bfloat16 activations into a float32 cache: not a combination it takes
        kernel.write_kv(k.bfloat16(), v.bfloat16(), caches[1][0], caches[1][1], slots)
