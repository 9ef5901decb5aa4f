"""Torch fallbacks for the kernel table (the CPU platform's overrides)."""

from __future__ import annotations


def override_with_torch(kernels) -> None:
    from kernelcore import kernels as core_kernels

    for name, fn in core_kernels.TORCH_REFERENCE_KERNELS.items():
        if kernels.has(name):
            kernels.override(name, fn, owner="cpu")
    if kernels.has("fused_moe"):
        from builtin_plugins.cpu.moe import onednn_fused_moe

        kernels.override("fused_moe", onednn_fused_moe, owner="cpu")
