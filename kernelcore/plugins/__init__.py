"""Discover, filter, load and trace plugins: the same way in every process.

Its modules, bottom up: :mod:`~kernelcore.plugins.trace` (the ``KC_TRACE_PLUGINS`` trace),
:mod:`~kernelcore.plugins.state` (this process's plugin manager and plugin records, keyed on the pid),
:mod:`~kernelcore.plugins.discovery` (entry points, the allow and block lists, import and registration),
:mod:`~kernelcore.plugins.calls` (a hook called plugin by plugin) and :mod:`~kernelcore.plugins.startup`
(the two loaders and the start-up registrations). Import the names from here.
"""

from kernelcore.plugins.calls import call_each, call_plugin_hook, implementers
from kernelcore.plugins.discovery import (
    BUILTIN_DIST,
    GENERAL_GROUP,
    GROUPS,
    PLATFORM_GROUP,
    STAT_LOGGER_GROUP,
    adopt_logger,
    allowed_status,
    discover,
    register_platform,
    unknown_hooks,
    warn_excluded_platforms,
    warn_unknown_allowed_names,
)
from kernelcore.plugins.startup import (
    STARTUP_HOOKS,
    apply_kernel_overrides,
    load_general_plugins,
    load_platform_plugins,
    load_stat_logger_classes,
    op_owners,
    report_components,
    trace_kernel_table,
)
from kernelcore.plugins.state import (
    PluginError,
    PluginRecord,
    describe,
    get_plugin_manager,
    plugin_dist,
    process_state,
    records,
    reset_for_tests,
)
from kernelcore.plugins.trace import trace_event

__all__ = [
    "BUILTIN_DIST", "GENERAL_GROUP", "GROUPS", "PLATFORM_GROUP", "STARTUP_HOOKS", "STAT_LOGGER_GROUP", "PluginError",
    "PluginRecord", "adopt_logger", "allowed_status", "apply_kernel_overrides", "call_each", "call_plugin_hook",
    "describe", "discover", "get_plugin_manager", "implementers", "load_general_plugins", "load_platform_plugins",
    "load_stat_logger_classes", "op_owners", "plugin_dist", "process_state", "records", "register_platform",
    "report_components", "reset_for_tests", "trace_event", "trace_kernel_table", "unknown_hooks",
    "warn_excluded_platforms", "warn_unknown_allowed_names",
]
