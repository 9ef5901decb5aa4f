"""Read a PEFT LoRA adapter directory: adapter_config.json + adapter_model.safetensors (or .bin, weights only)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import torch

CONFIG_NAME = "adapter_config.json"
WEIGHT_NAMES = ("adapter_model.safetensors", "adapter_model.bin")


class LoRAAdapterError(ValueError):
    """The adapter exists but cannot be used (bad config, rank too large, unsupported module)."""


class LoRANotFoundError(FileNotFoundError):
    """No adapter at this path (no adapter_config.json)."""


@dataclass
class LoRAAdapter:
    path: str
    rank: int
    scaling: float  # alpha / rank, or alpha / sqrt(rank) with rsLoRA
    base_model_name: str | None
    # module path as in kernelcore's model ("model.layers.0.self_attn.q_proj") -> (A [r, in], B [out, r])
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def read_adapter_config(path: str) -> dict:
    config_path = os.path.join(path, CONFIG_NAME)
    if not os.path.isfile(config_path):
        raise LoRANotFoundError(f"no LoRA adapter at {path!r}: {CONFIG_NAME} is missing")
    try:
        with open(config_path) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise LoRAAdapterError(f"{config_path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise LoRAAdapterError(f"{config_path} must hold a JSON object")
    return config


def check_adapter_config(config: dict, max_rank: int) -> tuple[int, float]:
    """(rank, scaling) of a PEFT LoRA config, or LoRAAdapterError naming what is unsupported."""
    if config.get("peft_type", "LORA") != "LORA":
        raise LoRAAdapterError(f"peft_type is {config.get('peft_type')!r}; only 'LORA' adapters are supported")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise LoRAAdapterError(f"adapter rank r={rank!r} must be a positive integer")
    if rank > max_rank:
        raise LoRAAdapterError(f"adapter rank {rank} is larger than --max-lora-rank {max_rank}")
    for key, ok in (("use_dora", False), ("fan_in_fan_out", False)):
        if bool(config.get(key)) != ok:
            raise LoRAAdapterError(f"{key}={config.get(key)!r} is not supported")
    if config.get("bias", "none") != "none":
        raise LoRAAdapterError(f"bias={config.get('bias')!r} is not supported (only 'none')")
    if config.get("modules_to_save"):
        raise LoRAAdapterError(f"modules_to_save={config['modules_to_save']!r} is not supported")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise LoRAAdapterError("per-module rank_pattern/alpha_pattern is not supported")
    alpha = config.get("lora_alpha", rank)
    if not isinstance(alpha, (int, float)):
        raise LoRAAdapterError(f"lora_alpha={alpha!r} must be a number")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    for name in WEIGHT_NAMES:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        if name.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(file)
        state = torch.load(file, map_location="cpu", weights_only=True)  # never unpickle arbitrary objects
        if not isinstance(state, dict):
            raise LoRAAdapterError(f"{file} does not hold a state dict")
        return state
    raise LoRAAdapterError(f"no adapter weights in {path!r}: expected one of {list(WEIGHT_NAMES)}")


def module_name(key: str) -> tuple[str, str] | None:
    """``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` -> (``model.layers.0...q_proj``, ``A``)."""
    for part in ("A", "B"):
        marker = f".lora_{part}."
        if marker in key:
            name = key.split(marker)[0]
            return name.removeprefix("base_model.model."), part
    return None


def load_adapter(path: str, max_rank: int) -> LoRAAdapter:
    config = read_adapter_config(path)
    rank, scaling = check_adapter_config(config, max_rank)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in _read_weights(path).items():
        parsed = module_name(key)
        if parsed is None:
            raise LoRAAdapterError(f"unexpected tensor {key!r} in the adapter (only lora_A/lora_B weights are supported)")
        pairs.setdefault(parsed[0], {})[parsed[1]] = tensor
    weights = {}
    for name, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise LoRAAdapterError(f"module {name!r} has lora_{'A' if 'A' not in pair else 'B'} missing")
        a, b = pair["A"], pair["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise LoRAAdapterError(f"module {name!r}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not have rank {rank}")
        weights[name] = (a.float(), b.float())
    if not weights:
        raise LoRAAdapterError(f"the adapter at {path!r} has no LoRA weights")
    return LoRAAdapter(os.path.abspath(path), rank, scaling, config.get("base_model_name_or_path"), weights)
