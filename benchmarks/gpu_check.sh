#!/usr/bin/env bash
# The GPU check, one command on one NVIDIA GPU (expected ~5 minutes on an H200, not yet run; each stage has a timeout,
# all of them together under 8 minutes). It writes results.json and its logs (check.txt, tests.txt, bench.txt,
# serve.log) to OUT_DIR:
#   1. installs kernelcore from this tree with --no-deps (the image's own CUDA torch and triton are kept), the
#      dummy plugins, and the wheels of .whl/ when present (benchmarks/gpu_wheels.sh downloads them, elsewhere);
#   2. the Triton kernel tests natively (fp32, fp16, bf16) and the decode-graph tests with real CUDA graphs;
#   3. benchmarks/gpu_check.py: greedy and logprob parity with transformers for every test architecture, with
#      CUDA graphs and with --enforce-eager; `kc serve` on the GPU answering the openai client (chat, streaming,
#      n=2, logprobs); bf16 W-uniform and W-mixed throughput of a 1B-class random Llama, kernelcore (graphs and
#      eager) vs transformers generate; decode steps at batch 1 and 64 vs their matmuls; peak memory vs KV budget.
# Usage: benchmarks/gpu_check.sh [OUT_DIR]                   OUT_DIR defaults to $OUT, else /tmp/kc-gpu-check
#        KC_GPU_CHECK_SMOKE=1 benchmarks/gpu_check.sh DIR    the Python stages on the CPU, tiny shapes (no GPU)
#        KC_GPU_CHECK_SECTIONS=serve,perf benchmarks/gpu_check.sh    a rerun of some of tests,parity,serve,perf
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-/tmp/kc-gpu-check}}
mkdir -p "$OUT_DIR"
SMOKE=${KC_GPU_CHECK_SMOKE:-0}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
LOG="$OUT_DIR/check.txt"
: >"$LOG"

if [ "$SMOKE" != 1 ]; then
  export KC_CACHE_DIR=${KC_CACHE_DIR:-/tmp/kc-gpu-check-cache}
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv >>"$LOG" 2>&1
  if [ -d .whl ]; then  # not inside a pipe: the export must reach the stages below
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/kc-site \
      .whl/*.whl >>"$LOG" 2>&1 && export PYTHONPATH=/tmp/kc-site${PYTHONPATH:+:$PYTHONPATH}
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 \
    || "$PY" -m pip install -q --no-index --no-deps --no-build-isolation . >>"$LOG" 2>&1
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation ./tests/plugins/kc_dummy_* >>"$LOG" 2>&1
  if ! "$PY" -c "import torch, triton, msgspec, openai, kernelcore; assert torch.cuda.is_available()
print('torch', torch.__version__, 'triton', triton.__version__)" >>"$LOG" 2>&1; then
    echo "missing packages or no GPU (see check.txt): run benchmarks/gpu_wheels.sh and carry .whl" | tee -a "$LOG"
    exit 1
  fi
  cat "$LOG"
  rm -f "$OUT_DIR/tests.txt"
  if [[ ",${KC_GPU_CHECK_SECTIONS:-tests}," == *,tests,* ]]; then
    KC_TEST_DEVICE=cuda timeout 150 "$PY" -m pytest -q -p no:cacheprovider -o timeout=120 \
      tests/test_triton_kernels.py tests/test_graph_runner.py 2>&1 | tee "$OUT_DIR/tests.txt"
  fi
  timeout 300 "$PY" benchmarks/gpu_check.py "$OUT_DIR" 2>&1 | tee "$OUT_DIR/bench.txt"
else
  timeout 600 "$PY" benchmarks/gpu_check.py "$OUT_DIR" --smoke 2>&1 | tee "$OUT_DIR/bench.txt"
fi
status=${PIPESTATUS[0]}
echo "gpu_check.py exited with $status; results in $OUT_DIR/results.json" | tee -a "$LOG"
exit "$status"
