"""A tiny Llama, OPT and Mistral (sliding window) through the Triton attention backend and Triton ops, in Triton's
interpreter on CPU tensors (the kc_dummy_triton_interp platform, KC_TRITON_INTERP=1), against the CPU platform's
logits.

Each run steps the model runner by hand: a profiling-style forward with no KV cache bound, then fresh
prefills, a prefill chunk continuing mid-sequence batched with decodes (ragged, masked tails), then an
all-decode step."""

import json

import pytest
import torch
from conftest_models import make_checkpoint, make_llama_checkpoint, make_opt_checkpoint
from helpers import run_python

pytestmark = pytest.mark.slow  # real servers / several processes: run with the full suite

pytest.importorskip("triton", reason="pip install 'kernelcore[cuda]'")

STEPS = """
import json, random, sys
import torch
from kernelcore.config_builder import build_config
from kernelcore.executor.model_runner import SeqBatchEntry as E
from kernelcore.executor.uniproc import create_worker


report = {}
for name, path, block_size, out in json.loads(sys.argv[1]):
    worker = create_worker(build_config(model=path, dtype="float32", block_size=block_size))
    runner = worker.model_runner
    rng = random.Random(0)
    toks = [[rng.randrange(3, 300) for _ in range(n)] for n in (12, 40, 6)]
    tables = [[1, 0], [5, 3, 7], [2]] if block_size == 32 else [[1, 0, 9], [5, 3, 7, 4, 8, 10], [2]]
    logits = [runner.execute([E(toks[0][:11], 0, [0], 11), E(toks[2][:5], 0, [0], 5)])]  # no cache bound
    worker.initialize_cache(11)
    logits.append(runner.execute([E(toks[0][:11], 0, tables[0], 11), E(toks[1][:9], 0, tables[1], 9),
                                  E(toks[2][:5], 0, tables[2], 5)]))
    logits.append(runner.execute([E(toks[0][11:], 11, tables[0], 1), E(toks[1][9:], 9, tables[1], 31),
                                  E(toks[2][5:], 5, tables[2], 1)]))
    logits.append(runner.execute([E([7], 12, tables[0], 1), E([8], 40, tables[1], 1), E([9], 6, tables[2], 1)]))
    torch.save(logits, out)
    ops = {type(m).__name__: m.forward_method_name for m in runner.model.modules() if hasattr(m, "forward_method_name")}
    report[name] = {"attn": type(runner.attn_layers[0].impl).__name__, "ops": ops}
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton_e2e")
    return {"llama": (make_llama_checkpoint(str(root / "llama")), 16),
            "opt": (make_opt_checkpoint(str(root / "opt")), 32),
            # a sliding window (12) shorter than the 40-token sequence: the kernel's window path
            "mistral": (make_checkpoint("mistral", str(root / "mistral")), 16)}


def _run(checkpoints, tmp_path, tag, **env):
    jobs = [(name, path, block_size, str(tmp_path / f"{tag}-{name}.pt"))
            for name, (path, block_size) in checkpoints.items()]
    trace = tmp_path / f"{tag}.trace"
    proc = run_python(STEPS.replace("sys.argv[1]", repr(json.dumps(jobs))), KC_TRACE_PLUGINS=str(trace), **env)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    logits = {name: torch.load(out) for name, _, _, out in jobs}
    return report, [e["result"] for e in events if e["hook"] == "kernel_table"], logits


def test_llama_opt_mistral_through_triton_interpreter_match_cpu_platform(checkpoints, tmp_path):
    cpu_report, cpu_tables, cpu_logits = _run(checkpoints, tmp_path, "cpu")
    report, tables, logits = _run(checkpoints, tmp_path, "triton", KC_TRITON_INTERP="1", TRITON_INTERPRET="1")

    assert cpu_report["llama"]["attn"] == "CpuAttentionImpl"
    assert {r["attn"] for r in report.values()} == {"TritonAttentionImpl"}
    assert report["llama"]["ops"] == {"TritonRMSNorm": "forward_oot", "TritonRotaryEmbedding": "forward_oot",
                                      "TritonSiluAndMul": "forward_oot"}
    # The trace names the winner of every kernel in each worker: the CPU platform's torch fallbacks there,
    # the Triton kernels here (no platform override).
    # the CPU platform's kernels: the torch fallbacks, fused_moe with prepacked expert weights, its native
    # pointwise ops (with torch fallbacks inside)
    native = {"cpu:onednn_fused_moe", "cpu:rms_norm", "cpu:fused_add_rms_norm", "cpu:rotary_embedding",
              "cpu:silu_and_mul"}
    assert cpu_tables and all(w.startswith("cpu:torch_") or w in native for w in cpu_tables[0].values())
    assert tables and all(w.startswith("triton_kernels:triton_") for w in tables[0].values())
    assert set(tables[0]) >= {"paged_attention", "reshape_and_cache", "rms_norm", "fused_add_rms_norm",
                              "rotary_embedding", "silu_and_mul"}
    for name in checkpoints:
        assert len(logits[name]) == len(cpu_logits[name]) == 4
        for got, want in zip(logits[name], cpu_logits[name], strict=True):
            torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
