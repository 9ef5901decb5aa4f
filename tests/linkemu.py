"""A link that misbehaves between the two simulated hosts of :mod:`netns`: one-way delay, random (seeded) loss,
and a partition switch (drop everything) that a test turns on and off while the hosts talk.

With ``tc netem`` in the kernel the veth pair itself is impaired (a netem qdisc on each end). Without it (no
module, none loadable) a userspace relay carries the traffic instead: each namespace gets a tun device holding
its host's address (``ADDR/32 peer OTHER``; the veth loses its address and goes down, so no packet between the
two addresses can take another way), and ONE relay process (``python tests/linkemu.py relay ...``, started by
:func:`emulated_link`) holds both tun file descriptors (opened inside each namespace with ``setns``) and copies
IP packets between them: each packet read is dropped while partitioned, dropped with probability ``loss`` (a
seeded generator, one draw per packet in arrival order), or written to the other tun ``delay_ms`` later (a
FIFO per direction: no reordering). The relay takes its settings from a unix control socket: one JSON object
per line (``{"delay_ms": 20, "loss": 0.01, "partition": true}``, any subset; ``{}`` only reads), answered once
applied with the settings and its packet counters, so a test acts on an acknowledged event, never on a sleep.

:func:`emulated_link` is a context manager: on exit (failure included) it ends the relay, deletes the tun
devices and gives the veth its address back, as :func:`netns.two_hosts` removes its namespaces.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import fcntl
import json
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

BACKENDS = ("auto", "relay", "netem")  # LINKEMU_BACKEND chooses one; auto: netem when the kernel has it
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
READY_TIMEOUT = 60.0  # a safety net: the relay prints its ready line as soon as both tuns are attached


# ---------------------------------------------------------------------------------------------------------
# The relay process (runs in the root namespace; enters each host's namespace only to open its tun).
# ---------------------------------------------------------------------------------------------------------

def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def open_tun(namespace: str, name: str) -> int:
    """Attach to the (persistent) tun device ``name`` of network namespace ``namespace``; the descriptor stays
    bound to that namespace's device after this thread returns to its own namespace."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            fd = os.open("/dev/net/tun", os.O_RDWR)
            try:
                fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI))
            except OSError:
                os.close(fd)
                raise
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)
    os.set_blocking(fd, False)
    return fd


class Relay:
    """Copies packets between two tun descriptors with the current delay, loss and partition."""

    DIRECTIONS = ("a_to_b", "b_to_a")

    def __init__(self, fds: tuple[int, int], control: socket.socket, seed: int, delay_ms: float = 0.0,
                 loss: float = 0.0) -> None:
        self.fds, self.control = fds, control
        self.rng = random.Random(seed)
        self.delay, self.loss, self.partition = delay_ms / 1000.0, loss, False
        self.queues: tuple[collections.deque, collections.deque] = (collections.deque(), collections.deque())
        self.stats = {d: {"packets": 0, "forwarded": 0, "lost": 0, "partitioned": 0, "write_errors": 0}
                      for d in self.DIRECTIONS}
        self.clients: dict[socket.socket, bytes] = {}

    def settings(self) -> dict[str, Any]:
        return {"delay_ms": self.delay * 1000.0, "loss": self.loss, "partition": self.partition}

    def apply(self, command: dict[str, Any]) -> dict[str, Any]:
        unknown = set(command) - {"delay_ms", "loss", "partition"}
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}")
        if "delay_ms" in command:
            if float(command["delay_ms"]) < 0:
                raise ValueError("delay_ms must be >= 0")
            self.delay = float(command["delay_ms"]) / 1000.0
        if "loss" in command:
            if not 0.0 <= float(command["loss"]) <= 1.0:
                raise ValueError("loss must be within [0, 1]")
            self.loss = float(command["loss"])
        if "partition" in command:
            self.partition = bool(command["partition"])
            if self.partition:  # the packets on the wire are lost with it
                for direction, queue in zip(self.DIRECTIONS, self.queues, strict=True):
                    self.stats[direction]["partitioned"] += len(queue)
                    queue.clear()
        return {"ok": True, "settings": self.settings(), "stats": self.stats}

    def _read(self, src: int, now: float) -> None:
        stats, queue = self.stats[self.DIRECTIONS[src]], self.queues[1 - src]
        for _ in range(256):  # then let the other direction and the control socket have their turn
            try:
                packet = os.read(self.fds[src], 65536)
            except BlockingIOError:
                return
            stats["packets"] += 1
            if self.partition:
                stats["partitioned"] += 1
            elif self.loss and self.rng.random() < self.loss:
                stats["lost"] += 1
            else:
                queue.append((now + self.delay, packet))

    def _release(self, now: float) -> None:
        for dst, queue in enumerate(self.queues):
            stats = self.stats[self.DIRECTIONS[1 - dst]]
            while queue and queue[0][0] <= now:
                _, packet = queue.popleft()
                try:
                    os.write(self.fds[dst], packet)
                    stats["forwarded"] += 1
                except OSError:
                    stats["write_errors"] += 1

    def _serve_client(self, client: socket.socket) -> None:
        try:
            data = client.recv(65536)
        except OSError:
            data = b""
        if not data:
            del self.clients[client]
            client.close()
            return
        buffer = self.clients[client] + data
        *lines, self.clients[client] = buffer.split(b"\n")
        for line in lines:
            try:
                reply = self.apply(json.loads(line or b"{}"))
            except (ValueError, TypeError) as exc:
                reply = {"ok": False, "error": str(exc)}
            with contextlib.suppress(OSError):
                client.sendall(json.dumps(reply).encode() + b"\n")

    def run(self) -> None:
        while True:
            due = [queue[0][0] for queue in self.queues if queue]
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            readable, _, _ = select.select([*self.fds, self.control, *self.clients], [], [], timeout)
            now = time.monotonic()
            for src, fd in enumerate(self.fds):
                if fd in readable:
                    self._read(src, now)
            if self.control in readable:
                client, _ = self.control.accept()
                self.clients[client] = b""
            for client in [c for c in readable if c in self.clients]:
                self._serve_client(client)
            self._release(time.monotonic())


def relay_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="linkemu.py relay")
    parser.add_argument("--ns", action="append", required=True, help="a namespace (twice)")
    parser.add_argument("--tun", action="append", required=True, help="its tun device (twice, in order)")
    parser.add_argument("--control", required=True, help="path of the unix control socket to create")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0)
    args = parser.parse_args(argv)
    if len(args.ns) != 2 or len(args.tun) != 2:
        parser.error("give --ns and --tun twice")
    with contextlib.suppress(OSError):  # the test that started us dies: so do we (nothing left running)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    fds = (open_tun(args.ns[0], args.tun[0]), open_tun(args.ns[1], args.tun[1]))
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.bind(args.control)
    control.listen(8)
    relay = Relay(fds, control, args.seed, args.delay_ms, args.loss)
    print(json.dumps({"ready": True, "pid": os.getpid(), "settings": relay.settings()}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        relay.run()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(args.control)
    return 0


# ---------------------------------------------------------------------------------------------------------
# The test's side.
# ---------------------------------------------------------------------------------------------------------

def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def netem_available(namespace: str, interface: str) -> bool:
    """Whether ``tc qdisc add ... netem`` works here (tried on ``interface`` of ``namespace``, then removed)."""
    if shutil.which("tc") is None:
        return False
    tried = subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", interface, "root",
                            "netem", "delay", "1ms"], capture_output=True, text=True, timeout=30)
    if tried.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", interface, "root"],
                   capture_output=True, timeout=30)
    return True


def skip_reason(backend: str = "relay") -> str | None:
    """Why ``backend`` cannot run here (None when it can); netns.skip_reason() covers root and iproute2."""
    if backend == "relay" and not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (no tun driver)"
    if backend == "netem" and shutil.which("tc") is None:
        return "tc (iproute2) is not installed"
    return None


class Link:
    """The link between the two hosts; ``set`` changes it (None keeps a setting) and returns once applied."""

    backend = ""

    def set(self, *, delay_ms: float | None = None, loss: float | None = None,
            partition: bool | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def partition(self) -> dict[str, Any]:
        return self.set(partition=True)

    def heal(self) -> dict[str, Any]:
        return self.set(partition=False)

    def stats(self) -> dict[str, Any]:
        """Packet counters per direction ({} where the backend has none to give)."""
        return {}


class RelayLink(Link):
    backend = "relay"

    def __init__(self, process: subprocess.Popen, control_path: str, log_path: str) -> None:
        self.process, self.control_path, self.log_path = process, control_path, log_path

    def log(self) -> str:
        with contextlib.suppress(OSError), open(self.log_path) as f:
            return f.read()[-4000:]
        return ""

    def command(self, command: dict[str, Any]) -> dict[str, Any]:
        if self.process.poll() is not None:
            raise RuntimeError(f"the link relay exited ({self.process.returncode}): {self.log()}")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)  # a safety net: the relay answers at once
            sock.connect(self.control_path)
            sock.sendall(json.dumps(command).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise RuntimeError(f"the link relay closed its control socket: {self.log()}")
                data += chunk
        reply = json.loads(data)
        if not reply.get("ok"):
            raise ValueError(reply.get("error"))
        return reply

    def set(self, *, delay_ms=None, loss=None, partition=None) -> dict[str, Any]:
        command = {k: v for k, v in (("delay_ms", delay_ms), ("loss", loss), ("partition", partition))
                   if v is not None}
        return self.command(command)

    def stats(self) -> dict[str, Any]:
        return self.command({})["stats"]


class NetemLink(Link):
    """A netem qdisc on each end of the veth: the delay and the loss apply to each direction once."""

    backend = "netem"

    def __init__(self, hosts) -> None:
        self.hosts = hosts
        self.settings = {"delay_ms": 0.0, "loss": 0.0, "partition": False}

    def set(self, *, delay_ms=None, loss=None, partition=None) -> dict[str, Any]:
        for key, value in (("delay_ms", delay_ms), ("loss", loss), ("partition", partition)):
            if value is not None:
                self.settings[key] = value
        loss_pct = 100.0 if self.settings["partition"] else 100.0 * float(self.settings["loss"])
        for host in (0, 1):
            subprocess.run(["ip", "netns", "exec", self.hosts.names[host], "tc", "qdisc", "replace", "dev",
                            self.hosts.interfaces[host], "root", "netem", "delay", f"{self.settings['delay_ms']}ms",
                            "loss", f"{loss_pct}%"], check=True, capture_output=True, timeout=30)
        return {"ok": True, "settings": dict(self.settings), "stats": {}}


def choose_backend(hosts, backend: str | None = None) -> str:
    backend = backend or os.environ.get("LINKEMU_BACKEND", "auto")
    if backend not in BACKENDS:
        raise ValueError(f"LINKEMU_BACKEND={backend!r}: one of {BACKENDS}")
    if backend == "auto":
        return "netem" if netem_available(hosts.names[0], hosts.interfaces[0]) else "relay"
    return backend


def _wait_ready(process: subprocess.Popen, log: str) -> None:
    """The relay's ready line (it has attached both tuns and listens on its control socket)."""
    lines: list[str] = []
    got = threading.Event()

    def read() -> None:
        lines.append(process.stdout.readline())  # type: ignore[union-attr]
        got.set()

    threading.Thread(target=read, daemon=True).start()
    if not got.wait(READY_TIMEOUT) or not lines[0].startswith("{"):
        with contextlib.suppress(OSError), open(log) as f:
            raise RuntimeError(f"the link relay did not start ({process.poll()}): {f.read()[-4000:]}")
        raise RuntimeError("the link relay did not start")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@contextlib.contextmanager
def emulated_link(hosts, *, delay_ms: float = 0.0, loss: float = 0.0, seed: int = 0,
                  backend: str | None = None) -> Iterator[Link]:
    """Make every packet between ``hosts.addrs`` cross an emulated link (see the module's docstring)."""
    backend = choose_backend(hosts, backend)
    if backend == "netem":
        link = NetemLink(hosts)
        try:
            link.set(delay_ms=delay_ms, loss=loss, partition=False)
            yield link
        finally:
            for host in (0, 1):
                subprocess.run(["ip", "netns", "exec", hosts.names[host], "tc", "qdisc", "del", "dev",
                                hosts.interfaces[host], "root"], capture_output=True, timeout=30)
        return
    tag = hosts.interfaces[0][4:]  # netns names its veth ends kcva<tag> / kcvb<tag>
    tuns = (f"kcta{tag}", f"kctb{tag}")
    workdir = tempfile.mkdtemp(prefix="kc-linkemu-")
    control, log_path = os.path.join(workdir, "control.sock"), os.path.join(workdir, "relay.log")
    created: list[int] = []
    moved: list[int] = []
    process = None
    try:
        for host in (0, 1):
            _ip("-n", hosts.names[host], "tuntap", "add", "mode", "tun", "name", tuns[host])
            created.append(host)
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "relay", "--ns", hosts.names[0], "--tun", tuns[0],
                 "--ns", hosts.names[1], "--tun", tuns[1], "--control", control, "--seed", str(seed),
                 "--delay-ms", str(delay_ms), "--loss", str(loss)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True)
        _wait_ready(process, log_path)
        for host in (0, 1):
            name, veth, tun = hosts.names[host], hosts.interfaces[host], tuns[host]
            mine, other = hosts.addrs[host], hosts.addrs[1 - host]
            moved.append(host)
            _ip("-n", name, "addr", "del", f"{mine}/24", "dev", veth)
            _ip("-n", name, "link", "set", veth, "down")
            _ip("-n", name, "addr", "add", f"{mine}/32", "peer", f"{other}/32", "dev", tun)
            _ip("-n", name, "link", "set", tun, "up")
        yield RelayLink(process, control, log_path)
    finally:
        if process is not None:
            _stop(process)
        for host in created:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("-n", hosts.names[host], "link", "del", tuns[host])
        for host in moved:  # the veth carries the hosts again, as netns.two_hosts left it
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("-n", hosts.names[host], "addr", "add", f"{hosts.addrs[host]}/24", "dev", hosts.interfaces[host])
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("-n", hosts.names[host], "link", "set", hosts.interfaces[host], "up")
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["relay"]:
        return relay_main(argv[1:])
    print("usage: linkemu.py relay --ns A --tun TUN_A --ns B --tun TUN_B --control PATH [--seed N] "
          "[--delay-ms MS] [--loss P]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
