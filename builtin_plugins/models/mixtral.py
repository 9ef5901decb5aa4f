"""Mixtral: Mistral's attention (sliding window when the config sets one) and in every layer a router choosing
the top 2 (num_experts_per_tok) of num_local_experts SwiGLU experts, whose softmax weights are always
renormalised over the chosen ones. The experts run as the FusedMoE op, as Qwen3-MoE's do."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

from builtin_plugins.models.llama import LlamaDecoderLayer, LlamaModel
from builtin_plugins.models.qwen3_moe import Qwen3MoeForCausalLM, SparseMoeBlock

# model.layers.3.block_sparse_moe.experts.5.w1.weight -> model.layers.3.mlp.experts.5.gate_proj.weight
MIXTRAL_EXPERT = re.compile(r"\.block_sparse_moe\.experts\.(?P<expert>\d+)\.(?P<w>w[123])\.")
MIXTRAL_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def MixtralMoE(hf_config, prefix: str = "", layer_idx: int = 0) -> SparseMoeBlock:
    return SparseMoeBlock(hf_config.hidden_size, hf_config.num_local_experts, hf_config.num_experts_per_tok,
                          hf_config.intermediate_size, renormalize=True)


class MixtralDecoderLayer(LlamaDecoderLayer):
    mlp_cls = staticmethod(MixtralMoE)


class MixtralModel(LlamaModel):
    layer_cls = MixtralDecoderLayer


class MixtralForCausalLM(Qwen3MoeForCausalLM):
    model_cls = MixtralModel

    def checkpoint_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
        """Mixtral's names (block_sparse_moe, experts' w1/w2/w3) as the shared MoE loader expects them."""
        for name, tensor in weights:
            name = MIXTRAL_EXPERT.sub(lambda m: f".mlp.experts.{m['expert']}.{MIXTRAL_PROJ[m['w']]}.", name)
            yield name.replace(".block_sparse_moe.gate.", ".mlp.gate."), tensor
