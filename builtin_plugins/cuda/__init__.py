"""The built-in CUDA platform plugin (entry point ``cuda`` in kernelcore.platform_plugins).

Detection is cheap: NVML when installed, else torch's device count query,
which does not create a CUDA context. Nothing heavy is imported here.
"""

import os

from kernelcore import hookimpl


def _num_nvidia_gpus() -> int:
    try:
        import pynvml  # nvidia-ml-py, part of the kernelcore[cuda] extra

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    # No NVML: the driver lists its GPUs under /proc (Linux); importing torch would be too heavy here.
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


@hookimpl
def detect_platform() -> str | None:
    return "builtin_plugins.cuda.platform.CudaPlatform" if _num_nvidia_gpus() > 0 else None
