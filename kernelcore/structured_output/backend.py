"""The grammar backends of this process: the registry filled by the ``register_structured_output_backends`` hook
(the contract itself, base classes and registry type, is :mod:`kernelcore.contract.structured_output`)."""

from __future__ import annotations

from kernelcore.contract.structured_output import (
    BackendFactory,
    GrammarMatcher,
    StructuredOutputBackend,
    StructuredOutputBackendRegistry,
    UnsupportedConstraint,
    allocate_bitmask,
)

__all__ = ["BackendFactory", "GrammarMatcher", "StructuredOutputBackend", "StructuredOutputBackendRegistry",
           "UnsupportedConstraint", "allocate_bitmask", "build_registry"]


def build_registry() -> StructuredOutputBackendRegistry:
    """A registry filled by every general plugin's ``register_structured_output_backends`` hook."""
    from kernelcore import platforms, plugins

    platforms.load_general_plugins()
    registry = StructuredOutputBackendRegistry()
    for impl in plugins.get_plugin_manager().hook.register_structured_output_backends.get_hookimpls():
        registry.owner = impl.plugin_name  # recorded as the owner of what it registers
        try:
            plugins.call_plugin_hook(impl.plugin_name, "register_structured_output_backends", registry=registry)
        finally:
            registry.owner = None
    return registry
