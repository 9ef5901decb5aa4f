"""The CPU worker's threads follow the cores other processes leave free: with every core taken by busy loops
the policy drops to one thread, and goes back up once they stop; after an idle spell, load that has stopped
takes no threads and load still running does. Waits on the policy's decisions (each looks at a quarter second
of /proc/stat) and on the busy loops' own CPU time, not on a fixed time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
import torch

from builtin_plugins.cpu.thread_policy import ThreadPolicy, others_runnable

pytestmark = [pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc"),
              pytest.mark.exclusive]  # other tests beside it would be the load it measures


def _machine_is_quiet() -> None:
    """Skip unless other processes leave the cores alone: the tests' premise is cores that only their own busy
    loops take (measured by psutil, not by the policy under test)."""
    end = time.monotonic() + 60.0
    while (busy := psutil.cpu_percent(interval=0.5) / 100 * psutil.cpu_count()) > 0.5:
        if time.monotonic() > end:
            pytest.skip(f"other processes keep {busy:.1f} cores busy: no free cores to come back to")


def _start_busy_loops(count: int, cpu_seconds: float) -> list[subprocess.Popen]:
    """``count`` busy loops, returned once each has run for ``cpu_seconds`` of CPU time."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    end = time.monotonic() + 120.0  # a bound on a hung machine, not a timing assertion
    while not all(psutil.Process(h.pid).cpu_times().user >= cpu_seconds for h in hogs):
        if time.monotonic() > end:
            _stop(hogs)
            raise AssertionError("the busy loops did not run")
        time.sleep(0.05)
    return hogs


def _stop(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait()


def _wait_for(policy: ThreadPolicy, condition, deadline_s: float = 60.0) -> int:
    end = time.monotonic() + deadline_s  # a bound on a hung machine, not a timing assertion
    while time.monotonic() < end:
        threads = policy.update()
        if condition(threads):
            return threads
        time.sleep(0.05)
    raise AssertionError(f"the policy stayed at {policy.threads} threads")


def test_threads_drop_while_other_processes_take_the_cores_and_come_back():
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("one core: there is nothing to give up")
    # Another process already holding the cores (a build beside the suite) would keep the policy at one thread
    # after the loops stop, rightly.
    _machine_is_quiet()
    before = torch.get_num_threads()
    policy = ThreadPolicy(max_threads=cpus)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        assert _wait_for(policy, lambda t: t == 1) == 1
        assert torch.get_num_threads() == 1  # what every kernel reads at its next call
    finally:
        _stop(hogs)
    try:
        assert _wait_for(policy, lambda t: t > 1) > 1
        assert policy.num_changes >= 2
    finally:
        torch.set_num_threads(before)


def test_the_policy_never_exceeds_the_configured_count():
    policy = ThreadPolicy(max_threads=1)
    for _ in range(3):
        assert policy.update() == 1


def test_after_an_idle_spell_load_that_stopped_takes_no_threads():
    """Two servers taking turns on one machine: the other one's work, over when this one's request comes,
    must not put this one's next step on fewer threads."""
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("one core: there is nothing to give up")
    _machine_is_quiet()
    before = torch.get_num_threads()
    started = time.monotonic()
    policy = ThreadPolicy(max_threads=cpus)  # its window starts now
    assert policy.update() == cpus  # a step (too soon for a decision) ...
    policy.step_finished()  # ... then the process waits while another one works
    hogs = _start_busy_loops(cpus, cpu_seconds=0.5)
    cpu_seconds = sum(sum(psutil.Process(h.pid).cpu_times()[:2]) for h in hogs)
    _stop(hogs)
    try:
        # the premise: over the window the loops took more than half a core, which the window alone would count
        assert cpu_seconds / (time.monotonic() - started) > 0.5
        assert policy.update() == cpus
        assert policy.num_changes == 0
    finally:
        torch.set_num_threads(before)


def test_after_an_idle_spell_load_still_running_takes_its_cores():
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("one core: there is nothing to give up")
    before = torch.get_num_threads()
    policy = ThreadPolicy(max_threads=cpus)
    hogs = _start_busy_loops(cpus, cpu_seconds=0.5)
    try:
        assert others_runnable() >= cpus  # a busy loop is runnable at every look
        assert policy.update() == 1  # the first decision after the idle spell
    finally:
        _stop(hogs)
        torch.set_num_threads(before)
