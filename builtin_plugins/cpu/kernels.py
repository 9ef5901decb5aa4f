"""The CPU platform's kernel table: torch fallbacks for the Triton kernels, its own MoE and pointwise ops."""

from __future__ import annotations

from builtin_plugins.cpu.moe import onednn_fused_moe
from builtin_plugins.cpu.pointwise import KERNELS
from kernelcore import kernels as core_kernels


def override_with_torch(kernels) -> None:
    for name, fn in core_kernels.TORCH_REFERENCE_KERNELS.items():
        if kernels.has(name):
            kernels.override(name, fn, owner="cpu")
    if kernels.has("fused_moe"):
        kernels.override("fused_moe", onednn_fused_moe, owner="cpu")
    # The layers' CPU forwards call these entries: they exist even where no plugin registered the name.
    for name, fn in KERNELS.items():
        if not kernels.has(name):
            kernels.register(name, fn)
        kernels.override(name, fn, owner="cpu")
