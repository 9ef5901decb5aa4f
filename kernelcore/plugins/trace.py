"""The plugin trace (``KC_TRACE_PLUGINS=path``): one JSON line per hook call or start-up event, from every process."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import pluggy

from kernelcore.hostproc.role import get_role


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


def install_trace(pm: pluggy.PluginManager, path: str) -> None:
    """Trace every hook call of ``pm`` to ``path``: the hook, its plugins, the duration and the result."""
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
