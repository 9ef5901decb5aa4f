"""This process's plugin state: its plugin manager, what it knows of each plugin, its platform.

The state is keyed on the pid and held here only (the other plugin modules reach it through
:func:`process_state`), so a forked child starts afresh and loads its plugins again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pluggy

from kernelcore import envs
from kernelcore.contract import hookspecs
from kernelcore.plugins.trace import install_trace


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
            install_trace(pm, envs.KC_TRACE_PLUGINS)
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


def records() -> list[PluginRecord]:
    return list(_process_state().records.values())


def plugin_dist(name: str) -> str:
    for (_group, plugin), record in _process_state().records.items():
        if plugin == name:
            return record.dist
    return "?"


def describe(plugin_name: str) -> str:
    """"plugin 'x' (distribution d)" for an entry-point name or a registered platform ("x:platform")."""
    name, _, kind = plugin_name.partition(":")
    label = "platform plugin" if kind == "platform" else "plugin"
    return f"{label} {name!r} (distribution {plugin_dist(name)})"
