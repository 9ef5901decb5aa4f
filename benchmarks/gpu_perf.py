"""The throughput half of the GPU check (benchmarks/gpu_check.py calls ``perf`` and shares ``free_memory``).

A random 1B-class Llama (TinyLlama-1.1B's shape) in bf16, on the W-uniform and W-mixed workloads of
benchmarks/throughput.py: kernelcore with CUDA graphs, kernelcore with enforce_eager and transformers
``generate`` (static batches of 32), in the same run. Then, per kernelcore mode, one steady decode step at
batch 1 and 64 (context 512, each sequence in its own blocks) against its weight matmuls alone, and the peak
GPU memory against the configured KV budget. Smoke runs (CPU): a tiny shape, the quick workloads, fp32.
"""

from __future__ import annotations

import os
import statistics
import time
import traceback

import torch
import torch.nn.functional as F

SHAPE_1B = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                num_attention_heads=32, num_key_value_heads=4)
SHAPE_SMOKE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2)
KV_BUDGET = 8 << 30  # bytes of KV cache kernelcore is configured with on the GPU
WORKLOADS = ("uniform", "mixed")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def free_memory() -> None:
    """Release what a finished run left (its model, KV cache, graphs) before the next one loads."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def median_seconds(fn, device: str, iters: int = 20) -> float:
    fn()
    sync(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build_checkpoint(root: str, device: str, smoke: bool, dtype: str) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    path = os.path.join(root, "llama-1b")
    with torch.device(device):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=2048, tie_word_embeddings=False,
                                             **(SHAPE_SMOKE if smoke else SHAPE_1B)))
    model.to(getattr(torch, dtype)).save_pretrained(path)
    del model
    return path


def decode_step(runner, batch: int, context: int, device: str) -> dict:
    """One decode step of ``batch`` sequences at ``context`` tokens vs the weight matmuls of that step alone."""
    from kernelcore.executor.model_runner import SeqBatchEntry

    per_seq = -(-(context + 1) // runner.block_size)
    assert batch * per_seq <= runner.num_blocks, (batch, per_seq, runner.num_blocks)
    entries = [SeqBatchEntry([7], context, list(range(i * per_seq, (i + 1) * per_seq))) for i in range(batch)]
    step = median_seconds(lambda: runner.execute(entries), device)
    weights = [p for n, p in runner.model.named_parameters() if p.dim() == 2 and "embed" not in n]
    x = {w.shape[1]: torch.randn(batch, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}
    matmuls = median_seconds(lambda: [F.linear(x[w.shape[1]], w) for w in weights], device)
    return {"step_ms": step * 1e3, "matmuls_ms": matmuls * 1e3, "matmul_share": matmuls / step}


def run_kernelcore(path: str, dtype: str, workloads: dict, eager: bool, device: str, smoke: bool) -> dict:
    from kernelcore import LLM, SamplingParams

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    kv_budget = (64 << 20) if smoke else KV_BUDGET
    # Smoke runs capture few sizes: the CPU attention under the test double reads the whole context bound.
    llm = LLM(path, dtype=dtype, max_model_len=2048, max_num_seqs=256, max_num_batched_tokens=8192,
              kv_cache_memory=kv_budget, enforce_eager=eager, graph_capture_sizes=[1, 2, 4, 8] if smoke else None)
    llm.generate([{"prompt_token_ids": [3] * 16}], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    result = {}
    for name, work in workloads.items():
        llm.engine_core.reset_prefix_cache()
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in work]
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p, _ in work], params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        assert num_tokens == sum(n for _, n in work), (num_tokens, name)
        result[f"{name}_tokens_per_s"] = num_tokens / elapsed
    runner = llm.engine_core.executor.worker.model_runner
    context = 64 if smoke else 512
    for batch in (1, 8 if smoke else 64):
        result[f"decode_batch{batch}"] = decode_step(runner, batch, context, device)
    graphs = runner.graph_runner
    result["graph_sizes"] = None if graphs is None else sorted(graphs.graphs)
    result["graph_replays"] = None if graphs is None else graphs.num_replays
    gib = 2**30
    result["memory"] = {
        "kv_budget_gib": llm.config.cache.kv_cache_memory / gib,
        "kv_allocated_gib": sum(c.numel() * c.element_size() for c in runner.kv_caches) / gib,
        "weights_gib": sum(p.numel() * p.element_size() for p in runner.model.parameters()) / gib,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / gib if device == "cuda" else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / gib if device == "cuda" else None,
    }
    llm.shutdown()
    del llm, runner, graphs
    free_memory()
    return result


def run_transformers(path: str, dtype: str, work, device: str, batch_size: int = 32) -> float:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    order = sorted(range(len(work)), key=lambda i: len(work[i][0]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    with torch.inference_mode():
        hf.generate(torch.tensor([work[0][0][:16]], device=device), max_new_tokens=4, do_sample=False)
        sync(device)
        start = time.perf_counter()
        for batch in batches:
            prompts = [work[i][0] for i in batch]
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
            n = max(work[i][1] for i in batch)
            hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                        pad_token_id=0)
        sync(device)
        elapsed = time.perf_counter() - start
    del hf
    return sum(n for _, n in work) / elapsed  # useful tokens: a static batch also pads shorter requests


def perf(device: str, smoke: bool, root: str) -> dict:
    from throughput import make_workload

    dtype = "float32" if smoke else "bfloat16"
    path = build_checkpoint(root, device, smoke, dtype)
    vocab = (SHAPE_SMOKE if smoke else SHAPE_1B)["vocab_size"]
    workloads = {name: make_workload(name, vocab, quick=smoke) for name in WORKLOADS}
    report = {"dtype": dtype, "shape": SHAPE_SMOKE if smoke else SHAPE_1B}
    for mode, eager in (("graphs", False), ("eager", True)):
        try:  # one failing mode still leaves the other's figures
            report[mode] = run_kernelcore(path, dtype, workloads, eager, device, smoke)
        except Exception:
            report[mode] = {"error": traceback.format_exc(limit=6)}
            free_memory()
        print(f"kernelcore {mode}: {report[mode]}", flush=True)
    report["transformers"] = {f"{name}_tokens_per_s": run_transformers(path, dtype, work, device)
                              for name, work in workloads.items()}
    print(f"transformers: {report['transformers']}", flush=True)
    graphs, eager, hf = report["graphs"], report["eager"], report["transformers"]
    if "error" in graphs or "error" in eager:
        report["ratios"] = None  # the JSON holds the failing mode's traceback
        return report
    report["ratios"] = {
        **{f"{name}_kernelcore_vs_transformers": graphs[f"{name}_tokens_per_s"] / hf[f"{name}_tokens_per_s"]
           for name in WORKLOADS},
        **{f"{name}_graphs_vs_eager": graphs[f"{name}_tokens_per_s"] / eager[f"{name}_tokens_per_s"]
           for name in WORKLOADS},
        "decode_batch1_graphs_vs_eager": eager["decode_batch1"]["step_ms"] / graphs["decode_batch1"]["step_ms"],
    }
    print(f"ratios: {report['ratios']}", flush=True)
    return report
