import ctypes.util

from kernelcore import hookimpl


@hookimpl
def report_components():
    # A vendor's runtime library: in use when the loader finds it, else the plugin's slower fallback.
    if ctypes.util.find_library("nova_runtime"):
        return {"nova.runtime": "ok: libnova_runtime"}
    return {"nova.runtime": "missing: libnova_runtime not found; the reference kernels run instead"}
