"""One decode step of 125M-class OPT and Llama shapes vs the time of just their weight matmuls.

    python benchmarks/bench_forward.py [--batch 1 8 32 128] [--dtype float32 bfloat16] [--iters 10] [--threads 1]

Random weights, every sequence at context ~128 in the paged cache (block size 16).
"roofline" = the same step's weight matmuls alone on [batch, in] inputs, LM head included, through the
prepacked oneDNN path the layers use (plain F.linear printed alongside); "matmul share" = roofline / forward.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

SHAPES = {
    "opt-125m": {"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 768, "num_hidden_layers": 12,
                 "num_attention_heads": 12, "ffn_dim": 3072, "vocab_size": 50272, "max_position_embeddings": 2048,
                 "word_embed_proj_dim": 768, "do_layer_norm_before": True, "activation_function": "relu"},
    "llama-125m": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768,
                   "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4,
                   "intermediate_size": 2048, "vocab_size": 32000, "max_position_embeddings": 2048,
                   "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False},
}
CONTEXT, BLOCK_SIZE = 128, 16


def median_time(fn, iters: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_roofline(model, batch: int, dtype: torch.dtype, iters: int, prepacked: bool) -> float:
    """The step's weight matmuls alone: plain ``F.linear``, or the prepacked oneDNN path the layers use."""
    from builtin_plugins.cpu.linear import fast_linear

    modules = [m for name, m in model.named_modules() if isinstance(getattr(m, "weight", None), torch.Tensor)
               and m.weight.dim() == 2 and "embed" not in name]
    inputs = [torch.randn(batch, m.weight.shape[1], dtype=dtype) for m in modules]
    holders = [torch.nn.Module() for _ in modules]  # own packed copies, not the model's

    def run():
        for x, m, h in zip(inputs, modules, holders, strict=True):
            fast_linear(h, x, m.weight, None) if prepacked else F.linear(x, m.weight)

    with torch.inference_mode():
        return median_time(run, iters)


def bench(shape: str, dtype: str, batches: list[int], iters: int) -> list[dict]:
    from kernelcore.config_builder import build_config
    from kernelcore.executor.model_runner import ModelRunner, SeqBatchEntry

    rows = []
    with tempfile.TemporaryDirectory() as path:
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(SHAPES[shape], f)
        config = build_config(model=path, dtype=dtype, block_size=BLOCK_SIZE, custom_ops=["all"])
        runner = ModelRunner(config)
        runner.load_model(is_dummy=True)
        blocks_per_seq = CONTEXT // BLOCK_SIZE + 1
        for batch in batches:
            runner.allocate_kv_cache(batch * blocks_per_seq)
            entries = [SeqBatchEntry([7], CONTEXT - 1, list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)))
                       for i in range(batch)]
            n = max(3, iters // (1 + batch // 32))
            forward = median_time(functools.partial(runner.execute, entries), n)
            roofline = matmul_roofline(runner.model, batch, runner.dtype, n, prepacked=True)
            plain = matmul_roofline(runner.model, batch, runner.dtype, n, prepacked=False)
            rows.append({"model": shape, "dtype": dtype, "batch": batch, "forward_ms": forward * 1e3,
                         "matmul_ms": roofline * 1e3, "plain_matmul_ms": plain * 1e3,
                         "matmul_pct": 100 * roofline / forward, "tokens_per_s": batch / forward})
            print(f"{shape:11s} {dtype:9s} batch {batch:4d}: forward {forward * 1e3:8.2f} ms"
                  f"  matmuls {roofline * 1e3:8.2f} ms (F.linear {plain * 1e3:8.2f} ms)"
                  f"  matmul share {100 * roofline / forward:5.1f}%"
                  f"  {batch / forward:8.1f} tok/s", flush=True)
        runner.allocate_kv_cache(0)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", nargs="+", default=list(SHAPES))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 by default: on a shared, oversubscribed machine OpenMP barriers "
                             "make multi-threaded timings meaningless)")
    parser.add_argument("--no-prepack", action="store_true",
                        help="the layers use plain F.linear (the state before oneDNN prepacking), for A/B runs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.no_prepack:
        import kernelcore.layers.linear

        kernelcore.layers.linear._ONEDNN = False
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for shape in args.model:
        for dtype in args.dtype:
            bench(shape, dtype, args.batch, args.iters)


if __name__ == "__main__":
    main()
