"""Read a PEFT LoRA adapter directory: adapter_config.json + adapter_model.safetensors (or .bin, weights only).

Every message names files by their name inside the adapter directory, never by an absolute path: the text
reaches clients (the server logs the directory).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import torch

from kernelcore.errors import RequestStateError

CONFIG_NAME = "adapter_config.json"
WEIGHT_NAMES = ("adapter_model.safetensors", "adapter_model.bin")


class LoRAAdapterError(RequestStateError):
    """The adapter exists but cannot be used (bad config or weights, rank too large, unsupported module)."""


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
        raise LoRANotFoundError(f"no LoRA adapter there: {CONFIG_NAME} is missing")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except OSError as exc:
        raise LoRAAdapterError(f"{CONFIG_NAME} cannot be read ({exc.strerror or type(exc).__name__})") from None
    except ValueError as exc:
        raise LoRAAdapterError(f"{CONFIG_NAME} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise LoRAAdapterError(f"{CONFIG_NAME} must hold a JSON object")
    return config


def check_adapter_config(config: dict, max_rank: int) -> tuple[int, float]:
    """(rank, scaling) of a PEFT LoRA config, or LoRAAdapterError naming what is unsupported."""
    if config.get("peft_type", "LORA") != "LORA":
        raise LoRAAdapterError(f"peft_type is {config.get('peft_type')!r}; only 'LORA' adapters are supported")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
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
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise LoRAAdapterError(f"lora_alpha={alpha!r} must be a finite number")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    for name in WEIGHT_NAMES:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                state = load_file(file)
            else:  # weights_only: never unpickle arbitrary objects; a pickle payload is refused, not run
                state = torch.load(file, map_location="cpu", weights_only=True)
        except OSError as exc:
            raise LoRAAdapterError(f"{name} cannot be read ({exc.strerror or type(exc).__name__})") from None
        except Exception as exc:  # UnpicklingError (refused payload), a corrupt archive or safetensors header
            raise LoRAAdapterError(f"{name} is not a plain tensor file ({type(exc).__name__}); it was refused") from exc
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise LoRAAdapterError(f"{name} does not hold a state dict of tensors")
        return state
    raise LoRAAdapterError(f"no adapter weights: expected one of {list(WEIGHT_NAMES)}")


def log_detail(exc: BaseException) -> str:
    """The client's message plus what caused it (for the server log only: it may hold paths)."""
    cause = exc.__cause__
    return f"{exc} [{type(cause).__name__}: {cause}]" if cause is not None else str(exc)


def module_name(key: str) -> tuple[str, str] | None:
    """``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` -> (``model.layers.0...q_proj``, ``A``)."""
    for part in ("A", "B"):
        marker = f".lora_{part}."
        if marker in key:
            name = key.split(marker)[0]
            return name.removeprefix("base_model.model."), part
    return None


def check_tensor(name: str, part: str, tensor: torch.Tensor, rank: int) -> None:
    """2-D, floating point, finite, ``rank`` rows (A) or columns (B)."""
    label = f"module {name!r}: lora_{part}"
    if tensor.dim() != 2:
        raise LoRAAdapterError(f"{label} has {tensor.dim()} dimensions, expected 2")
    if not tensor.dtype.is_floating_point:
        raise LoRAAdapterError(f"{label} has dtype {str(tensor.dtype).removeprefix('torch.')}, expected a float type")
    if tensor.shape[0 if part == "A" else 1] != rank:
        raise LoRAAdapterError(f"{label} {tuple(tensor.shape)} does not have the config's rank r={rank}")
    if not bool(torch.isfinite(tensor).all()):
        raise LoRAAdapterError(f"{label} holds NaN or infinite values")


def check_shapes(adapter: LoRAAdapter, features: dict[str, tuple[int, int]]) -> None:
    """Every module is one the model can adapt and its A is [r, in_features], its B [out_features, r]
    (``features``: module path -> the full, unsharded (in_features, out_features) of that module)."""
    unknown = sorted(set(adapter.weights) - set(features))
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:4]) + (f" and {len(unknown) - 4} more" if len(unknown) > 4 else "")
        raise LoRAAdapterError(f"the adapter targets modules this model cannot adapt: {shown}")
    for name, (a, b) in adapter.weights.items():
        in_features, out_features = features[name]
        for part, got, want in (("A", a, (adapter.rank, in_features)), ("B", b, (out_features, adapter.rank))):
            if tuple(got.shape) != want:
                raise LoRAAdapterError(f"module {name!r}: lora_{part} has shape {tuple(got.shape)}, "
                                       f"the model needs {want}")


def load_adapter(path: str, max_rank: int) -> LoRAAdapter:
    """The adapter at ``path`` with its config and every tensor checked (LoRANotFoundError, LoRAAdapterError)."""
    config = read_adapter_config(path)
    rank, scaling = check_adapter_config(config, max_rank)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in _read_weights(path).items():
        parsed = module_name(key)
        if parsed is None:
            raise LoRAAdapterError(f"unexpected tensor {key!r} in the adapter "
                                   "(only lora_A/lora_B weights are supported)")
        pairs.setdefault(parsed[0], {})[parsed[1]] = tensor
    weights = {}
    for name, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise LoRAAdapterError(f"module {name!r} has lora_{'A' if 'A' not in pair else 'B'} missing")
        for part in ("A", "B"):
            check_tensor(name, part, pair[part], rank)
        weights[name] = (pair["A"].float(), pair["B"].float())
    if not weights:
        raise LoRAAdapterError("the adapter has no LoRA weights")
    base_model = config.get("base_model_name_or_path")
    return LoRAAdapter(os.path.abspath(path), rank, scaling, base_model if isinstance(base_model, str) else None,
                       weights)
