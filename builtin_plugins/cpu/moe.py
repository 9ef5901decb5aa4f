"""The CPU platform's ``fused_moe`` kernel: the core's grouped experts with oneDNN-prepacked expert weights.

At the few rows an expert receives per decode step, ``F.linear`` repacks the weight on every call; prepacking
each expert's slice once is 2-4x faster there (docs/performance.md), the numerics equal within fp32 rounding.
"""

from __future__ import annotations

import torch

from builtin_plugins.cpu.linear import _PACKED_DTYPES
from kernelcore.kernels import torch_fused_moe as grouped_experts


def _packed_experts(weight: torch.Tensor) -> list[torch.Tensor]:
    """Each expert's prepacked [out, in] weight, cached on the parameter and rebuilt when it changes."""
    key = (weight.data_ptr(), None if weight.is_inference() else weight._version, weight.shape)
    cached = weight.__dict__.get("_onednn_experts")
    if cached is None or cached[0] != key:
        with torch.no_grad():
            cached = (key, [torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous()) for w in weight])
        weight.__dict__["_onednn_experts"] = cached
    return cached[1]


def _onednn_expert_linear(rows: torch.Tensor, weight: torch.Tensor, expert: int) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(rows, _packed_experts(weight)[expert], None, "none", [], "")


def onednn_fused_moe(x, w13, w2, topk_weights, topk_ids):
    if (x.device.type != "cpu" or x.dtype not in _PACKED_DTYPES or w13.dtype != x.dtype
            or (w13.requires_grad and torch.is_grad_enabled())):
        return grouped_experts(x, w13, w2, topk_weights, topk_ids)
    return grouped_experts(x, w13, w2, topk_weights, topk_ids, linear=_onednn_expert_linear)
