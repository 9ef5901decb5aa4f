"""OPT: learned positions (offset 2), LayerNorm pre- or post-norm, ReLU MLP, optional project_in/out."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from kernelcore.config_builder import load_hf_config
from kernelcore.contract.config import KernelConfig
from kernelcore.distributed import get_tp_group
from kernelcore.layers.attention import Attention
from kernelcore.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from kernelcore.layers.linear import ColumnParallelLinear, QKVParallelLinear, ReplicatedLinear, RowParallelLinear
from kernelcore.layers.norm import LayerNorm
from kernelcore.models.loader import load_params
from kernelcore.pipeline import PPMissingLayer, get_pp_group, make_layers

ACTIVATIONS = {"relu": lambda x: F.relu(x, inplace=True), "gelu": F.gelu,
               "gelu_new": lambda x: F.gelu(x, approximate="tanh")}


class OPTAttention(nn.Module):
    def __init__(self, hf_config, prefix: str) -> None:
        super().__init__()
        hidden, total_heads = hf_config.hidden_size, hf_config.num_attention_heads
        head_dim = hidden // total_heads
        bias = hf_config.enable_bias
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, total_heads, total_heads, bias=bias)
        self.out_proj = RowParallelLinear(hidden, hidden, bias=bias)
        self.q_size = self.qkv_proj.q_size
        self.attn = Attention(self.qkv_proj.num_heads, head_dim, head_dim ** -0.5, prefix=f"{prefix}.attn")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.q_size, self.q_size], dim=-1)
        return self.out_proj(self.attn(q, k, v))


class OPTDecoderLayer(nn.Module):
    def __init__(self, hf_config, prefix: str) -> None:
        super().__init__()
        hidden, affine = hf_config.hidden_size, hf_config.layer_norm_elementwise_affine
        self.self_attn = OPTAttention(hf_config, f"{prefix}.self_attn")
        self.is_pre_norm = hf_config.do_layer_norm_before
        self.self_attn_layer_norm = LayerNorm(hidden, elementwise_affine=affine)
        self.fc1 = ColumnParallelLinear(hidden, hf_config.ffn_dim, bias=hf_config.enable_bias)
        self.fc2 = RowParallelLinear(hf_config.ffn_dim, hidden, bias=hf_config.enable_bias)
        self.final_layer_norm = LayerNorm(hidden, elementwise_affine=affine)
        self.act = ACTIVATIONS[hf_config.activation_function]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        residual = hidden
        if self.is_pre_norm:
            hidden = self.self_attn_layer_norm(hidden)
        hidden = self.self_attn(hidden).add_(residual)
        if not self.is_pre_norm:
            hidden = self.self_attn_layer_norm(hidden)
        residual = hidden
        if self.is_pre_norm:
            hidden = self.final_layer_norm(hidden)
        hidden = self.fc2(self.act(self.fc1(hidden))).add_(residual)
        if not self.is_pre_norm:
            hidden = self.final_layer_norm(hidden)
        return hidden


class OPTDecoder(nn.Module):
    def __init__(self, hf_config, prefix: str) -> None:
        super().__init__()
        hidden, proj_dim = hf_config.hidden_size, hf_config.word_embed_proj_dim
        pp = get_pp_group()  # a pipeline stage builds only its own layers: embeddings first, final norm last
        self.embed_tokens = VocabParallelEmbedding(hf_config.vocab_size, proj_dim) if pp.is_first else PPMissingLayer()
        self.embed_positions = nn.Embedding(hf_config.max_position_embeddings + 2, hidden) if pp.is_first \
            else PPMissingLayer()
        if pp.is_first:
            self.embed_positions.weight.requires_grad_(False)
        self.project_in = ReplicatedLinear(proj_dim, hidden) if proj_dim != hidden and pp.is_first else None
        self.project_out = ReplicatedLinear(hidden, proj_dim) if proj_dim != hidden and pp.is_last else None
        has_final_norm = hf_config.do_layer_norm_before and not getattr(hf_config, "_remove_final_layer_norm", False)
        self.final_layer_norm = LayerNorm(hidden, elementwise_affine=hf_config.layer_norm_elementwise_affine) \
            if has_final_norm and pp.is_last else None
        self.start_layer, self.end_layer, self.layers = make_layers(
            hf_config.num_hidden_layers, lambda i: OPTDecoderLayer(hf_config, f"{prefix}.layers.{i}"))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: dict | None = None):
        if intermediate is None:
            hidden = self.embed_tokens(input_ids)
            if self.project_in is not None:
                hidden = self.project_in(hidden)
            hidden = hidden + F.embedding(positions + 2, cast(nn.Embedding, self.embed_positions).weight)  # first stage
        else:
            hidden = intermediate["hidden"]
        for layer in self.layers[self.start_layer:self.end_layer]:
            hidden = layer(hidden)
        if not get_pp_group().is_last:
            return {"hidden": hidden}
        if self.final_layer_norm is not None:
            hidden = self.final_layer_norm(hidden)
        if self.project_out is not None:
            hidden = self.project_out(hidden)
        return hidden


class OPTModel(nn.Module):
    def __init__(self, hf_config, prefix: str) -> None:
        super().__init__()
        self.decoder = OPTDecoder(hf_config, f"{prefix}.decoder")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: dict | None = None):
        return self.decoder(input_ids, positions, intermediate)


class OPTForCausalLM(nn.Module):
    supports_tensor_parallel = True
    supports_pipeline_parallel = True
    supports_lora = True
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    supported_lora_modules = ["qkv_proj", "out_proj", "fc1", "fc2"]
    stacked_params_mapping = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v")]

    def __init__(self, config: KernelConfig, prefix: str = "") -> None:
        super().__init__()
        self.config, self.hf_config = config, load_hf_config(config.model)
        self.model = OPTModel(self.hf_config, f"{prefix}.model" if prefix else "model")
        self.pp = get_pp_group()
        self.lm_head = ParallelLMHead(self.hf_config.vocab_size, self.hf_config.word_embed_proj_dim) \
            if self.pp.is_last else PPMissingLayer()
        self.is_tied = getattr(self.hf_config, "tie_word_embeddings", True)
        if self.is_tied and self.pp.num_stages == 1:
            # one stage: the head and the embedding are both real layers
            cast(ParallelLMHead, self.lm_head).tie_to(cast(VocabParallelEmbedding, self.model.decoder.embed_tokens))
        self.tp_size = get_tp_group().world_size

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: dict | None = None):
        return self.model(input_ids, positions, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def rename(name: str) -> str | None:
            if name.startswith("decoder."):
                name = "model." + name
            if name == "lm_head.weight" and self.is_tied:
                return None
            if self.is_tied and self.pp.num_stages > 1 and name == "model.decoder.embed_tokens.weight" \
                    and self.pp.is_last:
                return "lm_head.weight"  # the last stage keeps its own copy of the tied embedding
            return name

        return load_params(self, weights, self.stacked_params_mapping, rename)
