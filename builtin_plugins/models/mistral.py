"""Mistral: Llama with sliding-window attention in every layer (``sliding_window`` in the config, or none)."""

from __future__ import annotations

from builtin_plugins.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    pass  # the window reaches the Attention layers through layer_sliding_window, and the KV cache through
    # kv_cache_sliding_window, both inherited
