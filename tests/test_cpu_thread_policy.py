"""The CPU worker's threads follow the cores other processes leave free: with every core taken by busy loops
the policy drops to one thread, and goes back up once they stop. Waits on the policy's decisions (each looks
at a quarter second of /proc/stat), not on a fixed time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
import torch

from builtin_plugins.cpu.thread_policy import ThreadPolicy

pytestmark = [pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc"),
              pytest.mark.exclusive]  # other tests beside it would be the load it measures


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
    # The test's premise is cores that only its own busy loops take: another process already holding them (a
    # build beside the suite) would keep the policy at one thread after the loops stop, rightly. Measured by psutil,
    # not by the policy under test.
    end = time.monotonic() + 60.0
    while (busy := psutil.cpu_percent(interval=0.5) / 100 * psutil.cpu_count()) > 0.5:
        if time.monotonic() > end:
            pytest.skip(f"other processes keep {busy:.1f} cores busy: no free cores to come back to")
    before = torch.get_num_threads()
    policy = ThreadPolicy(max_threads=cpus)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        assert _wait_for(policy, lambda t: t == 1) == 1
        assert torch.get_num_threads() == 1  # what every kernel reads at its next call
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    try:
        assert _wait_for(policy, lambda t: t > 1) > 1
        assert policy.num_changes >= 2
    finally:
        torch.set_num_threads(before)


def test_the_policy_never_exceeds_the_configured_count():
    policy = ThreadPolicy(max_threads=1)
    for _ in range(3):
        assert policy.update() == 1
