"""Keep freed memory in the CPU worker's heap instead of returning it to the kernel.

torch's CPU tensors come from glibc's malloc, which serves every block of 32 MiB or more (and, until its
threshold adapts, of 128 KiB or more) with a fresh ``mmap`` and unmaps it on free. A prefill chunk of 2048 tokens
makes several such activations per layer, so every chunk page-faulted and zeroed them again: about 40% of
the first chunk's time on a 125M-parameter model (docs/performance.md). With mmap off and trimming raised,
the worker's memory stays at its peak and is reused, which is what a server process wants (the role
tcmalloc/jemalloc play under LD_PRELOAD elsewhere). Only glibc is tuned; elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import logging

logger = logging.getLogger("kernelcore.cpu")

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
TRIM_THRESHOLD = 1 << 30  # a free block at the heap's top is returned to the kernel only above 1 GiB


def keep_freed_memory() -> bool:
    """Tune glibc's malloc for this process; False where it is not glibc (musl, macOS) or refused."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only)
        tuned = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        logger.debug("malloc keeps freed memory: %s", tuned)
        return tuned
    except (OSError, AttributeError):
        logger.debug("not glibc: the CPU worker's allocator is left as it is")
        return False
