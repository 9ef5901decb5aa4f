"""The named kernel table: kernels contributed by plugins, replaceable by the platform.

General plugins fill it in ``register_kernels``; a worker's platform may then
swap entries in ``register_triton_kernel_overrides`` before any model code
runs. ``kernel_table.get(name)`` is what layers and attention backends call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger("kernelcore.kernels")


@dataclass
class KernelEntry:
    name: str
    fn: Callable
    owner: str
    is_override: bool = False


class KernelTable:
    def __init__(self) -> None:
        self._entries: dict[str, KernelEntry] = {}

    def _owner(self) -> str:
        from kernelcore import plugins

        return plugins.loading_plugin or "<direct call>"

    def register(self, name: str, fn: Callable) -> None:
        """Add a kernel. Re-registering by the same plugin is a no-op (spawn, reload)."""
        owner = self._owner()
        existing = self._entries.get(name)
        if existing is not None and existing.owner != owner:
            raise ValueError(f"kernel {name!r} is registered by plugin {existing.owner} and again by {owner}; "
                             "a platform replaces kernels with override() in register_triton_kernel_overrides")
        self._entries[name] = KernelEntry(name, fn, owner)

    def override(self, name: str, fn: Callable, owner: str | None = None) -> None:
        """Replace a registered kernel (the platform's prerogative)."""
        if name not in self._entries:
            raise KeyError(f"cannot override unknown kernel {name!r}; known: {sorted(self._entries)}")
        self._entries[name] = KernelEntry(name, fn, owner or self._owner(), is_override=True)

    def get(self, name: str) -> Callable:
        try:
            return self._entries[name].fn
        except KeyError:
            raise KeyError(f"no kernel named {name!r}; known: {sorted(self._entries)}") from None

    def has(self, name: str) -> bool:
        return name in self._entries

    def winners(self) -> dict[str, str]:
        """name -> "owner:function" of the implementation in use (for the trace)."""
        return {n: f"{e.owner}:{getattr(e.fn, '__qualname__', repr(e.fn))}" for n, e in sorted(self._entries.items())}


kernel_table = KernelTable()
