"""Two simulated hosts: Linux network namespaces joined by a veth pair, created (and removed) by the test.

Addresses are private (10.213.x.1 and .2/24, x from the pid) and live inside the namespaces only; nothing is
routed outside them. Each command also gets its host's name (a UTS namespace of its own). Needs root and
iproute2; :func:`skip_reason` says why not when they are missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
from helpers import clean_env


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs the suite as root)"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    if shutil.which("unshare") is None:
        return "util-linux ('unshare') is not installed"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@dataclass
class Hosts:
    names: tuple[str, str]
    addrs: tuple[str, str]
    interfaces: tuple[str, str]
    hostnames: tuple[str, str] = ("kc-host-a", "kc-host-b")  # each command's own UTS namespace: a host of its own

    def popen(self, host: int, args: list[str], stdin: int | None = None, **env: str) -> subprocess.Popen:
        own_hostname = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.hostnames[host]]
        return subprocess.Popen(["ip", "netns", "exec", self.names[host], *own_hostname, *args], env=clean_env(**env),
                                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def python(self, host: int, code: str, stdin: int | None = None, **env: str) -> subprocess.Popen:
        return self.popen(host, [sys.executable, "-c", code], stdin=stdin, **env)

    def kc(self, host: int, *args: str, **env: str) -> subprocess.Popen:
        return self.popen(host, [sys.executable, "-m", "kernelcore.entrypoints.cli", *args], **env)

    def run(self, host: int, *args: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.names[host], *args], check=True, capture_output=True, timeout=30)


def kc_family(proc: subprocess.Popen) -> list[int]:
    """The kernelcore processes (``kc::`` titles) below ``proc``, wherever they run."""
    try:
        return [p.pid for p in psutil.Process(proc.pid).children(recursive=True) if "kc::" in " ".join(p.cmdline())]
    except psutil.NoSuchProcess:
        return []


def alive(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def kill_tree(proc: subprocess.Popen) -> None:
    try:
        parent = psutil.Process(proc.pid)
        family = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(family, timeout=10)
    with contextlib.suppress(Exception):
        proc.wait(10)


@contextlib.contextmanager
def two_hosts() -> Iterator[Hosts]:
    tag = f"{os.getpid() % 100000}"
    subnet = 1 + os.getpid() % 250
    names = (f"kc16a{tag}", f"kc16b{tag}")
    interfaces = (f"kcva{tag}", f"kcvb{tag}")
    addrs = (f"10.213.{subnet}.1", f"10.213.{subnet}.2")
    created: list[str] = []
    try:
        for name in names:
            _ip("netns", "add", name)
            created.append(name)
        _ip("link", "add", interfaces[0], "type", "veth", "peer", "name", interfaces[1])
        for name, interface, addr in zip(names, interfaces, addrs, strict=True):
            _ip("link", "set", interface, "netns", name)
            _ip("-n", name, "addr", "add", f"{addr}/24", "dev", interface)
            _ip("-n", name, "link", "set", interface, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        yield Hosts(names, addrs, interfaces)
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", interfaces[0])  # gone already once its namespace is
        for name in created:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", name)
