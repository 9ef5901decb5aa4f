"""Test helpers: run code in a fresh interpreter (platform and plugin state are per process)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

DUMMY_ENV_VARS = ("KC_DUMMY_DEVICE", "KC_DUMMY_SECOND_DEVICE", "KC_DUMMY_BROKEN_DETECTOR", "KC_DUMMY_LEAVE_AUTO",
                  "KC_DUMMY_OPS", "KC_DUMMY_MODEL_RAISE", "KC_DUMMY_OVERRIDE_OPT", "KC_PLUGINS", "KC_BLOCK_PLUGINS",
                  "KC_PLATFORM", "KC_TRACE_PLUGINS", "KC_DUMMY_BLOCK_SIZE", "KC_DUMMY_DTYPE",
                  "KC_DUMMY_DRIVER", "KC_DUMMY_TYPO_HOOK", "KC_ENDPOINT_PLUGINS")


def clean_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DUMMY_ENV_VARS}
    env.update(overrides)
    return env


def run_python(code: str, *, check: bool = True, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=clean_env(**env), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snippet failed ({proc.returncode}):\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
    return proc


def run_kc(*args: str, check: bool = True, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "kernelcore.entrypoints.cli", *args], env=clean_env(**env),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"kc {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def scripted_default_model(target: str, kc_script: dict[str, list[int]]) -> str:
    """The embedded default model's files in ``target`` (symlinked) as architecture KcScriptedLlama (the dummy
    model package), which writes ``kc_script[str(position)]``'s token ids from that position on."""
    import json

    from kernelcore.models.default_model import ensure_default_model

    source = ensure_default_model()
    for name in os.listdir(source):
        if name != "config.json":
            os.symlink(os.path.join(source, name), os.path.join(target, name))
    with open(os.path.join(source, "config.json")) as f:
        config = json.load(f)
    config.update(architectures=["KcScriptedLlama"], kc_script=kc_script)
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(config, f)
    return target


PORTS_PER_WORKER = 4000
FIRST_WORKER_PORT = 20000  # below the kernel's ephemeral range (32768-60999): no connection takes these


def free_port() -> int:
    """A loopback port nobody listens on, for a server a test starts. Under pytest-xdist each worker draws from
    its own range: a port chosen by one worker and not yet bound by its server is never another worker's pick."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    if not worker.startswith("gw"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    first = FIRST_WORKER_PORT + int(worker[2:]) * PORTS_PER_WORKER
    while True:
        port = random.randrange(first, first + PORTS_PER_WORKER)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def start_server(*args: str, timeout: float = 180, log_path: str | None = None,
                 **env: str) -> tuple[subprocess.Popen, str]:
    """`kc serve ARGS` on a free port, its output to ``log_path`` (a fresh temporary file by default: a pipe
    nobody reads would fill and block it); returns once /health answers. ``proc.log_path`` and ``proc.args_used``
    say where its output went and how it was started."""
    import requests

    port = free_port()
    argv = [sys.executable, "-m", "kernelcore.entrypoints.cli", "serve", "--port", str(port), *args]
    if log_path is None:
        log_path = tempfile.NamedTemporaryFile("w+", prefix="kc-serve-", suffix=".log", delete=False).name
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=clean_env(**env), stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log_path, proc.args_used = log_path, argv  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}):\n{server_log(proc)}")
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except requests.ConnectionError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"server did not become healthy in time:\n{server_log(proc)}")


def server_log(proc: subprocess.Popen) -> str:
    with open(proc.log_path) as f:  # type: ignore[attr-defined]
        return f.read()


def stop_server(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
