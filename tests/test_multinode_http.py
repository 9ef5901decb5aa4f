"""`kc serve` across two simulated hosts (network namespaces), seen through HTTP: losing the headless host (its
worker killed, or its link down) turns the head's /health to 503 within 20 s, the streaming request in flight
ends with an error, and nothing is left running on either host."""

import json
import signal
import subprocess
import threading
import time

import netns
import psutil
import pytest
from helpers import run_python

pytestmark = [pytest.mark.skipif(netns.skip_reason() is not None, reason=str(netns.skip_reason())),
              pytest.mark.slow, pytest.mark.timeout(1800)]  # three model loads; a loaded machine is slow

SECRET = "http-cluster-secret"
CLUSTER_PORT, HTTP_PORT = "29581", "18123"  # inside the namespaces: no other test's ports there

# Runs on the head's host (its loopback is the server's): one stream after another until one fails; on "GO"
# (the test has cut the other host off) it polls /health until 503.
CLIENT = """
import json, sys, threading, time, urllib.error, urllib.request
import openai

BASE = "http://127.0.0.1:HTTP_PORT"
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300)
model = client.models.list().data[0].id
first_chunk, result = threading.Event(), {}

def streams():
    while True:
        chunks = 0
        try:
            for _ in client.completions.create(model=model, prompt="Once upon a time", max_tokens=1900,
                                               temperature=0, stream=True, extra_body={"ignore_eos": True}):
                chunks += 1
                first_chunk.set()
        except Exception as exc:
            result.update(error=f"{type(exc).__name__}: {exc}", chunks_before_error=chunks)
            return

def health():
    try:
        with urllib.request.urlopen(BASE + "/health", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code

thread = threading.Thread(target=streams, daemon=True)
thread.start()
first_chunk.wait(300)
print("STREAMING", flush=True)
assert sys.stdin.readline().strip() == "GO"
while health() != 503:
    time.sleep(0.1)
print("503", flush=True)
thread.join(120)
print(json.dumps(result), flush=True)
"""


class Drained:
    """Reads a process's output all along (a pipe nobody reads would fill and block it); waits for a line."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()

    def wait_for(self, needle: str, timeout: float = 1200) -> None:
        with self.changed:
            found = self.changed.wait_for(lambda: any(needle in line for line in self.lines), timeout)
        assert found, f"never saw {needle!r} in:\n{''.join(self.lines)[-4000:]}"

    def text(self) -> str:
        with self.changed:
            return "".join(self.lines)


@pytest.fixture(scope="module")
def model_dir():
    return run_python("from kernelcore.models.default_model import ensure_default_model\n"
                      "print(ensure_default_model())", timeout=900).stdout.strip().splitlines()[-1]


@pytest.fixture
def hosts():
    with netns.two_hosts() as h:
        h.started = []
        yield h
        for proc in h.started:
            netns.kill_tree(proc)



@pytest.mark.parametrize("failure", ["kill-remote-worker", "link-down"])
def test_losing_the_headless_host_is_a_503_and_an_error_for_the_request_in_flight(failure, model_dir, hosts):
    cluster = ["-tp", "2", "--nnodes", "2", "--master-addr", hosts.addrs[0], "--master-port", CLUSTER_PORT]
    head = hosts.kc(0, "serve", model_dir, *cluster, "--node-rank", "0", "--port", HTTP_PORT, KC_CLUSTER_SECRET=SECRET)
    node = hosts.kc(1, "serve", model_dir, *cluster, "--node-rank", "1", "--headless", KC_CLUSTER_SECRET=SECRET)
    hosts.started += [head, node]
    head_log, node_log = Drained(head.stderr), Drained(node.stderr)
    head_log.wait_for(f"on http://127.0.0.1:{HTTP_PORT}")
    client = hosts.python(0, CLIENT.replace("HTTP_PORT", HTTP_PORT), stdin=subprocess.PIPE)
    hosts.started.append(client)
    client_out = Drained(client.stdout)
    client_out.wait_for("STREAMING")
    head_children, node_children = netns.kc_family(head), netns.kc_family(node)
    # core+worker-0 | worker-1
    assert len(head_children) == 2 and len(node_children) == 1, (head_children, node_children)
    started = time.monotonic()
    if failure == "kill-remote-worker":
        psutil.Process(node_children[0]).kill()
    else:
        hosts.run(1, "ip", "link", "set", hosts.interfaces[1], "down")
    client.stdin.write("GO\n")
    client.stdin.flush()
    client_out.wait_for("503", timeout=120)
    detected = time.monotonic() - started
    assert detected < 20, f"/health took {detected:.0f}s to turn 503"  # the bound
    assert client.wait(120) == 0, client.stderr.read()[-4000:]
    result = json.loads(client_out.lines[-1])
    assert result["chunks_before_error"] >= 1 and result["error"], result  # failed in flight, not at its start
    head.send_signal(signal.SIGTERM)
    assert head.wait(60) == 0, head_log.text()[-4000:]
    assert node.wait(60) == 1, node_log.text()[-4000:]  # its worker died, or the head fell silent
    assert f"node 1 ({hosts.addrs[1]})" in head_log.text() or "worker-1" in head_log.text()
    assert not netns.alive(head_children + node_children + [head.pid, node.pid])
