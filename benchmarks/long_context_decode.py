"""Decode speed of one request after a long prompt (in-process engine, greedy, ignore_eos), where the decode
attention's reads of the KV cache grow with the context.

    python benchmarks/long_context_decode.py --model ~/.cache/kernelcore/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --contexts 256,4000

The prompt (random token ids) is prefilled once and then served from the prefix cache; each measurement
generates 1 and 65 tokens and takes the difference, so the figure is 64 decode steps without the prefill.
Medians over ``--num-runs``.
"""

from __future__ import annotations

import random
import statistics
import time

import click


@click.command()
@click.option("--model", required=True, help="A .gguf file or checkpoint directory.")
@click.option("--contexts", default="256,4000", show_default=True, help="Prompt lengths, comma-separated.")
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--num-runs", type=int, default=3, show_default=True)
def main(model: str, contexts: str, threads: int, num_runs: int) -> None:
    from kernelcore import LLM, SamplingParams

    lengths = [int(c) for c in contexts.split(",")]
    llm = LLM(model, max_model_len=max(lengths) + 128, kv_cache_memory=1 << 30, max_num_seqs=4,
              num_threads=threads, enable_prefix_caching=True)
    rng = random.Random(0)
    for length in lengths:
        prompt = {"prompt_token_ids": [rng.randrange(100, 20000) for _ in range(length)]}
        llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0))  # the prefill, cached from now on

        def seconds(max_tokens: int, prompt: dict = prompt) -> float:
            start = time.perf_counter()
            llm.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
            return time.perf_counter() - start

        steps = [(seconds(65) - seconds(1)) / 64 for _ in range(num_runs)]
        step = statistics.median(steps)
        click.echo(f"context {length}: {1 / step:.1f} tok/s ({step * 1000:.2f} ms a decode step; "
                   f"runs {', '.join(f'{1 / s:.1f}' for s in steps)})")


if __name__ == "__main__":
    main()
