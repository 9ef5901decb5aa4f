"""Links that misbehave between two simulated hosts (network namespaces, :mod:`linkemu`): the emulator itself
(delay, loss, partition), then a tensor-parallel cluster across the hosts (`kc serve` head + `--headless` node)
seen through HTTP: a slow lossy link changes no greedy output; a partition shorter than the 10 s heartbeat
timeout is survived; a 15 s one fails the request in flight naming the lost host, /health turns 503 naming it,
and after the heal the head answers 503 (never a hang) until it is stopped, leaving nothing running."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import linkemu
import netns
import pytest

from builtin_plugins.executors.cluster import HEARTBEAT_TIMEOUT  # 10 s: the head and each node

pytestmark = pytest.mark.skipif((netns.skip_reason() or linkemu.skip_reason()) is not None,
                                reason=str(netns.skip_reason() or linkemu.skip_reason()))

ECHO_PORT, UDP_PORT = 7391, 7392
SECRET = "link-faults-secret"
CLUSTER_PORT, HTTP_PORT = "29591", "18131"  # inside the namespaces: no other test's ports there
DETECTION_BOUND = 20.0  # the bound the multi-host tests hold the 10 s heartbeat to


class Lines:
    """Reads a process's stream all along (a pipe nobody reads fills and blocks it); waits for a line."""

    def __init__(self, stream) -> None:
        self.lines: list[tuple[float, str]] = []  # (arrival time, line)
        self.changed = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self.changed:
                self.lines.append((time.monotonic(), line))
                self.changed.notify_all()

    def wait_for(self, predicate, timeout: float, what: str):
        """The first line for which ``predicate`` is true (``timeout`` is a safety net only)."""
        def found():
            return next((line for _, line in self.lines if predicate(line)), None)

        with self.changed:
            line = self.changed.wait_for(found, timeout)
        assert line is not None, f"never saw {what} in:\n{self.text()[-4000:]}"
        return line

    def wait_for_text(self, needle: str, timeout: float = 1200) -> str:
        return self.wait_for(lambda line: needle in line, timeout, repr(needle))

    def text(self) -> str:
        return "".join(line for _, line in self.lines)


@pytest.fixture
def hosts():
    with netns.two_hosts() as h:
        h.started = []
        try:
            yield h
        finally:
            for proc in h.started:
                netns.kill_tree(proc)


@pytest.fixture
def linked(hosts):
    """The two hosts, every packet between their addresses crossing the emulated link (``hosts.link``); the
    processes a test started end before the link does."""
    with linkemu.emulated_link(hosts, seed=1234) as link:
        hosts.link = link
        try:
            yield hosts
        finally:
            for proc in hosts.started:
                netns.kill_tree(proc)


# ---------------------------------------------------------------------------------------------------------
# The emulator itself (fast).
# ---------------------------------------------------------------------------------------------------------

ECHO_SERVER = """
import socket, threading
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((@ADDR@, @PORT@))
server.listen(16)
print("LISTENING", flush=True)

def echo(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)

while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
"""

# Round trips of one byte on one connection, timed from outside the link (the client's own clock)
ROUND_TRIPS = """
import json, socket, time
conn = socket.create_connection((@ADDR@, @PORT@), timeout=120)
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for _ in range(5):
    started = time.monotonic()
    conn.sendall(b"x")
    assert conn.recv(1) == b"x"
    times.append(time.monotonic() - started)
print(json.dumps(times), flush=True)
"""

# One connection: an echo before the partition, then (on "GO") one sent into it, printed when it comes back
ACROSS_A_PARTITION = """
import socket, sys, time
conn = socket.create_connection((@ADDR@, @PORT@), timeout=120)
conn.sendall(b"before")
print("REPLY", conn.recv(64).decode(), flush=True)
assert sys.stdin.readline().strip() == "GO"
conn.settimeout(None)  # whatever the partition lasts: TCP retransmits until the heal
conn.sendall(b"during")
print("REPLY", conn.recv(64).decode(), flush=True)
"""

CONNECT = """
import socket
try:
    with socket.create_connection((@ADDR@, @PORT@), timeout=@TIMEOUT@) as conn:
        conn.sendall(b"hello")
        print("REPLY", conn.recv(64).decode(), flush=True)
except OSError as exc:
    print("FAILED", type(exc).__name__, exc, flush=True)
"""

UDP_RECEIVER = """
import socket
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
sock.bind((@ADDR@, @PORT@))
print("LISTENING", flush=True)
received = 0
while (data := sock.recv(2048)) != b"END":
    received += 1
print("RECEIVED", received, flush=True)
"""

# N numbered datagrams, then (on "END", once the test made the link lossless) the end marker
UDP_SENDER = """
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(@COUNT@):
    sock.sendto(b"%d" % i, (@ADDR@, @PORT@))
print("SENT", flush=True)
assert sys.stdin.readline().strip() == "END"
sock.sendto(b"END", (@ADDR@, @PORT@))
"""


def script(code: str, addr: str, port: int, **names) -> str:
    """``code`` with ``@ADDR@``, ``@PORT@`` and ``@NAME@`` (each of ``names``) replaced by their values."""
    for name, value in {"ADDR": addr, "PORT": port, **names}.items():
        code = code.replace(f"@{name}@", repr(value))
    return code


def start_echo_server(hosts) -> None:
    server = hosts.python(1, script(ECHO_SERVER, hosts.addrs[1], ECHO_PORT))
    hosts.started.append(server)
    assert server.stdout.readline().strip() == "LISTENING", server.stderr.read()


def wait_until(condition, timeout: float, what: str, interval: float = 0.05):
    """Poll ``condition`` (a cheap query of the relay) until it holds; ``timeout`` is a safety net only."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(interval)
    return value


def test_traffic_crosses_the_relay_with_at_least_the_configured_delay(linked):
    hosts, link = linked, linked.link
    start_echo_server(hosts)
    link.set(delay_ms=50)
    before = link.stats()
    client = hosts.python(0, script(ROUND_TRIPS, hosts.addrs[1], ECHO_PORT))
    hosts.started.append(client)
    out, err = client.communicate(timeout=300)
    assert client.returncode == 0, err
    times = json.loads(out)
    assert min(times) >= 2 * 0.050, times  # each round trip crosses the link twice: a lower bound only
    if link.backend == "relay":  # and it did cross the relay, both ways
        after = link.stats()
        for direction in ("a_to_b", "b_to_a"):
            assert after[direction]["forwarded"] - before[direction]["forwarded"] >= 5, (before, after)


def test_loss_drops_packets(linked):
    hosts, link = linked, linked.link
    sent = 300
    receiver = hosts.python(1, script(UDP_RECEIVER, hosts.addrs[1], UDP_PORT))
    hosts.started.append(receiver)
    assert receiver.stdout.readline().strip() == "LISTENING", receiver.stderr.read()
    link.set(loss=0.3)
    before = link.stats()
    sender = hosts.python(0, script(UDP_SENDER, hosts.addrs[1], UDP_PORT, COUNT=sent), stdin=subprocess.PIPE)
    hosts.started.append(sender)
    assert sender.stdout.readline().strip() == "SENT", sender.stderr.read()
    if link.backend == "relay":  # every datagram has met the loss before it goes (the relay read them all)
        wait_until(lambda: link.stats()["a_to_b"]["packets"] - before["a_to_b"]["packets"] >= sent, 120,
                   "the relay reading every datagram")
    link.set(loss=0.0)  # the end marker must arrive: it follows every surviving datagram (a FIFO link)
    sender.stdin.write("END\n")
    sender.stdin.flush()
    out, err = receiver.communicate(timeout=120)
    received = int(out.split()[-1])
    assert 0 < received < sent, (received, err)
    if link.backend == "relay":
        assert link.stats()["a_to_b"]["lost"] - before["a_to_b"]["lost"] >= sent - received - 5


@pytest.mark.slow
def test_a_partition_stops_tcp_and_the_heal_restores_it(linked):
    hosts, link = linked, linked.link
    start_echo_server(hosts)
    client = hosts.python(0, script(ACROSS_A_PARTITION, hosts.addrs[1], ECHO_PORT), stdin=subprocess.PIPE)
    hosts.started.append(client)
    replies = Lines(client.stdout)
    replies.wait_for_text("REPLY before", timeout=120)
    partitioned = link.partition()["stats"]
    client.stdin.write("GO\n")
    client.stdin.flush()
    if link.backend == "relay":  # the echo sent into the partition met it (and was dropped)
        wait_until(lambda: link.stats()["a_to_b"]["partitioned"] > partitioned["a_to_b"]["partitioned"], 120,
                   "a packet meeting the partition")
    # a new connection cannot get through either: its handshake is dropped until the connect times out
    # (2 s is no speed assumption: no handshake can succeed while everything is dropped)
    connect = hosts.python(0, script(CONNECT, hosts.addrs[1], ECHO_PORT, TIMEOUT=2.0))
    hosts.started.append(connect)
    out, _ = connect.communicate(timeout=120)
    assert out.startswith("FAILED"), out
    assert "REPLY during" not in replies.text()  # nothing crossed
    link.heal()
    replies.wait_for_text("REPLY during", timeout=120)  # TCP's retransmission gets it through after the heal
    again = hosts.python(0, script(CONNECT, hosts.addrs[1], ECHO_PORT, TIMEOUT=120.0))
    hosts.started.append(again)
    out, _ = again.communicate(timeout=120)
    assert out.strip() == "REPLY hello", out


def test_the_link_is_removed_even_when_the_test_fails(hosts):
    with pytest.raises(RuntimeError, match="the test failed"):
        with linkemu.emulated_link(hosts) as link:
            relay = getattr(link, "process", None)
            raise RuntimeError("the test failed")
    if relay is not None:
        assert relay.poll() is not None  # the relay is gone
    for host in (0, 1):
        shown = subprocess.run(["ip", "-n", hosts.names[host], "addr"], capture_output=True, text=True).stdout
        assert "kct" not in shown  # the tun devices too
        assert f"{hosts.addrs[host]}/24" in shown  # the veth carries the hosts again
    start_echo_server(hosts)
    client = hosts.python(0, script(CONNECT, hosts.addrs[1], ECHO_PORT, TIMEOUT=120.0))
    hosts.started.append(client)
    assert client.communicate(timeout=120)[0].strip() == "REPLY hello"


# ---------------------------------------------------------------------------------------------------------
# A tensor-parallel cluster across the link.
# ---------------------------------------------------------------------------------------------------------

# Runs on the head's host (the server's loopback): one JSON command per stdin line, each served on a thread of
# its own; one JSON line per outcome (with the time it was seen) on stdout.
DRIVER = r"""
import http.client, json, sys, threading, time

lock = threading.Lock()

def emit(**record):
    record["t"] = time.monotonic()
    with lock:
        print(json.dumps(record), flush=True)

def send(method, path, body=None, timeout=600):  # a safety net: a hang would show as a timeout error
    conn = http.client.HTTPConnection("127.0.0.1", @HTTP_PORT@, timeout=timeout)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    return conn.getresponse()

def complete(tag, body):
    try:
        response = send("POST", "/v1/completions", body)
        text = response.read().decode()
        emit(tag=tag, status=response.status, body=json.loads(text) if text.startswith("{") else text)
    except Exception as exc:
        emit(tag=tag, status=None, error=f"{type(exc).__name__}: {exc}")

def stream(tag, body):
    chunks, text, error, status = 0, "", None, None
    try:
        response = send("POST", "/v1/completions", dict(body, stream=True))
        status = response.status
        if status != 200:
            error = response.read().decode()
        else:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    break
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    error = event["error"]["message"]
                    continue
                chunks += 1
                text += event["choices"][0]["text"]
                if chunks == 1:
                    emit(tag=tag, event="first")
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    emit(tag=tag, event="end", status=status, chunks=chunks, text=text, error=error)

def health(tag):
    try:
        response = send("GET", "/health", timeout=60)
        emit(tag=tag, status=response.status, body=response.read().decode())
    except Exception as exc:
        emit(tag=tag, status=None, error=f"{type(exc).__name__}: {exc}")

for line in sys.stdin:
    command = json.loads(line)
    target = {"complete": complete, "stream": stream, "health": health}[command.pop("op")]
    threading.Thread(target=target, args=tuple(command.values()), daemon=True).start()
"""


class Driver:
    def __init__(self, hosts) -> None:
        self.proc = hosts.python(0, DRIVER.replace("@HTTP_PORT@", HTTP_PORT), stdin=subprocess.PIPE)
        hosts.started.append(self.proc)
        self.out = Lines(self.proc.stdout)
        self.count = 0

    def start(self, op: str, body: dict | None = None) -> str:
        self.count += 1
        tag = f"{op}-{self.count}"
        command = {"op": op, "tag": tag, **({"body": body} if body is not None else {})}
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return tag

    def result(self, tag: str, event: str | None = None, timeout: float = 900) -> dict:
        line = self.out.wait_for(lambda line: (r := json.loads(line))["tag"] == tag and r.get("event") == event,
                                 timeout, f"{tag} {event or ''}")
        return json.loads(line)

    def call(self, op: str, body: dict | None = None, timeout: float = 900) -> dict:
        return self.result(self.start(op, body), None, timeout)

    def health(self) -> dict:
        return self.call("health", timeout=120)


def completion(prompt: str, max_tokens: int) -> dict:
    return {"model": "llama", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


PROMPTS = ["Once upon a time", "The capital of", "1 2 3 4 5"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The multi-host tests' random 2-layer Llama, with a tokenizer (the server takes text)."""
    from conftest_models import make_llama_checkpoint
    from gguf_helpers import add_tokenizer

    path = make_llama_checkpoint(str(tmp_path_factory.mktemp("llama")), num_hidden_layers=2)
    add_tokenizer(path, 320)
    return path


def start_cluster(hosts, model_dir: str):
    """A head (`kc serve`, HTTP on its loopback) and a headless node, TP=2: a rank on each host. Returns the
    two processes, their logs and their kernelcore children once the head serves."""
    cluster = ["-tp", "2", "--nnodes", "2", "--master-addr", hosts.addrs[0], "--master-port", CLUSTER_PORT,
               "--kv-cache-memory", "16MiB", "--no-enable-prefix-caching"]  # no cache: every run computes alike
    head = hosts.kc(0, "serve", model_dir, *cluster, "--node-rank", "0", "--port", HTTP_PORT,
                    "--served-model-name", "llama", KC_CLUSTER_SECRET=SECRET)
    node = hosts.kc(1, "serve", model_dir, *cluster, "--node-rank", "1", "--headless", KC_CLUSTER_SECRET=SECRET)
    hosts.started += [head, node]
    head_log, node_log = Lines(head.stderr), Lines(node.stderr)
    head_log.wait_for_text(f"on http://127.0.0.1:{HTTP_PORT}")
    children = netns.kc_family(head), netns.kc_family(node)
    assert len(children[0]) == 2 and len(children[1]) == 1, children  # engine-core + worker-0 | worker-1
    return head, node, head_log, node_log, children


def texts(driver: Driver, max_tokens: int = 16) -> list[str]:
    """The greedy completions of PROMPTS, one request at a time (each batch the same, whatever the link)."""
    results = [driver.call("complete", completion(p, max_tokens)) for p in PROMPTS]
    assert all(r["status"] == 200 for r in results), results
    return [r["body"]["choices"][0]["text"] for r in results]


def stop_head(head, node, head_log, node_log, children, node_exit: int) -> None:
    """SIGTERM the head; it exits 0, the node exits with `node_exit` (0: the head's shutdown ended it; it
    notices a moment after the head is gone, so it is waited for), and no process of either is left."""
    head.send_signal(signal.SIGTERM)
    assert head.wait(120) == 0, head_log.text()[-4000:]
    assert node.wait(60) == node_exit, node_log.text()[-4000:]
    assert not netns.alive(children[0] + children[1] + [head.pid, node.pid])


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a model load on each host; a loaded 2-core machine is slow
def test_a_slow_lossy_link_and_a_short_partition_change_no_greedy_output(linked, model_dir):
    hosts, link = linked, linked.link
    head, node, head_log, node_log, children = start_cluster(hosts, model_dir)
    driver = Driver(hosts)
    clean = texts(driver)  # the reference: the same cluster over a clean link
    long_clean = driver.call("complete", completion(PROMPTS[0], 120))["body"]["choices"][0]["text"]
    assert all(clean) and long_clean

    # 1. 20 ms each way and 1% loss: TCP (gloo's and the control channels') recovers every loss
    before = link.stats()
    link.set(delay_ms=20, loss=0.01)
    assert texts(driver) == clean
    if link.backend == "relay":  # the impairments were on the traffic: packets were lost and recovered
        after = link.stats()
        assert sum(after[d]["lost"] - before[d]["lost"] for d in after) > 0, (before, after)

    # 2. a 2 s partition, well inside the 10 s heartbeat timeout, while a request streams: it finishes after
    #    the heal with the clean link's text, and the cluster is healthy. With 20 ms each way every step costs
    #    at least a round trip, so the 120-token request is still streaming when the partition starts (the
    #    delay goes once the link has healed).
    link.set(loss=0.0)
    stream = driver.start("stream", completion(PROMPTS[0], 120))
    driver.result(stream, "first")
    partitioned = link.partition()["stats"]
    time.sleep(2.0)  # the fault itself: two seconds without a packet
    healed = link.heal()["stats"]
    healed_at = time.monotonic()
    link.set(delay_ms=0)  # the rest of the stream and the checks below at the link's own speed
    if link.backend == "relay":
        assert healed["a_to_b"]["partitioned"] > partitioned["a_to_b"]["partitioned"]  # it did drop the traffic
    ended = driver.result(stream, "end")
    print(f"observed: the stream across the 2 s partition ended {ended['t'] - healed_at:.1f}s after the heal "
          f"with {ended['chunks']} chunks, error {ended['error']!r}; link counters {healed}")
    assert ended["error"] is None and ended["text"] == long_clean, ended
    assert driver.health()["status"] == 200
    assert texts(driver) == clean
    assert node.poll() is None and f"node 1 ({hosts.addrs[1]}) lost" not in head_log.text()
    stop_head(head, node, head_log, node_log, children, node_exit=0)  # the head's shutdown ends the node cleanly


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_15s_partition_fails_the_request_in_flight_and_the_head_answers_503_after_the_heal(linked, model_dir):
    hosts, link = linked, linked.link
    head, node, head_log, node_log, children = start_cluster(hosts, model_dir)
    driver = Driver(hosts)
    assert driver.health()["status"] == 200
    link.set(delay_ms=20)  # every step costs a round trip: the 200-token request is surely in flight below
    stream = driver.start("stream", completion(PROMPTS[0], 200))
    driver.result(stream, "first")
    whole = driver.start("complete", completion(PROMPTS[2], 200))  # and one answered in one piece, at its end
    link.partition()
    partitioned_at = time.monotonic()
    lost = f"node 1 ({hosts.addrs[1]}) lost"

    # during the partition: /health turns 503 naming the lost host (polled until then, or until the heal)
    health = driver.health()
    while health["status"] != 503 and time.monotonic() < partitioned_at + 15.0:
        time.sleep(0.2)
        health = driver.health()
    time.sleep(max(0.0, partitioned_at + 15.0 - time.monotonic()))  # the fault lasts its 15 s
    link.heal()
    assert health["status"] == 503 and lost in health["body"], health
    assert health["t"] - partitioned_at < DETECTION_BOUND, f"/health took {health['t'] - partitioned_at:.0f}s"

    # the stream ended with an error naming the lost host: the 10 s heartbeat timeout fired (about 10 s after
    # the last heartbeat that crossed, i.e. 9-11 s into the partition)
    ended = driver.result(stream, "end", timeout=300)
    assert ended["chunks"] >= 1 and ended["error"] and lost in ended["error"], ended  # failed in flight
    assert f"no heartbeat for {HEARTBEAT_TIMEOUT:.0f}s" in ended["error"], ended
    assert ended["t"] - partitioned_at < DETECTION_BOUND, f"the stream failed {ended['t'] - partitioned_at:.0f}s in"
    failed = driver.result(whole, timeout=300)
    assert failed["status"] == 503 and lost in failed["body"]["error"]["message"], failed
    assert failed["t"] - partitioned_at < DETECTION_BOUND, f"the request failed {failed['t'] - partitioned_at:.0f}s in"

    # the node gave up on the head (its own 10 s heartbeat timeout) and left nothing running
    assert node.wait(120) == 1, node_log.text()[-4000:]
    assert f"the head at {hosts.addrs[0]}:{CLUSTER_PORT} is gone (lost: no heartbeat for " \
        f"{HEARTBEAT_TIMEOUT:.0f}s)" in node_log.text()
    assert not netns.alive(children[1] + [node.pid])

    # after the heal the head answers at once: 503 naming the host it lost, for /health and for a request
    after = driver.health()
    assert after["status"] == 503 and lost in after["body"], after
    refused = driver.call("complete", completion(PROMPTS[1], 8), timeout=120)
    assert refused["status"] == 503 and lost in refused["body"]["error"]["message"], refused
    wait_until(lambda: not netns.alive(children[0]), 120, "the head's engine core and worker exiting")
    print(f"observed: /health 503 {health['t'] - partitioned_at:.1f}s into the partition ({health['body'].strip()!r});"
          f" the stream failed after {ended['chunks']} chunks, {ended['t'] - partitioned_at:.1f}s in "
          f"({ended['error']!r}); the whole-answer request: {failed['status']} {failed['t'] - partitioned_at:.1f}s in; "
          f"after the heal: {refused['body']['error']['message']!r}")
    stop_head(head, node, head_log, node_log, children, node_exit=1)
