"""Rotary position embedding (neox style) with the rope_scaling types Llama checkpoints use."""

from __future__ import annotations

import math
from typing import Any

import torch

from kernelcore.custom_op import CustomOp
from kernelcore.kernels import kernel_table


def _inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def _cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    freqs = positions.float()[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _build_cache(base: float, rotary_dim: int, max_position: int, scaling: dict[str, Any] | None) -> torch.Tensor:
    """[max_position, rotary_dim] float32: cos of the rotary_dim/2 frequencies, then sin."""
    scaling = scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    inv_freq = _inv_freq(base, rotary_dim)
    if kind == "default":
        return _cos_sin(inv_freq, torch.arange(max_position))
    if kind == "linear":
        return _cos_sin(inv_freq / scaling["factor"], torch.arange(max_position))
    if kind == "llama3":
        return _cos_sin(_llama3_inv_freq(inv_freq, scaling), torch.arange(max_position))
    if kind in ("longrope", "su"):
        # Phi-3's LongRoPE: per-frequency factors, the long ones when the served length exceeds the pretrained
        # one (chosen once for the whole cache, so cached keys never change rotation), cos/sin scaled by the
        # attention factor (given, or from the length ratio).
        native = scaling["original_max_position_embeddings"]
        factors = scaling["long_factor"] if max_position > native else scaling["short_factor"]
        cache = _cos_sin(inv_freq / torch.tensor(factors, dtype=torch.float32), torch.arange(max_position))
        return cache * scaling.get("attention_factor", 1.0)
    if kind == "dynamic":
        # transformers' dynamic NTK: unscaled within the native length, then the base grows with the
        # length; positions past it use the base of the longest supported length (as vLLM does).
        native = scaling.get("original_max_position_embeddings", max_position)
        factor = scaling["factor"]
        long_len = int(native * factor)
        long_base = base * ((factor * long_len / native) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
        return torch.cat([_cos_sin(inv_freq, torch.arange(native)),
                          _cos_sin(_inv_freq(long_base, rotary_dim),
                                  torch.arange(native, max(long_len, max_position)))])
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, dynamic, llama3, longrope)")


@CustomOp.register("rotary_embedding")
class RotaryEmbedding(CustomOp):
    """``forward(positions, q, k)`` rotates q [T, H*D] and k [T, Hkv*D]; returns (q, k)."""

    cos_sin_cache: torch.Tensor  # a buffer (register_buffer below)

    kernel_names = ("rotary_embedding",)

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 rope_scaling: dict[str, Any] | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.head_size, self.rotary_dim = head_size, rotary_dim
        cache = _build_cache(base, rotary_dim, max_position, rope_scaling)
        self.register_buffer("cos_sin_cache", cache.to(dtype or torch.get_default_dtype()), persistent=False)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x.view(x.shape[0], -1, self.head_size)
        half = self.rotary_dim // 2
        x1, x2 = x[..., :half], x[..., half:self.rotary_dim]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        if self.rotary_dim < self.head_size:
            rotated = torch.cat([rotated, x[..., self.rotary_dim:]], dim=-1)
        return rotated.flatten(1)

    def forward_native(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def forward_cpu(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        # A CPU platform's kernel, when it put one in the table (the built-in one does).
        if kernel_table.is_overridden("rotary_embedding"):
            return self.forward_cuda(positions, q, k)
        return self.forward_native(positions, q, k)

    def forward_cuda(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        # In place on q and k (column slices of the qkv output).
        return kernel_table.get("rotary_embedding")(positions, q, k, self.cos_sin_cache, self.head_size,
                                                    self.rotary_dim)


def get_rope(head_size: int, rotary_dim: int, max_position: int, base: float,
             rope_scaling: dict[str, Any] | None = None, dtype: torch.dtype | None = None) -> RotaryEmbedding:
    """Build the rotary op; an out-of-tree ``RotaryEmbedding.register_oot`` replacement is picked up here."""
    return RotaryEmbedding(head_size, rotary_dim, max_position, base, rope_scaling, dtype)
