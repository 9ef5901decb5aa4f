"""Executor backends: plugins name them in ``register_executor_backends``; the user picks one with
``--distributed-executor-backend NAME``.

The core contributes ``uni`` (the worker inside the engine-core process); everything else, the built-in
multiprocess executor ``mp`` included, comes from plugins. Without a choice, one rank on one node runs ``uni``
and anything larger runs ``mp``. The registry is rebuilt from the hook each time it is asked for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kernelcore.config import KernelConfig

logger = logging.getLogger("kernelcore.executor")

DEFAULT_SINGLE = "uni"
DEFAULT_DISTRIBUTED = "mp"


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
        from kernelcore.platforms import resolve_obj_by_qualname

        target = self.get_backend(name).target
        return resolve_obj_by_qualname(target) if isinstance(target, str) else target


def build_registry() -> ExecutorRegistry:
    """The core's ``uni`` plus every general plugin's ``register_executor_backends``.

    A plugin whose hook raises stops start-up with an error naming it.
    """
    from kernelcore import platforms, plugins

    registry = ExecutorRegistry()
    registry.plugin = "kernelcore"
    registry.register(DEFAULT_SINGLE, "kernelcore.executor.uniproc:UniProcExecutor")
    platforms.load_general_plugins()
    for impl in plugins.get_plugin_manager().hook.register_executor_backends.get_hookimpls():
        registry.plugin = impl.plugin_name
        try:
            plugins.call_plugin_hook(impl.plugin_name, "register_executor_backends", registry=registry)
        except Exception as exc:
            dist = plugins.plugin_dist(impl.plugin_name)
            raise plugins.PluginError(f"plugin {impl.plugin_name!r} ({dist}) raised in register_executor_backends: "
                                      f"{type(exc).__name__}: {exc}") from exc
    return registry


def backend_name(config: KernelConfig) -> str:
    parallel = config.parallel
    if parallel.distributed_executor_backend:
        return parallel.distributed_executor_backend
    is_single = parallel.world_size == 1 and parallel.nnodes == 1
    return DEFAULT_SINGLE if is_single else DEFAULT_DISTRIBUTED


def get_executor_cls(config: KernelConfig) -> type:
    name = backend_name(config)
    registry = build_registry()
    cls = registry.get_cls(name)
    logger.info("Executor backend %r (%s.%s, plugin %s)", name, cls.__module__, cls.__qualname__,
                registry.plugin_of(name))
    return cls
