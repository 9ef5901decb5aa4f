"""The built-in CPU platform plugin (entry point ``cpu`` in kernelcore.platform_plugins)."""

from kernelcore import hookimpl


@hookimpl
def detect_platform() -> str | None:
    # The CPU is always there; other built-ins (cuda) and any vendor platform win over it.
    return "builtin_plugins.cpu.platform.CpuPlatform"
