"""What must match on every host of one engine (checked when a host joins): the model's config, dtype, parallel
sizes, cache geometry, platform. Plain strings, so it travels in a msgpack handshake."""

from __future__ import annotations

import hashlib
import json
import os

from kernelcore.contract.config import KernelConfig


def _model_description(path: str) -> bytes:
    """A checkpoint directory's config.json; a GGUF file's tensor table (names, types, shapes, offsets) and size,
    from its parsed metadata: what two copies of one file share, without hashing gigabytes of weights."""
    from kernelcore.models import gguf_metadata
    from kernelcore.models.gguf_checkpoint import is_gguf

    if is_gguf(path):
        with open(os.path.join(gguf_metadata.cached_dir(path), "gguf.json"), "rb") as f:
            return f.read() + str(os.path.getsize(path)).encode()
    with open(os.path.join(path, "config.json"), "rb") as f:
        return f.read()


def fingerprint(config: KernelConfig) -> dict[str, str]:
    model_path = config.model.model
    if model_path is None:
        raise ValueError("config.model.model is not set (build_config sets it)")
    model_hash = hashlib.sha256(_model_description(model_path)
                                + json.dumps(config.model.hf_overrides, sort_keys=True).encode())
    p = config.parallel
    return {"model checkpoint": model_hash.hexdigest()[:16], "architecture": str(config.model.architecture),
            "quantization": str(config.model.quantization),
            "dtype": config.model.dtype, "max_model_len": str(config.model.max_model_len),
            "tensor_parallel_size": str(p.tensor_parallel_size),
            "pipeline_parallel_size": str(p.pipeline_parallel_size),
            "data_parallel_size": str(p.data_parallel_size), "nnodes": str(p.nnodes),
            "block_size": str(config.cache.block_size), "enable_lora": str(config.lora.enable_lora),
            "platform": str(config.platform_plugin)}


def mismatches(expected: dict[str, str], actual: dict[str, str], where: str) -> list[str]:
    """One sentence per setting that differs between the head (``expected``) and the host ``where``."""
    return [f"{key} is {actual.get(key)!r} on {where} but {value!r} on the head"
            for key, value in expected.items() if actual.get(key) != value]
