"""The CPU platform's answer to ``report_components``: every native kernel library, loaded or why not."""

from __future__ import annotations


def native_components() -> dict[str, str]:
    """``cpu.<library>`` -> "ok: <file>, <instruction set>[, detail]" or "missing: <why>; <what runs instead>".
    Loads (building once, cached) each library the platform's kernels use, as a worker does."""
    from builtin_plugins.cpu.gguf_native import load_gguf_kernel
    from builtin_plugins.cpu.native import load_paged_decode_kernel, native_status
    from builtin_plugins.cpu.pointwise import load_pointwise_kernels
    from builtin_plugins.cpu.small_gemm import load_small_gemm_kernel

    for load in (load_paged_decode_kernel, load_small_gemm_kernel, load_gguf_kernel, load_pointwise_kernels):
        load()
    return {f"cpu.{name}": status for name, status in sorted(native_status().items())}
