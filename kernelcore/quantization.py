"""The quantization-method registry: ``--quantization NAME`` -> the linear method every linear layer uses.

Plugins fill it in ``register_quantization_methods``; the platform runs last and may replace a method with
its own device's implementation (``override=True``). ``"none"`` is the unquantized method, the core default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

UNQUANTIZED = "none"


@dataclass
class MethodEntry:
    name: str
    method: Any  # a LinearMethodBase subclass, or its "module:Class" path (imported on first use)
    owner: str
    is_override: bool = False


class QuantizationRegistry:
    def __init__(self) -> None:
        self._entries: dict[str, MethodEntry] = {}
        self.register(UNQUANTIZED, "kernelcore.layers.linear:UnquantizedLinearMethod")

    def register(self, name: str, method: Any, override: bool = False) -> None:
        """Add method ``name``; ``override=True`` replaces an existing one (a platform's faster implementation)."""
        from kernelcore import plugins

        owner = getattr(plugins, "loading_plugin", None) or "<direct call>"
        existing = self._entries.get(name)
        if existing is not None and not override and existing.owner != owner:
            raise ValueError(f"quantization method {name!r} is registered by {existing.owner} and again by {owner}; "
                             "pass override=True to replace it")
        if override and existing is None:
            raise KeyError(f"cannot override unknown quantization method {name!r}; known: {self.names()}")
        self._entries[name] = MethodEntry(name, method, owner, is_override=override)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str | None) -> type:
        entry = self._entries.get(name or UNQUANTIZED)
        if entry is None:
            raise ValueError(f"unknown quantization method {name!r}; known: {', '.join(self.names())}")
        if isinstance(entry.method, str):
            from kernelcore.platforms import resolve_obj_by_qualname

            entry.method = resolve_obj_by_qualname(entry.method.replace(":", "."))
        return entry.method

    def owners(self) -> dict[str, str]:
        return {name: entry.owner for name, entry in sorted(self._entries.items())}


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
            plugins.loading_plugin = impl.plugin_name.split(":")[0]
            try:
                impl.function(registry=registry)
            finally:
                plugins.loading_plugin = None
        _registry = (pm, registry)
    return _registry[1]


def check_quantization(name: str | None) -> None:
    """Raise ValueError naming ``name`` and the known methods when no plugin provides it."""
    get_quantization_registry().get(name)


def make_linear_method(name: str | None):
    return get_quantization_registry().get(name)()
