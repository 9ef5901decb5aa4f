"""What Ollama's model routes report about the served checkpoint: details, model_info, size, digest, capabilities.

Read once per checkpoint from what is already on disk: a GGUF file's metadata (cached by kernelcore) or a
Hugging Face directory's config.json and safetensors headers. Nothing is hashed: the digest identifies the file
by path, size and modification time (Ollama's is its manifest's hash, which clients only display and compare).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

logger = logging.getLogger("kernelcore.server")

# llama.cpp's general.file_type values (LLAMA_FTYPE_MOSTLY_*) -> the level Ollama reports
GGUF_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
                   11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
                   18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
                   25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
                   32: "BF16", 36: "TQ1_0", 37: "TQ2_0"}
TORCH_DTYPES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
HF_INFO_KEYS = {  # transformers config attribute -> Ollama's model_info key (after "<arch>.")
    "hidden_size": "embedding_length", "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv", "intermediate_size": "feed_forward_length",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon", "rope_theta": "rope.freq_base", "vocab_size": "vocab_size",
}


@dataclass(frozen=True)
class ModelFacts:
    format: str  # "gguf" | "safetensors"
    family: str  # the architecture: "llama", "qwen2", ...
    parameter_count: int
    parameter_size: str  # "135M", "1.5B"
    quantization_level: str  # "Q4_1", "BF16", ...
    size: int  # bytes of the weights on disk
    modified_at: str  # RFC 3339, UTC
    digest: str  # 64 hex digits
    info: dict[str, Any] = field(default_factory=dict)  # general.* and <arch>.* keys, context length excluded
    license: str = ""

    def details(self, parent: str = "") -> dict[str, Any]:
        return {"parent_model": parent, "format": self.format, "family": self.family, "families": [self.family],
                "parameter_size": self.parameter_size, "quantization_level": self.quantization_level}

    def model_info(self, max_model_len: int) -> dict[str, Any]:
        return {**self.info, "general.architecture": self.family, "general.parameter_count": self.parameter_count,
                f"{self.family}.context_length": max_model_len}


def human_size(count: int) -> str:
    """Ollama's parameter_size style: 135M, 1.7B, 8.0B."""
    if count >= 1_000_000_000:
        return f"{count / 1e9:.1f}B"
    if count >= 1_000_000:
        return f"{count / 1e6:.0f}M"
    return f"{count / 1e3:.0f}K" if count else "unknown"


def _stamp(paths: list[str]) -> tuple[str, str]:
    """(modified_at, digest) of the newest of ``paths``; the digest from their names, sizes and times."""
    stats = [(os.path.realpath(p), os.stat(p)) for p in paths]
    newest = max((st.st_mtime for _, st in stats), default=0.0)
    key = "\n".join(f"{p}:{st.st_size}:{st.st_mtime_ns}" for p, st in sorted(stats, key=lambda s: s[0]))
    modified = datetime.fromtimestamp(newest, timezone.utc).isoformat().replace("+00:00", "Z")
    return modified, hashlib.sha256(key.encode()).hexdigest()


def _gguf_facts(path: str) -> ModelFacts:
    from kernelcore.models import gguf_metadata

    meta = gguf_metadata.metadata(path)
    tensors = gguf_metadata.tensors(path)
    arch = gguf_metadata.architecture(path) or "unknown"
    count = sum(functools.reduce(lambda a, b: a * b, t.shape, 1) for t in tensors)
    level = GGUF_FILE_TYPES.get(meta.get("general.file_type", -1))
    if level is None:  # the type most bytes are stored in
        by_bytes: Counter[str] = Counter()
        for t in tensors:
            by_bytes[t.type_name] += t.nbytes
        level = by_bytes.most_common(1)[0][0] if by_bytes else "unknown"
    modified, digest = _stamp([path])
    info = {k: v for k, v in meta.items() if not k.endswith(".context_length")}
    return ModelFacts("gguf", arch, count, str(meta.get("general.size_label") or human_size(count)), level,
                      os.path.getsize(path), modified, digest, info, str(meta.get("general.license") or ""))


def _safetensors_count(path: str) -> int:
    """Parameters in one .safetensors file, from its JSON header alone."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return sum(functools.reduce(lambda a, b: a * b, t.get("shape", []), 1)
               for name, t in header.items() if name != "__metadata__")


def _hf_facts(model_config: Any) -> ModelFacts:
    from kernelcore.config_builder import load_hf_config

    config = load_hf_config(model_config)
    arch = getattr(config, "model_type", None) or model_config.architecture or "unknown"
    directory = model_config.model
    files = []
    if directory and os.path.isdir(directory):
        files = [os.path.join(directory, n) for n in sorted(os.listdir(directory))
                 if n.endswith((".safetensors", ".bin", ".pt"))]
    count = 0
    for name in files:
        if name.endswith(".safetensors"):
            try:
                count += _safetensors_count(name)
            except (OSError, ValueError, struct.error):
                logger.debug("Cannot read the safetensors header of %s", name)
    dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "").replace("torch.", "")
    level = (model_config.quantization or "").upper() or TORCH_DTYPES.get(dtype, dtype.upper() or "unknown")
    modified, digest = _stamp(files) if files else (datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
                                                    hashlib.sha256(str(directory).encode()).hexdigest())
    info = {f"{arch}.{key}": getattr(config, attr) for attr, key in HF_INFO_KEYS.items()
            if isinstance(getattr(config, attr, None), (int, float))}
    return ModelFacts("safetensors", arch, count, human_size(count), level, sum(os.path.getsize(f) for f in files),
                      modified, digest, info)


_cache: dict[tuple[str | None, str | None], ModelFacts] = {}


def model_facts(engine: Any) -> ModelFacts:
    """The served checkpoint's facts (cached: the checkpoint does not change while it is served)."""
    from kernelcore.models.gguf_checkpoint import is_gguf

    model_config = engine.config.model
    key = (model_config.model, model_config.quantization)
    if key not in _cache:
        try:
            facts = _gguf_facts(model_config.model) if is_gguf(model_config.model) else _hf_facts(model_config)
        except Exception:  # an unusual checkpoint must not break the listing routes
            logger.exception("Ollama API: cannot describe %s; reporting it as unknown", model_config.model)
            facts = ModelFacts("unknown", model_config.architecture or "unknown", 0, "unknown", "unknown", 0,
                               datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
                               hashlib.sha256(str(model_config.model).encode()).hexdigest())
        _cache[key] = facts
    return _cache[key]
