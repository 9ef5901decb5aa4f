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
