"""What the CPU platform knows of this CPU: /proc/cpuinfo and the part of it a compiled kernel is tied to.

Read by the native build (its cache key), the linear tuning (its cache key) and the platform (bfloat16 or float32
by default), so it sits below all of them and imports nothing of the plugin.
"""

from __future__ import annotations

import functools
import os


@functools.cache
def read_cpuinfo() -> str:
    """/proc/cpuinfo, read once per process ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def cpu_id() -> str:
    """This CPU's model and flags (what -march=native ties a library to)."""
    wanted = ("model name", "flags")
    lines = read_cpuinfo().splitlines()
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted})) or os.uname().machine


def cpu_flags() -> list[str]:
    """The first processor's flags (avx2, avx512f, avx512_vnni, amx_tile, ...)."""
    for line in read_cpuinfo().splitlines():
        if line.split(":")[0].strip() == "flags":
            return line.split(":", 1)[1].split()
    return []
