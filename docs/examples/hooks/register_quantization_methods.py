from kernelcore import hookimpl
from kernelcore.layers.linear import Int8LinearMethod


class NovaInt8LinearMethod(Int8LinearMethod):
    """The same int8 weights; a vendor would call its own int8 matmul in ``apply``."""


@hookimpl
def register_quantization_methods(registry):
    registry.register("nova_int8", NovaInt8LinearMethod)  # kc serve --quantization nova_int8
