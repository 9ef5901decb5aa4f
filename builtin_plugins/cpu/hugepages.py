"""Model weights on transparent huge pages.

A decode step streams every weight once, and on 4 KiB pages that walk costs a TLB miss per page: with the
weights in one 2 MiB-aligned arena advised ``MADV_HUGEPAGE``, a batch-1 forward reads them 12-20% faster
(docs/performance.md). Where the kernel refuses the advice (THP ``never``) the arena is ordinary memory and
nothing changes but the copy made at load.
"""

from __future__ import annotations

import ctypes
import logging
import mmap

import torch
from torch import nn

logger = logging.getLogger("kernelcore.cpu")

MADV_HUGEPAGE = 14
HUGE_PAGE = 2 << 20
ALIGN = 64  # a cache line: every tensor starts on one


def _madvise_huge(buf: mmap.mmap) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        return libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(len(buf)), MADV_HUGEPAGE) == 0
    except (OSError, AttributeError, TypeError):
        return False


def _movable(tensor: torch.Tensor | None) -> bool:
    return (tensor is not None and tensor.device.type == "cpu" and tensor.is_contiguous() and tensor.numel() > 0
            and not tensor.is_sparse and not tensor.is_quantized
            and tensor.untyped_storage().nbytes() == tensor.nbytes)  # its own storage: no view shares it


def move_weights_to_huge_pages(model: nn.Module, min_total_bytes: int = 16 * HUGE_PAGE) -> int:
    """Copy ``model``'s parameters and buffers (each with its own storage) into one huge-page arena; returns
    the bytes moved (0 when the model is too small to matter or the copy is refused). The arena lives as
    long as the model (kept on it); tied weights stay one tensor."""
    seen: dict[int, torch.Tensor] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if _movable(tensor) and tensor.data_ptr() not in seen:
            seen[tensor.data_ptr()] = tensor
    tensors = list(seen.values())
    offsets, total = [], 0
    for tensor in tensors:
        offsets.append(total)
        total += -(-tensor.nbytes // ALIGN) * ALIGN
    if total < min_total_bytes:
        return 0
    # One spare huge page: the arena starts on a 2 MiB boundary inside the mapping.
    arena = mmap.mmap(-1, (-(-total // HUGE_PAGE) + 1) * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if not _madvise_huge(arena):
        logger.info("transparent huge pages refused; model weights stay where they were loaded")
        arena.close()
        return 0
    raw = torch.frombuffer(arena, dtype=torch.uint8)
    raw = raw[-raw.data_ptr() % HUGE_PAGE:]
    with torch.no_grad():
        for tensor, offset in zip(tensors, offsets, strict=True):
            moved = raw[offset:offset + tensor.nbytes].view(tensor.dtype).view(tensor.shape)
            moved.copy_(tensor)
            tensor.data = moved
    model.__dict__["_kc_huge_page_arena"] = arena  # the mapping must outlive every tensor viewing it
    logger.info("model weights: %.0f MiB on transparent huge pages", total / 2**20)
    return total
