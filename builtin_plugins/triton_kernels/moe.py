"""fused_moe: the experts' SwiGLU MLPs as two grouped GEMM launches over token-expert assignments.

The T*k assignments are sorted by expert and each expert's run padded to BLOCK_M rows (padding rows hold an
out-of-range id and are masked), so every row tile belongs to one expert. Launch 1 gathers each row's token
and multiplies it by that expert's gate/up weights; silu_and_mul follows; launch 2 multiplies by the down
weights, scales by the routing weight and writes each assignment's row in (token, k) order, summed over k.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from builtin_plugins.triton_kernels.activation import silu_and_mul


@triton.jit
def _grouped_gemm_kernel(a_ptr, b_ptr, c_ptr, weights_ptr, sorted_ids_ptr, tile_expert_ptr, num_valid, N, K,
                         stride_am, stride_be, stride_bn, stride_bk, stride_cm,
                         TOP_K: tl.constexpr, A_ROW_IS_TOKEN: tl.constexpr, MUL_WEIGHT: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_ok = ids < num_valid
    a_rows = ids // TOP_K if A_ROW_IS_TOKEN else ids
    expert = tl.load(tile_expert_ptr + pid_m)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        a = tl.load(a_ptr + a_rows[:, None] * stride_am + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptr + expert * stride_be + n[None, :] * stride_bn + kk[:, None] * stride_bk,
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc += tl.dot(a, b)
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + ids, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(c_ptr + ids[:, None] * stride_cm + n[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=row_ok[:, None] & n_ok[None, :])


def _align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted assignment ids padded per expert to block_m with T*k, the expert of each row tile)."""
    flat = topk_ids.flatten()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    starts = torch.cumsum(padded, 0) - padded
    rank = torch.arange(flat.numel(), device=flat.device) - (torch.cumsum(counts, 0) - counts)[sorted_experts]
    sorted_ids = torch.full((int(padded.sum()),), flat.numel(), dtype=torch.int64, device=flat.device)
    sorted_ids[starts[sorted_experts] + rank] = order
    tile_expert = torch.repeat_interleave(torch.arange(num_experts, device=flat.device), padded // block_m)
    return sorted_ids, tile_expert


def _gemm(a, b, out, weights, sorted_ids, tile_expert, num_valid, top_k, a_row_is_token, mul_weight, block_m):
    num_experts, n, k = b.shape
    block_n = min(64, max(16, triton.next_power_of_2(n)))
    block_k = min(64, max(16, triton.next_power_of_2(k)))
    grid = (sorted_ids.numel() // block_m, triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](a, b, out, weights, sorted_ids, tile_expert, num_valid, n, k, a.stride(0),
                               b.stride(0), b.stride(1), b.stride(2), out.stride(0), TOP_K=top_k,
                               A_ROW_IS_TOKEN=a_row_is_token, MUL_WEIGHT=mul_weight, BLOCK_M=block_m,
                               BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)


def fused_moe(x, w13, w2, topk_weights, topk_ids):
    """See kernelcore.kernels: x [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_* [T, k] -> [T, H]."""
    num_tokens, top_k = topk_ids.shape
    if num_tokens == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    block_m = 16
    sorted_ids, tile_expert = _align(topk_ids, w13.shape[0], block_m)
    num_valid = num_tokens * top_k
    gate_up = torch.empty(num_valid, w13.shape[1], dtype=x.dtype, device=x.device)
    weights = topk_weights.contiguous().flatten()
    _gemm(x, w13, gate_up, weights, sorted_ids, tile_expert, num_valid, top_k, True, False, block_m)
    hidden = silu_and_mul(gate_up)
    out = torch.empty(num_valid, w2.shape[1], dtype=x.dtype, device=x.device)
    _gemm(hidden, w2, out, weights, sorted_ids, tile_expert, num_valid, top_k, False, True, block_m)
    return out.view(num_tokens, top_k, -1).sum(dim=1)
