"""Random-weight HF checkpoints built with transformers' own classes (fixed seed), for parity tests."""

from __future__ import annotations

import os

import torch


def _save(model_cls, config, path: str, seed: int, std: float, safe_serialization: bool = True, **save_kwargs) -> str:
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Larger-than-default weights: logits spread out so greedy argmax is robust to fp32 rounding.
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p)) if name.endswith("weight") else p.normal_(0, 0.1)
            else:
                p.normal_(0, std)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, **save_kwargs)
    if not safe_serialization:
        to_bin_checkpoint(path, num_shards=2 if "max_shard_size" in save_kwargs else 1)
    return path


def to_bin_checkpoint(path: str, num_shards: int = 1) -> None:
    """Rewrite a safetensors checkpoint as pytorch_model*.bin (transformers 5 only saves safetensors)."""
    import glob
    import json

    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    tensors = {k: v for f in files for k, v in load_file(f).items()}
    for f in files + glob.glob(os.path.join(path, "*.safetensors.index.json")):
        os.remove(f)
    if num_shards == 1:
        torch.save(tensors, os.path.join(path, "pytorch_model.bin"))
        return
    names, weight_map = sorted(tensors), {}
    for i in range(num_shards):
        shard = f"pytorch_model-{i + 1:05d}-of-{num_shards:05d}.bin"
        part = names[i::num_shards]
        torch.save({k: tensors[k] for k in part}, os.path.join(path, shard))
        weight_map.update({k: shard for k in part})
    with open(os.path.join(path, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def make_llama_checkpoint(path: str, seed: int = 0, std: float = 0.1, safe_serialization: bool = True,
                          save_kwargs: dict | None = None, **config_overrides) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kwargs.update(config_overrides)
    return _save(LlamaForCausalLM, LlamaConfig(**kwargs), path, seed, std, safe_serialization, **(save_kwargs or {}))


def make_opt_checkpoint(path: str, seed: int = 0, std: float = 0.1, safe_serialization: bool = True,
                        save_kwargs: dict | None = None, **config_overrides) -> str:
    from transformers import OPTConfig, OPTForCausalLM

    kwargs = dict(vocab_size=320, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=256, word_embed_proj_dim=64, do_layer_norm_before=True,
                  bos_token_id=2, eos_token_id=2, pad_token_id=1)
    kwargs.update(config_overrides)
    return _save(OPTForCausalLM, OPTConfig(**kwargs), path, seed, std, safe_serialization, **(save_kwargs or {}))


# Tiny shapes of each further architecture; a test's overrides switch on the features it checks.
SMALL = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
ARCH_DEFAULTS = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"head_dim": 16, "sliding_window": 12}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": None}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16, "hidden_activation": "gelu_pytorch_tanh"}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"head_dim": 16, "moe_intermediate_size": 32,
                                                            "num_experts": 8, "num_experts_per_tok": 2}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"head_dim": 16, "num_local_experts": 4,
                                                        "num_experts_per_tok": 2}),
}


def make_checkpoint(arch: str, path: str, seed: int = 0, std: float = 0.1, **config_overrides) -> str:
    """A random-weight checkpoint of one of ARCH_DEFAULTS' architectures, built by transformers."""
    import transformers

    config_name, model_name, defaults = ARCH_DEFAULTS[arch]
    kwargs = {**SMALL, **defaults, **config_overrides}
    config = getattr(transformers, config_name)(**kwargs)
    return _save(getattr(transformers, model_name), config, path, seed, std)
