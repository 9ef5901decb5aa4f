"""`kc serve --tensor-parallel-size 2`: serves, reports a dead engine core (503/500, no hang), exits cleanly."""

import signal
import time

import psutil
import requests

from test_server_e2e import start_server
import pytest

pytestmark = pytest.mark.slow  # real servers / several processes: run with the full suite


def test_tp2_serving_then_engine_death_then_sigterm():
    proc, url = start_server("--tensor-parallel-size", "2", "--max-model-len", "128")
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        r = requests.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
        children = psutil.Process(proc.pid).children(recursive=True)
        (core,) = [c for c in psutil.Process(proc.pid).children() if "engine" in " ".join(c.cmdline()) + c.name()]
        core.kill()
        psutil.wait_procs([core], timeout=10)
        deadline = time.time() + 10
        while requests.get(url + "/health", timeout=5).status_code != 503:
            assert time.time() < deadline, "/health never turned 503 after the engine core died"
            time.sleep(0.2)
        r = requests.post(url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 500 and r.json()["error"]["code"] == 500
        r = requests.post(url + "/v1/completions", json={**body, "stream": True}, timeout=30)
        assert r.status_code == 500
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, f"orphans: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
