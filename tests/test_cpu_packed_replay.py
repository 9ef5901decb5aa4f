"""A CPU decode tape's runs of native launches replayed by one call into C (csrc/packed_call.h, kc_run_packed):
the arguments packed as 64-bit words (floats by their bit pattern), the same results as the ctypes calls, and a
failing launch stops the run and is named in the error (the tests in test_cpu_graphs.py run whole models)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from builtin_plugins.cpu.graphs import CpuTape, _NativeCall, _PackedRun, _words
from builtin_plugins.cpu.pointwise import load_pointwise_kernels

kernels = load_pointwise_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="no C++ compiler: the torch paths are used")


def rms_norm_call(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float, hidden: int | None = None):
    return _NativeCall(kernels.rms_norm, (1 if x.dtype == torch.bfloat16 else 0, x.data_ptr(), x.stride(0), None, 0,
                                          weight.data_ptr(), out.data_ptr(), out.stride(0), x.shape[0],
                                          x.shape[1] if hidden is None else hidden, eps, 1))


def test_words_are_integers_pointers_and_float_bits():
    argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_float, ctypes.c_double, ctypes.c_int64]
    words = _words(argtypes, (3, None, 1.0, -2.0, ctypes.c_int64(1 << 40)))
    assert words == [3, 0, 0x3F800000, -0x4000000000000000, 1 << 40]
    assert _words([ctypes.c_void_p], ("not a value",)) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_run_computes_what_the_ctypes_calls_do(dtype):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(3, 96, generator=g).to(dtype) for _ in range(4)]
    weight = torch.rand(96, generator=g).to(dtype) + 0.5
    by_ctypes = [torch.empty_like(x) for x in xs]
    by_c = [torch.empty_like(x) for x in xs]
    for x, out in zip(xs, by_ctypes, strict=True):
        rms_norm_call(x, weight, out, 1e-5)()
    calls = [rms_norm_call(x, weight, out, 1e-5) for x, out in zip(xs, by_c, strict=True)]
    tape = CpuTape(list(calls), [], by_c[-1])
    assert len(tape.calls) == 1 and isinstance(tape.calls[0], _PackedRun)
    tape.replay()
    for a, b in zip(by_ctypes, by_c, strict=True):
        assert torch.equal(a, b)


def test_a_failing_launch_stops_the_run_and_is_named():
    x, weight = torch.randn(2, 64), torch.ones(64)
    outs = [torch.zeros(2, 64) for _ in range(3)]
    calls = [rms_norm_call(x, weight, outs[0], 1e-5), rms_norm_call(x, weight, outs[1], 1e-5, hidden=0),
             rms_norm_call(x, weight, outs[2], 1e-5)]
    run = _PackedRun(calls, kernels.run_packed)
    with pytest.raises(ValueError, match=r"kc_rms_norm failed at replay \(-1\)"):
        run()
    assert outs[0].abs().sum() > 0 and outs[2].abs().sum() == 0  # the first ran, the one after the failure did not
