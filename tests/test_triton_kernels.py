"""Every Triton kernel against its torch reference (kernelcore.kernels.TORCH_REFERENCE_KERNELS), on CPU
tensors through Triton's interpreter: fp32 (and fp16 attention), ragged batches, block sizes 16 and 32,
GQA, prefill chunks starting mid-sequence, masked tails. Shapes stay small: the interpreter runs each
program in Python. On a GPU (benchmarks/gpu_check.sh) the same cases run natively with KC_TEST_DEVICE=cuda."""

import os
import sys

DEVICE = os.environ.get("KC_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: it picks its mode at @triton.jit

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="pip install 'kernelcore[cuda]'")

from kernelcore.kernels import TORCH_REFERENCE_KERNELS as REF  # noqa: E402

# bf16 arithmetic is broken in the interpreter: the low-precision cases run on a GPU only
LOW_PRECISION = [torch.float16, torch.bfloat16] if DEVICE != "cpu" else [torch.float16]


def _ensure_interpreted() -> None:
    """An earlier test may have imported triton in compiled mode (torch probes for it): import it again
    (all but its C extension, which cannot load twice)."""
    import triton.language as tl

    if DEVICE != "cpu" or type(tl.sum).__name__ == "InterpretedFunction":
        return
    stale = [m for m in sys.modules if (m.startswith("triton") and not m.startswith("triton._C"))
             or m.startswith("builtin_plugins.triton_kernels.")]
    for name in stale:
        del sys.modules[name]


_ensure_interpreted()


def kernel(name):
    from builtin_plugins.triton_kernels import load

    return load(name)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def tol(dtype):
    if dtype != torch.float32:
        return dict(atol=2e-2, rtol=2e-2)
    return dict(atol=1e-5, rtol=1e-5) if DEVICE == "cpu" else dict(atol=5e-3, rtol=5e-3)  # tl.dot: tf32 on GPUs


def make_batch(query_lens, context_lens, block_size, num_kv_heads, head_size, dtype, seed=0):
    """Random paged caches and shuffled block tables for a flattened batch."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    num_blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(num_blocks_per_seq) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    value_cache = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    block_tables = torch.zeros(len(seq_lens), max(num_blocks_per_seq), dtype=torch.long)
    for i, n in enumerate(num_blocks_per_seq):
        block_tables[i, :n] = torch.tensor(perm[:n])
        perm = perm[n:]
    query_start_loc = torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist())
    return (key_cache, value_cache, block_tables.to(DEVICE), torch.tensor(seq_lens, device=DEVICE),
            query_start_loc.to(DEVICE))


# (query_lens, context_lens): decodes, a fresh prefill, prefill chunks starting mid-sequence, tails
# that end mid-block, a chunk longer than one query tile.
BATCHES = {
    "mixed": ([1, 7, 1, 19, 5], [9, 0, 40, 13, 31]),
    "all-decode": ([1, 1, 1, 1], [0, 15, 16, 47]),
    "long-chunk": ([70, 1], [5, 33]),
}


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_paged_attention_matches_reference(block_size, num_heads, num_kv_heads, batch):
    query_lens, context_lens = BATCHES[batch]
    head_size, dtype = 16, torch.float32
    key_cache, value_cache, block_tables, seq_lens, qsl = make_batch(query_lens, context_lens, block_size,
                                                                      num_kv_heads, head_size, dtype)
    query = randn(sum(query_lens), num_heads, head_size)
    args = (query, key_cache, value_cache, block_tables, seq_lens, qsl, max(query_lens), int(seq_lens.max()), 0.3)
    torch.testing.assert_close(kernel("paged_attention")(*args), REF["paged_attention"](*args), **tol(dtype))


@pytest.mark.parametrize("dtype,head_size", [(d, 16) for d in LOW_PRECISION] + [(torch.float32, 24)])
def test_paged_attention_fp16_and_padded_head_size(dtype, head_size):
    query_lens, context_lens = BATCHES["mixed"]
    key_cache, value_cache, block_tables, seq_lens, qsl = make_batch(query_lens, context_lens, 16, 2, head_size, dtype)
    query = randn(sum(query_lens), 4, head_size, dtype=dtype)
    args = (query, key_cache, value_cache, block_tables, seq_lens, qsl, max(query_lens), int(seq_lens.max()),
            head_size ** -0.5)
    out = torch.full_like(query, float("nan"))
    kernel("paged_attention")(*args, out=out)
    torch.testing.assert_close(out, REF["paged_attention"](*args), **tol(dtype))


def dense_window_attention(query, key_cache, value_cache, block_tables, seq_lens, qsl, scale, window):
    """Every key of each sequence gathered, the causal and window masks applied: the plain definition."""
    out = torch.empty_like(query)
    block_size, group = key_cache.shape[1], query.shape[1] // key_cache.shape[2]
    for i, seq_len in enumerate(seq_lens.tolist()):
        s, e = qsl[i].item(), qsl[i + 1].item()
        table = block_tables[i, : -(-seq_len // block_size)]
        keys = key_cache[table].flatten(0, 1)[:seq_len].float().repeat_interleave(group, 1)
        values = value_cache[table].flatten(0, 1)[:seq_len].float().repeat_interleave(group, 1)
        pos = torch.arange(seq_len - (e - s), seq_len)[:, None]
        key_pos = torch.arange(seq_len)[None, :]
        scores = torch.einsum("qhd,khd->hqk", query[s:e].float(), keys) * scale
        scores = scores.masked_fill(~((key_pos <= pos) & (key_pos > pos - window)), float("-inf"))
        out[s:e] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values).to(query.dtype)
    return out


@pytest.mark.parametrize("window", [8, 21])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_paged_attention_sliding_window_never_reads_behind_the_window(batch, window):
    """The reference and the kernel against the dense definition; the blocks wholly behind each sequence's
    window hold huge values (the engine reuses freed blocks), so reading one would show."""
    query_lens, context_lens = BATCHES[batch]
    block_size, head_size = 16, 16
    key_cache, value_cache, block_tables, seq_lens, qsl = make_batch(query_lens, context_lens, block_size, 2,
                                                                      head_size, torch.float32)
    query = randn(sum(query_lens), 8, head_size)
    expected = dense_window_attention(query, key_cache, value_cache, block_tables, seq_lens, qsl, 0.3, window)
    for i, (context, _) in enumerate(zip(context_lens, query_lens, strict=True)):
        behind = max(0, context - window + 1) // block_size
        key_cache[block_tables[i, :behind]] = 1e4
        value_cache[block_tables[i, :behind]] = 1e4
    args = (query, key_cache, value_cache, block_tables, seq_lens, qsl, max(query_lens), int(seq_lens.max()), 0.3)
    torch.testing.assert_close(REF["paged_attention"](*args, sliding_window=window), expected, **tol(torch.float32))
    torch.testing.assert_close(kernel("paged_attention")(*args, sliding_window=window), expected, **tol(torch.float32))


@pytest.mark.parametrize("block_size", [16, 32])
def test_reshape_and_cache_matches_reference(block_size):
    num_tokens, num_kv_heads, head_size, num_blocks = 11, 2, 16, 4
    qkv = randn(num_tokens, (4 + 2 * num_kv_heads) * head_size)  # k and v as column slices, as the model has them
    k, v = qkv[:, 4 * head_size:].split(num_kv_heads * head_size, dim=-1)
    k, v = k.view(num_tokens, num_kv_heads, head_size), v.view(num_tokens, num_kv_heads, head_size)
    slots = torch.randperm(num_blocks * block_size)[:num_tokens].to(DEVICE)
    slots[3] = -1  # padding token: skipped
    caches = [torch.zeros(num_blocks, block_size, num_kv_heads, head_size, device=DEVICE) for _ in range(4)]
    kernel("reshape_and_cache")(k, v, caches[0], caches[1], slots)
    REF["reshape_and_cache"](k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[0].abs().sum() > 0


@pytest.mark.parametrize("shape", [(5, 48), (3, 64)])
def test_rms_norm_and_fused_add(shape):
    x, residual, weight = randn(*shape), randn(*shape), randn(shape[-1])
    torch.testing.assert_close(kernel("rms_norm")(x, weight, 1e-5), REF["rms_norm"](x, weight, 1e-5), **tol(x.dtype))
    res_a, res_b = residual.clone(), residual.clone()
    out_a, got_res = kernel("fused_add_rms_norm")(x, res_a, weight, 1e-5)
    out_b, _ = REF["fused_add_rms_norm"](x, res_b, weight, 1e-5)
    assert got_res is res_a  # the residual stream is updated in place
    torch.testing.assert_close(res_a, x + residual, **tol(x.dtype))
    torch.testing.assert_close(out_a, out_b, **tol(x.dtype))


@pytest.mark.parametrize("head_size,rotary_dim", [(16, 16), (32, 16)])
def test_rotary_embedding_in_place_on_qkv_slices(head_size, rotary_dim):
    from kernelcore.layers.rotary import _build_cache

    num_tokens, num_heads, num_kv_heads = 6, 4, 2
    cache = _build_cache(10000.0, rotary_dim, 64, None).to(DEVICE)
    positions = torch.tensor([0, 5, 6, 7, 33, 63], device=DEVICE)
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size)
    expected = qkv.clone()
    sizes = [num_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size]
    q, k, _ = qkv.split(sizes, dim=-1)
    eq, ek, _ = expected.split(sizes, dim=-1)
    kernel("rotary_embedding")(positions, q, k, cache, head_size, rotary_dim)
    REF["rotary_embedding"](positions, eq, ek, cache, head_size, rotary_dim)
    torch.testing.assert_close(qkv, expected, **tol(qkv.dtype))  # v untouched, q and k rotated in place


@pytest.mark.parametrize("shape", [(7, 80), (2, 3, 32)])
def test_silu_and_mul(shape):
    x = randn(*shape)
    torch.testing.assert_close(kernel("silu_and_mul")(x), REF["silu_and_mul"](x), **tol(x.dtype))


@pytest.mark.parametrize("shape", [(7, 80), (2, 3, 32)])
def test_gelu_tanh_and_mul(shape):
    x = randn(*shape) * 3  # into the tails, where tanh saturates
    torch.testing.assert_close(kernel("gelu_tanh_and_mul")(x), REF["gelu_tanh_and_mul"](x), **tol(x.dtype))


def naive_moe(x, w13, w2, topk_weights, topk_ids):
    """Token by token, expert by expert: the definition."""
    inter = w2.shape[2]
    out = torch.zeros_like(x, dtype=torch.float32)
    for t in range(x.shape[0]):
        for weight, e in zip(topk_weights[t].tolist(), topk_ids[t].tolist(), strict=True):
            h = w13[e].float() @ x[t].float()
            out[t] += weight * (w2[e].float() @ (torch.nn.functional.silu(h[:inter]) * h[inter:]))
    return out.to(x.dtype)


@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 8, 2), (37, 8, 2), (20, 4, 3)])
def test_fused_moe_matches_reference_and_definition(num_tokens, num_experts, top_k):
    from kernelcore.layers.fused_moe import select_experts

    hidden, inter = 48, 40  # neither a power of two: masked tiles
    x = randn(num_tokens, hidden)
    w13, w2 = randn(num_experts, 2 * inter, hidden) * 0.2, randn(num_experts, hidden, inter) * 0.2
    weights, ids = select_experts(randn(num_tokens, num_experts), top_k, renormalize=True)
    expected = naive_moe(x, w13, w2, weights, ids)
    torch.testing.assert_close(REF["fused_moe"](x, w13, w2, weights, ids), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kernel("fused_moe")(x, w13, w2, weights, ids), expected, atol=1e-4, rtol=1e-4)
