"""The executor-backend registry's type (what ``register_executor_backends`` receives): names selectable with
``--distributed-executor-backend NAME``."""

from __future__ import annotations

from dataclasses import dataclass

from kernelcore.contract.targets import resolve_target


class UnknownExecutorError(ValueError):
    """No plugin registered the requested executor backend."""


@dataclass
class _Backend:
    name: str
    target: type | str  # a class or "pkg.mod:Class" / "pkg.mod.Class" (imported when chosen)
    plugin: str


class ExecutorRegistry:
    def __init__(self) -> None:
        self._backends: dict[str, _Backend] = {}
        self.plugin = "<direct call>"  # set by the host while a plugin's hook runs

    def register(self, name: str, executor: type | str) -> None:
        """Make ``executor`` selectable as ``name``; registering a name twice raises."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"executor backend name must be a non-empty string, got {name!r}")
        if not isinstance(executor, (type, str)):
            raise TypeError(f"executor backend {name!r} must be a class or a dotted path, got {executor!r}")
        previous = self._backends.get(name)
        if previous is not None:
            raise ValueError(f"executor backend {name!r} is already registered by plugin {previous.plugin!r}")
        self._backends[name] = _Backend(name, executor, self.plugin)

    def names(self) -> list[str]:
        return sorted(self._backends)

    def plugin_of(self, name: str) -> str:
        return self.get_backend(name).plugin

    def get_backend(self, name: str) -> _Backend:
        if name not in self._backends:
            raise UnknownExecutorError(f"unknown executor backend {name!r}; available: {self.names()} "
                                       "(a plugin adds one with the register_executor_backends hook)")
        return self._backends[name]

    def get_cls(self, name: str) -> type:
        return resolve_target(self.get_backend(name).target)
