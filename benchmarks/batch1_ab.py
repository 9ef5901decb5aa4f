"""Batch-1 decode speed of the CPU linears' routing, A/B in one process: tuned at start-up vs the fixed limits.

    python benchmarks/batch1_ab.py --threads 2 --num-runs 5
    python benchmarks/batch1_ab.py --configs bfloat16,bfloat16+int8 --prompt-len 8

One in-process engine per (config, routing) (Llama-125M-shaped random checkpoint), all alive at once. "tuned"
is the default (builtin_plugins/cpu/linear_tuning.py times every implementation per layer shape and batch
size when the worker loads the model); "fixed" builds its engine with that step skipped, so the linears route
by the row limits of small_gemm.py. Every repeat runs each engine once, round-robin, so machine load hits them
alike. One request of 128 (``--prompt-len``) prompt + 128 generated tokens (greedy, ignore_eos); tok/s =
generated tokens over the request's time (prefill included, as the llama.cpp comparison counts it). Prints
medians and ratios by wall time and by this process's CPU time.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from unittest import mock

import click

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import build_checkpoint  # noqa: E402


@click.command()
@click.option("--configs", default="float32,bfloat16,bfloat16+int8,float32+int8", show_default=True,
              help="comma-separated dtype[+quantization]")
@click.option("--threads", type=int, default=None)
@click.option("--num-runs", type=int, default=5, show_default=True)
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--prompt-len", type=int, default=128, show_default=True,
              help="a short prompt (8) makes the figure nearly decode-only")
@click.option("--checkpoint-dir", type=click.Path(), default=None)
def main(configs, threads, num_runs, max_tokens, prompt_len, checkpoint_dir):
    from kernelcore import LLM, SamplingParams

    path = build_checkpoint("llama", checkpoint_dir or tempfile.mkdtemp(prefix="kc-b1ab-"))
    engines = {}
    for config in configs.split(","):
        dtype, _, quantization = config.partition("+")
        for routing in ("tuned", "fixed"):
            skip = mock.patch("builtin_plugins.cpu.worker.tune_linears") if routing == "fixed" else mock.MagicMock()
            with skip:
                engines[(config, routing)] = LLM(path, dtype=dtype, quantization=quantization or None,
                                                 max_model_len=1024, kv_cache_memory=64 << 20, max_num_seqs=8,
                                                 num_threads=threads)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(500, 500 + prompt_len))}
    for llm in engines.values():
        llm.generate([prompt], params.clone(max_tokens=8), use_tqdm=False)  # warm-up
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in engines}
    cpu_rates: dict[tuple[str, str], list[float]] = {key: [] for key in engines}
    outputs: dict[tuple[str, str], list[int]] = {}
    click.echo(f"threads {threads or 'default'}, load average before {os.getloadavg()[0]:.1f}")
    for run in range(num_runs):
        for key, llm in engines.items():
            # A fresh prompt per run: the prefix cache would otherwise skip the prefill from the second run on.
            request = {"prompt_token_ids": [(t + 97 * run) % 30000 + 259 for t in prompt["prompt_token_ids"]]}
            start, cpu_start = time.perf_counter(), time.process_time()
            out = llm.generate([request], params, use_tqdm=False)[0].outputs[0]
            rates[key].append(len(out.token_ids) / (time.perf_counter() - start))
            cpu_rates[key].append(len(out.token_ids) / (time.process_time() - cpu_start))
            outputs[key] = list(out.token_ids)
    click.echo(f"load average after {os.getloadavg()[0]:.1f}")
    for label, table in (("wall", rates), ("cpu-time", cpu_rates)):
        medians = {key: statistics.median(values) for key, values in table.items()}
        for (config, routing), rate in medians.items():
            same = outputs[(config, routing)] == outputs[(config, "fixed")]
            click.echo(f"[{label}] {config:16s} {routing:6s} {rate:7.1f} tok/s  "
                       f"x{rate / medians[(config, 'fixed')]:.2f} vs fixed  (runs "
                       f"{', '.join(f'{r:.1f}' for r in table[(config, routing)])}; same tokens as fixed: {same})")
        best_bf16 = max((v for (c, _), v in medians.items() if c == "bfloat16"), default=None)
        for (config, routing), rate in medians.items():
            if best_bf16 and config.endswith("+int8"):
                click.echo(f"[{label}] {config} {routing}: x{rate / best_bf16:.2f} vs kernelcore's best bfloat16")


if __name__ == "__main__":
    main()
