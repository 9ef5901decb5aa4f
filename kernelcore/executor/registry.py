"""Executor backends: plugins name them in ``register_executor_backends``; the user picks one with
``--distributed-executor-backend NAME``.

The core contributes ``uni`` (the worker inside the engine-core process); everything else, the built-in
multiprocess executor ``mp`` included, comes from plugins. Without a choice, one rank on one node runs ``uni``
and anything larger runs ``mp``. The registry is rebuilt from the hook each time it is asked for.
"""

from __future__ import annotations

import logging

from kernelcore.contract.config import KernelConfig
from kernelcore.contract.executors import ExecutorRegistry, UnknownExecutorError

__all__ = ["DEFAULT_DISTRIBUTED", "DEFAULT_SINGLE", "ExecutorRegistry", "UnknownExecutorError", "backend_name",
           "build_registry", "get_executor_cls"]

logger = logging.getLogger("kernelcore.executor")

DEFAULT_SINGLE = "uni"
DEFAULT_DISTRIBUTED = "mp"


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
