"""Batch-1 decode speed of the CPU linears, A/B in one process: torch/oneDNN vs the native small-M kernel.

    python benchmarks/batch1_ab.py --threads 1 --num-runs 5
    python benchmarks/batch1_ab.py --configs bfloat16,bfloat16+int8 --threads 2

One in-process engine per config (Llama-125M-shaped random checkpoint), all alive at once; every repeat runs
each (config, kernel) pair once, round-robin, so machine load hits them alike. One request of 128
(``--prompt-len``) prompt + 128 generated tokens (greedy, ignore_eos); tok/s = generated tokens over the
request's time (prefill included, as the llama.cpp comparison counts it). Prints medians and ratios, by wall time and by this
process's CPU time: with ``--threads 1`` the CPU-time figure is what a share of a loaded machine cannot
distort (memory-bandwidth contention still can).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

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
    from builtin_plugins.cpu.small_gemm import load_small_gemm_kernel
    from kernelcore import LLM, SamplingParams

    path = build_checkpoint("llama", checkpoint_dir or tempfile.mkdtemp(prefix="kc-b1ab-"))
    engines = {}
    for config in configs.split(","):
        dtype, _, quantization = config.partition("+")
        engines[config] = LLM(path, dtype=dtype, quantization=quantization or None, max_model_len=1024,
                              kv_cache_memory=64 << 20, max_num_seqs=8, num_threads=threads)
    kernel = load_small_gemm_kernel()
    native_rows = dict(kernel.max_rows_by_dtype) if kernel is not None else {}
    modes = {"torch": 0, "native": 1} if kernel is not None else {"torch": 0}
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(500, 500 + prompt_len))}
    for llm in engines.values():
        for rows in modes.values():
            if kernel is not None:
                kernel.max_rows_by_dtype = {d: r * rows for d, r in native_rows.items()}
            llm.generate([prompt], params.clone(max_tokens=8), use_tqdm=False)  # warm-up (builds, packs)
    rates: dict[tuple[str, str], list[float]] = {(c, m): [] for c in engines for m in modes}
    cpu_rates: dict[tuple[str, str], list[float]] = {(c, m): [] for c in engines for m in modes}
    outputs: dict[tuple[str, str], list[int]] = {}
    click.echo(f"threads {threads or 'default'}, load average before {os.getloadavg()[0]:.1f}")
    for _ in range(num_runs):
        for config, llm in engines.items():
            for mode, rows in modes.items():
                if kernel is not None:
                    kernel.max_rows_by_dtype = {d: r * rows for d, r in native_rows.items()}
                start, cpu_start = time.perf_counter(), time.process_time()
                out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
                rates[(config, mode)].append(len(out.token_ids) / (time.perf_counter() - start))
                cpu_rates[(config, mode)].append(len(out.token_ids) / (time.process_time() - cpu_start))
                outputs[(config, mode)] = list(out.token_ids)
    click.echo(f"load average after {os.getloadavg()[0]:.1f}")
    for label, table in (("wall", rates), ("cpu-time", cpu_rates)):
        medians = {key: statistics.median(values) for key, values in table.items()}
        for (config, mode), rate in medians.items():
            same = outputs[(config, mode)] == outputs[(config, "torch")]
            click.echo(f"[{label}] {config:16s} {mode:7s} {rate:7.1f} tok/s  "
                       f"x{rate / medians[(config, 'torch')]:.2f} vs torch  (runs "
                       f"{', '.join(f'{r:.1f}' for r in table[(config, mode)])}; same tokens as torch: {same})")
        best_bf16 = max((v for (c, _), v in medians.items() if c == "bfloat16"), default=None)
        for (config, mode), rate in medians.items():
            if best_bf16 and config.endswith("+int8"):
                click.echo(f"[{label}] {config} {mode}: x{rate / best_bf16:.2f} vs kernelcore's best bfloat16")


if __name__ == "__main__":
    main()
