"""kc serve on a busy machine: one chat answer's latency idle and beside CPU-bound neighbour processes.

    python benchmarks/busy_neighbour.py                                   # SmolLM2 (kc pull), 1 neighbour
    python benchmarks/busy_neighbour.py --neighbours 2 --config "--num-threads 1" --config "env:OMP_WAIT_POLICY=PASSIVE"

Each configuration (extra `kc serve` flags, or ``env:NAME=VALUE``) gets its own server; the same greedy 30-token
chat request (ignore_eos) runs --num-runs times idle, then with the neighbours spinning, and the medians are
printed. A neighbour is a Python busy loop: what a browser tab or another server does to a laptop's cores. The
groundwork for the busy-machine comparison with llama-server; never part of CI.
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
@click.option("--num-runs", default=3, show_default=True)
@click.option("--port", default=8219, show_default=True)
def main(model: str | None, configs: tuple[str, ...], neighbours: int, num_runs: int, port: int) -> None:
    if model is None:
        from kernelcore import model_fetch

        model = model_fetch.fetch("smollm2-135m-instruct-q4_1")
    url = f"http://127.0.0.1:{port}"
    for config in configs or ("",):
        proc = start(model, config, port)
        try:
            latency(url)  # warm-up
            idle = [latency(url) for _ in range(num_runs)]
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(neighbours)]
            try:
                busy = [latency(url) for _ in range(num_runs)]
            finally:
                for hog in hogs:
                    hog.kill()
        finally:
            proc.terminate()
            proc.wait(60)
        idle_s, busy_s = statistics.median(idle), statistics.median(busy)
        print(f"{config or 'default':32s} idle {idle_s:6.2f} s   beside {neighbours} neighbour(s) {busy_s:6.2f} s   "
              f"x{busy_s / idle_s:.1f}", flush=True)


if __name__ == "__main__":
    main()
