"""GFLOP/s of the Llama-125m layer matmuls (qkv, o, gate_up, down, LM head): plain F.linear vs the prepacked
oneDNN path the layers use (builtin_plugins.cpu.linear.fast_linear), interleaved in the same run.

    python benchmarks/bench_linear.py [--threads 1] [--rows 1 8 32 128 2048]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import torch.nn.functional as F

from builtin_plugins.cpu.linear import fast_linear

SHAPES = [(768, 1280), (768, 768), (768, 4096), (2048, 768), (768, 32000)]  # (in, out)


def plain(xs: list[torch.Tensor], weights: list[torch.Tensor]) -> list[torch.Tensor]:
    return [F.linear(x, w) for x, w in zip(xs, weights, strict=True)]


def prepacked(holders: list[torch.nn.Module], xs: list[torch.Tensor],
              weights: list[torch.Tensor]) -> list[torch.Tensor]:
    return [fast_linear(h, x, w, None) for h, x, w in zip(holders, xs, weights, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128, 2048])
    parser.add_argument("--iters", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        weights = [torch.randn(n, k, dtype=dtype) * 0.02 for k, n in SHAPES]
        holders = [torch.nn.Module() for _ in weights]
        for rows in args.rows:
            xs = [torch.randn(rows, k, dtype=dtype) for k, _ in SHAPES]
            variants = {"F.linear": functools.partial(plain, xs, weights),
                        "prepacked": functools.partial(prepacked, holders, xs, weights)}
            with torch.inference_mode():
                ref, out = variants["F.linear"](), variants["prepacked"]()
                err = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                          for a, b in zip(out, ref, strict=True))
                times = {k: [] for k in variants}
                for _ in range(args.iters if rows < 1000 else 3):
                    for k, fn in variants.items():
                        start = time.perf_counter()
                        fn()
                        times[k].append(time.perf_counter() - start)
            flops = sum(2 * rows * k * n for k, n in SHAPES)
            print(f"{str(dtype).removeprefix('torch.'):9s} rows {rows:5d}: " + "  ".join(
                f"{k} {flops / statistics.median(v) / 1e9:6.1f} GFLOP/s" for k, v in times.items())
                  + f"  max rel. diff {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
