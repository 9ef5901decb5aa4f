"""Torch fallbacks for the kernel table (the CPU platform's overrides)."""

from __future__ import annotations


def override_with_torch(kernels) -> None:
    from kernelcore import kernels as core_kernels

    for name, fn in core_kernels.TORCH_REFERENCE_KERNELS.items():
        if kernels.has(name):
            kernels.override(name, fn, owner="cpu")
