"""kc serve on a busy machine: one chat answer's latency idle and beside CPU-bound neighbour processes.

    python benchmarks/busy_neighbour.py                                   # SmolLM2 (kc pull), 1 neighbour
    python benchmarks/busy_neighbour.py --neighbours 2 --config "--num-threads 1" --config "env:OMP_WAIT_POLICY=PASSIVE"

Each configuration (extra `kc serve` flags, or ``env:NAME=VALUE``) gets its own server; the same greedy 30-token
chat request (ignore_eos; KC_BENCH_MAX_TOKENS sets another length) runs --num-runs times idle, then with the
neighbours spinning, and the medians are printed. A neighbour is a Python busy loop: what a browser tab or another
server does to a laptop's cores. The groundwork for the busy-machine comparison with llama-server; never part of
CI.

    cd /tmp && python /work/main/benchmarks/busy_neighbour.py --neighbour-kind server \
        --config "env:PYTHONPATH=/tmp/oldtree" --config ""

``--neighbour-kind server``: the neighbours are other kc serve processes (the same model, this tree) that take
turns with the server measured: each measured request comes right after one request to each of them, so the
machine was busy just before it and is idle while it runs (what a thread policy that looks back must not
mistake for a busy machine). An old tree given by ``env:PYTHONPATH`` needs a current directory outside the
checkout: ``python -m`` puts the current directory first on ``sys.path``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import click
import requests

BODY = {"model": "m", "messages": [{"role": "user", "content": "Tell me about Paris."}],
        "max_tokens": int(os.environ.get("KC_BENCH_MAX_TOKENS", "30")), "temperature": 0, "ignore_eos": True}


def start(model: str, config: str, port: int) -> subprocess.Popen:
    env, flags = dict(os.environ), []
    if config.startswith("env:"):
        name, _, value = config[4:].partition("=")
        env[name] = value
    elif config:
        flags = config.split()
    proc = subprocess.Popen([sys.executable, "-m", "kernelcore.entrypoints.cli", "serve", model, "--port", str(port),
                             "--served-model-name", "m", *flags], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    while True:  # the server's own health answer, however long start-up takes on a loaded machine
        if proc.poll() is not None:
            raise RuntimeError(f"kc serve {config!r} exited with {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=5).ok:
                return proc
        except requests.ConnectionError:
            time.sleep(0.5)


def latency(url: str) -> float:
    start_time = time.perf_counter()
    reply = requests.post(url + "/v1/chat/completions", json=BODY, timeout=600)
    reply.raise_for_status()
    return time.perf_counter() - start_time


@click.command()
@click.option("--model", default=None, help="A .gguf file or checkpoint directory [default: SmolLM2 via kc pull].")
@click.option("--config", "configs", multiple=True, help="Extra kc serve flags, or env:NAME=VALUE (repeatable).")
@click.option("--neighbours", default=1, show_default=True, help="CPU-bound processes beside the server.")
@click.option("--neighbour-kind", type=click.Choice(["loop", "server"]), default="loop", show_default=True,
              help="loop: busy loops all along; server: kc serve processes answering a request just before each.")
@click.option("--num-runs", default=3, show_default=True)
@click.option("--port", default=8219, show_default=True)
def main(model: str | None, configs: tuple[str, ...], neighbours: int, neighbour_kind: str, num_runs: int,
         port: int) -> None:
    if model is None:
        from kernelcore import model_fetch

        model = model_fetch.fetch("smollm2-135m-instruct-q4_1")
    servers = []
    if neighbour_kind == "server":
        servers = [start(model, "", port + 1 + i) for i in range(neighbours)]
    neighbour_urls = [f"http://127.0.0.1:{port + 1 + i}" for i in range(len(servers))]
    try:
        for neighbour_url in neighbour_urls:
            latency(neighbour_url)  # warm-up
        for config in configs or ("",):
            idle, busy = measure(model, config, port, neighbours, neighbour_urls, num_runs)
            idle_s, busy_s = statistics.median(idle), statistics.median(busy)
            print(f"{config or 'default':32s} idle {idle_s:6.2f} s   beside {neighbours} {neighbour_kind} "
                  f"neighbour(s) {busy_s:6.2f} s   x{busy_s / idle_s:.2f}", flush=True)
    finally:
        for server in servers:
            server.terminate()
            server.wait(60)


def measure(model: str, config: str, port: int, neighbours: int, neighbour_urls: list[str],
            num_runs: int) -> tuple[list[float], list[float]]:
    """Latencies of the server under ``config``: idle, then beside the neighbours (busy loops, or the neighbour
    servers each answering a request just before every measured one)."""
    url = f"http://127.0.0.1:{port}"
    proc = start(model, config, port)
    try:
        latency(url)  # warm-up
        idle = [latency(url) for _ in range(num_runs)]
        if neighbour_urls:
            busy = []
            for _ in range(num_runs):
                for neighbour_url in neighbour_urls:
                    latency(neighbour_url)
                busy.append(latency(url))
            return idle, busy
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(neighbours)]
        try:
            busy = [latency(url) for _ in range(num_runs)]
        finally:
            for hog in hogs:
                hog.kill()
        return idle, busy
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
