"""Linears over GGUF quantized weights on the CPU, at the shapes of two real models: the native kernels
(builtin_plugins/cpu/gguf_native.py) against torch. Median microseconds per call (and the GGUF bytes streamed
per second, the quantized size for every column, so that the columns compare times).

    python benchmarks/gguf_matmul.py --threads 1,2 --rows 1,4,16,64,256
    python benchmarks/gguf_matmul.py --models smollm2 --layers lm_head --rows 1 --warm

Columns (all run round-robin within each repeat; medians of ``--repeats``):
  float    gguf_native matmul: blocks dequantized in registers / L1, float32 FMAs (float32 x)
  int      gguf_native matmul(int_dot=True): int8 activations per block, integer dot products (VNNI)
  deq32    per call: the weight dequantized to float32, then F.linear (float32 x): GGUFKernel.linear(how="dequant"),
           whole up to 8 MiB of float, else 1 MiB of rows at a time
  deq16    the same in bfloat16 (bfloat16 weight and x: oneDNN's bf16 GEMM)
  f32lin   F.linear over a float32 copy dequantized once (8x Q4's bytes): the memory-bandwidth-ideal peer
  bf16lin  F.linear over a bfloat16 copy dequantized once (bfloat16 x)

Unless ``--warm``, every implementation cycles through enough copies of its weight (at least 64 MiB) that each
call reads it from memory, as a forward pass does (the models' weights are larger than the 32 MiB L3).
Random blocks with valid float16 scales: the time does not depend on the values.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable

import click
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from builtin_plugins.cpu.gguf_native import TYPES, load_gguf_kernel  # noqa: E402

# (model, layer, type, N, K): one of each distinct linear (SmolLM2-135M-Instruct.Q4_1.gguf: every linear Q4_1,
# the tied embedding / LM head Q8_0; gemma-3-270m-q4_k_m.gguf: q/k/gate/up Q5_0, v Q8_0, o Q4_K, down Q6_K or
# Q4_K, the tied embedding / LM head Q8_0).
SHAPES: list[tuple[str, str, str, int, int]] = [
    ("smollm2", "q/o", "Q4_1", 576, 576),
    ("smollm2", "k/v", "Q4_1", 192, 576),
    ("smollm2", "gate/up", "Q4_1", 1536, 576),
    ("smollm2", "down", "Q4_1", 576, 1536),
    ("smollm2", "lm_head", "Q8_0", 49152, 576),
    ("gemma3", "q", "Q5_0", 1024, 640),
    ("gemma3", "k", "Q5_0", 256, 640),
    ("gemma3", "v", "Q8_0", 256, 640),
    ("gemma3", "o", "Q4_K", 640, 1024),
    ("gemma3", "gate/up", "Q5_0", 2048, 640),
    ("gemma3", "down", "Q6_K", 640, 2048),
    ("gemma3", "down4", "Q4_K", 640, 2048),
    ("gemma3", "lm_head", "Q8_0", 262144, 640),
]
COLUMNS = ("float", "int", "deq32", "deq16", "f32lin", "bf16lin")
FP16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,), "Q5_0": (0,),
               "Q5_1": (0, 2), "Q2_K": (80, 82), "Q3_K": (108,), "Q5_K": (0, 2), "IQ4_NL": (0,), "IQ4_XS": (0,)}
COLD_BYTES = 64 << 20


def random_weight(type_name: str, n: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    _, block_values, block_bytes = TYPES[type_name]
    raw = rng.integers(0, 256, size=(n, k // block_values, block_bytes), dtype=np.uint8)
    for offset in FP16_FIELDS[type_name]:
        scale = (rng.standard_normal(raw.shape[:2]) * 0.01).astype(np.float16)
        raw[:, :, offset:offset + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    return torch.from_numpy(raw.reshape(n, -1))


def copies(t: torch.Tensor, cold: bool) -> list[torch.Tensor]:
    count = max(1, math.ceil(COLD_BYTES / t.nbytes)) if cold else 1
    return [t] + [t.clone() for _ in range(count - 1)]


def time_round_robin(fns: dict[str, Callable[[], object]], repeats: int, min_s: float) -> dict[str, float]:
    """Median seconds per call of each fn; each repeat runs every fn for at least min_s, in turn."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            calls, t0 = 0, time.perf_counter()
            while True:
                fn()
                calls += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= min_s:
                    break
            times[name].append(elapsed / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def cycling(fn: Callable[..., object], x: torch.Tensor, weights: list[torch.Tensor], *args: object,
            **kwargs: object) -> Callable[[], object]:
    """A call of ``fn(x, weight, *args, **kwargs)`` that takes the next of ``weights`` (the copies) each time."""
    state = [0]

    def call() -> object:
        state[0] = (state[0] + 1) % len(weights)
        return fn(x, weights[state[0]], *args, **kwargs)
    return call


@click.command()
@click.option("--threads", default="1,2", help="torch thread counts, comma-separated")
@click.option("--rows", default="1,4,16,64,256", help="activation rows M")
@click.option("--models", default="smollm2,gemma3")
@click.option("--layers", default="", help="only these layer names (comma-separated)")
@click.option("--columns", default=",".join(COLUMNS))
@click.option("--repeats", type=int, default=5)
@click.option("--min-ms", type=float, default=10.0, help="each repeat calls an implementation for this long")
@click.option("--warm", is_flag=True, help="one copy of each weight (cache-resident where it fits)")
@click.option("--shape", default="", help="instead of the models' shapes: N x K (e.g. 2048x2048) for each --types")
@click.option("--types", "type_names", default="Q2_K,Q3_K,Q5_K,IQ4_XS", help="with --shape")
def main(threads: str, rows: str, models: str, layers: str, columns: str, repeats: int, min_ms: float,
         warm: bool, shape: str, type_names: str) -> None:
    kernel = load_gguf_kernel()
    if kernel is None:
        sys.exit("the GGUF kernel could not be built here")
    wanted = [c for c in columns.split(",") if c]
    rng = np.random.default_rng(0)
    path = ("AVX-512 VNNI (32-value types), 256-bit VNNI (K-quants)" if kernel.avx512_int
            else "VNNI" if kernel.vnni else "AVX2/scalar")
    print(f"integer dot products via {path}; {'warm' if warm else 'cold'} weights; median us per call "
          f"(GB/s of GGUF bytes); choose: GGUFKernel.choose for bfloat16 activations")
    head = " ".join(f"{c:>15}" for c in wanted)
    print(f"{'model':8} {'layer':8} {'type':5} {'N x K':>12} {'M':>4} {'thr':>3} | {head} | choose")
    shapes = SHAPES
    if shape:
        n_, k_ = map(int, shape.lower().split("x"))
        shapes = [("shape", "-", t, n_, k_) for t in type_names.split(",")]
        models = "shape"
    for model, layer, type_name, n, k in shapes:
        if model not in models.split(",") or (layers and layer not in layers.split(",")):
            continue
        raw = random_weight(type_name, n, k, rng)
        raws = copies(raw, not warm)
        need32 = any(c in wanted for c in ("deq32", "f32lin"))
        w32s: list[torch.Tensor] = []
        w16s: list[torch.Tensor] = []
        if need32 or "bf16lin" in wanted:
            w32 = torch.empty(n, k)
            kernel.dequantize(raw, type_name, w32)
            if "f32lin" in wanted:
                w32s = copies(w32, not warm)
            if "bf16lin" in wanted:
                w16s = copies(w32.bfloat16(), not warm)
        for t in map(int, threads.split(",")):
            torch.set_num_threads(t)
            for m in map(int, rows.split(",")):
                x = torch.randn(m, k)
                x16 = x.bfloat16()
                fns: dict[str, Callable[[], object]] = {}
                if "float" in wanted:
                    fns["float"] = cycling(kernel.matmul, x, raws, type_name)
                if "int" in wanted and kernel.supports(type_name, int_dot=True):
                    fns["int"] = cycling(kernel.matmul, x, raws, type_name, int_dot=True)
                if "deq32" in wanted:
                    fns["deq32"] = cycling(kernel.linear, x, raws, type_name, None, "dequant")
                if "deq16" in wanted:
                    fns["deq16"] = cycling(kernel.linear, x16, raws, type_name, None, "dequant")
                if w32s:
                    fns["f32lin"] = cycling(F.linear, x, w32s)
                if w16s:
                    fns["bf16lin"] = cycling(F.linear, x16, w16s)
                secs = time_round_robin(fns, repeats, min_ms / 1e3)
                cells = " ".join(f"{secs[c] * 1e6:9.0f} ({raw.nbytes / secs[c] / 1e9:4.1f})" if c in secs
                                 else f"{'-':>15}" for c in wanted)
                pick = kernel.choose(type_name, m, n, k) if hasattr(kernel, "choose") else "-"
                print(f"{model:8} {layer:8} {type_name:5} {n:>6}x{k:<5} {m:>4} {t:>3} | {cells} | {pick}",
                      flush=True)


if __name__ == "__main__":
    main()
