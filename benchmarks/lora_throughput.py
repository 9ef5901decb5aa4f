"""Multi-LoRA throughput: the W-mixed workload spread over 4 adapters vs the same workload without LoRA, same run.

    python benchmarks/lora_throughput.py --quick            # 16 requests, a quarter of the output tokens
    python benchmarks/lora_throughput.py --num-runs 3       # interleaved runs, medians

Three in-process ``EngineCore``s are stepped in turn (one step each, round robin), so every side runs under the
same machine load step by step; "base" is an engine built without LoRA, "lora" one
with ``enable_lora`` (max_loras 4) where request i uses adapter i % 4 (rank 8 on q/k/v/o/gate/up/down, made
with peft), "lora-idle" the LoRA engine serving only base requests (the wrappers' cost when unused).
Besides wall-clock tokens/s it reports tokens per CPU-second of this process, which a machine shared with
other jobs disturbs far less (use ``--threads 1`` there, so CPU time is not spent spinning).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import time

import click

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def make_engine(path: str, workload, adapters: list[str] | None, use_adapters: bool, max_num_seqs: int,
                max_num_batched_tokens: int, num_threads: int | None = None):
    from kernelcore.config_builder import build_config
    from kernelcore.core_types.sampling_params import SamplingParams
    from kernelcore.engine.core import EngineCore
    from kernelcore.engine.request import EngineCoreRequest

    lora = dict(enable_lora=True, max_loras=4, max_lora_rank=8) if adapters else {}
    core = EngineCore(build_config(model=path, max_model_len=2048, kv_cache_memory=512 << 20,
                                   max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                   num_threads=num_threads, **lora))
    for i, adapter in enumerate(adapters or []):
        core.add_lora(i + 1, f"adapter-{i}", adapter)
    for i, (prompt, num_out) in enumerate(workload):
        lora_id = i % len(adapters) + 1 if use_adapters else 0
        core.add_request(EngineCoreRequest(request_id=str(i), prompt_token_ids=prompt, lora_id=lora_id,
                                           sampling_params=SamplingParams(temperature=0, max_tokens=num_out,
                                                                          ignore_eos=True)))
    return core


def run_interleaved(engines: dict) -> dict:
    """Step every engine in turn until all are done: each step of each side runs under the same machine load.

    The order rotates every round, so no side always runs right after another (cache and position effects)."""
    totals = {name: dict(num_tokens=0, seconds=0.0, cpu_seconds=0.0) for name in engines}
    names = list(engines)
    round_index = 0
    while any(core.has_unfinished_requests() for core in engines.values()):
        round_index += 1
        for name in names[round_index % len(names):] + names[:round_index % len(names)]:
            core = engines[name]
            if not core.has_unfinished_requests():
                continue
            start, cpu_start = time.perf_counter(), time.process_time()
            outputs = core.step().outputs
            total = totals[name]
            total["seconds"] += time.perf_counter() - start
            total["cpu_seconds"] += time.process_time() - cpu_start
            total["num_tokens"] += sum(len(o.new_token_ids) for o in outputs)
    return {name: dict(tokens_per_s=t["num_tokens"] / t["seconds"], tokens_per_cpu_s=t["num_tokens"] / t["cpu_seconds"],
                       **t) for name, t in totals.items()}


@click.command()
@click.option("--shape", type=click.Choice(["llama"]), default="llama")
@click.option("--workload", "workload_name", type=click.Choice(["uniform", "mixed", "shared-prefix"]), default="mixed")
@click.option("--num-runs", type=int, default=1)
@click.option("--quick", is_flag=True)
@click.option("--max-num-seqs", type=int, default=64)
@click.option("--max-num-batched-tokens", type=int, default=1024)
@click.option("--threads", type=int, default=None)
@click.option("--work-dir", default=None, help="Keeps the checkpoint and adapters between runs.")
def main(shape, workload_name, num_runs, quick, max_num_seqs, max_num_batched_tokens, threads, work_dir):
    import torch
    from lora_helpers import make_peft_adapter
    from throughput import build_checkpoint, make_workload

    if threads:
        torch.set_num_threads(threads)
    root = work_dir or tempfile.mkdtemp(prefix="kc-lora-bench-")
    path = build_checkpoint(shape, root)
    adapters = []
    for i in range(4):
        adapter = os.path.join(root, f"adapter-{i}")
        if not os.path.isfile(os.path.join(adapter, "adapter_config.json")):
            make_peft_adapter(path, adapter, "llama", seed=i, rank=8, alpha=16, std=0.02)
        adapters.append(adapter)
    from transformers import AutoConfig

    workload = make_workload(workload_name, AutoConfig.from_pretrained(path).vocab_size, quick)
    sides = {"base": (None, False), "lora": (adapters, True), "lora-idle": (adapters, False)}
    results = {name: [] for name in sides}
    for run in range(num_runs):
        engines = {name: make_engine(path, workload, side_adapters, use, max_num_seqs, max_num_batched_tokens, threads)
                   for name, (side_adapters, use) in sides.items()}
        for name, result in run_interleaved(engines).items():
            assert result["num_tokens"] == sum(n for _, n in workload)
            results[name].append(result)
            print(f"run {run} {name}: {result['tokens_per_s']:.1f} tok/s, {result['tokens_per_cpu_s']:.1f} tok/cpu-s "
                  f"({result['seconds']:.1f}s)", file=sys.stderr)
        for core in engines.values():
            core.shutdown()
        del engines
        gc.collect()
    summary = {"shape": shape, "workload": workload_name, "num_requests": len(workload), "quick": quick,
               "threads": torch.get_num_threads()}
    for key in ("tokens_per_s", "tokens_per_cpu_s"):
        medians = {name: statistics.median(r[key] for r in runs) for name, runs in results.items()}
        summary[key] = medians
        summary[f"{key}: lora/base"] = medians["lora"] / medians["base"]
        summary[f"{key}: lora-idle/base"] = medians["lora-idle"] / medians["base"]
    print(json.dumps({**summary, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
