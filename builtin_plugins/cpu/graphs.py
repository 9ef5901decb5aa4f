"""CPU decode graphs: the decode forward recorded once per batch size as a tape of kernel calls, replayed
without the Python around them.

At batch 1 a decode step's kernels take a few milliseconds and the Python that reaches them (module calls,
argument checks, dispatch) about as long again. Capturing runs the forward once, eagerly, and records in
order every native kernel launch (launch.py's ``launch``: the raw ctypes call and its arguments) and every torch op
that computes (through a dispatch mode; views and allocations are only kept alive). Replaying calls the
recorded launches and ops again on the same tensors: the model runner's static input buffers feed the
first, each op's output tensor is rewritten in place, and the last one holds the logits. A run of consecutive
native launches is replayed by one call into C (``kc_run_packed``, csrc/packed_call.h), its arguments packed
once at capture: a decode step's hundred-odd launches then cost no Python between them.

As with CUDA graphs every host value is frozen: a forward that reads a tensor's value on the host
(``.item()``, ``.tolist()``) cannot be captured, and the model runner then runs it eagerly. Native kernels
keep their own bounds checks (block tables, slots, positions) at replay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# NativeCall, PackedRun and pack_words are also re-exported under the names they had here before they moved
# down to launch.py.
from builtin_plugins.cpu.launch import NativeCall as _NativeCall  # noqa: F401
from builtin_plugins.cpu.launch import PackedRun as _PackedRun  # noqa: F401
from builtin_plugins.cpu.launch import pack_runs, recording
from builtin_plugins.cpu.launch import pack_words as _words  # noqa: F401
from builtin_plugins.cpu.pointwise import load_pointwise_kernels
from kernelcore import envs
from kernelcore.executor.graph_runner import GraphCaptureBackend

logger = logging.getLogger("kernelcore.cpu")

aten = torch.ops.aten
# Ops that only allocate or describe memory: nothing to redo at replay, but their tensors must stay alive.
_NO_COMPUTE = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default, aten.detach.default,
               aten.alias.default, aten.lift_fresh.default}
_HOST_READS = {aten._local_scalar_dense.default, aten.item.default}
# Ops whose output shape depends on the values: a replay would need another shape.
_DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
                   aten.unique_consecutive.default, aten.bincount.default, aten.argwhere.default}


class CaptureRefused(RuntimeError):
    """The forward did something a replay could not repeat (it read a tensor's value on the host)."""


def _pack_runs(calls: list[Callable[[], None]]) -> list[Callable[[], None]]:
    """The tape with every run of two or more packable native launches replayed from C (when the pointwise
    library, which holds the runner, is built)."""
    kernels = load_pointwise_kernels()
    return calls if kernels is None else pack_runs(calls, kernels.run_packed)


class _TorchCall:
    __slots__ = ("func", "args", "kwargs", "out")

    def __init__(self, func, args: tuple, kwargs: dict, out: Any) -> None:
        self.func, self.args, self.kwargs, self.out = func, args, kwargs, out

    def __call__(self) -> None:
        result = self.func(*self.args, **self.kwargs)
        outs, results = (self.out, result) if isinstance(self.out, (tuple, list)) else ((self.out,), (result,))
        for out, new in zip(outs, results, strict=False):
            if isinstance(out, torch.Tensor) and new is not out:  # in-place ops return their argument
                if new.shape != out.shape:
                    raise RuntimeError(f"{self.func} changed shape at replay: {tuple(out.shape)} -> {tuple(new.shape)}")
                out.copy_(new)


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch otherwise wraps __torch_dispatch__ in torch._dynamo.disable, whose first call imports dynamo and
        # triton (about 150 MiB resident in every CPU worker); nothing is compiled under this mode.
        return False

    def __init__(self, tape: list, keep: list) -> None:
        super().__init__()
        self.tape, self.keep = tape, keep

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS:
            raise CaptureRefused(f"the forward reads a tensor on the host ({func})")
        if func in _DATA_DEPENDENT or (func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None) \
                or (func is aten.index.Tensor and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                                      for i in args[1])):
            raise CaptureRefused(f"the forward's shapes depend on tensor values ({func})")
        out = func(*args, **kwargs)
        if func in _NO_COMPUTE or (func.is_view and _aliases_an_input(out, args)):
            self.keep.append(out)
        else:
            self.tape.append(_TorchCall(func, args, kwargs, out))
        return out


def _refuse_host_read(self, *args, **kwargs):
    raise CaptureRefused("the forward reads a tensor on the host (tolist/numpy)")


def _aliases_an_input(out: Any, args: tuple) -> bool:
    """Whether ``out`` shares memory with an input. Ops that may alias (reshape, contiguous, split of a
    non-contiguous tensor under inference mode) copy instead when they must: those are computed again."""
    storages = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return all(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in storages for o in outs)


class CpuTape:
    """One captured forward."""

    def __init__(self, calls: list[Callable[[], None]], keep: list, output: torch.Tensor) -> None:
        self.calls, self.keep, self.output = _pack_runs(calls), keep, output

    def replay(self) -> torch.Tensor:
        for call in self.calls:
            call()
        # A copy: the caller may keep the logits past the next replay (a few rows: a few microseconds).
        return self.output.clone()


class CpuGraphBackend(GraphCaptureBackend):
    """The CPU platform's decode graphs (``get_graph_capture_backend_cls``). Each captured size keeps its own
    intermediate tensors, so only small batches are captured (``KC_CPU_GRAPH_MAX_BATCH``, default 8): there
    the Python is a large share of the step; larger batches are dominated by their matmuls."""

    name = "CPU kernel-tape"

    def __init__(self) -> None:
        self.max_capture_size = envs.KC_CPU_GRAPH_MAX_BATCH

    def capture(self, fn: Callable[[], torch.Tensor]) -> CpuTape:
        from kernelcore.distributed import get_tp_group

        if get_tp_group().world_size > 1:  # gloo collectives run outside the dispatcher: a tape would skip them
            raise CaptureRefused("tensor-parallel collectives are not recorded; decode steps run eagerly")
        calls: list[Callable[[], None]] = []
        keep: list = []
        # tolist() and numpy() read values without dispatching an op the recorder would see.
        saved = torch.Tensor.tolist, torch.Tensor.numpy
        torch.Tensor.tolist = torch.Tensor.numpy = _refuse_host_read  # type: ignore[method-assign,assignment]
        try:
            with recording(calls), _Recorder(calls, keep):  # native launches and torch ops, in one order
                output = fn()
        finally:
            torch.Tensor.tolist, torch.Tensor.numpy = saved  # type: ignore[method-assign]
        if not isinstance(output, torch.Tensor):
            raise CaptureRefused("the captured forward did not return a tensor")
        return CpuTape(calls, keep, output)
