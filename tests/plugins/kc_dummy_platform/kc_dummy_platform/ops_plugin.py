"""General plugin: replaces the in-tree RotaryEmbedding by class name, on its own device only."""

from kernelcore import hookimpl


@hookimpl
def register_ops():
    from kernelcore.platforms import current_platform

    if current_platform.device_name == "DummyDevice":
        import kc_dummy_platform.ops  # noqa: F401  (the import runs register_oot)
