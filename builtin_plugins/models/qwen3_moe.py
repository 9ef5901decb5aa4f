"""Qwen3-MoE: Qwen3's attention (q/k norm), and in the sparse layers a router choosing top-k of many small
SwiGLU experts (the FusedMoE op); the checkpoint's norm_topk_prob decides whether the k weights are renormalised."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from builtin_plugins.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel
from builtin_plugins.models.qwen import Qwen3Attention
from kernelcore.layers.fused_moe import FusedMoE
from kernelcore.layers.linear import ReplicatedLinear
from kernelcore.models.loader import load_params

# model.layers.3.mlp.experts.17.gate_proj.weight: one expert's projection
EXPERT_WEIGHT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
EXPERT_SHARD = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def is_sparse_layer(hf_config, layer_idx: int) -> bool:
    step = getattr(hf_config, "decoder_sparse_step", 1) or 1
    return (layer_idx not in (getattr(hf_config, "mlp_only_layers", None) or [])
            and hf_config.num_experts > 0 and (layer_idx + 1) % step == 0)


class SparseMoeBlock(nn.Module):
    """A replicated router (``gate``) and the FusedMoE experts; shared by the MoE architectures."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int,
                 renormalize: bool) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts)
        self.experts = FusedMoE(num_experts, top_k, hidden_size, intermediate_size, renormalize=renormalize)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x))


def Qwen3MoeMLP(hf_config, prefix: str = "", layer_idx: int = 0) -> nn.Module:
    if not is_sparse_layer(hf_config, layer_idx):
        return LlamaMLP(hf_config)
    return SparseMoeBlock(hf_config.hidden_size, hf_config.num_experts, hf_config.num_experts_per_tok,
                          hf_config.moe_intermediate_size, renormalize=bool(hf_config.norm_topk_prob))


class Qwen3MoeDecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention
    mlp_cls = staticmethod(Qwen3MoeMLP)


class Qwen3MoeModel(LlamaModel):
    layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    model_cls: type[nn.Module] = Qwen3MoeModel
    supports_pipeline_parallel = False  # not tested across stages yet
    supports_lora = False  # adapters on the experts are not supported yet
    is_mixture_of_experts = True

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Per-expert checkpoint tensors go straight into their FusedMoE parameters, the rest as Llama's."""
        params = dict(self.named_parameters())
        expert_params: set[str] = set()

        def dense(named: Iterable[tuple[str, torch.Tensor]]):
            for name, tensor in named:
                match = EXPERT_WEIGHT.match(name)
                if match is None:
                    yield name, tensor
                    continue
                proj = match["proj"]
                param_name = f"{match['prefix']}.{'w2' if proj == 'down_proj' else 'w13'}_weight"
                if param_name not in params:
                    raise ValueError(f"checkpoint tensor {name!r} has no expert parameter {param_name!r}")
                loader = getattr(params[param_name], "weight_loader")  # set by FusedMoE on its parameters
                loader(params[param_name], tensor, int(match["expert"]), EXPERT_SHARD[proj])
                expert_params.add(param_name)

        loaded = load_params(self, dense(self.checkpoint_weights(weights)), self.stacked_params_mapping,
                             self.rename_weight, loaded_elsewhere=expert_params)
        partial = [n for n, m in self.named_modules() if isinstance(m, FusedMoE) and not m.is_fully_loaded]
        if partial:
            raise ValueError(f"checkpoint does not provide every expert's gate/up/down weights for {partial[:4]}")
        return loaded | expert_params
