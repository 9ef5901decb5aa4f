"""benchmarks/gpu_check.sh in its smoke mode (KC_GPU_CHECK_SMOKE=1): every Python stage of the GPU check on the
CPU with tiny shapes (decode graphs through the test double), so the script a device run gets has run here."""

import json
import os
import subprocess
import sys

import pytest
from helpers import clean_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_gpu_check_smoke_run_reports_every_section(tmp_path):
    out = tmp_path / "out"
    env = clean_env(KC_GPU_CHECK_SMOKE="1", PYTHON=sys.executable)
    proc = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_check.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["errors"] == {} and results["smoke"] is True
    assert set(results["parity"]) == {"llama", "opt"}
    for arch in results["parity"].values():
        assert arch["graphs_equal_eager_tokens"]
        assert arch["graphs"]["greedy_token_match"] == arch["eager"]["greedy_token_match"] == 1.0
        assert arch["graphs"]["max_logprob_abs_diff"] < 1e-4 and arch["graphs"]["graph_replays"] > 0
        assert arch["eager"]["graph_replays"] is None
    assert {k: v for k, v in results["serve"].items() if k.endswith("_ok") or k.startswith("stream")} == {
        "chat_ok": True, "stream_equals_chat": True, "n2_ok": True, "logprobs_ok": True}
    perf = results["perf"]
    assert perf["graphs"]["graph_sizes"] == [1, 2, 4, 8] and perf["graphs"]["graph_replays"] > 0
    assert perf["eager"]["graph_sizes"] is None
    for mode in ("graphs", "eager"):
        assert perf[mode]["memory"]["kv_allocated_gib"] >= perf[mode]["memory"]["kv_budget_gib"] * 0.9
        assert {"decode_batch1", "decode_batch8"} <= set(perf[mode])
    assert set(perf["ratios"]) == {"uniform_kernelcore_vs_transformers", "mixed_kernelcore_vs_transformers",
                                   "uniform_graphs_vs_eager", "mixed_graphs_vs_eager", "decode_batch1_graphs_vs_eager"}
    assert (out / "serve.log").exists() and (out / "bench.txt").exists()
