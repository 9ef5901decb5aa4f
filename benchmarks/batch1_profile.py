"""Where a lone request's decode steps spend their time (in-process engine, one request, greedy, ignore_eos).

    python benchmarks/batch1_profile.py --dtype float32
    python benchmarks/batch1_profile.py --dtype bfloat16 --quantization int8
    python benchmarks/batch1_profile.py --model ~/.cache/kernelcore/models/SmolLM2-135M-Instruct.Q4_1.gguf

Wall-clock totals of the engine's stages over one 128 + 128 request (inclusive: core.step contains the
worker, the worker contains the runner, the runner contains the forward and the LM head). Whatever the step
spends outside ``runner.execute`` is scheduler, sampler and bookkeeping; whatever the request spends outside
``core.step`` is the front end (request set-up, output assembly).
"""

from __future__ import annotations

import collections
import os
import sys
import time

import click

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import build_checkpoint  # noqa: E402


def _timed(totals: collections.Counter, cls: type, name: str, key: str) -> None:
    fn = getattr(cls, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - start

    setattr(cls, name, wrapper)


@click.command()
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True)
@click.option("--quantization", default=None)
@click.option("--threads", type=int, default=None)
@click.option("--num-runs", type=int, default=3, show_default=True)
@click.option("--checkpoint-dir", type=click.Path(), default=None)
@click.option("--model", default=None, help="A .gguf file or checkpoint directory instead of the random Llama-125M.")
def main(dtype, quantization, threads, num_runs, checkpoint_dir, model):
    import tempfile

    from kernelcore import LLM, SamplingParams
    from kernelcore.engine.core import EngineCore
    from kernelcore.engine.scheduler import Scheduler
    from kernelcore.executor.model_runner import ModelRunner
    from kernelcore.executor.sampler import Sampler
    from kernelcore.executor.worker import WorkerBase

    path = model or build_checkpoint("llama", checkpoint_dir or tempfile.mkdtemp(prefix="kc-b1-"))
    llm = LLM(path, dtype=dtype, quantization=quantization, max_model_len=2048, kv_cache_memory=1 << 30,
              max_num_seqs=32, num_threads=threads)
    model_cls = type(llm.engine_core.executor.worker.model_runner.model)
    totals: collections.Counter = collections.Counter()
    for cls, name, key in ((EngineCore, "step", "core.step"), (WorkerBase, "execute_model", "worker.execute_model"),
                           (ModelRunner, "execute", "runner.execute"), (ModelRunner, "prepare", "runner.prepare"),
                           (model_cls, "forward", "model.forward"), (model_cls, "compute_logits", "lm_head"),
                           (Sampler, "__call__", "sampler"), (Scheduler, "schedule", "scheduler.schedule"),
                           (Scheduler, "update_from_output", "scheduler.update")):
        _timed(totals, cls, name, key)
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [3] * 16}], params.clone(max_tokens=4), use_tqdm=False)  # warm-up
    for run in range(num_runs):
        totals.clear()
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": list(range(500 + run, 628 + run))}], params, use_tqdm=False)  # (ids < 32000)
        total = time.perf_counter() - start
        click.echo(f"{dtype} {quantization or ''} run {run + 1}: {128 / total:.1f} tok/s, "
                   f"request {total * 1e3:.0f} ms, load {os.getloadavg()[0]:.1f}")
        for key, seconds in totals.most_common():
            click.echo(f"    {key:22s} {seconds * 1e3:9.1f} ms  {seconds / total:6.1%}")


if __name__ == "__main__":
    main()
