"""Gemma 3 (text): GeGLU, (1 + w) RMSNorms around attention and MLP, embeddings scaled by sqrt(hidden), q/k norm,
interleaved sliding-window and global layers each with their own rope base and scaling, final logit soft-capping."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from builtin_plugins.models.llama import head_dim_of, layer_sliding_window, rope_config
from kernelcore.config_builder import load_hf_config
from kernelcore.contract.config import KernelConfig
from kernelcore.layers.activation import GeluAndMul
from kernelcore.layers.attention import Attention
from kernelcore.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from kernelcore.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from kernelcore.layers.norm import GemmaRMSNorm
from kernelcore.layers.rotary import RotaryEmbedding, get_rope
from kernelcore.models.loader import load_params


def check_servable(hf_config) -> None:
    """What kernelcore cannot compute exactly is refused, never approximated."""
    if getattr(hf_config, "attn_logit_softcapping", None) is not None:
        raise ValueError("Gemma 3 with attn_logit_softcapping is not supported (no attention backend soft-caps scores)")
    if getattr(hf_config, "use_bidirectional_attention", False):
        raise ValueError("Gemma 3 with use_bidirectional_attention is an encoder: not a causal LM kernelcore serves")
    if getattr(hf_config, "hidden_activation", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported Gemma 3 hidden_activation {hf_config.hidden_activation!r}")


class Gemma3Attention(nn.Module):
    def __init__(self, hf_config, rotary_emb: RotaryEmbedding, prefix: str, layer_idx: int) -> None:
        super().__init__()
        hidden, heads = hf_config.hidden_size, hf_config.num_attention_heads
        self.head_dim = head_dim = head_dim_of(hf_config)
        bias = getattr(hf_config, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, heads, hf_config.num_key_value_heads, bias=bias)
        self.o_proj = RowParallelLinear(heads * head_dim, hidden, bias=bias)
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.q_norm = GemmaRMSNorm(head_dim, hf_config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(head_dim, hf_config.rms_norm_eps)
        self.rotary_emb = rotary_emb
        self.attn = Attention(self.qkv_proj.num_heads, head_dim, hf_config.query_pre_attn_scalar ** -0.5,
                              self.qkv_proj.num_kv_heads, prefix=f"{prefix}.attn",
                              sliding_window=layer_sliding_window(hf_config, layer_idx))

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class Gemma3MLP(nn.Module):
    def __init__(self, hf_config) -> None:
        super().__init__()
        hidden, inter = hf_config.hidden_size, hf_config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [inter, inter])
        self.down_proj = RowParallelLinear(inter, hidden)
        self.act_fn = GeluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, hf_config, rotary_emb: RotaryEmbedding, prefix: str, layer_idx: int) -> None:
        super().__init__()
        hidden, eps = hf_config.hidden_size, hf_config.rms_norm_eps
        self.self_attn = Gemma3Attention(hf_config, rotary_emb, f"{prefix}.self_attn", layer_idx)
        self.mlp = Gemma3MLP(hf_config)
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.post_attention_layernorm(self.self_attn(positions, self.input_layernorm(hidden)))
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))


class Gemma3Model(nn.Module):
    def __init__(self, hf_config, prefix: str) -> None:
        super().__init__()
        head_dim = head_dim_of(hf_config)
        layer_types = getattr(hf_config, "layer_types", None) or ["full_attention"] * hf_config.num_hidden_layers
        params = getattr(hf_config, "rope_parameters", None) or {}
        ropes = {}  # one rotary table per layer type: local and global layers rotate with different bases
        for layer_type in sorted(set(layer_types)):
            theta, scaling = rope_config(hf_config, params.get(layer_type, params))
            ropes[layer_type] = get_rope(head_dim, head_dim, hf_config.max_position_embeddings, theta, scaling)
        self.embed_tokens = VocabParallelEmbedding(hf_config.vocab_size, hf_config.hidden_size)
        self.embed_scale = hf_config.hidden_size ** 0.5
        self.layers = nn.ModuleList(Gemma3DecoderLayer(hf_config, ropes[layer_types[i]], f"{prefix}.layers.{i}", i)
                                    for i in range(hf_config.num_hidden_layers))
        self.norm = GemmaRMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)  # rounded to the dtype, as transformers
        for layer in self.layers:
            hidden = layer(positions, hidden)
        return self.norm(hidden)


class Gemma3ForCausalLM(nn.Module):
    supports_tensor_parallel = True
    supports_lora = True
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    supported_lora_modules = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    stacked_params_mapping = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
                              ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]

    @classmethod
    def kv_cache_sliding_window(cls, hf_config) -> int | None:
        return None  # the global layers see the whole sequence: no block can be freed early

    def __init__(self, config: KernelConfig, prefix: str = "") -> None:
        super().__init__()
        self.config, self.hf_config = config, load_hf_config(config.model)
        check_servable(self.hf_config)
        self.model = Gemma3Model(self.hf_config, f"{prefix}.model" if prefix else "model")
        self.lm_head = ParallelLMHead(self.hf_config.vocab_size, self.hf_config.hidden_size)
        self.is_tied = bool(getattr(self.hf_config, "tie_word_embeddings", True))
        if self.is_tied:
            self.lm_head.tie_to(self.model.embed_tokens)
        self.softcap = getattr(self.hf_config, "final_logit_softcapping", None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def rename(name: str) -> str | None:
            if "rotary_emb" in name or (name == "lm_head.weight" and self.is_tied):
                return None
            return name

        return load_params(self, weights, self.stacked_params_mapping, rename)
