"""What must match on every host of one engine (checked when a host joins): the model's config, dtype, parallel
sizes, cache geometry, platform. Plain strings, so it travels in a msgpack handshake."""

from __future__ import annotations

import hashlib
import json
import os

from kernelcore.config import KernelConfig


def fingerprint(config: KernelConfig) -> dict[str, str]:
    model_dir = config.model.model
    if model_dir is None:
        raise ValueError("config.model.model is not set (build_config sets it)")
    with open(os.path.join(model_dir, "config.json"), "rb") as f:
        model_hash = hashlib.sha256(f.read() + json.dumps(config.model.hf_overrides, sort_keys=True).encode())
    p = config.parallel
    return {"model config.json": model_hash.hexdigest()[:16], "architecture": str(config.model.architecture),
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
