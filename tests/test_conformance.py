"""The conformance kit (`kc plugins check NAME`): passes for the built-in CPU platform and the dummy vendor
platform, and each numeric check catches a broken implementation."""

import json

import pytest
import torch
from helpers import run_kc

from kernelcore.conformance import numerics


@pytest.mark.slow
@pytest.mark.parametrize("name,env", [("cpu", {}), ("dummy_platform", {"KC_DUMMY_DEVICE": "1"})])
def test_conformance_kit_passes(name, env):
    proc = run_kc("plugins", "check", name, "--json", check=False, **env)
    results = json.loads(proc.stdout)
    assert proc.returncode == 0, [r for r in results if not r["ok"]]
    assert len(results) == 8 and all(r["ok"] for r in results)
    if name == "dummy_platform":
        ops = next(r for r in results if r["name"].startswith("op replacements"))
        assert "DummyRotaryEmbedding (forward_oot) matches forward_native" in ops["detail"]


def test_absent_device_fails_detection_and_exits_1():
    proc = run_kc("plugins", "check", "dummy_platform", check=False)
    assert proc.returncode == 1
    assert "FAIL  detection is cheap and side-effect free: detect_platform returned None here" in proc.stdout


def test_attention_check_passes_the_cpu_backend_and_catches_a_wrong_one():
    from builtin_plugins.cpu.attention import CpuAttentionBackend

    assert "matches reference attention" in numerics.check_attention_backend(CpuAttentionBackend, block_size=16)

    class OffByOneScale(CpuAttentionBackend.get_impl_cls()):
        def forward(self, q, k, v, kv_cache, metadata):
            out = super().forward(q, k, v, kv_cache, metadata)
            return out if metadata.max_query_len > 1 else out * 1.01  # wrong on decode steps only

    class Broken(CpuAttentionBackend):
        @classmethod
        def get_impl_cls(cls):
            return OffByOneScale

    with pytest.raises(AssertionError, match="ragged decode|decode step"):
        numerics.check_attention_backend(Broken, block_size=16)


def test_op_check_catches_a_replacement_that_differs(monkeypatch):
    from kernelcore.custom_op import op_registry_oot
    from kernelcore.layers import RMSNorm

    class SloppyRMSNorm(RMSNorm):
        def forward_cpu(self, x, residual=None):
            out = super().forward_cpu(x, residual)
            return (out[0] + 1e-2, out[1]) if residual is not None else out

    monkeypatch.setitem(op_registry_oot, "RMSNorm", SloppyRMSNorm)
    with pytest.raises(AssertionError, match="SloppyRMSNorm .* differs from RMSNorm.forward_native"):
        numerics.check_op_replacements()

    class NotASubclass(torch.nn.Module):
        pass

    monkeypatch.setitem(op_registry_oot, "RMSNorm", NotASubclass)
    with pytest.raises(AssertionError, match="does not subclass"):
        numerics.check_op_replacements()


@pytest.mark.slow
def test_kc_plugins_shows_platform_hooks_replaced_ops_and_kernel_winners():
    report = json.loads(run_kc("plugins", "--json", KC_DUMMY_DEVICE="1", KC_DUMMY_OPS="1").stdout)
    assert {"update_block_size_for_backend", "register_triton_kernel_overrides"} <= set(report["platform"]["hooks"])
    assert "detect_platform" not in report["platform"]["hooks"]
    assert report["ops"]["RotaryEmbedding"] == {"class": "kc_dummy_platform.ops.DummyRotaryEmbedding",
                                                "plugin": "dummy_custom_ops"}
    assert report["ops"]["RMSNorm"]["plugin"] == "dummy_ops"
    assert report["kernels"]["rms_norm"] == "dummy_platform:dummy_rms_norm"
    assert report["kernels"]["paged_attention"].startswith("triton_kernels:")
    text = run_kc("plugins", KC_DUMMY_DEVICE="1").stdout
    assert "[replaced ops]" in text and "[kernel table: the implementation a worker runs]" in text
