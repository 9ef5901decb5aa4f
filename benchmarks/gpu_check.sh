#!/usr/bin/env bash
# The GPU check of issue 7, on one NVIDIA GPU, in under 8 minutes:
#   1. the Triton kernel tests natively (fp32, fp16, bf16) against their torch references;
#   2. parity: greedy tokens of a tiny Llama and OPT, kernelcore (CUDA platform) vs transformers, same GPU;
#   3. bf16 throughput of a 1B-class random Llama on W-mixed (64 requests, prompts 32-512, outputs 16-256):
#      kernelcore vs transformers generate (static batches of 32) in the same run, and one steady decode
#      step (64 sequences at context 512) vs the time of its weight matmuls alone (the matmul roofline).
# Usage: benchmarks/gpu_check.sh [out_dir]         results: out_dir/results.json (+ the logs)
#        KC_GPU_CHECK_SMOKE=1 benchmarks/gpu_check.sh   the same code paths on the CPU, tiny shapes (no GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/kc-gpu-check}
mkdir -p "$OUT"
SMOKE=${KC_GPU_CHECK_SMOKE:-0}

if [ "$SMOKE" != 1 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
  python -c "import torch; assert torch.cuda.is_available(), 'this torch has no CUDA: install a CUDA build first'"
  # kernelcore with its cuda extra (triton, nvidia-ml-py); the installed CUDA torch is kept.
  python -m pip install -q -e '.[test,cuda]' || echo "pip install failed (offline?): using what is installed"
  python -m pip install -q --no-deps --no-build-isolation ./tests/plugins/kc_dummy_* || true
  KC_TEST_DEVICE=cuda timeout 180 python -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py \
    2>&1 | tee "$OUT/kernels.txt"
fi

timeout 360 python - "$OUT" "$SMOKE" <<'PY' 2>&1 | tee "$OUT/bench.txt"
import gc, json, os, statistics, sys, tempfile, time

import torch
import torch.nn.functional as F

sys.path[:0] = ["tests", "benchmarks"]
out_dir, smoke = sys.argv[1], sys.argv[2] == "1"
device = "cpu" if smoke else "cuda"
results = {"gpu": "cpu (smoke run)" if smoke else torch.cuda.get_device_name(), "torch": torch.__version__}
root = tempfile.mkdtemp(prefix="kc-gpu-check-")


def sync():
    if device == "cuda":
        torch.cuda.synchronize()


def free_memory():
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


from conftest_models import make_llama_checkpoint, make_opt_checkpoint  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

from kernelcore import LLM, SamplingParams  # noqa: E402

# -- 2. parity ------------------------------------------------------------------------------------------
prompts = [[5, 9, 11, 3, 7, 8, 100, 200, 17], list(range(40, 71)), [3, 4]]
for name, make in (("llama", make_llama_checkpoint), ("opt", make_opt_checkpoint)):
    path = make(os.path.join(root, name))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    want = []
    with torch.inference_mode():
        for p in prompts:
            ids = hf.generate(torch.tensor([p], device=device), max_new_tokens=16, min_new_tokens=16, do_sample=False)
            want.append(ids[0, len(p):].tolist())
    del hf
    free_memory()
    llm = LLM(path, dtype="float32")
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    got = [list(o.outputs[0].token_ids) for o in outs]
    match = sum(a == b for g, w in zip(got, want) for a, b in zip(g, w)) / sum(len(w) for w in want)
    results[f"parity_{name}_greedy_token_match"] = match
    print(f"parity {name}: {match:.1%} of greedy tokens equal to transformers", flush=True)
    del llm
    free_memory()

# -- 3. throughput and roofline (bf16) --------------------------------------------------------------------
shape = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
             num_attention_heads=32, num_key_value_heads=4)  # TinyLlama-1.1B
if smoke:
    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
dtype = "float32" if smoke else "bfloat16"
path = os.path.join(root, "llama-1b")
with torch.device(device):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=2048, tie_word_embeddings=False, **shape))
model.to(getattr(torch, dtype)).save_pretrained(path)
del model
free_memory()

from throughput import make_workload  # noqa: E402

work = make_workload("mixed", shape["vocab_size"], quick=smoke)
num_out = sum(n for _, n in work)


def run_transformers():
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    order = sorted(range(len(work)), key=lambda i: len(work[i][0]))
    batches = [order[i:i + 32] for i in range(0, len(order), 32)]
    with torch.inference_mode():
        hf.generate(torch.tensor([work[0][0][:16]], device=device), max_new_tokens=4, do_sample=False)
        sync()
        start = time.perf_counter()
        for batch in batches:
            ps = [work[i][0] for i in batch]
            width = max(len(p) for p in ps)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in ps], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps], device=device)
            n = max(work[i][1] for i in batch)
            hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                        pad_token_id=0)
        sync()
        elapsed = time.perf_counter() - start
    del hf
    free_memory()
    return num_out / elapsed


def median_time(fn, iters=20):
    fn()
    sync()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_kernelcore():
    from kernelcore.executor.model_runner import SeqBatchEntry

    llm = LLM(path, dtype=dtype, max_model_len=2048, max_num_seqs=256, max_num_batched_tokens=8192)
    llm.generate([{"prompt_token_ids": work[0][0][:16]}], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    llm.engine_core.reset_prefix_cache()
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in work]
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p, _ in work], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert sum(len(o.outputs[0].token_ids) for o in outputs) == num_out
    # One steady decode step: 64 sequences at context 512, each in its own blocks.
    runner = llm.engine_core.executor.worker.model_runner
    batch, context, bs = (8, 64, runner.block_size) if smoke else (64, 512, runner.block_size)
    per_seq = -(-(context + 1) // bs)
    assert batch * per_seq <= runner.num_blocks, (batch, per_seq, runner.num_blocks)
    entries = [SeqBatchEntry([7], context, list(range(i * per_seq, (i + 1) * per_seq))) for i in range(batch)]
    step = median_time(lambda: runner.execute(entries))
    weights = [p for n, p in runner.model.named_parameters() if p.dim() == 2 and "embed" not in n]
    x = {w.shape[1]: torch.randn(batch, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}
    matmuls = median_time(lambda: [F.linear(x[w.shape[1]], w) for w in weights])
    del llm, runner
    free_memory()
    return num_out / elapsed, step, matmuls


kc_tps, step, matmuls = run_kernelcore()
hf_tps = run_transformers()
results.update(w_mixed_kernelcore_tokens_per_s=kc_tps, w_mixed_transformers_tokens_per_s=hf_tps,
               w_mixed_ratio=kc_tps / hf_tps, decode_step_ms=step * 1e3, decode_matmuls_ms=matmuls * 1e3,
               decode_roofline_share=matmuls / step)
print(f"W-mixed {dtype}: kernelcore {kc_tps:.0f} tok/s, transformers {hf_tps:.0f} tok/s, "
      f"ratio {kc_tps / hf_tps:.2f}x (target >= 3x)")
print(f"steady decode step: {step * 1e3:.2f} ms, its weight matmuls alone {matmuls * 1e3:.2f} ms: "
      f"{matmuls / step:.0%} of the matmul roofline (target >= 50%)")
with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
print(json.dumps(results, indent=2))
PY
