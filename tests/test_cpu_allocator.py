"""The CPU worker's malloc tuning: large tensors come from the heap and are reused, not mmapped per allocation."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")

PROBE = textwrap.dedent("""
    import ctypes, sys, torch
    from builtin_plugins.cpu.allocator import keep_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] == "tuned":
        assert keep_freed_memory()
    before = libc.mallinfo2().hblkhd
    x = torch.ones(4 << 20)  # 16 MiB: above glibc's default threshold, below the tuned one
    mapped = libc.mallinfo2().hblkhd - before
    heap = libc.mallinfo2().arena
    del x
    kept = libc.mallinfo2().arena >= heap  # not trimmed back to the kernel
    y = torch.ones(4 << 20)
    print(mapped, libc.mallinfo2().hblkhd - before, int(kept))
""")


def _probe(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return [int(v) for v in out.stdout.split()]


def test_tuned_worker_allocates_large_tensors_from_the_heap():
    mapped, _, _ = _probe("default")
    assert mapped >= 16 << 20  # glibc's default: a fresh mapping for a large tensor, unmapped on free
    assert _probe("tuned") == [0, 0, 1]  # from the heap, which keeps the freed block
