"""Threads that follow the cores other processes leave free.

A forward's kernels split each matmul over all their threads and wait for the slowest; when another program
keeps one of two cores busy, the thread sharing its core runs in the scheduler's time slices and every wait
stretches to them (measured: a 30-token answer 3.8x slower beside one busy loop, against 1.9x for an idle
thread that sleeps instead of spinning). So before a step the CPU worker counts the cores the rest of the
machine is using (``/proc/stat`` less this process's own time, over the last quarter second or more) and runs
on the cores that are left, between one thread and the configured count. Outputs do not depend on the thread
count (each output element is one thread's fixed-order sum).

Load seen while this process waited for work says little about the step about to run: another server that
answered the previous request, or a client that rendered it, was busy then and may have stopped since
(measured: two servers taking turns each ran the first quarter second of every request on one thread: a
166-token prompt's first token in 350 ms instead of 250, an answer after a cached prompt 10-20% slower). So
when the window holds an idle spell (a wait between steps), its count is capped by the threads of other
processes that stay runnable over a few milliseconds now; a busy loop that keeps running counts either way.
"""

from __future__ import annotations

import os
import time

import torch

INTERVAL_S = 0.25  # the shortest window a decision looks at
IDLE_GAP_S = 0.02  # a longer wait between the end of a step and the next is an idle spell
RUNNABLE_LOOKS, RUNNABLE_GAP_S = 5, 0.001  # looks at the runnable threads after an idle spell, and between them


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


def _own_running() -> int | None:
    """This process's threads that are running or runnable now (the caller included)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    running = 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                running += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue  # a thread that exited meanwhile
    return running


def others_runnable(looks: int = RUNNABLE_LOOKS, gap_s: float = RUNNABLE_GAP_S) -> int | None:
    """Threads of other processes that stayed runnable through ``looks`` looks ``gap_s`` apart: the fewest
    seen (a kernel worker or a process winding down is runnable for a moment, a busy loop at every look).
    None without /proc."""
    fewest = None
    for look in range(looks):
        if look:
            time.sleep(gap_s)
        try:
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])  # "1.0 0.5 0.2 RUNNABLE/TOTAL LASTPID"
        except (OSError, ValueError, IndexError):
            return None
        own = _own_running()
        if own is None:
            return None
        seen = max(0, running - own)
        fewest = seen if fewest is None else min(fewest, seen)
        if fewest == 0:
            break
    return fewest


class ThreadPolicy:
    """``update()`` before each step sets torch's (and so every native kernel's) thread count;
    ``step_finished()`` after it marks where the process starts to wait."""

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max_threads
        self.cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.threads = max_threads
        self.num_changes = 0
        self._last: tuple[float, int, int, int] | None = self._sample()  # the first window starts now
        self._step_end: float | None = time.monotonic()  # idle from the start until the first step
        self._idled = False  # the current window holds an idle spell

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
        idled, self._idled = self._idled, False
        if total1 <= total0:
            return None
        num_cpus = len(self.cpus) if self.cpus else (os.cpu_count() or 1)
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / (total1 - total0) * num_cpus
        if idled:  # part of that load may be over: keep what is still runnable now
            runnable = others_runnable()
            if runnable is not None:
                others = min(others, float(runnable))
        return others

    def follow_during(self, model: torch.nn.Module) -> None:
        """Decide again between the layers of an eager forward too: one long prefill would otherwise run on the
        decision made before it, from a window that may be seconds old (a neighbour that has stopped since)."""
        def before_layer(_module: torch.nn.Module, _args: tuple) -> None:
            self.update()  # a pre-hook's return value would replace the layer's arguments

        for module in model.modules():
            if isinstance(module, torch.nn.ModuleList):
                for layer in module:
                    layer.register_forward_pre_hook(before_layer)

    def step_finished(self) -> None:
        """The worker finished a step: until the next ``update()`` this process waits (an idle spell if long)."""
        self._step_end = time.monotonic()

    def update(self) -> int:
        """Before a step (and between the layers of an eager one): the thread count to run on."""
        if self._step_end is not None:
            self._idled |= time.monotonic() - self._step_end > IDLE_GAP_S
            self._step_end = None
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
