"""The LoRA-resolver registry's type (what ``register_lora_resolvers`` receives) and the resolver protocol.

Resolvers are tried by ascending ``order`` (default 50), ties by resolver name; the first that returns a path wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_ORDER = 50


class LoRAPathError(ValueError):
    """An adapter name or path that would leave its root (``..``, absolute, separators, NUL, symlinks)."""


class LoRAResolverError(ValueError):
    """A resolver raised; the message names the resolver and the adapter."""


class LoRAResolver(Protocol):
    def resolve_lora(self, base_model_name: str, lora_name: str) -> Any:
        """A local adapter directory for ``lora_name``, or None; may be a coroutine function."""


@dataclass
class _Registration:
    name: str
    resolver: LoRAResolver
    order: int
    plugin: str


class LoRAResolverRegistry:
    def __init__(self) -> None:
        self._entries: dict[str, _Registration] = {}
        self.plugin = "<direct call>"  # set by the host while a plugin's hook runs

    def register(self, name: str, resolver: LoRAResolver, order: int = DEFAULT_ORDER) -> None:
        previous = self._entries.get(name)
        if previous is not None:
            raise ValueError(f"LoRA resolver {name!r} is already registered by plugin {previous.plugin!r}")
        if not callable(getattr(resolver, "resolve_lora", None)):
            raise TypeError(f"LoRA resolver {name!r} has no resolve_lora(base_model_name, lora_name) method")
        self._entries[name] = _Registration(name, resolver, order, self.plugin)

    def get(self, name: str) -> LoRAResolver:
        if name not in self._entries:
            raise KeyError(f"LoRA resolver {name!r} not found. Available resolvers: {self.names()}")
        return self._entries[name].resolver

    def names(self) -> list[str]:
        return [r.name for r in self.ordered()]

    def ordered(self) -> list[_Registration]:
        return sorted(self._entries.values(), key=lambda r: (r.order, r.name))
