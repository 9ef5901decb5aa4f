"""Calling a native kernel from Python, and replaying recorded calls from C.

``launch`` is how every kernel wrapper calls its ctypes function: while a decode-graph capture runs
(``recording``, used by graphs.py) the call is also appended to the capture's tape. ``replay_in_c`` notes a
kernel's ``KC_PACKED`` twin (csrc/packed_call.h), so that ``pack_runs`` can turn a run of recorded launches into
one call into C: a decode step's hundred-odd launches then cost no Python between them.

The tape itself (the torch ops recorded around these launches, the replay) is graphs.py's; this module holds
only what the kernel wrappers below it need, so they never import the graph backend above them.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import struct
from collections.abc import Callable, Iterator
from typing import Any

_tape: list[Callable[[], None]] | None = None  # the tape being recorded, if any


def replay_in_c(library: ctypes.CDLL, fn: Any) -> None:
    """Note on ``fn`` (a kernel of ``library``, its ``argtypes`` set) the address of its ``KC_PACKED`` twin
    (csrc/packed_call.h): a tape then replays runs of such launches with one call into C."""
    fn.packed_address = ctypes.cast(getattr(library, fn.__name__ + "_packed"), ctypes.c_void_p).value


def launch(fn: Callable[..., int], *args: Any) -> int:
    """Call a native kernel (a ctypes function returning a status); recorded when a capture is running."""
    if _tape is not None:
        _tape.append(NativeCall(fn, args))
    return fn(*args)


@contextlib.contextmanager
def recording(tape: list[Callable[[], None]]) -> Iterator[None]:
    """Append every ``launch`` inside the block to ``tape`` (one recording at a time)."""
    global _tape
    if _tape is not None:
        raise RuntimeError("a CPU graph capture is already running")
    _tape = tape
    try:
        yield
    finally:
        _tape = None


class NativeCall:
    """One recorded launch: calling it launches the kernel again with the same arguments."""

    __slots__ = ("fn", "args", "words")

    def __init__(self, fn: Callable[..., int], args: tuple) -> None:
        # Converted to the C types once: a replay's call then skips ctypes' per-argument conversion (2.0 ->
        # 1.4 us for a 12-argument kernel, a hundred such calls per decode step).
        argtypes = getattr(fn, "argtypes", None)
        if argtypes and len(argtypes) == len(args):
            args = tuple(a if a is None or isinstance(a, t) else t(a) for t, a in zip(argtypes, args, strict=True))
        self.fn, self.args = fn, args
        self.words = pack_words(argtypes, args) if getattr(fn, "packed_address", None) else None

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))

    def __call__(self) -> None:
        status = self.fn(*self.args)
        if status != 0:  # the kernel's own checks (e.g. a block table outside the KV cache)
            raise ValueError(f"CPU kernel {self.name} failed at replay ({status})")


def pack_words(argtypes, args: tuple) -> list[int] | None:
    """A launch's arguments as packed_call.h's 64-bit words, or None where one is not a plain C value."""
    words = []
    for ctype, arg in zip(argtypes, args, strict=False):
        value = arg.value if isinstance(arg, ctypes._SimpleCData) else arg
        if ctype is ctypes.c_float:
            words.append(struct.unpack("<I", struct.pack("<f", value))[0])
        elif ctype is ctypes.c_double:
            words.append(struct.unpack("<q", struct.pack("<d", value))[0])
        elif value is None or isinstance(value, int):
            words.append(int(value or 0))
        else:
            return None
    return words


class PackedRun:
    """Consecutive native launches replayed by one call into C (``runner``: kc_run_packed), in order,
    stopping at the first that fails."""

    __slots__ = ("calls", "runner", "args", "status")

    def __init__(self, calls: list[NativeCall], runner: Any) -> None:
        words = [w for call in calls for w in call.words or ()]
        offsets = list(itertools.accumulate((len(call.words or ()) for call in calls[:-1]), initial=0))
        self.calls, self.runner, self.status = calls, runner, ctypes.c_int(0)
        n = len(calls)
        self.args = (n, (ctypes.c_int64 * n)(*(getattr(call.fn, "packed_address") for call in calls)),
                     (ctypes.c_int64 * len(words))(*words), (ctypes.c_int64 * n)(*offsets), ctypes.byref(self.status))

    def __call__(self) -> None:
        done = self.runner(*self.args)
        if done != len(self.calls):
            raise ValueError(f"CPU kernel {self.calls[done].name} failed at replay ({self.status.value})")


def pack_runs(calls: list[Callable[[], None]], runner: Any) -> list[Callable[[], None]]:
    """``calls`` with every run of two or more packable native launches replaced by one ``PackedRun``."""
    packed: list[Callable[[], None]] = []
    run: list[NativeCall] = []
    for call in [*calls, None]:
        if isinstance(call, NativeCall) and call.words is not None:
            run.append(call)
            continue
        if len(run) > 1:
            packed.append(PackedRun(run, runner))
        else:
            packed.extend(run)
        run = []
        if call is not None:
            packed.append(call)
    return packed
