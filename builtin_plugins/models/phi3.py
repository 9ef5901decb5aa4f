"""Phi-3: Llama's blocks with q/k/v and gate/up fused in the checkpoint, partial rotary and LongRoPE scaling."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from builtin_plugins.models.llama import LlamaForCausalLM, LlamaModel, head_dim_of, rope_config
from kernelcore.contract.config import get_current_config
from kernelcore.layers.rotary import RotaryEmbedding, get_rope


class Phi3Model(LlamaModel):
    def make_rope(self, hf_config) -> RotaryEmbedding:
        theta, scaling = rope_config(hf_config)
        params = getattr(hf_config, "rope_parameters", None) or {}
        head_dim = head_dim_of(hf_config)
        rotary_dim = int(head_dim * params.get("partial_rotary_factor",
                                               getattr(hf_config, "partial_rotary_factor", 1.0)))
        # LongRoPE picks its factors by the served length: the cache covers max_model_len positions.
        max_position = max(get_current_config().model.max_model_len or 0, 1)
        if scaling is None:
            max_position = max(max_position, hf_config.max_position_embeddings)
        return get_rope(head_dim, rotary_dim, max_position, theta, scaling)


class Phi3ForCausalLM(LlamaForCausalLM):
    model_cls = Phi3Model
    supports_pipeline_parallel = False  # not tested across stages yet
    supports_lora = False  # Phi-3 adapters target the fused qkv_proj / gate_up_proj: not mapped yet

    def checkpoint_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
        """Split the fused tensors into the q/k/v and gate/up parts the sharded loaders take one by one."""
        hf = self.hf_config
        head_dim = head_dim_of(hf)
        q_size = hf.num_attention_heads * head_dim
        kv_size = (getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads) * head_dim
        for name, tensor in weights:
            if ".qkv_proj." in name:
                pieces = tensor.split([q_size, kv_size, kv_size])
                for part, piece in zip(("q_proj", "k_proj", "v_proj"), pieces, strict=True):
                    yield name.replace(".qkv_proj.", f".{part}."), piece
            elif ".gate_up_proj." in name:
                for part, piece in zip(("gate_proj", "up_proj"), tensor.chunk(2), strict=True):
                    yield name.replace(".gate_up_proj.", f".{part}."), piece
            else:
                yield name, tensor
