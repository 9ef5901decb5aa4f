"""Decode-sized linears on the CPU: the native small-M kernel vs torch, interleaved, medians.

    python benchmarks/small_gemm.py --threads 2 --rows 1,2,4,8

Per (shape, rows): microseconds per call of each implementation (all run round-robin within every repeat, so
machine load hits them alike) and each one's speed-up over bfloat16 ``F.linear``. Shapes: Llama-125M's
(768x768, 768x3072, 3072x768, the 32000x768 LM head) and the benchmark checkpoint's fused qkv/gate_up.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import click
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from builtin_plugins.cpu.linear import _int8_bf16_linear, fast_linear  # noqa: E402
from builtin_plugins.cpu.small_gemm import load_small_gemm_kernel  # noqa: E402

SHAPES = [(768, 768), (3072, 768), (768, 3072), (32000, 768), (1280, 768), (4096, 768), (768, 2048)]  # (N, K)


def _impls(n: int, k: int) -> dict:
    kernel = load_small_gemm_kernel()
    w32 = torch.randn(n, k) * 0.02
    w16 = w32.bfloat16()
    scale = w32.abs().amax(dim=1) / 127
    q = torch.round(w32 / scale[:, None]).clamp(-127, 127).to(torch.int8)
    holder, holder16 = nn.Module(), nn.Module()
    impls = {
        "F.linear bf16": ("bf16", lambda x: F.linear(x, w16)),
        "F.linear fp32": ("fp32", lambda x: F.linear(x, w32)),
        "oneDNN fp32": ("fp32", lambda x: fast_linear(holder, x, w32, None)),
        "oneDNN bf16": ("bf16", lambda x: fast_linear(holder16, x, w16, None)),
        "int8 widened bf16": ("bf16", lambda x: _int8_bf16_linear(x, q, None, scale)),
        "int8pack_mm bf16x": ("bf16", lambda x: torch._weight_int8pack_mm(x, q, scale.bfloat16())),
        "bf16 upcast to fp32": ("bf16", lambda x: F.linear(x.float(), w16.float()).bfloat16()),
    }
    if kernel is not None:
        impls.update({
            "native fp32": ("fp32", lambda x: kernel(x, w32)),
            "native bf16": ("bf16", lambda x: kernel(x, w16)),
            "native int8 bf16x": ("bf16", lambda x: kernel(x, q, scale)),
            "native int8 fp32x": ("fp32", lambda x: kernel(x, q, scale)),
        })
    return impls


@click.command()
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--rows", default="1,2,4,8", show_default=True)
@click.option("--repeats", type=int, default=7, show_default=True)
@click.option("--calls", type=int, default=20, show_default=True, help="calls per timing sample")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="cpu: this process's CPU time (with --threads 1, what a loaded machine's scheduling cannot "
                   "distort)")
@click.option("--shapes", default=None, help="comma-separated NxK (default: all)")
@click.option("--only", default=None, help="comma-separated implementation names to run (default: all)")
def main(threads, rows, repeats, calls, clock, shapes, only):
    clock_fn = time.process_time if clock == "cpu" else time.perf_counter
    shape_list = [tuple(int(v) for v in s.split("x")) for s in shapes.split(",")] if shapes else SHAPES
    torch.set_num_threads(threads)
    print(f"threads {threads}, {clock} clock, load average {os.getloadavg()[0]:.2f}")
    for n, k in shape_list:
        impls = _impls(n, k)
        if only:
            impls = {name: impl for name, impl in impls.items() if name in only.split(",") or name == "F.linear bf16"}
        for m in (int(r) for r in rows.split(",")):
            xs = {"fp32": torch.randn(m, k), "bf16": torch.randn(m, k).bfloat16()}
            kernel = load_small_gemm_kernel()
            if kernel is not None:  # every native variant at every size, whatever the routing would pick
                kernel.max_rows_by_dtype = dict.fromkeys(kernel.max_rows_by_dtype, 1 << 20)
            times: dict[str, list[float]] = {name: [] for name in impls}
            for _ in range(repeats):
                for name, (act, fn) in impls.items():
                    x = xs[act]
                    fn(x)
                    start = clock_fn()
                    for _ in range(calls):
                        fn(x)
                    times[name].append((clock_fn() - start) / calls * 1e6)
            base = statistics.median(times["F.linear bf16"])
            cells = [f"{name} {statistics.median(t):.0f}us ({base / statistics.median(t):.2f}x)"
                     for name, t in times.items()]
            print(f"N={n} K={k} M={m}: " + " | ".join(cells), flush=True)
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
