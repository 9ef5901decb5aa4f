"""Keep freed memory in the CPU worker's heap instead of returning it to the kernel; map the KV cache lazily.

torch's CPU tensors come from glibc's malloc, which serves a block of 128 KiB or more with a fresh ``mmap``
until its threshold adapts to the sizes it has seen freed, and unmaps it on free. A prefill chunk of 2048
tokens makes many such activations per layer, so a server's first large chunks page-faulted and zeroed
them again (the first 2048-token chunk of a 125M-parameter model took 0.8-1.0 s instead of 0.5-0.6;
docs/performance.md). The threshold is set to glibc's largest (32 MiB) and trimming raised: activations are
reused from the heap, while the KV cache and other huge blocks keep their own mappings. (Turning mmap off
altogether measured slower at batch 1.) Only glibc is tuned; elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import math
import mmap

import torch

from builtin_plugins.cpu.hugepages import huge_page_buffer

logger = logging.getLogger("kernelcore.cpu")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
TRIM_THRESHOLD = 1 << 30  # a free block at the heap's top is returned to the kernel only above 1 GiB
MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks below it come from the heap (the KV cache still gets a mapping)


def keep_freed_memory() -> bool:
    """Tune glibc's malloc for this process; False where it is not glibc (musl, macOS) or refused."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only)
        tuned = (bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
                 and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)))
        logger.debug("malloc keeps freed memory: %s", tuned)
        return tuned
    except (OSError, AttributeError):
        logger.debug("not glibc: the CPU worker's allocator is left as it is")
        return False


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the kernel now (glibc's ``malloc_trim``): what loading the weights freed
    (a file's tensors read, converted, copied into place) would otherwise stay resident for the server's life under
    ``keep_freed_memory``'s raised trim threshold. False where it is not glibc."""
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):
        return False


def zero_pages_tensor(shape: tuple[int, ...], dtype: torch.dtype, huge_pages: bool = False) -> torch.Tensor:
    """A zeroed tensor in its own private anonymous mapping: the kernel's zero pages, which take memory only once
    written. A KV cache allocated this way makes a server's resident memory follow the tokens it has cached, not
    the cache's size (``torch.zeros`` writes every page: a 2 GiB cache was 2 GiB resident from the start).
    ``huge_pages``: the mapping starts on a 2 MiB boundary and is advised ``MADV_HUGEPAGE`` (where the kernel
    takes the advice, memory comes 2 MiB at a time and a long context's attention misses the TLB far less).
    The mapping lives as long as the tensor."""
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    if huge_pages and (buffer := huge_page_buffer(nbytes)) is not None:
        return buffer[1].view(dtype).view(shape)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(mapping, dtype=dtype, count=numel).view(shape)
