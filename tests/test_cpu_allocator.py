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
    x = torch.ones(16 << 20)  # 64 MiB: above glibc's largest mmap threshold
    during = libc.mallinfo2().hblkhd
    del x
    heap = libc.mallinfo2().arena
    y = torch.ones(16 << 20)  # the freed block again, not more heap
    print(during - before, libc.mallinfo2().arena - heap)
""")


def _probe(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return [int(v) for v in out.stdout.split()]


def test_tuned_worker_allocates_large_tensors_from_the_heap():
    mapped, _ = _probe("default")
    assert mapped >= 64 << 20  # glibc's default: a fresh mapping per large tensor, unmapped on free
    assert _probe("tuned") == [0, 0]  # from the heap, and the freed block is reused
