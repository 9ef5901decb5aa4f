"""The built-in quantization methods (entry point ``quantization`` in kernelcore.general_plugins)."""

from kernelcore import hookimpl


@hookimpl
def register_quantization_methods(registry) -> None:
    # The portable int8 reference; platforms override it with their own int8 matmul.
    registry.register("int8", "kernelcore.layers.linear:Int8LinearMethod")
    # GGUF checkpoints: "gguf" plus one "gguf_<type>" per tensor type it loads; the quantized ones compute with
    # the stored blocks (the pure-torch reference here; platforms override them with native kernels).
    from builtin_plugins.quantization.gguf_blocks import QUANTIZED_TYPES

    registry.register("gguf", "builtin_plugins.quantization.gguf:GGUFLinearMethod")
    for kind in ("f32", "f16", "bf16"):
        registry.register(f"gguf_{kind}", "builtin_plugins.quantization.gguf:GGUFFloatMethod")
    for kind in QUANTIZED_TYPES:
        registry.register(f"gguf_{kind.lower()}", "builtin_plugins.quantization.gguf:GGUFBlocksMethod")
