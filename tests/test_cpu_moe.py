"""The CPU platform's fused_moe kernel (prepacked expert weights) against the core's grouped-experts reference."""

from __future__ import annotations

import pytest
import torch

from builtin_plugins.cpu.kernels import override_with_torch
from builtin_plugins.cpu.linear import _PACKED_DTYPES
from builtin_plugins.cpu.moe import onednn_fused_moe
from kernelcore.kernels import KernelTable, torch_fused_moe
from kernelcore.layers.fused_moe import grouped_experts, select_experts


@pytest.mark.skipif(torch.float32 not in _PACKED_DTYPES, reason="oneDNN linear prepacking is not available")
@pytest.mark.parametrize("num_tokens", [1, 5, 64])
def test_prepacked_experts_match_the_reference(num_tokens):
    torch.manual_seed(num_tokens)
    experts, hidden, inter, top_k = 6, 32, 24, 2
    x = torch.randn(num_tokens, hidden)
    w13 = torch.nn.Parameter(torch.randn(experts, 2 * inter, hidden) / hidden ** 0.5, requires_grad=False)
    w2 = torch.nn.Parameter(torch.randn(experts, hidden, inter) / inter ** 0.5, requires_grad=False)
    weights, ids = select_experts(torch.randn(num_tokens, experts), top_k, renormalize=True)
    expected = grouped_experts(x, w13, w2, weights, ids)
    torch.testing.assert_close(onednn_fused_moe(x, w13, w2, weights, ids), expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # a changed weight is repacked, never served stale
        w2.mul_(2)
    torch.testing.assert_close(onednn_fused_moe(x, w13, w2, weights, ids), 2 * expected, atol=2e-5, rtol=1e-5)


def test_the_cpu_platform_installs_it_in_the_kernel_table():
    table = KernelTable()
    table.register("fused_moe", lambda *a: None, owner="triton")
    override_with_torch(table.owned_by("cpu"))
    assert table.get("fused_moe") is onednn_fused_moe
    empty = KernelTable()
    override_with_torch(empty.owned_by("cpu"))
    assert not empty.has("fused_moe")
    assert torch_fused_moe is not onednn_fused_moe


def test_the_engine_serves_a_moe_model_through_it(tmp_path):
    """The whole engine (the worker applies the platform's kernel overrides) on a Qwen3-MoE checkpoint: the kernel
    table's fused_moe is the prepacked one, and greedy tokens equal transformers' generate."""
    from conftest_models import make_checkpoint
    from test_models_parity import load_hf, random_tokens

    from kernelcore import SamplingParams
    from kernelcore.engine.llm import LLM
    from kernelcore.kernels import kernel_table

    path = make_checkpoint("qwen3_moe", str(tmp_path / "moe"), norm_topk_prob=True)
    llm = LLM(path, max_num_batched_tokens=16)
    prompts = [random_tokens(n, seed=n) for n in (9, 21)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    if torch.float32 in _PACKED_DTYPES:
        assert kernel_table.get("fused_moe") is onednn_fused_moe
    llm.shutdown()
    hf = load_hf(path)
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
        assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist()
