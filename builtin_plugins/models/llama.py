"""Llama: GQA, RoPE (incl. rope_scaling), RMSNorm with fused residual, SwiGLU, tied or untied head.

The classes are also the building blocks of the Llama-like architectures (Qwen2/3, Mistral, ...): a
subclass changes a class attribute (bias, q/k norm, the layer or MLP class) instead of copying code."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from torch import nn

from kernelcore.config_builder import load_hf_config
from kernelcore.contract.config import KernelConfig
from kernelcore.layers.activation import SiluAndMul
from kernelcore.layers.attention import Attention
from kernelcore.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from kernelcore.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from kernelcore.layers.norm import RMSNorm
from kernelcore.layers.rotary import RotaryEmbedding, get_rope
from kernelcore.models.loader import load_params
from kernelcore.pipeline import PPMissingLayer, get_pp_group, make_layers


def rope_config(hf_config, params: dict | None = None) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either transformers' 5.x rope_parameters or the 4.x fields; ``params``:
    one layer type's entry of a per-layer-type rope_parameters (Gemma 3)."""
    if params is not None:
        params = dict(params)
        scaling = params or None
    else:
        params = dict(getattr(hf_config, "rope_parameters", None) or {})
        scaling = getattr(hf_config, "rope_scaling", None) or params or None
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None) or 10000.0)
    if scaling is not None and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    if scaling is not None and "original_max_position_embeddings" not in scaling:
        native = getattr(hf_config, "original_max_position_embeddings", None) or hf_config.max_position_embeddings
        scaling = {**scaling, "original_max_position_embeddings": native}
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) in ("longrope", "su") \
            and scaling.get("attention_factor") is None:
        native = scaling["original_max_position_embeddings"]
        factor = scaling.get("factor") or hf_config.max_position_embeddings / native
        scaling = {**scaling,
                   "attention_factor": 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(native))}
    return theta, scaling


def head_dim_of(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def layer_sliding_window(hf_config, layer_idx: int) -> int | None:
    """The layer's attention window in tokens (``layer_types`` when the config has them), None for full."""
    window = getattr(hf_config, "sliding_window", None)
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types:
        return window if layer_types[layer_idx] == "sliding_attention" else None
    return window


def all_layers_window(hf_config) -> int | None:
    """The window every layer attends within (KV blocks behind it can be freed), None if any layer is full."""
    windows = [layer_sliding_window(hf_config, i) for i in range(hf_config.num_hidden_layers)]
    return None if not windows or None in windows else max(cast("list[int]", windows))


class LlamaAttention(nn.Module):
    qkv_bias: bool | None = None  # None: the config's attention_bias
    o_bias: bool | None = None
    qk_norm = False  # per-head RMSNorm of q and k before the rotation (Qwen3)

    def __init__(self, hf_config, rotary_emb: RotaryEmbedding, prefix: str, layer_idx: int = 0) -> None:
        super().__init__()
        hidden, total_heads = hf_config.hidden_size, hf_config.num_attention_heads
        total_kv_heads = getattr(hf_config, "num_key_value_heads", None) or total_heads
        self.head_dim = head_dim = head_dim_of(hf_config)
        bias = getattr(hf_config, "attention_bias", False)
        qkv_bias = bias if self.qkv_bias is None else self.qkv_bias
        o_bias = bias if self.o_bias is None else self.o_bias
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, total_heads, total_kv_heads, bias=qkv_bias)
        self.o_proj = RowParallelLinear(total_heads * head_dim, hidden, bias=o_bias)
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        if self.qk_norm:
            self.q_norm = RMSNorm(head_dim, hf_config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, hf_config.rms_norm_eps)
        self.rotary_emb = rotary_emb
        self.attn = Attention(self.qkv_proj.num_heads, head_dim, self.scale(hf_config), self.qkv_proj.num_kv_heads,
                              prefix=f"{prefix}.attn", sliding_window=layer_sliding_window(hf_config, layer_idx))

    def scale(self, hf_config) -> float:
        return self.head_dim ** -0.5

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class LlamaMLP(nn.Module):
    def __init__(self, hf_config, prefix: str = "", layer_idx: int = 0) -> None:
        super().__init__()
        hidden, inter = hf_config.hidden_size, hf_config.intermediate_size
        bias = getattr(hf_config, "mlp_bias", False)
        assert hf_config.hidden_act == "silu", f"unsupported hidden_act {hf_config.hidden_act!r}"
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [inter, inter], bias=bias)
        self.down_proj = RowParallelLinear(inter, hidden, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    attention_cls: type[nn.Module] = LlamaAttention
    mlp_cls: Callable[..., nn.Module] = LlamaMLP

    def __init__(self, hf_config, rotary_emb: RotaryEmbedding, prefix: str, layer_idx: int = 0) -> None:
        super().__init__()
        eps = hf_config.rms_norm_eps
        self.self_attn = self.attention_cls(hf_config, rotary_emb, f"{prefix}.self_attn", layer_idx)
        self.mlp = self.mlp_cls(hf_config, f"{prefix}.mlp", layer_idx)
        self.input_layernorm = RMSNorm(hf_config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hf_config.hidden_size, eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    layer_cls: type[nn.Module] = LlamaDecoderLayer

    def __init__(self, hf_config, prefix: str) -> None:
        super().__init__()
        rotary_emb = self.make_rope(hf_config)
        pp = get_pp_group()  # a pipeline stage builds only its own layers
        self.embed_tokens = VocabParallelEmbedding(hf_config.vocab_size, hf_config.hidden_size) if pp.is_first \
            else PPMissingLayer()
        self.start_layer, self.end_layer, self.layers = make_layers(
            hf_config.num_hidden_layers, lambda i: self.layer_cls(hf_config, rotary_emb, f"{prefix}.layers.{i}", i))
        self.norm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps) if pp.is_last else PPMissingLayer()

    def make_rope(self, hf_config) -> RotaryEmbedding:
        theta, scaling = rope_config(hf_config)
        head_dim = head_dim_of(hf_config)
        return get_rope(head_dim, head_dim, hf_config.max_position_embeddings, theta, scaling)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: dict | None = None):
        if intermediate is None:
            hidden, residual = self.embed_tokens(input_ids), None
        else:
            hidden, residual = intermediate["hidden"], intermediate.get("residual")
        for layer in self.layers[self.start_layer:self.end_layer]:
            hidden, residual = layer(positions, hidden, residual)
        if not get_pp_group().is_last:
            return {"hidden": hidden, "residual": residual}
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    supports_tensor_parallel = True
    supports_lora = True
    supports_pipeline_parallel = True
    model_cls: type[nn.Module] = LlamaModel
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    supported_lora_modules = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    stacked_params_mapping = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
                              ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]

    @classmethod
    def kv_cache_sliding_window(cls, hf_config) -> int | None:
        """Tokens behind which no layer looks back: the engine frees KV blocks wholly behind the window."""
        return all_layers_window(hf_config)

    @classmethod
    def max_positions(cls, hf_config) -> int | None:
        """The positions the rotary table covers: dynamic NTK scaling extends it to the scaled length."""
        _, scaling = rope_config(hf_config)
        if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "dynamic":
            long_len = int(scaling["original_max_position_embeddings"] * scaling["factor"])
            return max(long_len, hf_config.max_position_embeddings)
        return hf_config.max_position_embeddings

    def __init__(self, config: KernelConfig, prefix: str = "") -> None:
        super().__init__()
        self.config, self.hf_config = config, load_hf_config(config.model)
        self.model = self.model_cls(self.hf_config, f"{prefix}.model" if prefix else "model")
        self.pp = get_pp_group()
        self.lm_head = ParallelLMHead(self.hf_config.vocab_size, self.hf_config.hidden_size) if self.pp.is_last \
            else PPMissingLayer()
        self.is_tied = bool(getattr(self.hf_config, "tie_word_embeddings", False))
        if self.is_tied and self.pp.num_stages == 1:
            # one stage: the head and the embedding are both real layers
            cast(ParallelLMHead, self.lm_head).tie_to(cast(VocabParallelEmbedding, self.model.embed_tokens))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: dict | None = None):
        return self.model(input_ids, positions, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def rename_weight(self, name: str) -> str | None:
        """The parameter a checkpoint tensor goes to (None: skip it)."""
        if "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and self.is_tied):
            return None
        if self.is_tied and self.pp.num_stages > 1 and name == "model.embed_tokens.weight" and self.pp.is_last:
            return "lm_head.weight"  # the last stage keeps its own copy of the tied embedding
        return name

    def checkpoint_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors as this class's loader expects them (a subclass splits fused ones)."""
        return weights

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_params(self, self.checkpoint_weights(weights), self.stacked_params_mapping, self.rename_weight)
