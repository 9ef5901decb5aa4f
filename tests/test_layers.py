"""Custom ops against transformers' reference modules, both dispatch paths; backend selection caching."""

from __future__ import annotations

import pytest
import torch

from kernelcore.layers.activation import SiluAndMul
from kernelcore.layers.norm import LayerNorm, RMSNorm
from kernelcore.layers.rotary import RotaryEmbedding, get_rope

PATHS = ["forward_native", "forward_cpu"]


@pytest.mark.parametrize("path", PATHS)
def test_rms_norm_matches_transformers_with_and_without_residual(path):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    x, residual = torch.randn(7, 64), torch.randn(7, 64)
    ref = LlamaRMSNorm(64, eps=1e-5)
    ours = RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        ref.weight.normal_()
        ours.weight.copy_(ref.weight)
        fwd = getattr(ours, path)
        torch.testing.assert_close(fwd(x.clone()), ref(x))
        out, new_residual = fwd(x.clone(), residual.clone())
        torch.testing.assert_close(new_residual, x + residual)
        torch.testing.assert_close(out, ref(x + residual))


@pytest.mark.parametrize("path", PATHS)
def test_layer_norm_matches_torch(path):
    torch.manual_seed(0)
    x = torch.randn(5, 32) * 3 + 1
    ref = torch.nn.LayerNorm(32)
    ours = LayerNorm(32)
    with torch.no_grad():
        ref.weight.normal_(), ref.bias.normal_()
        ours.weight.copy_(ref.weight), ours.bias.copy_(ref.bias)
        torch.testing.assert_close(getattr(ours, path)(x), ref(x), atol=1e-5, rtol=1e-5)


def test_silu_and_mul_paths_agree():
    x = torch.randn(4, 16)
    op = SiluAndMul()
    expected = torch.nn.functional.silu(x[:, :8]) * x[:, 8:]
    torch.testing.assert_close(op.forward_native(x), expected)
    torch.testing.assert_close(op.forward_cpu(x.clone()), expected)


ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ROPES)
def test_rotary_matches_transformers(kind, path):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from builtin_plugins.models.llama import rope_config

    head_dim, num_heads, num_kv_heads, max_pos = 32, 4, 2, 256
    config = LlamaConfig(hidden_size=head_dim * num_heads, num_attention_heads=num_heads,
                         num_key_value_heads=num_kv_heads, max_position_embeddings=max_pos,
                         rope_scaling=ROPES[kind], rope_theta=500000.0)
    theta, scaling = rope_config(config)
    rope = get_rope(head_dim, head_dim, max_pos, theta, scaling, dtype=torch.float32)
    positions = torch.tensor([0, 1, 5, 63, 64, 100, 200, 255])  # within max_pos: dynamic equals unscaled rope
    torch.manual_seed(0)
    qkv = torch.randn(len(positions), (num_heads + 2 * num_kv_heads) * head_dim)
    q, k, _ = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(q.view(1, -1, num_heads, head_dim).transpose(1, 2),
                                        k.view(1, -1, num_kv_heads, head_dim).transpose(1, 2), cos, sin)
    q_out, k_out = getattr(rope, path)(positions, q, k)
    torch.testing.assert_close(q_out, q_ref.transpose(1, 2).reshape(len(positions), -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref.transpose(1, 2).reshape(len(positions), -1), atol=1e-5, rtol=1e-5)


def test_get_rope_picks_up_an_out_of_tree_replacement():
    from kernelcore import custom_op

    class MyRope(RotaryEmbedding):
        pass

    RotaryEmbedding.register_oot(MyRope)
    try:
        assert type(get_rope(16, 16, 32, 10000.0)) is MyRope
    finally:
        custom_op.op_registry_oot.pop("RotaryEmbedding", None)
    assert type(get_rope(16, 16, 32, 10000.0)) is RotaryEmbedding


def test_custom_ops_none_dispatches_to_native():
    from kernelcore.config import KernelConfig, set_current_config

    with set_current_config(KernelConfig(custom_ops=["none"])):
        assert RMSNorm(8).forward_method_name == "forward_native"
    with set_current_config(KernelConfig(custom_ops=["none", "+rms_norm"])):
        assert RMSNorm(8).forward_method_name == "forward_cpu"
        assert LayerNorm(8).forward_method_name == "forward_native"


def test_attention_backend_is_asked_once_per_distinct_selector():
    from kernelcore import hookimpl, plugins
    from kernelcore.attention.selector import get_attn_backend
    from kernelcore.layers.attention import Attention
    from kernelcore.platforms import current_platform  # noqa: F401  (the platform is registered first)

    calls = []

    class Spy:
        @hookimpl(tryfirst=True)
        def get_attn_backend_cls(self, selector):
            calls.append(selector)
            return None  # pass: the platform answers

    pm = plugins.get_plugin_manager()
    get_attn_backend.cache_clear()
    pm.register(Spy(), name="attn-spy")
    try:
        layers = [Attention(4, 16, 0.25, 2), Attention(4, 16, 0.25, 2), Attention(4, 16, 0.25, 4)]
    finally:
        pm.unregister(name="attn-spy")
        get_attn_backend.cache_clear()
    assert len(calls) == 2 and calls[0].num_kv_heads == 2 and calls[1].num_kv_heads == 4
    assert layers[0].backend.get_name() == "CPU_SDPA"
