from __future__ import annotations

import os

from builtin_plugins.cpu.cpuinfo import read_cpuinfo
from kernelcore import hookimpl
from kernelcore.contract.platform import Platform


class CpuPlatform(Platform):
    device_name = "cpu"
    device_type = "cpu"
    priority = -100  # the fallback: any other active built-in platform wins

    @hookimpl
    def check_and_update_config(self, config):
        if config.parallel.worker_cls == "auto":
            config.parallel.worker_cls = "builtin_plugins.cpu.worker.CpuWorker"
        if not any(mode in config.custom_ops for mode in ("all", "none")):
            config.custom_ops.append("all")
        if config.model.dtype == "auto":
            # Unset: float32. An explicit --dtype auto: bfloat16 where the CPU computes it natively.
            is_fast = config.is_user_set("model.dtype") and _has_fast_bf16()
            config.model.dtype = "bfloat16" if is_fast else "float32"

    @hookimpl
    def get_attn_backend_cls(self, selector):
        return "builtin_plugins.cpu.attention.CpuAttentionBackend"

    @hookimpl
    def get_graph_capture_backend_cls(self, config):
        from kernelcore import envs

        return "builtin_plugins.cpu.graphs.CpuGraphBackend" if envs.KC_CPU_GRAPH_MAX_BATCH > 0 else None

    @hookimpl
    def get_device_communicator_cls(self):
        return "kernelcore.distributed.TorchDistCommunicator"

    @hookimpl
    def register_quantization_methods(self, registry):
        # Faster CPU implementations of the core's linear methods (the platform runs last, so these win).
        registry.register("none", "builtin_plugins.cpu.linear:OneDnnLinearMethod", override=True)
        if "int8" in registry.names():
            registry.register("int8", "builtin_plugins.cpu.linear:CpuInt8LinearMethod", override=True)
        # Imported here (and the kernel table below): detecting the platform imports this module without torch.
        from builtin_plugins.cpu.gguf_native import TYPES

        for kind in TYPES:  # the GGUF block types the native kernels compute, where a plugin registered them
            if f"gguf_{kind.lower()}" in registry.names():
                registry.register(f"gguf_{kind.lower()}", "builtin_plugins.cpu.gguf_linear:CpuGGUFMethod",
                                  override=True)

    @hookimpl
    def report_components(self):
        # Each native library built (or found in the cache) and loaded, or why not: a fallback is never silent.
        from builtin_plugins.cpu.components import native_components

        return native_components()

    @hookimpl
    def register_triton_kernel_overrides(self, kernels):
        # Triton cannot launch on CPU tensors: every kernel gets its torch fallback.
        from builtin_plugins.cpu.kernels import override_with_torch

        override_with_torch(kernels)


def _has_fast_bf16() -> bool:
    flags = read_cpuinfo()
    if not flags:
        return os.uname().machine == "arm64"
    return "avx512_bf16" in flags or "amx_bf16" in flags
