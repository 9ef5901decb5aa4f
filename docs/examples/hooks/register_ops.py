from kernelcore import hookimpl


@hookimpl
def register_ops():
    from kernelcore.platforms import current_platform

    if current_platform.device_name == "nova":
        import nova_kc.ops  # noqa: F401  (its @RMSNorm.register_oot classes replace the in-tree ops)
