"""The quantization-method registry: ``--quantization NAME`` -> the linear method every linear layer uses.

Plugins fill it in ``register_quantization_methods``; the platform runs last and may replace a method with
its own device's implementation (``override=True``). ``"none"`` is the unquantized method, the core default.
"""

from __future__ import annotations

from typing import Any

from kernelcore.contract.quantization import UNQUANTIZED, MethodEntry, QuantizationRegistry

__all__ = ["UNQUANTIZED", "MethodEntry", "QuantizationRegistry", "check_quantization", "get_quantization_registry",
           "make_linear_method"]


_registry: tuple[Any, QuantizationRegistry] | None = None


def get_quantization_registry() -> QuantizationRegistry:
    """This process's registry, filled by the plugins' hooks on first use (again if the plugin manager changed)."""
    global _registry
    from kernelcore import platforms, plugins

    platforms.load_general_plugins()
    pm = plugins.get_plugin_manager()
    if _registry is None or _registry[0] is not pm:
        registry = QuantizationRegistry()
        # One implementation at a time, in pluggy's call order (the platform last), so each entry records its owner.
        for impl in reversed(pm.hook.register_quantization_methods.get_hookimpls()):
            registry.owner = impl.plugin_name.split(":")[0]
            try:
                impl.function(registry=registry)
            finally:
                registry.owner = "<direct call>"
        _registry = (pm, registry)
    return _registry[1]


def check_quantization(name: str | None) -> None:
    """Raise ValueError naming ``name`` and the known methods when no plugin provides it."""
    get_quantization_registry().get(name)


def make_linear_method(name: str | None):
    return get_quantization_registry().get(name)()
