"""Decode attention per layer: the CPU backend's native kernel vs its torch-ops path, same run.

    python benchmarks/bench_decode_attention.py [--threads 1] [--iters 20] [--block-size 16]

One layer, one query per sequence, every sequence at the same context length in a paged cache whose blocks
are shuffled (block size 16 unless --block-size). Prints median milliseconds per call for each path and their
ratio, and the largest difference between the two outputs.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from builtin_plugins.cpu.attention import CpuAttentionBackend, CpuAttentionImpl

SHAPES = {"llama": (12, 4, 64), "opt": (12, 12, 64)}  # heads, kv heads, head size


def time_ms(fn, iters: int) -> float:
    fn()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--cases", nargs="*", default=["32x200", "64x300", "64x700", "8x2000"],
                        help="BATCHxCONTEXT")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"threads {torch.get_num_threads()}")
    print(f"{'shape':6} {'dtype':9} {'batch x ctx':>12} {'torch ms':>9} {'native ms':>9} {'speed-up':>8} "
          f"{'max diff':>9}")
    for name, (num_heads, num_kv_heads, head_size) in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            impl = CpuAttentionImpl(num_heads, head_size, head_size ** -0.5, num_kv_heads)
            if impl.native_decode is None:
                raise SystemExit("the native kernel could not be built here (see the log)")
            for case in args.cases:
                batch, context = map(int, case.split("x"))
                block_size = args.block_size
                blocks_per_seq = -(-context // block_size)
                num_blocks = batch * blocks_per_seq
                k_cache, v_cache = torch.randn(CpuAttentionBackend.get_kv_cache_shape(
                    num_blocks, block_size, num_kv_heads, head_size)).to(dtype)
                block_tables = torch.randperm(num_blocks).view(batch, blocks_per_seq)
                seq_lens = torch.full((batch,), context)
                q = torch.randn(batch, num_heads, head_size).to(dtype)

                scratch: dict = {}  # the torch path's buffers, kept between its calls
                run_torch = functools.partial(impl._decode_torch, q, k_cache, v_cache, block_tables, seq_lens, context,
                                              scratch)
                run_native = functools.partial(impl.native_decode, q, k_cache, v_cache, block_tables, seq_lens,
                                               impl.scale)

                diff = (run_torch().float() - run_native().float()).abs().max().item()
                torch_ms, native_ms = time_ms(run_torch, args.iters), time_ms(run_native, args.iters)
                print(f"{name:6} {str(dtype).removeprefix('torch.'):9} {case:>12} {torch_ms:9.2f} {native_ms:9.2f} "
                      f"{torch_ms / native_ms:7.1f}x {diff:9.1e}")


if __name__ == "__main__":
    main()
