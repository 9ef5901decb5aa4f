"""What runs where: each process's role, pid, host, platform and loaded plugins, sent up with its ready report.

A process's summary includes the summaries its own children reported, so the front end holds the whole tree
(engine core, its workers) without asking anyone.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any


def loaded_plugins() -> list[dict[str, Any]]:
    from kernelcore import plugins

    return [{"name": r.name, "group": r.group.rsplit(".", 1)[-1], "dist": r.dist, "version": r.version,
             "hooks": list(r.hooks)} for r in plugins.records() if r.status == "loaded"]


def describe_process(children: Sequence[Any] = ()) -> dict[str, Any]:
    """This process and the summaries its ``hostproc`` children sent when they became ready."""
    from kernelcore import platforms
    from kernelcore.hostproc.role import get_role

    platform = platforms.current_platform.plugin_name if platforms.is_resolved() else None
    return {"role": get_role(), "pid": os.getpid(), "host": socket.gethostname(), "platform": platform,
            "plugins": loaded_plugins(), "children": [c.summary for c in children if c.summary is not None]}


def flatten(tree: dict[str, Any], parent: int | None = None) -> list[dict[str, Any]]:
    """The tree as a list (parents first), each entry with its parent's pid and whether it is still alive."""
    import psutil

    entry = {k: v for k, v in tree.items() if k != "children"}
    entry["parent_pid"], entry["alive"] = parent, psutil.pid_exists(tree["pid"])
    out = [entry]
    for child in tree.get("children", []):
        out += flatten(child, tree["pid"])
    return out
