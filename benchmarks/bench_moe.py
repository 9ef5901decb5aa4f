"""Share of a Qwen3-MoE step spent in the FusedMoE op (routing + grouped expert matmuls), and the op's CPU
grouping vs a per-token loop, on the MoE shape of benchmarks/throughput.py (random weights, no checkpoint).

    python benchmarks/bench_moe.py [--batch 1 32] [--prefill 256] [--iters 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from throughput import SHAPES, _time_experts  # noqa: E402

CONTEXT, BLOCK_SIZE = 128, 16


def make_runner(root: str):
    from kernelcore.config_builder import build_config
    from kernelcore.executor.model_runner import ModelRunner

    shape = {k: v for k, v in SHAPES["moe"].items() if k != "arch"}
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-6, "hidden_act": "silu", **shape}
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(config, f)
    runner = ModelRunner(build_config(model=root, block_size=BLOCK_SIZE, max_num_batched_tokens=4096))
    runner.load_model(is_dummy=True)
    runner.allocate_kv_cache(2048)
    return runner


def step_entries(batch: int, prefill: int):
    from kernelcore.executor.model_runner import SeqBatchEntry

    per_seq = -(-(CONTEXT + 1) // BLOCK_SIZE)
    if prefill:
        return [SeqBatchEntry(list(range(4, 4 + prefill)), 0, list(range(-(-prefill // BLOCK_SIZE))))]
    return [SeqBatchEntry([5], CONTEXT, list(range(i * per_seq, (i + 1) * per_seq))) for i in range(batch)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prefill", type=int, nargs="+", default=[256])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as root:
        runner = make_runner(root)
        expert_seconds = [0.0]
        _time_experts(runner.model, expert_seconds)
        print(f"threads={torch.get_num_threads()} load average {os.getloadavg()[0]:.1f}")
        for kind, sizes in (("decode", args.batch), ("prefill", args.prefill)):
            for n in sizes:
                entries = step_entries(n, n if kind == "prefill" else 0)
                runner.execute(entries)  # warm up
                totals, shares = [], []
                for _ in range(args.iters):
                    expert_seconds[0] = 0.0
                    start = time.perf_counter()
                    runner.execute(entries)
                    totals.append(time.perf_counter() - start)
                    shares.append(expert_seconds[0] / totals[-1])
                print(f"{kind:7s} {n:4d} tokens: step {statistics.median(totals) * 1e3:8.1f} ms, "
                      f"FusedMoE {statistics.median(shares):.0%} of it")


if __name__ == "__main__":
    main()
