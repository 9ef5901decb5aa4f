"""Threads that follow the cores other processes leave free.

A forward's kernels split each matmul over all their threads and wait for the slowest; when another program
keeps one of two cores busy, the thread sharing its core runs in the scheduler's time slices and every wait
stretches to them (measured: a 30-token answer 3.8x slower beside one busy loop, against 1.9x for an idle
thread that sleeps instead of spinning). So before a step the CPU worker counts the cores the rest of the
machine is using (``/proc/stat`` less this process's own time, over the last quarter second or more) and runs
on the cores that are left, between one thread and the configured count. Outputs do not depend on the thread
count (each output element is one thread's fixed-order sum).
"""

from __future__ import annotations

import os
import time

import torch

INTERVAL_S = 0.25  # the shortest window a decision looks at


def _proc_stat_busy(cpus: set[int] | None) -> tuple[int, int] | None:
    """(busy, total) clock ticks summed over ``cpus`` (all when None), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def _own_ticks() -> int | None:
    """This process's user + system clock ticks (every thread)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


class ThreadPolicy:
    """``update()`` before each step sets torch's (and so every native kernel's) thread count."""

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max_threads
        self.cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.threads = max_threads
        self.num_changes = 0
        self._last: tuple[float, int, int, int] | None = None
        self._sample()

    def _sample(self) -> tuple[float, int, int, int] | None:
        system, own = _proc_stat_busy(self.cpus), _own_ticks()
        if system is None or own is None:
            return None
        return time.monotonic(), system[0], system[1], own

    def others_busy(self) -> float | None:
        """Cores the other processes kept busy since the last decision (None: too soon, or no /proc)."""
        if self._last is not None and time.monotonic() - self._last[0] < INTERVAL_S:
            return None  # decided recently: not even /proc is read (this is asked between layers)
        now = self._sample()
        if now is None:
            return None
        if self._last is None:
            self._last = now
            return None
        (_, busy0, total0, own0), (_, busy1, total1, own1) = self._last, now
        self._last = now
        if total1 <= total0:
            return None
        num_cpus = len(self.cpus) if self.cpus else (os.cpu_count() or 1)
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / (total1 - total0) * num_cpus

    def follow_during(self, model: torch.nn.Module) -> None:
        """Decide again between the layers of an eager forward too: one long prefill would otherwise run on the
        decision made before it, from a window that may be seconds old (a neighbour that has stopped since)."""
        def before_layer(_module: torch.nn.Module, _args: tuple) -> None:
            self.update()  # a pre-hook's return value would replace the layer's arguments

        for module in model.modules():
            if isinstance(module, torch.nn.ModuleList):
                for layer in module:
                    layer.register_forward_pre_hook(before_layer)

    def update(self) -> int:
        others = self.others_busy()
        if others is not None:
            num_cpus = len(self.cpus) if self.cpus else (os.cpu_count() or 1)
            free = num_cpus - int(others + 0.5)  # a core counts as taken when others used half of it or more
            wanted = max(1, min(self.max_threads, free))
            if wanted != self.threads:
                self.threads = wanted
                self.num_changes += 1
                torch.set_num_threads(wanted)
        return self.threads
