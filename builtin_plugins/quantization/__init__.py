"""The built-in quantization methods (entry point ``quantization`` in kernelcore.general_plugins)."""

from kernelcore import hookimpl


@hookimpl
def register_quantization_methods(registry) -> None:
    # The portable int8 reference; platforms override it with their own int8 matmul.
    registry.register("int8", "kernelcore.layers.linear:Int8LinearMethod")
