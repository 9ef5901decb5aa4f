"""GGUF quantized weights kept as their stored blocks: loading them into a layer and cutting them into parts.

A quantized GGUF tensor reaches the loader as uint8 [rows, row_bytes] (``tensor.gguf_blocks``). For a layer whose
linear method sets ``loads_gguf_blocks``, the layer's own weight_loader runs unchanged but on a uint8 buffer per
GGUF type instead of its float weight: a fused qkv/gate_up loader narrows rows, a row-parallel one narrows bytes
at block boundaries, exactly as it narrows a float weight. A bool mask per (row, block) is loaded the same way to
record which rows each type filled. After loading, :func:`parts` turns that into contiguous row ranges of one type
each (q, k and v may be stored in three different types), and the float weight is freed: only the file's blocks
stay in memory. Every other layer (and every layer whose rows cannot be cut at block boundaries, e.g. a
row-parallel shard of a 256-value super-block) gets the tensor dequantized to float, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

logger = logging.getLogger("kernelcore.models")

FLOAT_TYPES = ("F32", "F16", "BF16")


def block_size(type_name: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a GGUF type."""
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]


def dequantize_blocks(raw: torch.Tensor, type_name: str) -> torch.Tensor:
    """Stored blocks uint8 [rows, row_bytes] -> float32 [rows, cols], exactly gguf.quants.dequantize."""
    import gguf

    array = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[type_name])
    return torch.from_numpy(array.reshape(raw.shape[0], -1))


@dataclass
class _Typed:
    blocks: torch.Tensor  # uint8 [rows, row_bytes(cols)]: this rank's rows, filled where mask says
    mask: torch.Tensor  # bool [rows, blocks per row]


class BlockStore:
    """The per-type block buffers of one weight parameter while it loads (``param.gguf_store``)."""

    def __init__(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self.typed: dict[str, _Typed] = {}
        self.float_mask = torch.zeros(rows, 1, dtype=torch.bool)  # rows loaded as float into the parameter

    def fits(self, type_name: str) -> bool:
        return self.cols % block_size(type_name)[0] == 0

    def load(self, inner: Callable[..., None], tensor: torch.Tensor, args: tuple) -> None:
        kind = getattr(tensor, "gguf_type")
        values, nbytes = block_size(kind)
        typed = self.typed.get(kind)
        if typed is None:
            blocks_per_row = self.cols // values
            typed = self.typed[kind] = _Typed(torch.zeros(self.rows, blocks_per_row * nbytes, dtype=torch.uint8),
                                              torch.zeros(self.rows, blocks_per_row, dtype=torch.bool))
        inner(typed.blocks, tensor, *args)
        # the same narrowing, on a zero-memory "every block" marker the size of the tensor's block grid
        full_rows, full_cols = getattr(tensor, "gguf_shape")
        inner(typed.mask, torch.ones((), dtype=torch.bool).expand(full_rows, full_cols // values), *args)

    def mark_float(self, inner: Callable[..., None], tensor: torch.Tensor, args: tuple) -> None:
        """Record the rows a float tensor fills: the loader's narrowing on a zero-memory marker, one column per
        rank's share of the tensor's columns (a row-parallel loader narrows dim 1 too)."""
        marker = torch.ones((), dtype=torch.bool).expand(tensor.shape[0], max(1, tensor.shape[-1] // self.cols))
        mask = torch.zeros(self.rows, 1, dtype=torch.bool)
        inner(mask, marker, *args)
        self.float_mask |= mask


class GGUFPart(nn.Module):
    """Rows ``start:stop`` of a layer's weight, all stored in one GGUF type: the layer a ``gguf_<type>`` method
    processes and applies. Quantized: ``qweight`` uint8 [rows, row_bytes]; float: ``weight`` [rows, cols]."""

    start: int
    stop: int
    input_size: int
    output_size: int
    gguf_type: str
    params_dtype: torch.dtype  # the model dtype (embedding rows come out in it); set by the gguf method
    qweight: torch.Tensor
    quant_method: Any  # the gguf_<type> method computing this part

    def __init__(self, start: int, stop: int, cols: int, gguf_type: str, data: torch.Tensor) -> None:
        super().__init__()
        self.start, self.stop, self.input_size, self.output_size = start, stop, cols, stop - start
        self.gguf_type = gguf_type
        if gguf_type in FLOAT_TYPES:
            self.weight = nn.Parameter(data, requires_grad=False)
        else:
            self.register_buffer("qweight", data, persistent=False)


def _runs(row_kind: list[int]) -> list[tuple[int, int, int]]:
    runs: list[tuple[int, int, int]] = []
    for row, kind in enumerate(row_kind):
        if runs and runs[-1][2] == kind:
            runs[-1] = (runs[-1][0], row + 1, kind)
        else:
            runs.append((row, row + 1, kind))
    return runs


def parts(param: nn.Parameter) -> list[GGUFPart] | None:
    """The parameter's rows as parts of one type each (computed once, shared by a tied embedding and LM head),
    or None when it loaded no GGUF blocks (every row float: the parameter stays as it is)."""
    cached = getattr(param, "gguf_parts", None)
    if cached is not None:
        return cached
    store: BlockStore | None = getattr(param, "gguf_store", None)
    if store is None or not store.typed:
        return None
    kinds = list(store.typed)
    coverage = torch.stack([t.mask.any(dim=1) for t in store.typed.values()] + [store.float_mask[:, 0]])
    if bool((coverage.sum(dim=0) > 1).any()):
        raise ValueError("GGUF tensors of different types were loaded into the same rows of one weight")
    # row -> index of its type (len(kinds) = float, len(kinds) + 1 = never loaded: vocabulary padding)
    row_kind = torch.where(coverage.any(dim=0), coverage.int().argmax(dim=0), len(kinds) + 1).tolist()
    result = []
    for start, stop, index in _runs(row_kind):
        if index < len(kinds):
            kind, data = kinds[index], store.typed[kinds[index]].blocks[start:stop].clone()
        else:  # float rows, and padding rows (zero: a padded vocabulary's logits are cut away)
            kind = "F32"
            data = param.data[start:stop].float().clone() if index == len(kinds) else \
                torch.zeros(stop - start, store.cols)
        result.append(GGUFPart(start, stop, store.cols, kind, data))
    delattr(param, "gguf_store")
    setattr(param, "gguf_parts", result)
    param.data = torch.empty(0, store.cols, dtype=param.dtype)  # the float copy goes; the blocks are the weight
    return result


def _accepts_blocks(module: nn.Module) -> bool:
    return bool(getattr(getattr(module, "quant_method", None), "loads_gguf_blocks", False))


def record_gguf_types(model: nn.Module) -> None:
    """Wrap every weight's weight_loader for a GGUF checkpoint: each module learns the GGUF types its weight was
    loaded from (``module.gguf_types``; a fused qkv/gate_up weight collects every part's type), and stored blocks
    go to the parameter's :class:`BlockStore` where the module's method computes with blocks, else to float."""
    from kernelcore.layers.linear import default_weight_loader

    for module in model.modules():
        param = module._parameters.get("weight")
        if param is None:
            continue
        inner = getattr(param, "weight_loader", default_weight_loader)

        def loader(p, tensor, *args, _inner=inner, _module=module, _param=param):
            kind = getattr(tensor, "gguf_type", None)
            if kind is not None:
                _module.__dict__.setdefault("gguf_types", set()).add(kind)
            if p is not _param:  # a wrapped loader of a tied weight, already redirected by the outer wrapper
                return _inner(p, tensor, *args)
            store = getattr(_param, "gguf_store", None)
            if store is None and _accepts_blocks(_module) and _param.dim() == 2:
                store = BlockStore(*_param.shape)
                setattr(_param, "gguf_store", store)
            if getattr(tensor, "gguf_blocks", False):
                if store is not None and store.fits(kind):
                    return store.load(_inner, tensor, args)
                logger.info("GGUF %s tensor %s kept in float for %s (rows of %d values do not split into its "
                            "blocks, or the layer's method computes in float)", kind, tuple(tensor.shape),
                            type(_module).__name__, _param.shape[-1])
                tensor = dequantize_blocks(tensor, kind)
            if store is not None:
                store.mark_float(_inner, tensor, args)
            return _inner(p, tensor, *args)

        setattr(param, "weight_loader", loader)
