"""General plugin: on the interpreter platform only, the in-tree ops launch the kernel table's kernels."""

from kernelcore import hookimpl


@hookimpl
def register_ops():
    from kernelcore.platforms import current_platform

    if current_platform.device_name == "TritonInterp":
        import kc_dummy_triton_interp.ops  # noqa: F401  (the import runs register_oot)
