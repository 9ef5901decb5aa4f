"""Qwen2 (bias on q/k/v only) and Qwen3 (per-head RMSNorm of q and k): Llama with two attention changes."""

from __future__ import annotations

from builtin_plugins.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class Qwen2Attention(LlamaAttention):
    qkv_bias, o_bias = True, False


class Qwen3Attention(LlamaAttention):
    qk_norm = True


class Qwen2DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen2Attention


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen2Model(LlamaModel):
    layer_cls = Qwen2DecoderLayer


class Qwen3Model(LlamaModel):
    layer_cls = Qwen3DecoderLayer


class Qwen2ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen2Model


class Qwen3ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3Model
