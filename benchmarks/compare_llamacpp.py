"""kc serve vs llama.cpp's llama-server, same run, one client, one server measured at a time.

    python benchmarks/compare_llamacpp.py                          # fp32, bf16, int8 (vs Q8_0), medians of 3
    python benchmarks/compare_llamacpp.py --precisions fp32 --num-runs 1 --workloads batch1
    python benchmarks/compare_llamacpp.py --gguf "$(kc pull smollm2-135m-instruct-q4_1)"   # a real file, as stored

llama-server is built from the llama-cpp-python sdist on PyPI (benchmarks/llamacpp_build.py, cached) and reads
the benchmark checkpoint converted by llama.cpp's own convert_hf_to_gguf.py (f32, bf16, q8_0). Both servers get
token-id prompts, greedy sampling, ignore_eos, the same thread count. Both servers stay up (the idle one takes no
CPU) and each workload runs on kc, then at once on llama-server, run after run, so a drift in the machine's
speed (seen: 30% within minutes on a shared host) hits both alike; the ratio printed is the median of the
per-run ratios. Never part of CI.

With ``--gguf FILE`` (repeatable) both servers serve that file as it is, kc with its default ``gguf`` method (every
tensor computed as stored) and the same workloads over the file's vocabulary; the resident memory of each
server's whole process tree (RSS summed, after the runs) is printed beside the speeds.

Workloads (fixed seed, a Llama-125M-shaped random checkpoint with a byte-fallback BPE tokenizer):
  uniform: 32 requests x (128 prompt + 128 out), all at once
  mixed:   64 requests, prompts 32-512, outputs 16-256, 32 in flight
  batch1:  1 request, 128 + 128
  stream1: the same request streamed (server-sent events, a token at a time: what a person chatting sees)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import click

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_build import build_server, convert  # noqa: E402
from throughput import build_checkpoint  # noqa: E402

PRECISIONS = {  # name -> (kc serve flags, GGUF outtype)
    "fp32": (["--dtype", "float32"], "f32"),
    "bf16": (["--dtype", "bfloat16"], "bf16"),
    "int8": (["--dtype", "bfloat16", "--quantization", "int8"], "q8_0"),
}


def add_tokenizer(path: str, vocab_size: int) -> None:
    """A Llama-style (byte-fallback BPE) tokenizer covering the whole vocabulary, which the converter accepts."""
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        return
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for i in range(len(vocab), vocab_size):
        vocab[f"\u2581w{i}"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(path)


def make_workload(name: str, vocab_size: int) -> tuple[list[tuple[list[int], int]], int]:
    """(requests as (prompt ids, output tokens), requests in flight)."""
    rng = random.Random(0)
    tok = lambda n: [rng.randrange(259, vocab_size) for _ in range(n)]  # noqa: E731  (no byte/special ids)
    if name == "uniform":
        return [(tok(128), 128) for _ in range(32)], 32
    if name == "mixed":
        return [(tok(rng.randint(32, 512)), rng.randint(16, 256)) for _ in range(64)], 32
    if name in ("batch1", "stream1"):
        return [(tok(128), 128)], 1
    raise ValueError(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process on a loopback port, stopped on exit."""

    def __init__(self, kind: str, argv: list[str], port: int, log_path: str,
                 fallback: list[str] | None = None) -> None:
        """``fallback``: the command to start instead if ``argv`` crashes (a signal) before it is healthy."""
        self.kind, self.argv, self.port, self.log_path, self.fallback = kind, argv, port, log_path, fallback

    def __enter__(self):
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            asyncio.run(self._wait_healthy())
        except RuntimeError:
            if not self.fallback or self.proc.returncode is None or self.proc.returncode >= 0:
                raise
            click.echo(f"  {self.kind} crashed (signal {-self.proc.returncode}) loading the model; "
                       f"retrying as {' '.join(self.fallback[len(self.argv):])!r} appended")
            self.argv = self.fallback
            self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)
            asyncio.run(self._wait_healthy())
        return self

    async def _wait_healthy(self, timeout: float = 900.0) -> None:
        import aiohttp

        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}; log: {self.log_path}")
                try:
                    async with session.get(f"http://127.0.0.1:{self.port}/health") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.5)
        raise TimeoutError(f"{self.kind} did not become healthy; log: {self.log_path}")

    def resident_bytes(self) -> int:
        """RSS of the server and every process under it (kc serve: front end, engine core, workers)."""
        import psutil

        root = psutil.Process(self.proc.pid)
        total = 0
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        return total

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def _one(session, kind: str, port: int, prompt: list[int], num_out: int, stream: bool = False) -> int:
    if kind == "kc":
        url, body = f"http://127.0.0.1:{port}/v1/completions", dict(
            model="bench", prompt=prompt, max_tokens=num_out, temperature=0.0, ignore_eos=True)
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
    else:
        url, body = f"http://127.0.0.1:{port}/completion", dict(
            prompt=prompt, n_predict=num_out, temperature=0.0, top_k=1, ignore_eos=True, cache_prompt=False,
            stream=stream)
    async with session.post(url, json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{kind} answered {r.status}: {await r.text()}")
        if stream:  # every event read as it comes; the last one with a count says how many tokens came
            data = {}
            async for line in r.content:
                if line.startswith(b"data: {"):
                    event = json.loads(line[len(b"data: "):])
                    if event.get("usage") or event.get("stop"):
                        data = event
        else:
            data = await r.json()
    n = data["usage"]["completion_tokens"] if kind == "kc" else data["tokens_predicted"]
    if n != num_out:
        raise RuntimeError(f"{kind} returned {n} tokens, {num_out} requested")
    return n


async def run_workload(kind: str, port: int, requests: list[tuple[list[int], int]], in_flight: int,
                       stream: bool = False) -> float:
    """Output tokens per second over the whole workload."""
    import aiohttp

    limit = asyncio.Semaphore(in_flight)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=in_flight)) as session:
        async def go(prompt, num_out):
            async with limit:
                return await _one(session, kind, port, prompt, num_out, stream)

        await _one(session, kind, port, requests[0][0][:16], 4)  # warm-up
        start = time.perf_counter()
        counts = await asyncio.gather(*(go(p, n) for p, n in requests))
        return sum(counts) / (time.perf_counter() - start)


def kc_argv(path: str, flags: list[str], port: int, threads: int) -> list[str]:
    return [sys.executable, "-m", "kernelcore.entrypoints.cli", "serve", path, "--port", str(port),
            "--served-model-name", "bench", "--max-model-len", "2048", "--max-num-seqs", "32",
            "--kv-cache-memory", "2GiB", "--num-threads", str(threads), *flags]


def llama_argv(binary: str, gguf: str, port: int, threads: int) -> list[str]:
    return [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-tb", str(threads),
            "-np", "32", "-c", str(32 * 1024), "--no-webui", "--load-mode", "none"]


@click.command()
@click.option("--precisions", default="fp32,bf16,int8", show_default=True, help="Comma-separated: fp32,bf16,int8.")
@click.option("--workloads", default="uniform,mixed,batch1,stream1", show_default=True)
@click.option("--num-runs", type=int, default=3, show_default=True)
@click.option("--engines", default="kc,llama", show_default=True, help="Which servers to run (kc alone: a smoke run).")
@click.option("--threads", type=int, default=2, show_default=True, help="Threads for both servers.")
@click.option("--checkpoint-dir", type=click.Path(), default=None, help="Keep the checkpoint and GGUF files here.")
@click.option("--llamacpp-version", default="0.3.36", show_default=True, help="llama-cpp-python sdist to build.")
@click.option("--json-out", type=click.Path(), default=None)
@click.option("--gguf", "gguf_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Serve this GGUF file with both servers instead of the converted checkpoint (repeatable).")
def main(precisions, workloads, num_runs, engines, threads, checkpoint_dir, llamacpp_version, json_out, gguf_files):
    """Output tok/s of kc serve and llama-server on the same workloads, same run."""
    engines = engines.split(",")
    binary = build_server(llamacpp_version) if "llama" in engines else None
    root = checkpoint_dir or tempfile.mkdtemp(prefix="kc-vs-llamacpp-")
    names = workloads.split(",")
    if gguf_files:
        from kernelcore.models.gguf_checkpoint import hf_config

        # one "precision" per file: (label, kc flags, kc model, llama-server model, vocabulary size)
        variants = [(os.path.basename(f), [], f, f, hf_config(f).vocab_size) for f in gguf_files]
    else:
        path = build_checkpoint("llama", root)
        add_tokenizer(path, 32000)
        variants = [(p, PRECISIONS[p][0], path, None, 32000) for p in precisions.split(",")]
    click.echo(f"llama-server {binary}; threads {threads}; load average {os.getloadavg()[0]:.1f}; runs interleaved")
    rows = []
    notes: set[str] = set()
    for precision, flags, path, gguf, vocab_size in variants:
        work = {w: make_workload(w, vocab_size) for w in names}
        if gguf is None and binary:
            gguf = convert(path, PRECISIONS[precision][1], llamacpp_version)
        results = {(k, w): [] for k in engines for w in names}
        servers = {}
        with contextlib.ExitStack() as stack:
            ports = {}
            for kind in engines:  # both up, idle but for the one being measured
                port = ports[kind] = free_port()
                argv = kc_argv(path, flags, port, threads) if kind == "kc" else llama_argv(binary, gguf, port, threads)
                # llama.cpp's weight repacking for some CPUs crashes on load (seen: Q8_0 on an AMX Xeon); its
                # plain layout is what such a user would be left with.
                fallback = argv + ["--no-repack"] if kind == "llama" else None
                server = servers[kind] = stack.enter_context(
                    Server(kind, argv, port, os.path.join(root, f"{kind}-{precision}.log"), fallback))
                if server.argv is fallback:
                    notes.add(f"{precision}: llama-server crashed loading the model and ran with --no-repack")
            for run in range(num_runs):
                for w in names:
                    for kind in engines:  # adjacent in time: a drift in the machine's speed hits both alike
                        results[(kind, w)].append(asyncio.run(run_workload(kind, ports[kind], *work[w],
                                                                           stream=w == "stream1")))
                        click.echo(f"  run {run + 1} {precision} {kind:5s} {w:8s} {results[(kind, w)][-1]:8.1f} tok/s")
            rss = {kind: server.resident_bytes() for kind, server in servers.items()}
            click.echo("  resident memory of the server tree: " + ", ".join(
                f"{kind} {b / 2**20:.0f} MiB" for kind, b in rss.items())
                + (f" (kc/llama {rss['kc'] / rss['llama']:.2f}x)" if len(rss) == 2 else ""))
            rows.append(dict(precision=precision, workload="resident MiB", kc=rss.get("kc", 0) / 2**20,
                             llama=rss.get("llama", 0) / 2**20, ratio=rss["kc"] / rss["llama"] if len(rss) == 2
                             else float("nan"), kc_runs=[], llama_runs=[]))
        for w in names:
            kc, ll = results.get(("kc", w), []), results.get(("llama", w), [])
            med = lambda v: statistics.median(v) if v else float("nan")  # noqa: E731
            ratio = med([a / b for a, b in zip(kc, ll)])
            rows.append(dict(precision=precision, workload=w, kc=med(kc), llama=med(ll), ratio=ratio, kc_runs=kc,
                             llama_runs=ll))
    click.echo("\n| workload | precision | kc serve tok/s | llama-server tok/s | ratio |\n|---|---|---|---|---|")
    for r in rows:
        click.echo(f"| {r['workload']} | {r['precision']} | {r['kc']:.0f} | {r['llama']:.0f} | {r['ratio']:.2f}x |")
    click.echo(f"(medians of {num_runs}; load average at the end {os.getloadavg()[0]:.1f})")
    for note in sorted(notes):
        click.echo(f"note: {note}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
