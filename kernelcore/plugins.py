"""Discover, filter, load and trace plugins: the same way in every process."""

from __future__ import annotations

import difflib
import importlib.metadata as md
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import pluggy

from kernelcore import envs
from kernelcore.contract import hookspecs
from kernelcore.hostproc.role import get_role

logger = logging.getLogger("kernelcore.plugins")

PLATFORM_GROUP = "kernelcore.platform_plugins"
GENERAL_GROUP = "kernelcore.general_plugins"
STAT_LOGGER_GROUP = "kernelcore.stat_logger_plugins"
GROUPS = (PLATFORM_GROUP, GENERAL_GROUP, STAT_LOGGER_GROUP)
BUILTIN_DIST = "kernelcore"
# Hooks a general plugin runs once per process when it is loaded.
STARTUP_HOOKS = ("register_ops", "register_models", "register_kernels")


class PluginError(RuntimeError):
    """A plugin failed; the message names the plugin, its distribution and the process."""


@dataclass
class PluginRecord:
    group: str
    name: str
    value: str
    dist: str
    version: str
    is_builtin: bool
    status: str = "discovered"  # loaded | blocked | not-allowed | failed
    error: str | None = None
    hooks: list[str] = field(default_factory=list)


@dataclass
class _ProcessState:
    pm: pluggy.PluginManager
    records: dict[tuple[str, str], PluginRecord] = field(default_factory=dict)
    general_loaded: bool = False
    platform_loaded: bool = False
    op_owners: dict[str, str] = field(default_factory=dict)  # in-tree op name -> plugin whose register_ops replaced it
    platform: Any = None  # this process's Platform instance (kernelcore.platforms.current_platform)


_state: _ProcessState | None = None
_state_pid: int | None = None


def _process_state() -> _ProcessState:
    # Keyed on the pid: a forked child must load its plugins again.
    global _state, _state_pid
    if _state is None or _state_pid != os.getpid():
        pm = pluggy.PluginManager("kernelcore")
        pm.add_hookspecs(hookspecs)
        if envs.KC_TRACE_PLUGINS:
            _install_trace(pm, envs.KC_TRACE_PLUGINS)
        _state, _state_pid = _ProcessState(pm=pm), os.getpid()
    return _state


def get_plugin_manager() -> pluggy.PluginManager:
    return _process_state().pm


def process_state() -> _ProcessState:
    """This process's plugin manager, plugin records and platform (rebuilt after a fork)."""
    return _process_state()


def reset_for_tests() -> None:
    global _state
    _state = None


# -- tracing ---------------------------------------------------------------------


def trace_event(path: str | None, **event: Any) -> None:
    if not path:
        return
    event = {"time": time.time(), "host": socket.gethostname(), "pid": os.getpid(), "role": get_role(), **event}
    line = json.dumps(event, default=repr) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())  # one write per line: O_APPEND keeps processes from interleaving
    finally:
        os.close(fd)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _install_trace(pm: pluggy.PluginManager, path: str) -> None:
    starts: list[float] = []

    def before(hook_name, hook_impls, kwargs):
        starts.append(time.perf_counter())

    def after(outcome, hook_name, hook_impls, kwargs):
        duration_ms = (time.perf_counter() - starts.pop()) * 1000
        error = outcome.exception
        trace_event(
            path,
            hook=hook_name,
            plugins=[impl.plugin_name for impl in hook_impls],
            duration_ms=round(duration_ms, 3),
            result=_short(error if error is not None else outcome.get_result()),
            ok=error is None,
        )

    pm.add_hookcall_monitoring(before, after)


# -- discovery and filtering -------------------------------------------------------


def _record_for(group: str, ep: md.EntryPoint) -> PluginRecord:
    dist = getattr(ep, "dist", None)
    dist_name = dist.metadata["Name"] if dist is not None else "?"
    return PluginRecord(
        group=group,
        name=ep.name,
        value=ep.value,
        dist=dist_name,
        version=dist.version if dist is not None else "?",
        is_builtin=(dist_name or "").lower() == BUILTIN_DIST,
    )


def discover(group: str) -> list[tuple[md.EntryPoint, PluginRecord]]:
    found = [(ep, _record_for(group, ep)) for ep in md.entry_points(group=group)]
    # Built-ins first, then third-party, each by name: discovery order is not a contract.
    return sorted(found, key=lambda pair: (not pair[1].is_builtin, pair[1].name))


def allowed_status(record: PluginRecord) -> str | None:
    """None when the plugin may load, else the status explaining why not."""
    if record.name in envs.KC_BLOCK_PLUGINS:
        return "blocked"
    allow = envs.KC_PLUGINS
    if not record.is_builtin and allow is not None and record.name not in allow:
        return "not-allowed"
    return None


def warn_excluded_platforms(records: list[PluginRecord]) -> None:
    excluded = [r for r in records if r.status == "not-allowed"]
    for r in excluded:
        logger.warning("KC_PLUGINS=%s excludes the installed platform plugin %r (%s), so its device is not used; "
                       "add %s to KC_PLUGINS to use it (endpoint plugins are enabled with KC_ENDPOINT_PLUGINS instead)",
                       ",".join(envs.KC_PLUGINS or []), r.name, r.dist, r.name)


def warn_unknown_allowed_names() -> None:
    allow = envs.KC_PLUGINS
    if not allow:
        return
    known = {ep.name for group in GROUPS for ep in md.entry_points(group=group)}
    for name in allow:
        if name not in known:
            logger.warning("KC_PLUGINS names %r, but no installed plugin has that name", name)


def _load_group(group: str, is_fatal: bool = True) -> list[tuple[PluginRecord, Any]]:
    """Import every allowed entry point of a group.

    An import failure is fatal for general plugins; for platform plugins it only
    makes that platform inactive (logged with its name).
    """
    state = _process_state()
    loaded = []
    for ep, record in discover(group):
        state.records[(group, record.name)] = record
        status = allowed_status(record)
        if status is not None:
            record.status = status
            if status == "blocked":
                state.pm.set_blocked(record.name)  # before loading, as pluggy requires
            continue
        try:
            obj = ep.load()
        except Exception as exc:
            record.status, record.error = "failed", f"{type(exc).__name__}: {exc}"
            if not is_fatal:
                logger.warning("Plugin %s (%s) failed to import: %s", record.name, record.dist, record.error)
                continue
            raise PluginError(
                f"plugin {record.name!r} (distribution {record.dist}) failed to import "
                f"in process {get_role()} (pid {os.getpid()}): {record.error}"
            ) from exc
        record.status = "loaded"
        adopt_logger(record.value)
        loaded.append((record, obj))
    return loaded


def adopt_logger(entry_point_value: str) -> None:
    """Give the plugin's top-level package logger (``logging.getLogger("nova_kc")``) kernelcore's handler."""
    from kernelcore.logging_setup import adopt_plugin_logger

    adopt_plugin_logger(entry_point_value.split(":")[0].split(".")[0].strip())


def unknown_hooks(pm: pluggy.PluginManager, obj: Any) -> list[str]:
    """The hookimpl names of ``obj`` that match no hookspec, each with a suggestion."""
    specs = [name for name in vars(pm.hook) if getattr(pm.hook, name).spec is not None]
    problems = []
    for caller in pm.get_hookcallers(obj) or []:
        if caller.spec is None:
            match = difflib.get_close_matches(caller.name, specs, n=1)
            hint = f"; did you mean {match[0]!r}?" if match else f"; known hooks: {', '.join(sorted(specs))}"
            problems.append(f"unknown hook {caller.name!r}{hint}")
    return problems


def describe(plugin_name: str) -> str:
    """"plugin 'x' (distribution d)" for an entry-point name or a registered platform ("x:platform")."""
    name, _, kind = plugin_name.partition(":")
    label = "platform plugin" if kind == "platform" else "plugin"
    return f"{label} {name!r} (distribution {plugin_dist(name)})"


def _register(record: PluginRecord, obj: Any) -> None:
    pm = _process_state().pm
    if pm.has_plugin(record.name) or pm.is_registered(obj):
        return
    try:
        pm.register(obj, name=record.name)
    except Exception as exc:
        record.status, record.error = "failed", str(exc)
        raise PluginError(f"plugin {record.name!r} (distribution {record.dist}) cannot register: {exc}") from exc
    record.hooks = sorted(caller.name for caller in pm.get_hookcallers(obj) or [])
    problems = unknown_hooks(pm, obj)
    if problems:
        pm.unregister(obj)
        record.status, record.error = "failed", "; ".join(problems)
        raise PluginError(f"plugin {record.name!r} (distribution {record.dist}): {record.error}")


def register_platform(platform: Any, entry_point_name: str) -> None:
    """Register the resolved Platform instance; a misspelled hook method is an error naming it."""
    pm = _process_state().pm
    name = f"{entry_point_name}:platform"
    pm.register(platform, name=name)
    problems = unknown_hooks(pm, platform)
    if problems:
        pm.unregister(platform)
        raise PluginError(f"{describe(name)}, class {type(platform).__qualname__}: {'; '.join(problems)}")


def implementers(hook_name: str) -> list[str]:
    """Plugin names implementing a hook, in the order pluggy calls them."""
    return [impl.plugin_name for impl in reversed(getattr(_process_state().pm.hook, hook_name).get_hookimpls())]


def call_each(hook_name: str, **kwargs: Any) -> None:
    """Call a hook's implementations one by one, in pluggy's order.

    One that raises stops the call with a one-line :class:`PluginError` naming the plugin, its
    distribution, the hook and the message; the traceback is logged at debug level.
    """
    for plugin_name in implementers(hook_name):
        try:
            call_plugin_hook(plugin_name, hook_name, **kwargs)
        except Exception as exc:
            logger.debug("%s raised in %s", plugin_name, hook_name, exc_info=True)
            raise PluginError(f"{describe(plugin_name)} failed in {hook_name}: {type(exc).__name__}: {exc}") from exc


def call_plugin_hook(plugin_name: str, hook_name: str, **kwargs: Any) -> Any:
    """Call one plugin's implementation of a hook (traced like any hook call)."""
    pm = _process_state().pm
    others = [p for name, p in pm.list_name_plugin() if name != plugin_name and p is not None]
    return pm.subset_hook_caller(hook_name, remove_plugins=others)(**kwargs)


# -- the two loaders -------------------------------------------------------------------


def load_platform_plugins() -> list[PluginRecord]:
    """Import and register every allowed platform plugin (detectors are not called here)."""
    state = _process_state()
    if not state.platform_loaded:
        state.platform_loaded = True
        for record, obj in _load_group(PLATFORM_GROUP, is_fatal=False):
            try:
                _register(record, obj)
            except PluginError as exc:
                logger.warning("%s", exc)
        warn_excluded_platforms([r for (g, _), r in state.records.items() if g == PLATFORM_GROUP])
    return [r for (g, _), r in state.records.items() if g == PLATFORM_GROUP]


def load_general_plugins(platform: Any) -> None:
    """Load the general plugins once per process, after the platform is fixed.

    ``platform`` is this process's resolved platform: the caller fixes it first (their hooks may read it),
    so this module never imports ``kernelcore.platforms``. Call ``kernelcore.platforms.load_general_plugins()``,
    which does both. A plugin that raises stops start-up with a :class:`PluginError` naming it;
    the once-flag is set only when every plugin succeeded.
    """
    state = _process_state()
    if platform is None or platform is not state.platform:
        raise RuntimeError("load_general_plugins needs this process's resolved platform "
                           "(call kernelcore.platforms.load_general_plugins())")
    if state.general_loaded:
        return
    warn_unknown_allowed_names()
    loaded = _load_group(GENERAL_GROUP)
    for record, obj in loaded:
        _register(record, obj)
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
    return dict(_process_state().op_owners)


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
    return [(record.name, obj) for record, obj in _load_group(STAT_LOGGER_GROUP)]


def records() -> list[PluginRecord]:
    return list(_process_state().records.values())


def plugin_dist(name: str) -> str:
    for (group, plugin), record in _process_state().records.items():
        if plugin == name:
            return record.dist
    return "?"
