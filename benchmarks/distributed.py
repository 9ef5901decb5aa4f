"""Distributed execution on this machine: collective costs, and step time / throughput per TP, PP configuration.

    python benchmarks/distributed.py [--configs 1x1 2x1 1x2 2x2] [--batch 8] [--tokens 32] [--hidden 512] [--layers 8]

Part 1 measures gloo on loopback between two processes: all_reduce and send/recv of [rows, hidden] fp32
(median microseconds). Part 2 runs the engine (an EngineCore over the multiprocess executor, random-weight
Llama of the given shape) for each TPxPP configuration on the same greedy workload and prints the median decode
step time, generated tokens/s, and the communication share of a decode step, estimated as the collectives
the step makes (TP: two all-reduces per layer plus the embedding's and the head's gather; PP: one hand-off
per stage boundary) times the measured cost of each, over the step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = (1, 8, 64)  # rows of hidden states: a decode step's batch


def _collectives(rank: int, store_path: str, hidden: int, iters: int, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    results = {}
    for rows in SIZES:
        t = torch.randn(rows, hidden)
        for name in ("all_reduce", "send_recv"):
            samples = []
            for _ in range(iters):
                dist.barrier()
                start = time.perf_counter()
                if name == "all_reduce":
                    dist.all_reduce(t)
                elif rank == 0:
                    dist.send(t, 1)
                else:
                    dist.recv(t, 0)
                samples.append((time.perf_counter() - start) * 1e6)
            results[f"{name} {rows}x{hidden}"] = statistics.median(samples)
    if rank == 1:  # the receiver's time is the whole hand-off
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def measure_collectives(hidden: int, iters: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="kc-bench-") as tmp:
        out = os.path.join(tmp, "out.json")
        mp.spawn(_collectives, args=(os.path.join(tmp, "store"), hidden, iters, out), nprocs=2)
        with open(out) as f:
            return json.load(f)


ENGINE = """
import json, statistics, time
from kernelcore.config_builder import build_config
from kernelcore.engine.core import EngineCore
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.core_types.sampling_params import SamplingParams
if __name__ == "__main__":
    core = EngineCore(build_config(model={model!r}, tensor_parallel_size={tp}, pipeline_parallel_size={pp},
                                   kv_cache_memory=1 << 28))
    for i in range({batch}):
        core.add_request(EngineCoreRequest(request_id=str(i), prompt_token_ids=[5 + i, 9, 14, 3] * 4,
                         sampling_params=SamplingParams(temperature=0, max_tokens={tokens}, ignore_eos=True)))
    steps, generated, start = [], 0, time.perf_counter()
    while core.has_unfinished_requests():
        out = core.step()
        generated += sum(len(o.new_token_ids) for o in out.outputs)
        if out.stats is not None and out.stats.num_running == {batch}:
            steps.append(out.stats.step_time)
    elapsed = time.perf_counter() - start
    core.shutdown()
    print(json.dumps({{"step_ms": statistics.median(steps[1:]) * 1e3, "tokens_per_s": generated / elapsed}}))
"""


def run_engine(model: str, tp: int, pp: int, batch: int, tokens: int) -> dict[str, float]:
    code = ENGINE.format(model=model, tp=tp, pp=pp, batch=batch, tokens=tokens)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def make_model(path: str, hidden: int, layers: int) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def comm_share(tp: int, pp: int, layers: int, step_ms: float, costs: dict[str, float], batch: int,
               hidden: int) -> float:
    rows = min(SIZES, key=lambda r: abs(r - batch))
    all_reduce, hand_off = costs[f"all_reduce {rows}x{hidden}"], costs[f"send_recv {rows}x{hidden}"]
    per_stage_layers = layers / pp
    tp_us = (2 * per_stage_layers + 2) * all_reduce if tp > 1 else 0.0  # per stage; stages run one after another
    comm_us = tp_us * pp + (pp - 1) * hand_off
    return comm_us / 1e3 / step_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="*", default=["1x1", "2x1", "1x2", "2x2"], help="TPxPP")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    costs = measure_collectives(args.hidden, args.iters)
    print(f"gloo on loopback, 2 processes ({os.cpu_count()} CPUs), median of {args.iters}:")
    for name, us in costs.items():
        print(f"  {name:<22} {us:9.1f} us")
    with tempfile.TemporaryDirectory(prefix="kc-bench-model-") as tmp:
        model = make_model(tmp, args.hidden, args.layers)
        print(f"\nLlama hidden {args.hidden}, {args.layers} layers, fp32; "
              f"{args.batch} sequences x {args.tokens} tokens")
        print(f"  {'TPxPP':<6} {'step ms':>8} {'tokens/s':>9} {'comm share':>11} {'vs 1x1':>7}")
        base = None
        for cfg in args.configs:
            tp, pp = (int(x) for x in cfg.split("x"))
            r = run_engine(model, tp, pp, args.batch, args.tokens)
            base = base or r["step_ms"]
            share = comm_share(tp, pp, args.layers, r["step_ms"], costs, args.batch, args.hidden)
            print(f"  {cfg:<6} {r['step_ms']:8.2f} {r['tokens_per_s']:9.1f} {share:10.1%} {r['step_ms'] / base:6.2f}x",
                  flush=True)


if __name__ == "__main__":
    main()
