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


def huge_page_buffer(nbytes: int) -> tuple[mmap.mmap, torch.Tensor] | None:
    """``nbytes`` of zero pages from a 2 MiB boundary in their own private anonymous mapping advised
    ``MADV_HUGEPAGE``: (the mapping, a uint8 tensor over those bytes, which keeps it alive), or None where the
    kernel refuses the advice. The pages take memory once written, 2 MiB at a time where the kernel gives them."""
    # One spare huge page: the buffer starts on a 2 MiB boundary inside the mapping.
    mapping = mmap.mmap(-1, (-(-nbytes // HUGE_PAGE) + 1) * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if not _madvise_huge(mapping):
        mapping.close()
        return None
    raw = torch.frombuffer(mapping, dtype=torch.uint8)
    return mapping, raw[-raw.data_ptr() % HUGE_PAGE:][:nbytes]


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
    buffer = huge_page_buffer(total)
    if buffer is None:
        logger.info("transparent huge pages refused; model weights stay where they were loaded")
        return 0
    arena, raw = buffer
    with torch.no_grad():
        for tensor, offset in zip(tensors, offsets, strict=True):
            moved = raw[offset:offset + tensor.nbytes].view(tensor.dtype).view(tensor.shape)
            moved.copy_(tensor)
            tensor.data = moved
    model.__dict__["_kc_huge_page_arena"] = arena  # the mapping must outlive every tensor viewing it
    logger.info("model weights: %.0f MiB on transparent huge pages", total / 2**20)
    return total
