"""The built-in quantization methods (entry point ``quantization`` in kernelcore.general_plugins)."""

from kernelcore import hookimpl


@hookimpl
def register_quantization_methods(registry) -> None:
    # The portable int8 reference; platforms override it with their own int8 matmul.
    registry.register("int8", "kernelcore.layers.linear:Int8LinearMethod")
    # GGUF checkpoints: "gguf" plus one "gguf_<type>" per tensor type it loads (F32/F16/BF16/Q8_0/Q4_0).
    registry.register("gguf", "builtin_plugins.quantization.gguf:GGUFLinearMethod")
    for kind in ("f32", "f16", "bf16"):
        registry.register(f"gguf_{kind}", "builtin_plugins.quantization.gguf:GGUFFloatMethod")
    for kind in ("q8_0", "q4_0"):
        registry.register(f"gguf_{kind}", "builtin_plugins.quantization.gguf:GGUFInt8Method")
