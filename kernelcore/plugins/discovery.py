"""Find the plugins of an entry-point group, apply the allow and block lists, import them and register them."""

from __future__ import annotations

import difflib
import importlib.metadata as md
import logging
import os
from typing import Any

import pluggy

from kernelcore import envs
from kernelcore.hostproc.role import get_role
from kernelcore.plugins.state import PluginError, PluginRecord, describe, process_state

logger = logging.getLogger("kernelcore.plugins")

PLATFORM_GROUP = "kernelcore.platform_plugins"
GENERAL_GROUP = "kernelcore.general_plugins"
STAT_LOGGER_GROUP = "kernelcore.stat_logger_plugins"
GROUPS = (PLATFORM_GROUP, GENERAL_GROUP, STAT_LOGGER_GROUP)
BUILTIN_DIST = "kernelcore"


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


def load_group(group: str, is_fatal: bool = True) -> list[tuple[PluginRecord, Any]]:
    """Import every allowed entry point of a group.

    An import failure is fatal for general plugins; for platform plugins it only
    makes that platform inactive (logged with its name).
    """
    state = process_state()
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


def register_plugin(record: PluginRecord, obj: Any) -> None:
    """Register a loaded plugin under its entry-point name; an unknown hook makes it fail, naming the hook."""
    pm = process_state().pm
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
    pm = process_state().pm
    name = f"{entry_point_name}:platform"
    pm.register(platform, name=name)
    problems = unknown_hooks(pm, platform)
    if problems:
        pm.unregister(platform)
        raise PluginError(f"{describe(name)}, class {type(platform).__qualname__}: {'; '.join(problems)}")
