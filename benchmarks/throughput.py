"""Offline throughput: kernelcore vs transformers ``generate`` on the same synthetic workloads, same run.

    python benchmarks/throughput.py --shape llama --workload uniform --dtype float32
    python benchmarks/throughput.py --shape qwen3-0.6b --shape moe --workload uniform --workload mixed
    python benchmarks/throughput.py --quick          # a smoke run

For a MoE shape each row also reports the share of kernelcore's wall time spent in the MoE layers and, within
it, in the expert matmuls (the MoE layers minus the routing softmax/top-k); measured in-process only.
    kc bench throughput ...                          # the same command, mounted in the CLI

Workloads (fixed seed, random-weight checkpoints built with transformers into a temp dir):
  uniform:       32 requests, 128-token prompts, 128 output tokens, ignore_eos
  mixed:         64 requests, prompts uniform in 32-512, outputs uniform in 16-256, ignore_eos
  shared-prefix: 64 requests sharing a 384-token prefix + 32 distinct tokens, 64 outputs
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import statistics
import tempfile
import threading
import time

import click
import torch

SHAPES = {
    "opt": dict(arch="opt", vocab_size=50272, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                ffn_dim=3072),
    "llama": dict(arch="llama", vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, intermediate_size=2048),
    # Qwen3-0.6B's shape (0.6B parameters, tied embeddings, q/k norm)
    "qwen3-0.6b": dict(arch="qwen3", vocab_size=151936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072, tie_word_embeddings=True),
    # a Qwen3-MoE of ~0.5B parameters: 8 experts, top-2 (about 0.17B active per token)
    "moe": dict(arch="qwen3_moe", vocab_size=32000, hidden_size=1024, num_hidden_layers=12, num_attention_heads=16,
                num_key_value_heads=4, head_dim=64, intermediate_size=2816, moe_intermediate_size=1408, num_experts=8,
                num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False),
}
ARCH_CLASSES = {"opt": ("OPTConfig", "OPTForCausalLM"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
                "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM")}


def build_checkpoint(shape: str, root: str) -> str:
    import transformers

    path = os.path.join(root, shape)
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    kwargs = dict(SHAPES[shape])
    arch = kwargs.pop("arch")
    config_cls, model_cls = (getattr(transformers, name) for name in ARCH_CLASSES[arch])
    torch.manual_seed(0)
    if arch == "opt":
        kwargs.update(word_embed_proj_dim=768)
    else:
        kwargs.setdefault("tie_word_embeddings", False)
    model = model_cls(config_cls(max_position_embeddings=2048, **kwargs))
    model.save_pretrained(path)
    return path


def make_workload(name: str, vocab_size: int, quick: bool) -> list[tuple[list[int], int]]:
    rng = random.Random(0)
    tok = lambda n: [rng.randrange(4, vocab_size) for _ in range(n)]  # noqa: E731
    scale = 4 if quick else 1
    if name == "uniform":
        return [(tok(128), 128 // scale) for _ in range(32 // scale)]
    if name == "mixed":
        return [(tok(rng.randint(32, 512)), rng.randint(16, 256) // scale) for _ in range(64 // scale)]
    if name == "shared-prefix":
        prefix = tok(384)
        return [(prefix + tok(32), 64 // scale) for _ in range(64 // scale)]
    raise ValueError(name)


class PeakRss:
    """Peak resident memory of this process while the block runs (sampled every 20 ms)."""

    def __enter__(self):
        import psutil

        self.proc, self.peak, self.is_done = psutil.Process(), 0, False
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while not self.is_done:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.02)

    def __exit__(self, *exc):
        self.is_done = True
        self.thread.join()


def run_kernelcore(path: str, workload, dtype: str, max_num_seqs: int, max_num_batched_tokens: int,
                   kv_cache_memory: int = 2 << 30, threads: int | None = None, multiprocess: bool = False) -> dict:
    from kernelcore import LLM, SamplingParams

    llm = LLM(path, dtype=dtype, max_model_len=2048, kv_cache_memory=kv_cache_memory, max_num_seqs=max_num_seqs,
              skip_tokenizer_init=True,  # token-id workloads: the random checkpoints ship no tokenizer
              max_num_batched_tokens=max_num_batched_tokens, multiprocess=multiprocess, num_threads=threads)
    # Warm-up on a token the workloads never use (they draw ids >= 4), so it leaves no prefix-cache hit behind.
    llm.generate([{"prompt_token_ids": [3] * 16}], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    prompts = [{"prompt_token_ids": p} for p, _ in workload]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in workload]
    moe_seconds = [0.0, 0.0]  # FusedMoE forwards, and the routing (softmax + top-k) inside them
    with contextlib.ExitStack() as timing:
        if not multiprocess:
            timing.enter_context(_time_experts(llm.engine_core.executor.worker.model_runner.model, moe_seconds))
        with PeakRss() as mem:
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert num_tokens == sum(n for _, n in workload)
    if multiprocess:  # the core's RSS is in another process; the hit rate is not reported back
        hit_rate = float("nan")
        llm.shutdown()
    else:
        kv = llm.engine_core.scheduler.kv
        hit_rate = kv.num_hits / max(kv.num_queries, 1)
    result = dict(tokens_per_s=num_tokens / elapsed, seconds=elapsed, peak_rss_gib=mem.peak / 2**30,
                  prefix_hit_rate=hit_rate, expert_share=moe_seconds[0] / elapsed,
                  expert_matmul_share=(moe_seconds[0] - moe_seconds[1]) / elapsed)
    del llm
    gc.collect()
    return result


@contextlib.contextmanager
def _time_experts(model, total: list[float]):
    """While active: the wall time of every FusedMoE forward into total[0], of its routing into total[1]; the
    difference is the experts' matmuls (plus the TP all-reduce when there is one). The CPU ops run synchronously,
    so wall time is compute time."""
    from kernelcore.layers import fused_moe

    def timed(fn, slot: int):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                total[slot] += time.perf_counter() - start
        return wrapper

    modules = [m for m in model.modules() if isinstance(m, fused_moe.FusedMoE)]
    originals = [m._forward_method for m in modules]
    select = fused_moe.select_experts
    for module, inner in zip(modules, originals, strict=True):
        module._forward_method = timed(inner, 0)
    fused_moe.select_experts = timed(select, 1)
    try:
        yield
    finally:
        fused_moe.select_experts = select
        for module, inner in zip(modules, originals, strict=True):
            module._forward_method = inner


def run_transformers(path: str, workload, dtype: str, batch_size: int = 32, threads: int | None = None) -> dict:
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    order = sorted(range(len(workload)), key=lambda i: len(workload[i][0]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    with torch.inference_mode():
        model.generate(torch.tensor([workload[0][0][:16]]), max_new_tokens=4, do_sample=False)
    with PeakRss() as mem, torch.inference_mode():
        start = time.perf_counter()
        for batch in batches:
            prompts = [workload[i][0] for i in batch]
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            num_new = max(workload[i][1] for i in batch)
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=num_new, min_new_tokens=num_new,
                           do_sample=False, pad_token_id=0)
        elapsed = time.perf_counter() - start
    num_tokens = sum(n for _, n in workload)  # useful tokens: a static batch also pads shorter requests
    del model
    gc.collect()
    return dict(tokens_per_s=num_tokens / elapsed, seconds=elapsed, peak_rss_gib=mem.peak / 2**30)


def matmul_peak_gflops(dtype: str, m: int = 64, k: int = 768, n: int = 3072) -> float:
    """The best of plain ``a @ b`` and the prepacked oneDNN linear the layers use (the higher peak is the roofline)."""
    from builtin_plugins.cpu.linear import fast_linear

    a, w = torch.randn(m, k, dtype=getattr(torch, dtype)), torch.randn(n, k, dtype=getattr(torch, dtype))
    b, holder = w.t().contiguous(), torch.nn.Module()
    best = 0.0
    for fn in (lambda: a @ b, lambda: fast_linear(holder, a, w, None)):
        with torch.inference_mode():
            for _ in range(5):
                fn()
            iters, start = 50, time.perf_counter()
            for _ in range(iters):
                fn()
        best = max(best, 2 * m * k * n * iters / (time.perf_counter() - start) / 1e9)
    return best


def flops_per_token(path: str) -> float:
    from safetensors import safe_open

    num_params = 0
    for name in os.listdir(path):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(path, name), "pt") as f:
                for key in f.keys():
                    if "embed_tokens" not in key and "embed_positions" not in key:
                        num_params += _numel(f.get_slice(key).get_shape())
    return 2.0 * num_params


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@click.command("throughput")
@click.option("--shape", type=click.Choice([*SHAPES, "all"]), multiple=True, default=["opt", "llama"],
              show_default=True)
@click.option("--workload", type=click.Choice(["uniform", "mixed", "shared-prefix", "all"]), multiple=True,
              default=["all"], show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True)
@click.option("--num-runs", type=int, default=1, show_default=True,
              help="Repeat each measurement; medians are printed.")
@click.option("--quick", is_flag=True, help="A quarter of the requests and output tokens (smoke run).")
@click.option("--skip-hf", is_flag=True, help="Do not run transformers generate.")
@click.option("--max-num-seqs", type=int, default=128, show_default=True)
@click.option("--max-num-batched-tokens", type=int, default=2048, show_default=True)
@click.option("--threads", type=int, default=None,
              help="torch threads for both engines (default: one per core, what the CPU worker picks).")
@click.option("--multiprocess", is_flag=True,
              help="Also run kernelcore through the engine-core process (LLM(multiprocess=True)) in the same run and "
                   "print its overhead vs in-process.")
@click.option("--checkpoint-dir", type=click.Path(), default=None, help="Reuse/keep the random checkpoints here.")
@click.option("--json-out", type=click.Path(), default=None, help="Also write the results as JSON.")
def throughput(shape, workload, dtype, num_runs, quick, skip_hf, max_num_seqs, max_num_batched_tokens,
               threads, multiprocess, checkpoint_dir, json_out):
    """kernelcore vs transformers generate: output tokens/s on synthetic workloads, in the same run."""
    shapes = list(SHAPES) if "all" in shape else list(shape)
    workloads = ["uniform", "mixed", "shared-prefix"] if "all" in workload else list(workload)
    root = checkpoint_dir or tempfile.mkdtemp(prefix="kc-bench-")
    threads = threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    torch.set_num_threads(threads)
    peak = matmul_peak_gflops(dtype)
    click.echo(f"threads={torch.get_num_threads()} dtype={dtype} matmul peak (64x768x3072) {peak:.0f} GFLOP/s "
               f"load average {os.getloadavg()[0]:.1f} (ratios: median over {num_runs} interleaved "
               f"kernelcore/transformers pairs)")
    results = []
    for s in shapes:
        path = build_checkpoint(s, root)
        flops = flops_per_token(path)
        for w in workloads:
            work = make_workload(w, SHAPES[s]["vocab_size"], quick)
            kc_runs, hf_runs, mp_runs = [], [], []
            for _ in range(num_runs):  # interleaved, so both see the same machine load
                kc_runs.append(run_kernelcore(path, work, dtype, max_num_seqs, max_num_batched_tokens, threads=threads))
                if multiprocess:
                    mp_runs.append(run_kernelcore(path, work, dtype, max_num_seqs, max_num_batched_tokens,
                                                  threads=threads, multiprocess=True))
                if not skip_hf:
                    hf_runs.append(run_transformers(path, work, dtype, threads=threads))
            kc = statistics.median(r["tokens_per_s"] for r in kc_runs)
            hf = statistics.median(r["tokens_per_s"] for r in hf_runs) if hf_runs else float("nan")
            ratio = statistics.median(a["tokens_per_s"] / b["tokens_per_s"]
                                      for a, b in zip(kc_runs, hf_runs, strict=True)) if hf_runs else None
            row = dict(shape=s, workload=w, dtype=dtype, quick=quick, num_requests=len(work),
                       kernelcore_tokens_per_s=kc, transformers_tokens_per_s=hf, ratio=ratio,
                       kernelcore_peak_rss_gib=max(r["peak_rss_gib"] for r in kc_runs),
                       transformers_peak_rss_gib=max(r["peak_rss_gib"] for r in hf_runs) if hf_runs else None,
                       prefix_hit_rate=kc_runs[0]["prefix_hit_rate"],
                       expert_share=statistics.median(r["expert_share"] for r in kc_runs),
                       expert_matmul_share=statistics.median(r["expert_matmul_share"] for r in kc_runs),
                       roofline_share=kc * flops / (peak * 1e9))
            if mp_runs:
                row["multiprocess_tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in mp_runs)
                # IPC overhead: how much slower the engine-core process path is (median over the per-run pairs).
                row["multiprocess_overhead"] = statistics.median(1 - b["tokens_per_s"] / a["tokens_per_s"]
                                                                 for a, b in zip(kc_runs, mp_runs, strict=True))
            results.append(row)
            click.echo(f"{s:6s} {w:14s} kernelcore {kc:7.1f} tok/s | transformers {hf:7.1f} tok/s | "
                       f"ratio {row['ratio'] or float('nan'):5.2f}x | "
                       f"peak RSS kc {row['kernelcore_peak_rss_gib']:.2f} GiB"
                       f" hf {row['transformers_peak_rss_gib'] or float('nan'):.2f} GiB | "
                       f"prefix hits {row['prefix_hit_rate']:.0%} | roofline {row['roofline_share']:.0%}"
                       + (f" | MoE layers {row['expert_share']:.0%} of kc time, expert matmuls "
                          f"{row['expert_matmul_share']:.0%}" if row["expert_share"] else "")
                       + (f" | multiprocess {row['multiprocess_tokens_per_s']:.1f} tok/s, overhead "
                          f"{row['multiprocess_overhead']:+.1%}" if mp_runs else ""))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    throughput()
