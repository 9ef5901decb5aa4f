"""hostproc: spawned, named children that load plugins first and die with their parent."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import clean_env, run_python

from kernelcore import hostproc

pytestmark = pytest.mark.slow  # spawns processes

TESTS_DIR = os.path.dirname(__file__)


@pytest.fixture(autouse=True)
def _importable_targets(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_child_reports_ready_with_its_role_and_title():
    child = hostproc.spawn("hostproc_targets.ready_then_sleep", role="worker-7", args=(30.0,))
    try:
        info = child.wait_ready(120)
        assert info["role"] == "worker-7" and info["pid"] == child.pid
        assert "kc::worker-7" in " ".join(psutil.Process(child.pid).cmdline())
    finally:
        child.terminate()
    assert not child.is_alive()


def test_start_failure_is_reported_with_the_error():
    child = hostproc.spawn("hostproc_targets.fail_on_start", role="engine-core")
    with pytest.raises(hostproc.ProcessStartError, match="engine-core.*target refused to start"):
        child.wait_ready(120)


def test_failing_general_plugin_in_child_names_plugin_distribution_and_process():
    proc = run_python(f"""
        import sys; sys.path.insert(0, {TESTS_DIR!r})
        from kernelcore import hostproc
        child = hostproc.spawn("hostproc_targets.ready_then_exit", role="worker-3")
        try:
            child.wait_ready(120)
        except hostproc.ProcessStartError as e:
            print("ERROR:", e)
    """, KC_DUMMY_MODEL_RAISE="1")
    assert "ERROR: process worker-3 failed to start" in proc.stdout
    assert "'dummy_model' (distribution kc-dummy-model) raised in register_models in process worker-3" in proc.stdout
    assert "dummy model plugin refused to register" in proc.stdout


def test_children_die_when_the_parent_is_sigkilled(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    parent = subprocess.Popen([sys.executable, "-c", f"""
import sys; sys.path.insert(0, {TESTS_DIR!r})
from kernelcore import hostproc
child = hostproc.spawn("hostproc_targets.spawn_grandchild_and_wait", role="engine-core", args=({str(pid_file)!r},))
child.wait_ready(120)
print("ready", child.pid, flush=True)
import time; time.sleep(120)
"""], env=clean_env(), stdout=subprocess.PIPE, text=True)
    line = parent.stdout.readline().split()
    assert line and line[0] == "ready"
    child_pid, grandchild_pid = int(line[1]), int(pid_file.read_text())
    assert psutil.pid_exists(child_pid) and psutil.pid_exists(grandchild_pid)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(p) for p in (child_pid, grandchild_pid)):
        time.sleep(0.1)
    assert not _alive(child_pid) and not _alive(grandchild_pid)


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_general_plugins_run_exactly_once_in_every_spawned_process(tmp_path):
    trace = tmp_path / "trace.jsonl"
    run_python(f"""
        import sys; sys.path.insert(0, {TESTS_DIR!r})
        from kernelcore import hostproc, platforms, plugins
        platforms.load_general_plugins()
        children = [hostproc.spawn("hostproc_targets.ready_then_exit", role=f"worker-{{i}}") for i in range(2)]
        for c in children:
            c.wait_ready(120)
        for c in children:
            c.process.join(30)
    """, KC_TRACE_PLUGINS=str(trace), KC_DUMMY_OPS="1")
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    roles = {e["role"] for e in events}
    assert roles == {"frontend", "worker-0", "worker-1"}
    pids = {e["pid"] for e in events}
    assert len(pids) == 3
    for pid in pids:
        mine = [e for e in events if e["pid"] == pid]
        resolved = [e for e in mine if e["hook"] == "platform_resolved"]
        assert len(resolved) == 1 and resolved[0]["plugins"] == ["cpu"]
        register_ops = [e for e in mine if e["hook"] == "register_ops"]
        assert sorted(p for e in register_ops for p in e["plugins"]) == ["dummy_custom_ops", "dummy_ops"]
        models = [e for e in mine if e["hook"] == "register_models"]
        assert [p for e in models for p in e["plugins"]].count("models") == 1
        first_general = min(e["time"] for e in register_ops)
        assert resolved[0]["time"] < first_general  # the platform is fixed before any general plugin runs
