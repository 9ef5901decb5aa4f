"""Targets for hostproc tests (module-level so spawn can import them)."""

import os
import time

from kernelcore import hostproc


def ready_then_sleep(seconds: float = 60.0) -> None:
    hostproc.report_ready({"pid": os.getpid(), "role": hostproc.get_role()})
    time.sleep(seconds)


def ready_then_exit() -> None:
    from kernelcore import platforms

    platforms.load_general_plugins()  # a second call in the same process is a no-op
    hostproc.report_ready({"pid": os.getpid()})


def fail_on_start() -> None:
    raise ValueError("target refused to start")


def spawn_grandchild_and_wait(pid_file: str) -> None:
    child = hostproc.spawn("hostproc_targets.ready_then_sleep", role="grandchild", args=(120.0,))
    info = child.wait_ready(120)
    with open(pid_file, "w") as f:
        f.write(str(info["pid"]))
    hostproc.report_ready(info)
    time.sleep(120)
