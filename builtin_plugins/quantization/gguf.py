"""Linear methods for GGUF checkpoints: each layer keeps the precision its GGUF tensor was stored in.

The loader hands every layer its weight dequantized to float (exactly: a Q8_0/Q4_0 value is an integer times a
float16 block scale) and tags the layer with the GGUF types it came from (``layer.gguf_types``). ``gguf`` then
asks the registry for the method named ``gguf_<type>`` and delegates to it, so a vendor adds a GGUF type
(Q4_K, ...) by registering ``gguf_q4_k`` from its own ``register_quantization_methods``.

Built in: float types stay float (the registry's ``none``: the platform's float matmul); Q8_0 and Q4_0 are
repacked to the ``int8`` method's per-output-channel format (the platform's int8 matmul). For Q8_0 this
re-rounds each row onto one scale instead of one per 32 weights (a small, measured error on top of Q8_0's);
for Q4_0 the 16-level blocks fit the 255-level rows almost exactly, but memory is 8 bits per weight, not 4.5.
"""

from __future__ import annotations

import logging

from torch import nn

from kernelcore.layers.linear import LinearMethodBase

logger = logging.getLogger("kernelcore.quantization")


def _registered(name: str) -> LinearMethodBase:
    from kernelcore.quantization import get_quantization_registry

    return get_quantization_registry().get(name)()


class _Delegating(LinearMethodBase):
    """Chooses the real method at ``process_weights_after_loading`` (the GGUF type is known only then)."""

    inner: LinearMethodBase | None = None

    def choose(self, layer: nn.Module) -> LinearMethodBase:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.inner = self.choose(layer)
        self.inner.process_weights_after_loading(layer)

    def apply(self, layer, x, bias):
        return self.inner.apply(layer, x, bias)

    def __getattr__(self, name: str):  # e.g. dequantized_weight of an int8 inner method
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


class GGUFLinearMethod(_Delegating):
    """``--quantization gguf`` (the default for a .gguf model): per layer, the method of its stored type."""

    def choose(self, layer: nn.Module) -> LinearMethodBase:
        from kernelcore.models.gguf_checkpoint import method_name

        types = sorted(layer.__dict__.get("gguf_types") or ())
        names = {method_name(kind) for kind in types}
        if len(names) != 1:  # parts of one fused weight stored differently (or nothing recorded): keep float
            if types:
                logger.info("GGUF parts stored as %s share one weight: kept in float", "/".join(types))
            return _registered("none")
        return _registered(names.pop())


class GGUFFloatMethod(_Delegating):
    """F32/F16/BF16 tensors: the unquantized method (in the model dtype)."""

    def choose(self, layer: nn.Module) -> LinearMethodBase:
        return _registered("none")


class GGUFInt8Method(_Delegating):
    """Q8_0/Q4_0 tensors: repacked to the int8 method's per-channel format (and the platform's int8 matmul)."""

    def choose(self, layer: nn.Module) -> LinearMethodBase:
        return _registered("int8")

