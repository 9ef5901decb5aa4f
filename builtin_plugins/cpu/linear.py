"""The CPU platform's linear methods: oneDNN-prepacked float weights, and an int8 weight-only matmul.

Registered over the core's ``none`` and ``int8`` methods (``register_quantization_methods``, override=True), so
the core's linear layers hold no CPU-specific code.
"""

from __future__ import annotations

import threading
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from builtin_plugins.cpu.linear_tuning import Candidates, Impl, run_tuned
from builtin_plugins.cpu.small_gemm import SmallGemmKernel, load_small_gemm_kernel
from kernelcore.layers.linear import Int8LinearMethod, UnquantizedLinearMethod

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
_INT8_MM = hasattr(torch, "_weight_int8pack_mm")


def _onednn_dtypes() -> tuple[torch.dtype, ...]:
    """oneDNN's bf16 linear needs avx512bw/vl/dq or avx_ne_convert; without them only fp32 is prepacked."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=torch.bfloat16))
        return torch.float32, torch.bfloat16
    except RuntimeError:
        return (torch.float32,)


_PACKED_DTYPES = _onednn_dtypes() if _ONEDNN else ()


def fast_linear(module: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` through oneDNN with the weight prepacked once per module (fp32/bf16 CPU tensors, no autograd).

    Prepacking skips MKL's per-call repacking of the weight: 1.5-2x the GFLOP/s of ``F.linear`` at decode
    batch sizes (8-128 rows), equal numerics within fp32 rounding (docs/performance.md). The packed copy is
    rebuilt when the weight changes (version counter / storage), and is not part of the state dict."""
    if (weight.dtype not in _PACKED_DTYPES or x.dtype != weight.dtype or x.device.type != "cpu"
            or (weight.requires_grad and torch.is_grad_enabled())):
        return F.linear(x, weight, bias)
    key = (weight.data_ptr(), None if weight.is_inference() else weight._version, weight.shape)
    packed = module.__dict__.get("_onednn_weight")
    if packed is None or packed[0] != key:
        with torch.no_grad():
            packed = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach()))
        module.__dict__["_onednn_weight"] = packed
    return torch.ops.mkldnn._linear_pointwise(x, packed[1], bias, "none", [], "")


def _tensor(layer: nn.Module, name: str) -> torch.Tensor:
    return cast(torch.Tensor, getattr(layer, name))


def _native_variants(kernel: SmallGemmKernel, weight_name: str, scale_name: str | None, pair_dot: bool,
                     float32_weight: bool = False) -> dict[str, Impl]:
    """The native kernel with each prefetch distance, with float lanes where pair dot products would apply,
    and for a float32 weight with its rows walked one at a time at one activation row (``-seq``)."""

    def variant(float_lanes: bool, far_prefetch: bool, single_stream: bool = False) -> Impl:
        def native(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
            scale = _tensor(layer, scale_name) if scale_name else None
            return kernel.run(x, _tensor(layer, weight_name), scale, bias, owner=layer, float_lanes=float_lanes,
                              far_prefetch=far_prefetch, single_stream=single_stream)
        return native

    variants = {"native": variant(False, False), "native-far": variant(False, True)}
    if pair_dot:
        variants.update({"native-float": variant(True, False), "native-float-far": variant(True, True)})
    if float32_weight:
        variants.update({"native-seq": variant(False, False, True), "native-seq-far": variant(False, True, True)})
    return variants


class OneDnnLinearMethod(UnquantizedLinearMethod):
    """Decode-sized calls (a few rows) through the native small-M kernel, the rest through oneDNN/MKL."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        super().process_weights_after_loading(layer)
        self._kernel = load_small_gemm_kernel()

    def prepack(self, layer: nn.Module) -> None:
        """Pack the weight for oneDNN now (for a dtype oneDNN serves), not in the first batch that needs it."""
        weight = cast(torch.Tensor, layer.weight)
        if weight.dtype in _PACKED_DTYPES and weight.device.type == "cpu":
            with torch.inference_mode():
                fast_linear(layer, weight.new_zeros(1, weight.shape[-1]), weight, None)

    def candidates(self, layer: nn.Module) -> Candidates:
        """The ways this layer's matmul can run here, for the start-up tuning (linear_tuning.py)."""
        weight = _tensor(layer, "weight")
        kernel = getattr(self, "_kernel", None)

        def torch_linear(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            return F.linear(x, _tensor(layer, "weight"), bias)

        def onednn(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            return fast_linear(layer, x, _tensor(layer, "weight"), bias)

        def upcast(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            return _upcast_linear(x, _tensor(layer, "weight"), bias)

        impls: dict[str, Impl] = {"torch": torch_linear}
        if kernel is not None:
            impls.update(_native_variants(kernel, "weight", None, kernel.pair_dot and weight.dtype == torch.bfloat16,
                                          weight.dtype == torch.float32))
        if weight.dtype in _PACKED_DTYPES:
            impls["onednn"] = onednn
        elif weight.dtype == torch.bfloat16:
            impls["upcast"] = upcast
        return Candidates((type(self).__name__, tuple(weight.shape), weight.dtype), weight.dtype, impls)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = run_tuned(layer, x, bias)
        if y is not None:
            return y
        weight = cast(torch.Tensor, layer.weight)
        kernel = getattr(self, "_kernel", None)
        if kernel is not None:
            y = kernel(x, weight, None, bias, owner=layer)
            if y is not None:
                return y
        if weight.dtype == x.dtype == torch.bfloat16 and torch.bfloat16 not in _PACKED_DTYPES:
            return _upcast_linear(x, weight, bias)
        return fast_linear(layer, x, weight, bias)


def prepack_linears(model: nn.Module) -> None:
    """Pack every oneDNN-served weight at start-up (after the weights found their final memory): the first large
    batch would otherwise pay for all of them (about a second for a 100M-parameter model)."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, OneDnnLinearMethod):
            method.prepack(module)


_scratch = threading.local()


def _scratch_like(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A ``dtype`` tensor of the weight's shape in a buffer kept per thread and dtype (grown, never shrunk)."""
    buffers = _scratch.__dict__.setdefault("buffers", {})
    buffer = buffers.get(dtype)
    if buffer is None or buffer.numel() < weight.numel():
        with torch.inference_mode(False):  # a normal tensor: written in place inside inference mode and out of it
            buffer = buffers[dtype] = torch.empty(weight.numel(), dtype=dtype)
    return buffer[:weight.numel()].view(weight.shape)


def _upcast_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   scale: torch.Tensor | None = None) -> torch.Tensor:
    """bf16 (or int8, with ``scale``) ``F.linear`` for calls the native kernel does not take (prefill-sized)
    where the CPU has no bf16 matmul (AVX2): the weight is upcast per call and the fp32 GEMM runs, 4-5x torch's
    bf16 ``F.linear`` (docs/performance.md); same fp32 accumulation, one rounding.
    The fp32 copy goes to a buffer kept per thread: a fresh tensor per call was a new mapping page-faulted in
    (tens of MB per step)."""
    upcast = _scratch_like(weight, torch.float32)
    if scale is None:
        upcast.copy_(weight)
    else:  # an int8 weight's per-output-channel scale, applied in the same pass (int8 -> float32 is exact)
        torch.mul(weight, scale[:, None], out=upcast)
    return F.linear(x.float(), upcast, None if bias is None else bias.float()).to(x.dtype)


def _int8_bf16_linear(x: torch.Tensor, qweight: torch.Tensor, bias: torch.Tensor | None,
                      scale: torch.Tensor) -> torch.Tensor:
    """A bf16-activation int8 linear for calls the native kernel does not take, where the CPU has bf16 dot
    products: the int8 weight is converted to bf16 (exact: every int8 is a bf16) in a reused buffer, oneDNN's bf16
    GEMM runs, and the per-output-channel scale is applied to its output (float32) before the one rounding."""
    widened = _scratch_like(qweight, torch.bfloat16)
    widened.copy_(qweight)
    y = F.linear(x, widened).float().mul_(scale)
    if bias is not None:
        y.add_(bias)
    return y.to(x.dtype)


class CpuInt8LinearMethod(Int8LinearMethod):
    """Reads the int8 weight directly (a quarter of fp32's bytes per token): the native kernel for decode
    steps and batches up to its row limit; larger calls convert the weight into a reused buffer (bf16 where the
    CPU has bf16 dot products, else dequantized float32) and run oneDNN/MKL; ``torch._weight_int8pack_mm``
    where the kernel could not be built."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        super().process_weights_after_loading(layer)
        self._kernel = load_small_gemm_kernel()
        if self._kernel is not None:
            scale = cast(torch.Tensor, layer.weight_scale)
            layer.register_buffer("weight_scale_f32", scale.float(), persistent=False)

    def candidates(self, layer: nn.Module) -> Candidates:
        """The ways this layer's matmul can run here, for the start-up tuning (linear_tuning.py)."""
        qweight, scale = _tensor(layer, "qweight"), _tensor(layer, "weight_scale")
        kernel = getattr(self, "_kernel", None)

        def widened(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            return _int8_bf16_linear(x, _tensor(layer, "qweight"), bias, _tensor(layer, "weight_scale_f32"))

        def upcast(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            return _upcast_linear(x, _tensor(layer, "qweight"), bias, _tensor(layer, "weight_scale_f32"))

        impls: dict[str, Impl] = {}
        if kernel is not None:
            impls.update(_native_variants(kernel, "qweight", "weight_scale_f32",
                                          kernel.pair_dot and scale.dtype == torch.bfloat16))
            if scale.dtype == torch.bfloat16 and torch.bfloat16 in _PACKED_DTYPES:
                impls["widened"] = widened  # the float32 upcast's work in half the bytes and a bf16 GEMM
            else:
                impls["upcast"] = upcast
        if _INT8_MM:
            impls["int8pack"] = _int8pack_linear
        return Candidates((type(self).__name__, tuple(qweight.shape), qweight.dtype), scale.dtype, impls)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = run_tuned(layer, x, bias)
        if y is not None:
            return y
        qweight, scale = cast(torch.Tensor, layer.qweight), cast(torch.Tensor, layer.weight_scale)
        kernel = getattr(self, "_kernel", None)
        if kernel is not None and x.dtype == scale.dtype:
            y = kernel(x, qweight, cast(torch.Tensor, layer.weight_scale_f32), bias, owner=layer)
            if y is not None:
                return y
        if kernel is not None and x.dtype == scale.dtype and x.device.type == "cpu":
            if kernel.pair_dot and x.dtype == torch.bfloat16:  # the CPU multiplies bf16 natively
                return _int8_bf16_linear(x, qweight, bias, cast(torch.Tensor, layer.weight_scale_f32))
            # Prefill-sized: dequantized into the reused float32 buffer, then oneDNN/MKL (1.4x
            # _weight_int8pack_mm at 2048 rows on AVX2; docs/performance.md).
            return _upcast_linear(x, qweight, bias, cast(torch.Tensor, layer.weight_scale_f32))
        if not _INT8_MM or x.dtype != scale.dtype or x.device.type != "cpu" or x.numel() == 0:
            return super().apply(layer, x, bias)
        return _int8pack_linear(layer, x, bias)


def _int8pack_linear(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """torch's int8 weight-only matmul (activations in the scale's dtype)."""
    x2 = x.reshape(-1, x.shape[-1])
    y = torch._weight_int8pack_mm(x2 if x2.is_contiguous() else x2.contiguous(), _tensor(layer, "qweight"),
                                  _tensor(layer, "weight_scale"))
    if bias is not None:
        y.add_(bias)
    return y.view(*x.shape[:-1], y.shape[-1])
