"""The built-in CUDA platform without a GPU: cheap detection, a faked GPU probe, config, kernel table."""

from __future__ import annotations

import pytest
import torch
from conftest_models import make_llama_checkpoint
from helpers import run_python

FAKE_GPU = "import builtin_plugins.cuda as cuda_plugin\ncuda_plugin._num_nvidia_gpus = lambda: 1\n"
SHOW = "from kernelcore.platforms import current_platform as p\nprint(type(p).__name__, p.plugin_name)\n"


def test_detection_without_gpu_is_cheap_and_imports_nothing_heavy():
    out = run_python("""
        import sys, time
        start = time.perf_counter()
        import builtin_plugins.cuda as cuda_plugin
        assert cuda_plugin.detect_platform() is None
        elapsed = time.perf_counter() - start
        import builtin_plugins.cuda.platform
        from kernelcore.platforms import detect_all
        detected = {d.name: d.qualname for d in detect_all()}
        heavy = sorted(m for m in ("torch", "triton") if m in sys.modules)
        print(detected["cuda"], heavy, elapsed < 2.0)
    """).stdout.split()
    assert out == ["None", "[]", "True"]


def test_fake_gpu_wins_over_cpu():
    out = run_python(FAKE_GPU + SHOW).stdout.split()
    assert out == ["CudaPlatform", "cuda"]


def test_vendor_platform_wins_over_cuda():
    out = run_python(FAKE_GPU + SHOW, KC_DUMMY_DEVICE="1").stdout.split()
    assert out == ["DummyPlatform", "dummy_platform"]


@pytest.mark.slow
def test_cuda_config_without_creating_a_cuda_context(tmp_path):
    path = make_llama_checkpoint(str(tmp_path / "llama"))
    out = run_python(FAKE_GPU + f"""
import torch
from kernelcore import plugins
from kernelcore.attention import AttentionSelector
from kernelcore.config_builder import build_config
config = build_config(model={path!r}, dtype="auto")
pm = plugins.get_plugin_manager()
print(config.parallel.worker_cls, config.model.dtype, config.custom_ops,
      pm.hook.get_attn_backend_cls(selector=AttentionSelector(16, 4, 2, "bfloat16", 16)),
      pm.hook.get_device_communicator_cls(), pm.hook.get_graph_capture_backend_cls(config=config),
      torch.cuda.is_initialized())
""").stdout.split()
    assert out == ["builtin_plugins.cuda.worker.CudaWorker", "bfloat16", "['all']",
                   "builtin_plugins.cuda.attention.TritonAttentionBackend",
                   "kernelcore.distributed.TorchDistCommunicator",
                   "builtin_plugins.cuda.graphs.CudaGraphCaptureBackend", "False"]


@pytest.mark.slow
def test_missing_triton_says_what_to_install(tmp_path):
    path = make_llama_checkpoint(str(tmp_path / "llama"))
    proc = run_python(FAKE_GPU + f"""
import importlib.util
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "triton" else find_spec(name, *a)
from builtin_plugins.triton_kernels import load
try:
    load("rms_norm")
except ImportError as exc:
    print("kernel:", exc)
from kernelcore.config_builder import build_config
build_config(model={path!r})
""", check=False)
    assert proc.returncode != 0
    assert "kernel:" in proc.stdout and "pip install 'kernelcore[cuda]'" in proc.stdout
    assert "pip install 'kernelcore[cuda]'" in proc.stderr


def test_kernel_table_registers_lazily_and_cpu_overrides_with_torch():
    out = run_python("""
        import sys
        from kernelcore import platforms, plugins
        from kernelcore.kernels import TORCH_REFERENCE_KERNELS, kernel_table
        platforms.load_general_plugins()
        before = kernel_table.winners()
        assert set(before) == set(TORCH_REFERENCE_KERNELS), before
        assert all(w.startswith("triton_kernels:triton_") for w in before.values()), before
        plugins.get_plugin_manager().hook.register_triton_kernel_overrides(kernels=kernel_table)
        after = kernel_table.winners()
        # every kernel falls back to torch, but fused_moe, which gets the CPU's prepacked-expert version
        assert after.pop("fused_moe") == "cpu:onednn_fused_moe", after
        for name in ("rms_norm", "fused_add_rms_norm", "rotary_embedding", "silu_and_mul"):  # native, torch fallback
            assert after.pop(name) == f"cpu:{name}", after
        assert all(w.startswith("cpu:torch_") for w in after.values()), after
        print("triton" in sys.modules)
    """).stdout.split()
    assert out == ["False"]  # registering (and overriding) never imports triton


class _Runner:
    def kv_cache_bytes_per_block(self):
        return 1 << 20


@pytest.mark.parametrize("kv_cache_memory,expected", [(None, (72 - 8) * 1024), (1 << 30, 1024),
                                                       (100 << 30, "only")])
def test_kv_budget_from_free_device_memory(monkeypatch, kv_cache_memory, expected):
    from builtin_plugins.cuda.worker import CudaWorker
    from kernelcore.config import CacheConfig, KernelConfig, ModelConfig, SchedulerConfig

    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (72 * gib, 80 * gib))
    cache = CacheConfig() if kv_cache_memory is None else CacheConfig(kv_cache_memory=kv_cache_memory)
    config = KernelConfig(model=ModelConfig(max_model_len=1 << 20), cache=cache,
                          scheduler=SchedulerConfig(max_num_seqs=1 << 10))
    worker = CudaWorker(config)
    worker.device, worker.model_runner = torch.device("cpu"), _Runner()
    if expected == "only":
        with pytest.raises(ValueError, match="only"):
            worker.determine_num_blocks()
    else:
        # default: 72 GiB free less 10% of 80 GiB, in 1 MiB blocks; a user budget is kept
        assert worker.determine_num_blocks() == expected


def test_cuda_model_runner_moves_inputs_and_cache_to_its_device(tmp_path):
    """The device plumbing, checked with device=cpu: same logits as the plain runner."""
    from builtin_plugins.cuda.worker import CudaModelRunner
    from kernelcore.config_builder import build_config
    from kernelcore.executor.model_runner import ModelRunner, SeqBatchEntry

    config = build_config(model=make_llama_checkpoint(str(tmp_path / "llama")), dtype="float32", block_size=16)
    logits = []
    for runner in (ModelRunner(config), CudaModelRunner(config, torch.device("cpu"))):
        runner.load_model()
        runner.allocate_kv_cache(4)
        logits.append(runner.execute([SeqBatchEntry([5, 6, 7, 8], 0, [0], 4), SeqBatchEntry([9, 10], 0, [1], 2)]))
    torch.testing.assert_close(logits[0], logits[1])
