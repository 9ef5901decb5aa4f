"""The built-in CPU platform plugin (entry point ``cpu`` in kernelcore.platform_plugins)."""

from kernelcore import envs, hookimpl


def _isa(value: str) -> str:
    if value not in ("native", "avx2"):
        raise ValueError(f"KC_CPU_KERNEL_ISA must be native or avx2, not {value!r}")
    return value


def _int_dot_setting(value: str | None) -> tuple[str, ...]:
    """("auto",), ("all",) or the type names (upper case); () for none. Resolved by gguf_native.int_dot_types."""
    text = (value or "").strip()
    if text.lower() in ("", "auto"):
        return ("auto",)
    if text.lower() in ("all", "1", "true", "yes", "on"):
        return ("all",)
    if text.lower() in ("none", "0", "false", "no", "off"):
        return ()
    return tuple(sorted({name.strip().upper() for name in text.split(",") if name.strip()}))


# 0 = the CPU platform's decode attention and small linears use torch ops instead of the kernels built with g++.
envs.declare("KC_CPU_NATIVE_KERNELS", lambda v: v is None or envs.boolean(v), owner="cpu")
# The fixed routing (KC_CPU_TUNE_LINEARS=0): fp32 linears with at most this many rows (decode steps) use the
# native kernel (bf16/int8 weights: larger batches too, see small_gemm.py); 0 = always torch/oneDNN.
envs.declare("KC_CPU_SMALL_GEMM_ROWS", lambda v: 8 if v is None else int(v), owner="cpu")
# Decode steps of at most this many sequences replay a recorded tape of kernel calls; 0 = always eager.
envs.declare("KC_CPU_GRAPH_MAX_BATCH", lambda v: 8 if v is None else int(v), owner="cpu")
# 0 = the worker keeps its thread count, however busy the other cores are (see builtin_plugins/cpu/thread_policy.py).
envs.declare("KC_CPU_FOLLOW_FREE_CORES", lambda v: v is None or envs.boolean(v), owner="cpu")
# 0 = model weights stay in the loader's memory instead of one transparent-huge-page arena.
envs.declare("KC_CPU_HUGE_PAGES", lambda v: v is None or envs.boolean(v), owner="cpu")
# 0 = glibc's malloc keeps its defaults in the CPU worker (large blocks mmapped per allocation, trimmed on free).
envs.declare("KC_CPU_KEEP_FREED_MEMORY", lambda v: v is None or envs.boolean(v), owner="cpu")
# Which GGUF types may quantize the activations to int8 per block for integer dot products (llama.cpp's scheme:
# faster, the activations rounded): unset/auto = the types whose quality bound holds (gguf_native.INT_DEFAULT_TYPES),
# 1/all = every type with an integer kernel, 0/none = none (the float kernel: exactly the file's weights), or a
# comma-separated list of type names (Q4_1,Q8_0).
envs.declare("KC_CPU_GGUF_INT_DOT", lambda v: _int_dot_setting(v), owner="cpu")
# avx2 = the native kernels compiled without AVX-512 (and AMX), as for an AVX2-only CPU; unset/native = -march=native.
envs.declare("KC_CPU_KERNEL_ISA", lambda v: _isa(v or "native"), owner="cpu")
# Time each linear implementation per layer shape and batch size at start-up and route by the result.
envs.declare("KC_CPU_TUNE_LINEARS", lambda v: v is None or envs.boolean(v), owner="cpu")


@hookimpl
def detect_platform() -> str | None:
    # The CPU is always there; other built-ins (cuda) and any vendor platform win over it.
    return "builtin_plugins.cpu.platform.CpuPlatform"
