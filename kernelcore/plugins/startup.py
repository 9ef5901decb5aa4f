"""The two loaders (platform plugins, then general plugins) and what a process runs with its plugins at start-up:
the registration hooks, the kernel overrides and the stat-logger classes."""

from __future__ import annotations

import logging
import os
from typing import Any

from kernelcore import envs
from kernelcore.hostproc.role import get_role
from kernelcore.plugins.calls import call_plugin_hook, implementers
from kernelcore.plugins.discovery import (
    GENERAL_GROUP,
    PLATFORM_GROUP,
    STAT_LOGGER_GROUP,
    load_group,
    register_plugin,
    warn_excluded_platforms,
    warn_unknown_allowed_names,
)
from kernelcore.plugins.state import PluginError, PluginRecord, process_state
from kernelcore.plugins.trace import trace_event

logger = logging.getLogger("kernelcore.plugins")

# Hooks a general plugin runs once per process when it is loaded.
STARTUP_HOOKS = ("register_ops", "register_models", "register_kernels")


def load_platform_plugins() -> list[PluginRecord]:
    """Import and register every allowed platform plugin (detectors are not called here)."""
    state = process_state()
    if not state.platform_loaded:
        state.platform_loaded = True
        for record, obj in load_group(PLATFORM_GROUP, is_fatal=False):
            try:
                register_plugin(record, obj)
            except PluginError as exc:
                logger.warning("%s", exc)
        warn_excluded_platforms([r for (g, _), r in state.records.items() if g == PLATFORM_GROUP])
    return [r for (g, _), r in state.records.items() if g == PLATFORM_GROUP]


def load_general_plugins(platform: Any) -> None:
    """Load the general plugins once per process, after the platform is fixed.

    ``platform`` is this process's resolved platform: the caller fixes it first (their hooks may read it),
    so this package never imports ``kernelcore.platforms``. Call ``kernelcore.platforms.load_general_plugins()``,
    which does both. A plugin that raises stops start-up with a :class:`PluginError` naming it;
    the once-flag is set only when every plugin succeeded.
    """
    state = process_state()
    if platform is None or platform is not state.platform:
        raise RuntimeError("load_general_plugins needs this process's resolved platform "
                           "(call kernelcore.platforms.load_general_plugins())")
    if state.general_loaded:
        return
    warn_unknown_allowed_names()
    loaded = load_group(GENERAL_GROUP)
    for record, obj in loaded:
        register_plugin(record, obj)
    state.pm.check_pending()
    for record, _ in loaded:
        for hook_name in STARTUP_HOOKS:
            if hook_name not in record.hooks:
                continue
            try:
                replaced = _replaced_ops()
                call_plugin_hook(record.name, hook_name, **_startup_kwargs(hook_name, record.name))
                state.op_owners.update({k: record.name for k, v in _replaced_ops().items() if replaced.get(k) is not v})
            except Exception as exc:
                record.status, record.error = "failed", f"{type(exc).__name__}: {exc}"
                raise PluginError(
                    f"general plugin {record.name!r} (distribution {record.dist}) raised in "
                    f"{hook_name} in process {get_role()} (pid {os.getpid()}): {record.error}"
                ) from exc
    state.general_loaded = True


def _replaced_ops() -> dict[str, type]:
    import sys

    custom_op = sys.modules.get("kernelcore.custom_op")  # not imported: nothing was replaced yet
    return dict(custom_op.op_registry_oot) if custom_op is not None else {}


def op_owners() -> dict[str, str]:
    return dict(process_state().op_owners)


def _startup_kwargs(hook_name: str, owner: str) -> dict[str, Any]:
    # Each plugin gets a view that stamps its registrations with its name (ownership passed explicitly).
    if hook_name == "register_models":
        from kernelcore.models.registry import model_registry

        return {"registry": model_registry.owned_by(owner)}
    if hook_name == "register_kernels":
        from kernelcore.kernels import kernel_table

        return {"kernels": kernel_table.owned_by(owner)}
    return {}


def apply_kernel_overrides() -> None:
    """Run every ``register_triton_kernel_overrides``, each override stamped with its plugin (a worker's start-up)."""
    from kernelcore.kernels import kernel_table

    for name in implementers("register_triton_kernel_overrides"):
        call_plugin_hook(name, "register_triton_kernel_overrides", kernels=kernel_table.owned_by(name.split(":")[0]))


def trace_kernel_table() -> None:
    """Write the implementation in use for each kernel to the plugin trace (end of every worker's start-up)."""
    from kernelcore.kernels import kernel_table

    trace_event(envs.KC_TRACE_PLUGINS, hook="kernel_table", plugins=kernel_table.owners(),
                result=kernel_table.winners(), ok=True)


def load_stat_logger_classes() -> list[tuple[str, type]]:
    """The classes named in the stat-logger group (validated by the metrics module)."""
    return [(record.name, obj) for record, obj in load_group(STAT_LOGGER_GROUP)]


def report_components() -> dict[str, str]:
    """Every plugin's ``report_components`` answer merged (component -> "ok ..." / "missing ..."), each logged: a
    warning for a component that is missing. A plugin that raises is reported as a missing component named after
    it, not a failed start-up: a diagnostic never stops the server."""
    components: dict[str, str] = {}
    for name in implementers("report_components"):
        try:
            answer = call_plugin_hook(name, "report_components")
        except Exception as exc:
            logger.debug("%s raised in report_components", name, exc_info=True)
            answer = [{name: f"missing: report_components raised {type(exc).__name__}: {exc}"}]
        for part in answer or []:
            components.update(part or {})
    for component, status in components.items():
        (logger.info if status.startswith("ok") else logger.warning)("component %s: %s", component, status)
    return components
