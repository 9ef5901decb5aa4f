"""GGUF quantized parts on the CPU: the native kernels of gguf_native.py over the stored blocks.

Registered over the portable ``gguf_<type>`` methods (``register_quantization_methods``, override=True). Per call
the kernel's ``choose`` picks, from the row count, the type and the CPU: the float kernel (blocks dequantized in
registers, dotted with the activations in float32), the integer one (activations quantized per block to int8 the
way llama.cpp does, integer dot products), or for prefill-sized calls a dequantization of the weight into a reused
buffer and oneDNN's GEMM. Where the kernel cannot be built, the pure-torch reference runs.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from builtin_plugins.cpu.gguf_native import GGUFKernel, int_dot_types, load_gguf_kernel
from builtin_plugins.cpu.linear import _PACKED_DTYPES, _scratch_like
from builtin_plugins.cpu.linear_tuning import Candidates, Impl, run_tuned
from builtin_plugins.quantization.gguf import GGUFBlocksMethod
from kernelcore import envs
from kernelcore.models.gguf_params import GGUFPart

# Calls of up to this many rows (decode batches, speculative verifications of up to 15 drafts) take one path per
# part shape: each path computes a row the same whatever the call's other rows, so a token does not depend on the
# batch it shares or on speculation (the int and float paths round differently).
SAME_PATH_ROWS = 16
DEQUANT_TILE_BYTES = 1 << 20  # rows dequantized per GEMM: an L2-sized tile, written and read back from cache


def _dequant_linear(kernel: GGUFKernel, x: torch.Tensor, layer: GGUFPart, bias: torch.Tensor | None) -> torch.Tensor:
    """Prefill-sized: the part dequantized a tile of rows at a time (bf16 where oneDNN has a bf16 GEMM and x is
    bf16, else float32) into one buffer kept per thread, each tile multiplied as it is made. A whole-weight
    buffer would hold the largest weight in float (Gemma's LM head: 671 MB) and stream it through memory twice;
    measured on SmolLM2's Q4_1 layers at 128 rows, 1 MiB tiles beat 256 KiB ones and the float kernel."""
    dtype = torch.bfloat16 if x.dtype == torch.bfloat16 and torch.bfloat16 in _PACKED_DTYPES else torch.float32
    raw, num_in, num_out = layer.qweight, layer.input_size, layer.output_size
    step = max(1, min(num_out, DEQUANT_TILE_BYTES // (num_in * dtype.itemsize)))
    tile = _scratch_like(torch.empty(step, num_in, device="meta"), dtype)
    xd = x.to(dtype)
    y = torch.empty(x.shape[0], num_out, dtype=dtype)
    for start in range(0, num_out, step):
        rows = min(step, num_out - start)
        kernel.dequantize(raw[start:start + rows], layer.gguf_type, tile[:rows])
        y[:, start:start + rows] = xd @ tile[:rows].t()
    if bias is not None:
        y += bias.to(dtype)
    return y.to(x.dtype)


class CpuGGUFMethod(GGUFBlocksMethod):
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        kernel = load_gguf_kernel()
        part = cast(GGUFPart, layer)
        self.kernel = kernel if kernel is not None and kernel.supports(part.gguf_type) else None
        # read once: apply is on every decode step
        self.allow_int = part.gguf_type in int_dot_types(envs.KC_CPU_GGUF_INT_DOT) and GGUFKernel.supports(
            part.gguf_type, int_dot=True)

    def candidates(self, layer: nn.Module) -> Candidates:
        """The ways this part's matmul can run here, for the start-up tuning (linear_tuning.py): the float kernel,
        dequantized tiles + GEMM, and the int kernel where the quality policy allows it for this type."""
        kernel, part = self.kernel, cast(GGUFPart, layer)
        impls: dict[str, Impl] = {}
        if kernel is not None:
            def native(how: str) -> Impl:
                def impl(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
                    return self._run(how, cast(GGUFPart, layer), x, bias)
                return impl

            impls = {how: native(how) for how in kernel.options(part.gguf_type) if how != "int" or self.allow_int}
        key = (type(self).__name__, (part.output_size, part.input_size), part.gguf_type, "int" in impls)
        return Candidates(key, part.params_dtype, impls, in_features=part.input_size, same_upto=SAME_PATH_ROWS,
                          row_exact=("float", "int"))  # (dequant's GEMM may sum a row differently per row count)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        kernel, part = self.kernel, cast(GGUFPart, layer)
        if kernel is None or x.dtype not in (torch.float32, torch.bfloat16) or x.device.type != "cpu":
            return super().apply(layer, x, bias)
        y = run_tuned(layer, x, bias)
        if y is not None:
            return y
        x2 = x.reshape(-1, x.shape[-1])
        how = kernel.choose(part.gguf_type, x2.shape[0], part.output_size, part.input_size, dtype=x.dtype,
                            allow_int=self.allow_int)
        return self._run(how, part, x, bias)

    def _run(self, how: str, part: GGUFPart, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        kernel = cast(GGUFKernel, self.kernel)
        x2 = x.reshape(-1, x.shape[-1])
        if how == "dequant":
            y = _dequant_linear(kernel, x2, part, bias)
        else:
            y = kernel.matmul(x2, part.qweight, part.gguf_type, bias, int_dot=how == "int")
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        kernel, part = self.kernel, cast(GGUFPart, layer)
        if kernel is None or part.params_dtype not in (torch.float32, torch.bfloat16):
            return super().embedding(layer, ids)
        rows = part.qweight[ids.reshape(-1)]
        out = torch.empty(rows.shape[0], part.input_size, dtype=part.params_dtype)
        kernel.dequantize(rows, part.gguf_type, out)
        return out.reshape(*ids.shape, part.input_size)
