"""An op-replacement plugin: swaps RMSNorm when KC_DUMMY_OPS=1."""

import os

from kernelcore import hookimpl


@hookimpl
def register_ops():
    if os.environ.get("KC_DUMMY_OPS") == "1":
        import kc_dummy_ops.rmsnorm  # noqa: F401


@hookimpl
def register_quantization_methods(registry):
    registry.register("dummy_fp16", "kc_dummy_ops.quant:Fp16WeightMethod")
