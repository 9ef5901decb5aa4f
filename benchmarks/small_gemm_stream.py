"""Decode-sized linears as a forward streams them: the benchmark checkpoint's 12 layers x (qkv, o, gate_up,
down) in turn, so each weight comes from memory as in a decode step (benchmarks/small_gemm.py times one weight
over and over, which stays in cache).

    python benchmarks/small_gemm_stream.py --weights int8 --rows 1
    python benchmarks/small_gemm_stream.py --weights bf16 --rows 1,4,16

Every native kernel variant the start-up tuning may choose (float lanes, far prefetch, float32 one row at a
time) and the torch paths
for that weight dtype, interleaved per repeat; the fastest repeat of each, in ms and GB/s of weight read.
"""

from __future__ import annotations

import os
import sys
import time

import click
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from builtin_plugins.cpu.small_gemm import load_small_gemm_kernel  # noqa: E402

SHAPES = [(1280, 768), (768, 768), (4096, 768), (768, 2048)]  # qkv, o, gate_up, down of the benchmark checkpoint
LAYERS = 12


def _impls(dtype: torch.dtype, layers, scales):
    kernel = load_small_gemm_kernel()
    impls = {}
    if kernel is not None:
        for float_lanes in (False, True) if dtype == torch.bfloat16 or dtype == torch.int8 else (False,):
            for single in (False, True) if dtype == torch.float32 else (False,):
                for far in (False, True):
                    name = "native" + ("-float" if float_lanes else "") + ("-seq" if single else "") + \
                        ("-far" if far else "")
                    impls[name] = lambda x, w, s, fl=float_lanes, far=far, single=single: kernel.run(
                        x, w, s, float_lanes=fl, far_prefetch=far, single_stream=single)
    if dtype == torch.int8:
        impls["int8pack"] = lambda x, w, s: torch._weight_int8pack_mm(x, w, s.to(x.dtype))
    else:
        impls["F.linear"] = lambda x, w, s: F.linear(x, w)
        packed = {id(w): torch.ops.mkldnn._reorder_linear_weight(w) for layer in layers for w in layer}
        impls["oneDNN"] = lambda x, w, s: torch.ops.mkldnn._linear_pointwise(x, packed[id(w)], None, "none", [], "")
    return impls


@click.command()
@click.option("--weights", type=click.Choice(["fp32", "bf16", "int8"]), default="int8", show_default=True)
@click.option("--rows", default="1", show_default=True, help="comma-separated row counts")
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--repeats", type=int, default=15, show_default=True)
def main(weights, rows, threads, repeats):
    torch.set_num_threads(threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}[weights]
    act = torch.float32 if dtype == torch.float32 else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    if dtype == torch.int8:
        layers = [[torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8) for n, k in SHAPES]
                  for _ in range(LAYERS)]
    else:
        layers = [[(torch.randn(n, k, generator=g) * 0.05).to(dtype) for n, k in SHAPES] for _ in range(LAYERS)]
    scales = [[torch.rand(n, generator=g) / 127 if dtype == torch.int8 else None for n, _ in SHAPES]
              for _ in range(LAYERS)]
    impls = _impls(dtype, layers, scales)
    nbytes = sum(w.nbytes for layer in layers for w in layer)
    click.echo(f"{weights} weights, {nbytes / 1e6:.0f} MB per pass, {threads} threads, "
               f"load average {os.getloadavg()[0]:.2f}")
    with torch.inference_mode():
        for m in (int(r) for r in rows.split(",")):
            xs = {k: torch.randn(m, k, generator=g).to(act) for _, k in SHAPES}
            best = dict.fromkeys(impls, float("inf"))
            for _ in range(repeats):
                for name, impl in impls.items():
                    start = time.perf_counter()
                    for layer, layer_scales in zip(layers, scales, strict=True):
                        for w, s in zip(layer, layer_scales, strict=True):
                            impl(xs[w.shape[1]], w, s)
                    best[name] = min(best[name], time.perf_counter() - start)
            cells = [f"{name} {t * 1e3:.2f} ms ({nbytes / t / 1e9:.1f} GB/s)" for name, t in best.items()]
            click.echo(f"rows {m}: " + " | ".join(cells))
    click.echo(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
