"""The named kernel table's type: what ``register_kernels`` and ``register_triton_kernel_overrides`` receive.

The process's table (``kernelcore.kernels.kernel_table``) and the named kernels' torch reference implementations
live in :mod:`kernelcore.kernels`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class KernelEntry:
    name: str
    fn: Callable
    owner: str
    is_override: bool = False


DIRECT = "<direct call>"  # the owner of a registration made outside a plugin's hook


class OwnedView:
    """What a registration hook receives: ``target`` with every registration stamped with the plugin's name."""

    def __init__(self, target: Any, owner: str) -> None:
        self._target, self._owner = target, owner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name in getattr(self._target, "OWNED_METHODS", ()):
            def stamped(*args: Any, **kwargs: Any) -> Any:
                kwargs.setdefault("owner", self._owner)
                return attr(*args, **kwargs)
            return stamped
        return attr


class KernelTable:
    OWNED_METHODS = ("register", "override")

    def __init__(self) -> None:
        self._entries: dict[str, KernelEntry] = {}

    def owned_by(self, owner: str) -> KernelTable:
        return OwnedView(self, owner)  # type: ignore[return-value]

    def register(self, name: str, fn: Callable, owner: str = DIRECT) -> None:
        """Add a kernel. Re-registering by the same plugin is a no-op (spawn, reload)."""
        existing = self._entries.get(name)
        if existing is not None and existing.owner != owner:
            raise ValueError(f"kernel {name!r} is registered by plugin {existing.owner} and again by {owner}; "
                             "a platform replaces kernels with override() in register_triton_kernel_overrides")
        self._entries[name] = KernelEntry(name, fn, owner)

    def override(self, name: str, fn: Callable, owner: str = DIRECT) -> None:
        """Replace a registered kernel (the platform's prerogative)."""
        if name not in self._entries:
            raise KeyError(f"cannot override unknown kernel {name!r}; known: {sorted(self._entries)}")
        self._entries[name] = KernelEntry(name, fn, owner, is_override=True)

    def is_overridden(self, name: str) -> bool:
        entry = self._entries.get(name)
        return entry is not None and entry.is_override

    def get(self, name: str) -> Callable:
        try:
            return self._entries[name].fn
        except KeyError:
            raise KeyError(f"no kernel named {name!r}; known: {sorted(self._entries)}") from None

    def has(self, name: str) -> bool:
        return name in self._entries

    def owners(self) -> list[str]:
        """The plugins whose kernels are in the table."""
        return sorted({e.owner for e in self._entries.values()})

    def winners(self) -> dict[str, str]:
        """name -> "owner:function" of the implementation in use (for the trace)."""
        return {n: f"{e.owner}:{getattr(e.fn, '__qualname__', repr(e.fn))}" for n, e in sorted(self._entries.items())}
