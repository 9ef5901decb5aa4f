"""The quantization-method registry's type (what ``register_quantization_methods`` receives):
``--quantization NAME`` -> the linear method every linear layer uses. ``"none"`` is the unquantized method."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelcore.contract.targets import resolve_obj_by_qualname

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
        self.owner = "<direct call>"  # the plugin whose hook is registering (set by the loader: ownership passed)
        self.register(UNQUANTIZED, "kernelcore.layers.linear:UnquantizedLinearMethod")

    def register(self, name: str, method: Any, override: bool = False) -> None:
        """Add method ``name``; ``override=True`` replaces an existing one (a platform's faster implementation)."""
        owner = self.owner
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
            entry.method = resolve_obj_by_qualname(entry.method.replace(":", "."))
        return entry.method

    def owners(self) -> dict[str, str]:
        return {name: entry.owner for name, entry in sorted(self._entries.items())}
