"""hostproc: the one way kernelcore starts a process.

Every child is started with the ``spawn`` method under a role name
(``engine-core``, ``worker-0``, ...). Its bootstrap, before the target runs:
names the process (visible in ``ps``), arranges to die with its parent (also
when the parent is SIGKILLed), resolves the platform and loads the general
plugins. The target then calls :func:`report_ready` once it can serve;
the parent waits for that with :meth:`HostProcess.wait_ready`.

Arguments must be plain data that pickles (configs are dataclasses).
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from kernelcore.hostproc.role import get_role, set_role

__all__ = ["spawn", "HostProcess", "report_ready", "report_error", "get_role", "set_role", "ProcessStartError"]


class ProcessStartError(RuntimeError):
    """A child failed before reporting ready (its error, or its death, is in the message)."""


_children: list[HostProcess] = []
_status_conn: Connection | None = None


class HostProcess:
    def __init__(self, process: BaseProcess, status: Connection, role: str) -> None:
        self.process, self.status, self.role = process, status, role
        self.ready_info: Any = None
        self.summary: dict | None = None  # the child's process tree (role, pid, plugins), sent with "ready"

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def wait_ready(self, timeout: float) -> Any:
        """Block until the child calls report_ready; raise ProcessStartError on error, death or timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.status.poll(0.05):
                try:
                    kind, payload, *extra = self.status.recv()
                except EOFError:
                    break
                if kind == "ready":
                    self.ready_info = payload
                    self.summary = extra[0] if extra else None
                    return payload
                raise ProcessStartError(f"process {self.role} failed to start: {payload}")
            if not self.process.is_alive():
                if self.status.poll(0):
                    continue
                break
        if self.process.is_alive():
            self.terminate()
            raise ProcessStartError(f"process {self.role} did not report ready within {timeout:.0f}s")
        raise ProcessStartError(f"process {self.role} died during start-up (exit code {self.process.exitcode})")

    def terminate(self, timeout: float = 5.0) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)


def spawn(target: Callable[..., Any] | str, *, role: str, args: tuple = (), kwargs: dict | None = None) -> HostProcess:
    """Start ``target(*args, **kwargs)`` in a new spawned process named ``role``.

    ``target`` is a module-level function or its dotted path ``"pkg.mod.func"``.
    """
    ctx = mp.get_context("spawn")
    parent_end, child_end = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_bootstrap,
        name=f"kc-{role}",
        args=(role, target, args, kwargs or {}, os.getpid(), child_end),
        daemon=False,  # daemonic processes cannot have children (the engine core spawns workers)
    )
    process.start()
    child_end.close()
    child = HostProcess(process, parent_end, role)
    _children.append(child)
    return child


def report_ready(info: Any = None) -> None:
    """Called by a child's target once it can serve."""
    if _status_conn is not None:
        _status_conn.send(("ready", info, describe_process()))


def describe_process() -> dict:
    """This process and its ready children (role, pid, host, platform, loaded plugins), as a tree."""
    from kernelcore.hostproc.inventory import describe_process as describe

    return describe(_children)


def report_error(message: str) -> None:
    if _status_conn is not None:
        try:
            _status_conn.send(("error", message))
        except (OSError, ValueError):
            pass


def _die_with_parent(parent_pid: int) -> None:
    try:  # Linux: the kernel delivers SIGKILL when the parent thread dies
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass

    def watch() -> None:  # portable fallback: re-parenting means the parent is gone
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, name="kc-parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:
        os._exit(1)


def _bootstrap(role: str, target: Callable[..., Any] | str, args: tuple, kwargs: dict, parent_pid: int,
               status: Connection) -> None:
    global _status_conn
    _status_conn = status
    set_role(role)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides
    _die_with_parent(parent_pid)
    try:
        import setproctitle

        setproctitle.setproctitle(f"kc::{role}")
    except ImportError:
        pass
    from kernelcore.logging_setup import configure_logging

    configure_logging()
    try:
        from kernelcore import platforms

        platforms.load_general_plugins()
        run = platforms.resolve_obj_by_qualname(target) if isinstance(target, str) else target
        run(*args, **kwargs)
    except SystemExit:
        raise
    except BaseException as exc:
        import traceback

        report_error(f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
        os._exit(1)


@atexit.register
def _terminate_children() -> None:
    for child in _children:
        try:
            child.terminate(timeout=3.0)
        except Exception:
            pass
