"""The Triton kernels (entry point ``triton_kernels`` in kernelcore.general_plugins).

``register_kernels`` only records names: triton is imported on a kernel's first launch, so a CPU-only
process never loads it (and the CPU platform overrides every entry with its torch reference anyway).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable

from kernelcore import hookimpl

# kernel name -> "module:function" inside this package
KERNELS = {
    "paged_attention": "attention:paged_attention",
    "reshape_and_cache": "cache:reshape_and_cache",
    "rms_norm": "norm:rms_norm",
    "fused_add_rms_norm": "norm:fused_add_rms_norm",
    "rotary_embedding": "rotary:rotary_embedding",
    "silu_and_mul": "activation:silu_and_mul",
    "gelu_tanh_and_mul": "activation:gelu_tanh_and_mul",
    "fused_moe": "moe:fused_moe",
}
MISSING_TRITON = "the Triton kernels need triton, which is not installed: pip install 'kernelcore[cuda]'"


def require_triton() -> None:
    if importlib.util.find_spec("triton") is None:
        raise ImportError(MISSING_TRITON)


def load(name: str) -> Callable:
    """The launcher of a kernel (imports triton)."""
    require_triton()
    module, fn_name = KERNELS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), fn_name)


def _lazy(name: str) -> Callable:
    fn = None

    def launch(*args, **kwargs):
        nonlocal fn
        if fn is None:
            fn = load(name)
        return fn(*args, **kwargs)

    launch.__name__ = launch.__qualname__ = f"triton_{name}"
    launch.__module__ = f"{__name__}.{KERNELS[name].split(':')[0]}"
    return launch


@hookimpl
def register_kernels(kernels) -> None:
    for name in KERNELS:
        kernels.register(name, _lazy(name))
