# nova_kc/__init__.py, entry point `nova = "nova_kc"` in kernelcore.platform_plugins
import os

from kernelcore import hookimpl


@hookimpl
def detect_platform():
    # Cheap: a device node, never a driver call; the Platform class is imported only if it wins.
    return "nova_kc.platform.NovaPlatform" if os.path.exists("/dev/nova0") else None
