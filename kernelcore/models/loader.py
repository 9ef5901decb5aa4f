"""Load a model from a local Hugging Face directory: safetensors (memory-mapped) or .bin, sharded or not."""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet

import torch
from torch import nn

from kernelcore.contract.config import KernelConfig, set_current_config

logger = logging.getLogger("kernelcore.models")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def get_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def weight_files(model_dir: str) -> tuple[list[str], str]:
    """The checkpoint files to read and their format ("safetensors" or "bin")."""
    for index_name, fmt in (("model.safetensors.index.json", "safetensors"), ("pytorch_model.bin.index.json", "bin")):
        index = os.path.join(model_dir, index_name)
        if os.path.isfile(index):
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
            files = [os.path.join(model_dir, n) for n in names]
            missing = [f for f in files if not os.path.isfile(f)]
            if missing:
                raise FileNotFoundError(f"{index_name} in {model_dir} lists missing shard files: {missing}")
            return files, fmt
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if files:
        return files, "safetensors"
    files = sorted(glob.glob(os.path.join(model_dir, "pytorch_model*.bin")))
    if files:
        return files, "bin"
    raise FileNotFoundError(f"no model weights in {model_dir}: expected *.safetensors or pytorch_model*.bin "
                            "(optionally with an .index.json for shards)")


def iterate_weights(model_dir: str, use_tqdm: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    from tqdm.auto import tqdm

    files, fmt = weight_files(model_dir)
    size_mb = sum(os.path.getsize(f) for f in files) / 1e6
    logger.info("Loading weights: %d %s file(s), %.1f MB, from %s", len(files), fmt, size_mb, model_dir)
    # disable=None: a bar only on a terminal; a log file gets the plain lines around it
    bar = tqdm(files, desc="Loading weights", unit="file", disable=None if use_tqdm else True, leave=False)
    for path in bar:
        if fmt == "safetensors":
            from safetensors import safe_open

            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        else:
            try:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # legacy (non-zip) format cannot be memory-mapped
                state = torch.load(path, map_location="cpu", weights_only=True)
            yield from state.items()
            del state


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
    from kernelcore.layers.linear import copy_checked

    copy_checked(param.data, loaded_weight)


def load_params(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                stacked_params_mapping: Sequence[tuple[str, str, object]] = (),
                rename: Callable[[str], str | None] | None = None,
                loaded_elsewhere: AbstractSet[str] = frozenset()) -> set[str]:
    """Copy checkpoint tensors into ``model`` through each parameter's ``weight_loader``.

    ``stacked_params_mapping`` holds (fused param part, checkpoint part, shard id), e.g.
    ("qkv_proj", "q_proj", "q"). Raises naming the tensor on a shape mismatch, and
    naming the parameters the checkpoint did not provide. ``loaded_elsewhere``: parameters the caller
    fills itself while ``weights`` is consumed (e.g. per-expert tensors), not missing at the end.
    """
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    unexpected: list[str] = []
    for ckpt_name, tensor in weights:
        name = rename(ckpt_name) if rename else ckpt_name
        if name is None:
            continue
        shard_id: object = None
        for param_part, ckpt_part, sid in stacked_params_mapping:
            if f".{ckpt_part}." in name:
                name, shard_id = name.replace(f".{ckpt_part}.", f".{param_part}."), sid
                break
        param = params.get(name)
        if param is None:
            unexpected.append(ckpt_name)
            continue
        loader: Callable[..., None] = getattr(param, "weight_loader", default_weight_loader)
        try:
            loader(param, tensor) if shard_id is None else loader(param, tensor, shard_id)
        except (ValueError, RuntimeError) as exc:
            raise ValueError(f"cannot load checkpoint tensor {ckpt_name!r} {tuple(tensor.shape)} into parameter "
                             f"{name!r} {tuple(param.shape)}: {exc}") from None
        loaded.add(name)
    if unexpected:
        from kernelcore.pipeline import get_pp_group

        # a pipeline stage skips the other stages' tensors by design
        (logger.warning if get_pp_group().num_stages == 1 else logger.debug)(
            "ignored %d checkpoint tensors with no matching parameter: %s", len(unexpected), unexpected[:8])
    missing = sorted(set(params) - loaded - set(loaded_elsewhere))
    if missing:
        raise ValueError(f"checkpoint does not provide {len(missing)} parameters: {missing[:10]}")
    return loaded


@torch.no_grad()
def init_dummy_weights(model: nn.Module, std: float = 0.02, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0 if name.endswith("weight") else 0.0)
        else:
            param.copy_(torch.randn(param.shape, generator=generator) * std)


@torch.no_grad()
def process_weights_after_loading(model: nn.Module) -> None:
    """Let each layer's linear method quantize or repack the weights it was loaded with."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)


def get_model(config: KernelConfig, is_dummy: bool = False) -> nn.Module:
    """Resolve the architecture in the registry, build it under the config and dtype, load its weights.

    ``is_dummy``: random weights instead of the checkpoint's (benchmarks; only config.json is needed).
    """
    from kernelcore.models.registry import model_registry

    architecture = config.model.architecture
    if architecture is None:
        from kernelcore.config_builder import load_hf_config

        architectures = getattr(load_hf_config(config.model), "architectures", None) or []
        architecture, _ = model_registry.resolve(list(architectures))
    model_cls = model_registry.get_model_cls(architecture)
    if config.parallel.pipeline_parallel_size > 1 and not getattr(model_cls, "supports_pipeline_parallel", False):
        raise ValueError(f"{architecture} does not support pipeline parallelism (supports_pipeline_parallel)")
    model_dir = config.model.model
    if model_dir is None:
        raise ValueError("config.model.model is not set (build_config sets it)")
    import kernelcore.models.gguf_checkpoint as gguf_checkpoint

    is_gguf = gguf_checkpoint.is_gguf(model_dir)
    if not is_dummy and not is_gguf:
        weight_files(model_dir)  # fail on missing weights before building anything
    with set_current_config(config), default_dtype(get_dtype(config.model.dtype)):
        model = model_cls(config, prefix="")
        if is_dummy:
            init_dummy_weights(model)
        elif is_gguf:
            from kernelcore.config_builder import load_hf_config
            from kernelcore.models.gguf_params import record_gguf_types

            record_gguf_types(model)
            model.load_weights(gguf_checkpoint.iterate_weights(model_dir, load_hf_config(config.model)))
        else:
            model.load_weights(iterate_weights(model_dir))
        process_weights_after_loading(model)
    return model.eval()
