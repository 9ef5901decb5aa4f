"""`kc serve --tensor-parallel-size 2`: nothing listens beyond loopback, a dead engine core is a 503 (no hang),
a clean exit leaves no process and no private socket directory behind."""

import ipaddress
import os
import shutil
import signal
import tempfile
import time

import psutil
import pytest
import requests
from test_server_e2e import start_server

pytestmark = pytest.mark.slow  # real servers / several processes: run with the full suite


def _listening(procs: list[psutil.Process]) -> list[tuple[str, str, int]]:
    found = []
    for proc in procs:
        for conn in proc.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN or (conn.type == 2 and not conn.raddr):  # TCP listen, bound UDP
                found.append((proc.name(), conn.laddr.ip, conn.laddr.port))
    return found


@pytest.fixture
def tmpdir_short():
    """A TMPDIR of its own, short enough for unix socket paths (pytest's tmp_path is not)."""
    path = tempfile.mkdtemp(prefix="kct-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_tp2_serving_then_engine_death_then_sigterm(tmpdir_short):
    tmpdir = tmpdir_short
    proc, url = start_server("--tensor-parallel-size", "2", "--max-model-len", "128", TMPDIR=str(tmpdir))
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        r = requests.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
        processes = requests.get(url + "/console/api/overview", timeout=30).json()["processes"]
        by_role = {p["role"]: p for p in processes}
        assert set(by_role) == {"frontend", "engine-core", "worker-0", "worker-1"}
        for rank in (0, 1):  # the workers hang under the engine core, each with the general plugins loaded
            worker = by_role[f"worker-{rank}"]
            assert worker["parent_pid"] == by_role["engine-core"]["pid"] and worker["alive"]
            assert {"cpu", "models"} <= {p["name"] for p in worker["plugins"]}
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 3  # engine core and two workers
        listening = _listening([psutil.Process(proc.pid), *children])
        assert listening and all(ipaddress.ip_address(ip).is_loopback for _, ip, _ in listening), listening
        (core,) = [c for c in psutil.Process(proc.pid).children() if "engine" in " ".join(c.cmdline()) + c.name()]
        core.kill()
        psutil.wait_procs([core], timeout=10)
        deadline = time.time() + 10
        while requests.get(url + "/health", timeout=5).status_code != 503:
            assert time.time() < deadline, "/health never turned 503 after the engine core died"
            time.sleep(0.2)
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for path, payload in [("/v1/completions", body), ("/v1/completions", {**body, "stream": True}),
                              ("/v1/chat/completions", chat), ("/v1/chat/completions", {**chat, "stream": True})]:
            r = requests.post(url + path, json=payload, timeout=30)
            assert r.status_code == 503, (path, r.text)
            assert r.json()["error"]["code"] == 503 and "engine" in r.json()["error"]["message"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"orphans: {alive}"
        assert not [d for d in os.listdir(tmpdir) if d.startswith("kc-ipc-")]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_clean_exit_leaves_no_socket_directory(tmpdir_short):
    tmpdir = tmpdir_short
    proc, url = start_server("--max-model-len", "128", TMPDIR=str(tmpdir))
    try:
        assert requests.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60).ok
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not [d for d in os.listdir(tmpdir) if d.startswith("kc-ipc-")]
    finally:
        if proc.poll() is None:
            proc.kill()
