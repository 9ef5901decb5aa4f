"""kc serve vs llama.cpp's llama-server, same run, one client, one server measured at a time.

    python benchmarks/compare_llamacpp.py                          # fp32, bf16, int8 (vs Q8_0), medians of 3
    python benchmarks/compare_llamacpp.py --precisions fp32 --num-runs 1 --workloads batch1
    python benchmarks/compare_llamacpp.py --gguf "$(kc pull smollm2-135m-instruct-q4_1)"   # a real file, as stored
    python benchmarks/compare_llamacpp.py --precisions fp32 --workloads ttft512,ttft2k,ttft8k   # long prompts
    python benchmarks/compare_llamacpp.py --precisions fp32 --workloads batch1,neighbour1 --neighbours 1
    python benchmarks/compare_llamacpp.py --workloads ttft2k --kc-flags "--max-num-batched-tokens 512"

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
  neighbour1: the batch1 request while --neighbours N (default 1) CPU-bound busy loops (``while True: pass``, as
           busy_neighbour.py's) run beside the server: started just before each server's measurement, killed
           right after (and with the benchmark, however it ends)
  ttft512, ttft2k, ttft8k: time to first token (the first streamed chunk) of one streamed request with a 512 /
           2048 / 8000-token prompt, 4 tokens out; a fresh random prompt every run (the same one for both servers
           within a run) and llama-server's cache_prompt off, so neither server has it cached; the first run is
           preceded by an untimed request of the same length. kc runs its default chunked prefill
           (--max-num-batched-tokens 2048; try others with --kc-flags) and llama-server its default -b/-ub.
           Measured on a second pair of servers with a long enough context (kc --max-model-len, llama-server
           -np 1 -c); with --gguf the prompt is cut to fit the file's context and the length used is printed.
           ttft8k takes minutes on 2 cores and is not in the default set.
  decode4k: decoding after a long prompt (RAG, agents): one streamed request with a 4000-token prompt (fresh
           every run, as the ttft ones) and 128 tokens out, on the TTFT servers; tokens per second from the first
           streamed token to the last, so the prefill is left out and the decode attention reads 4000+ positions
           of K/V at every step.

Ratios are oriented so that > 1.00x means kc is faster: kc/llama for tok/s, llama/kc for TTFT (the resident
memory row: kc/llama, > 1.00x means kc uses more).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shlex
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


BASE_WORKLOADS = ("uniform", "mixed", "batch1", "stream1", "neighbour1")
TTFT_WORKLOADS = {"ttft512": 512, "ttft2k": 2048, "ttft8k": 8000}  # name -> prompt tokens
TTFT_OUT = 4  # tokens out of a TTFT request
LONG_DECODE_WORKLOADS = {"decode4k": 4000}  # name -> prompt tokens; decoded on the TTFT servers
LONG_DECODE_OUT = 128
LONG_WORKLOADS = {**TTFT_WORKLOADS, **LONG_DECODE_WORKLOADS}
TTFT_MARGIN = 16  # tokens of the context left unused by the longest TTFT request
CHECKPOINT_CTX = 16384  # max_position_embeddings given to the benchmark checkpoint: ttft8k fits both servers
# a neighbour: a Python busy loop, SIGKILLed by the kernel if this benchmark dies without stopping it (Linux)
NEIGHBOUR = ("import ctypes, sys\n"
             "if sys.platform.startswith('linux'): ctypes.CDLL(None).prctl(1, 9)\n"  # PR_SET_PDEATHSIG, SIGKILL
             "while True: pass\n")


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
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(path)


def make_workload(name: str, vocab_size: int) -> tuple[list[tuple[list[int], int]], int]:
    """(requests as (prompt ids, output tokens), requests in flight)."""
    rng = random.Random(0)
    tok = lambda n: [rng.randrange(259, vocab_size) for _ in range(n)]  # noqa: E731  (no byte/special ids)
    if name == "uniform":
        return [(tok(128), 128) for _ in range(32)], 32
    if name == "mixed":
        return [(tok(rng.randint(32, 512)), rng.randint(16, 256)) for _ in range(64)], 32
    if name in ("batch1", "stream1", "neighbour1"):
        return [(tok(128), 128)], 1
    raise ValueError(name)


def random_prompt(length: int, vocab_size: int, seed: str) -> list[int]:
    """Token ids (no byte/special ids), a different prompt for every seed: no prefix-cache hit between seeds."""
    rng = random.Random(seed)
    return [rng.randrange(259, vocab_size) for _ in range(length)]


def allow_long_context(path: str, n: int) -> None:
    """Raise the checkpoint's max_position_embeddings to ``n`` (RoPE without scaling: the weights are unchanged),
    dropping GGUF files converted before, which carry the old training context llama-server caps a slot to."""
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if cfg.get("max_position_embeddings", 0) >= n:
        return
    cfg["max_position_embeddings"] = n
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    for name in os.listdir(path):
        if name.startswith("model-") and name.endswith(".gguf"):
            os.remove(os.path.join(path, name))


@contextlib.contextmanager
def busy_neighbours(n: int):
    """``n`` CPU-bound processes spinning for the duration of the block; killed however the block ends."""
    hogs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            hogs.append(subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdin=subprocess.DEVNULL))
        time.sleep(0.3)  # interpreter start-up: spinning before the measurement starts
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process on a loopback port, stopped on exit."""

    def __init__(self, kind: str, argv: list[str], port: int, log_path: str,
                 fallback: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        """``fallback``: the command to start instead if ``argv`` crashes (a signal) before it is healthy;
        ``env``: variables added to this process's environment for the server."""
        self.kind, self.argv, self.port, self.log_path, self.fallback = kind, argv, port, log_path, fallback
        self.env = {**os.environ, **(env or {})}

    def __enter__(self):
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        try:
            asyncio.run(self._wait_healthy())
        except RuntimeError:
            if not self.fallback or self.proc.returncode is None or self.proc.returncode >= 0:
                raise
            click.echo(f"  {self.kind} crashed (signal {-self.proc.returncode}) loading the model; "
                       f"retrying as {' '.join(self.fallback[len(self.argv):])!r} appended")
            self.argv = self.fallback
            self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
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


def _request(kind: str, port: int, prompt: list[int], num_out: int, stream: bool) -> tuple[str, dict]:
    if kind == "kc":
        url, body = f"http://127.0.0.1:{port}/v1/completions", dict(
            model="bench", prompt=prompt, max_tokens=num_out, temperature=0.0, ignore_eos=True)
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
    else:
        url, body = f"http://127.0.0.1:{port}/completion", dict(
            prompt=prompt, n_predict=num_out, temperature=0.0, top_k=1, ignore_eos=True, cache_prompt=False,
            stream=stream)
    return url, body


async def _one(session, kind: str, port: int, prompt: list[int], num_out: int, stream: bool = False) -> int:
    url, body = _request(kind, port, prompt, num_out, stream)
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


async def _first_token(session, kind: str, port: int, prompt: list[int],
                       num_out: int) -> tuple[float, int, float]:
    """(seconds from sending the request to its first streamed token chunk, tokens that chunk carried, seconds
    from sending it to its last token chunk)."""
    url, body = _request(kind, port, prompt, num_out, stream=True)
    start = time.perf_counter()
    first, first_tokens, last, data = None, 0, 0.0, {}
    async with session.post(url, json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{kind} answered {r.status}: {await r.text()}")
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[len(b"data: "):])
            # kc: a chunk per token (the usage chunk has no choices); llama-server: partial results, then the final
            # one (an incomplete UTF-8 piece is held back and comes with the next token: tokens_predicted > 1)
            is_token = bool(event.get("choices")) if kind == "kc" else "prompt_progress" not in event
            if first is None and is_token:
                first = time.perf_counter() - start
                first_tokens = 1 if kind == "kc" else event.get("tokens_predicted", 1)
            if is_token and (kind == "kc" or not event.get("stop")):  # (llama's final event repeats the totals)
                last = time.perf_counter() - start
            if event.get("usage") or event.get("stop"):
                data = event
    n = data["usage"]["completion_tokens"] if kind == "kc" else data["tokens_predicted"]
    if n != num_out or first is None:
        raise RuntimeError(f"{kind} returned {n} tokens, {num_out} requested")
    return first, first_tokens, last


async def run_ttft(kind: str, port: int, prompt: list[int], num_out: int,
                   warm_prompt: list[int]) -> tuple[float, int, float]:
    """Time to first token of one streamed request, after an untimed one (``warm_prompt``, no prefix in common);
    with the tokens its first chunk carried and the time to its last."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        await _one(session, kind, port, warm_prompt, num_out)
        return await _first_token(session, kind, port, prompt, num_out)


# --isa -> kc serve's environment: the native kernels compiled without AVX-512 and torch's own kernels, oneDNN and
# MKL dispatching no further than AVX2.
ISA_ENV = {"native": {}, "avx2": {"KC_CPU_KERNEL_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2",
                                  "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}


def kc_argv(path: str, flags: list[str], port: int, threads: int, max_model_len: int = 2048,
            extra: list[str] = ()) -> list[str]:
    """``extra`` (--kc-flags) last: click keeps an option's last value, so it overrides the flags before it."""
    return [sys.executable, "-m", "kernelcore.entrypoints.cli", "serve", path, "--port", str(port),
            "--served-model-name", "bench", "--max-model-len", str(max_model_len), "--max-num-seqs", "32",
            "--kv-cache-memory", "2GiB", "--num-threads", str(threads), *flags, *extra]


# The base servers' context: llama-server's 32 slots of SLOT_CTX tokens each (-c is split among the slots), kc's
# --max-num-seqs 32 at --max-model-len SLOT_CTX, so both hold at most 32 * SLOT_CTX tokens of KV cache (the same
# context, for the resident-memory row).
SLOT_CTX = 1024


def llama_argv(binary: str, gguf: str, port: int, threads: int, ctx: int | None = None) -> list[str]:
    """``ctx``: one slot of that context (the TTFT servers); else 32 slots of SLOT_CTX."""
    slots = ["-np", "32", "-c", str(32 * SLOT_CTX)] if ctx is None else ["-np", "1", "-c", str(ctx)]
    return [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-tb", str(threads),
            *slots, "--no-webui", "--load-mode", "none"]


def check_workloads(ctx, param, value: str) -> list[str]:
    names = value.split(",")
    unknown = [w for w in names if w not in BASE_WORKLOADS and w not in LONG_WORKLOADS]
    if unknown:
        raise click.BadParameter(f"unknown {', '.join(unknown)}; choose from "
                                 f"{', '.join([*BASE_WORKLOADS, *LONG_WORKLOADS])}")
    return names


@click.command()
@click.option("--precisions", default="fp32,bf16,int8", show_default=True, help="Comma-separated: fp32,bf16,int8.")
@click.option("--workloads", default="uniform,mixed,batch1,stream1", show_default=True, callback=check_workloads,
              help="Comma-separated: " + ",".join([*BASE_WORKLOADS, *LONG_WORKLOADS])
              + " (neighbour1: batch1 beside --neighbours busy loops; ttft*: time to first token, long prompts;"
              " decode4k: decoding after a long prompt).")
@click.option("--num-runs", type=int, default=3, show_default=True)
@click.option("--engines", default="kc,llama", show_default=True, help="Which servers to run (kc alone: a smoke run).")
@click.option("--threads", type=int, default=2, show_default=True, help="Threads for both servers.")
@click.option("--neighbours", type=click.IntRange(1), default=1, show_default=True,
              help="CPU-bound busy-loop processes beside the server in the neighbour1 workload.")
@click.option("--kc-flags", default="", help='Extra kc serve flags, appended (shlex-split), e.g. '
              '"--max-num-batched-tokens 512".')
@click.option("--checkpoint-dir", type=click.Path(), default=None, help="Keep the checkpoint and GGUF files here.")
@click.option("--llamacpp-version", default="0.3.36", show_default=True, help="llama-cpp-python sdist to build.")
@click.option("--isa", type=click.Choice(sorted(ISA_ENV)), default="native", show_default=True,
              help="avx2: both servers without AVX-512 (kc's kernels, torch, oneDNN and MKL capped at AVX2; "
              "llama-server built for AVX2), as on an AVX2-only CPU.")
@click.option("--json-out", type=click.Path(), default=None)
@click.option("--gguf", "gguf_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Serve this GGUF file with both servers instead of the converted checkpoint (repeatable).")
def main(precisions, workloads, num_runs, engines, threads, neighbours, kc_flags, checkpoint_dir, llamacpp_version,
         isa, json_out, gguf_files):
    """Output tok/s (and time to first token) of kc serve and llama-server on the same workloads, same run."""
    engines = engines.split(",")
    kc_extra = shlex.split(kc_flags)
    binary = build_server(llamacpp_version, isa=isa) if "llama" in engines else None
    root = checkpoint_dir or tempfile.mkdtemp(prefix="kc-vs-llamacpp-")
    os.makedirs(root, exist_ok=True)  # with --gguf nothing else makes it: the server logs go there
    names = workloads
    if gguf_files:
        from kernelcore.models.gguf_checkpoint import hf_config

        # one "precision" per file: (label, kc flags, kc model, llama-server model, vocabulary size, context)
        variants = []
        for f in gguf_files:
            cfg = hf_config(f)
            variants.append((os.path.basename(f), [], f, f, cfg.vocab_size,
                             getattr(cfg, "max_position_embeddings", None) or 2048))
    else:
        path = build_checkpoint("llama", root)
        add_tokenizer(path, 32000)
        allow_long_context(path, CHECKPOINT_CTX)
        variants = [(p, PRECISIONS[p][0], path, None, 32000, CHECKPOINT_CTX) for p in precisions.split(",")]
    click.echo(f"instruction sets: {isa}; llama-server {binary}; threads {threads}; "
               f"load average {os.getloadavg()[0]:.1f}; runs interleaved")
    click.echo(f"kc serve extra flags: {shlex.join(kc_extra) if kc_extra else '(none: --max-num-batched-tokens 2048)'}")
    rows = []
    notes: set[str] = set()
    for precision, flags, path, gguf, vocab_size, model_ctx in variants:
        if gguf is None and binary:
            gguf = convert(path, PRECISIONS[precision][1], llamacpp_version)
        # the TTFT prompts: cut to the model's context, less the tokens out and a margin
        out_len = {w: LONG_DECODE_OUT if w in LONG_DECODE_WORKLOADS else TTFT_OUT for w in LONG_WORKLOADS}
        prompt_len = {w: min(LONG_WORKLOADS[w], model_ctx - out_len[w] - TTFT_MARGIN) for w in names
                      if w in LONG_WORKLOADS}
        groups = [(g, [w for w in names if (w in LONG_WORKLOADS) == (g == "ttft")]) for g in ("base", "ttft")]
        for group, group_names in groups:
            if not group_names:
                continue
            if group == "ttft":
                longest = max(prompt_len[w] + out_len[w] for w in group_names)
                ctx = min(model_ctx, max(2048, -(-(longest + TTFT_MARGIN) // 256) * 256))
                click.echo(f"  {precision} TTFT servers: context {ctx}; prompts " + ", ".join(
                    f"{w} {prompt_len[w]} tokens, {out_len[w]} out" for w in group_names))
            else:
                ctx = None
                work = {w: make_workload(w, vocab_size) for w in group_names}
            results = {(k, w): [] for k in engines for w in group_names}
            servers = {}
            with contextlib.ExitStack() as stack:
                ports = {}
                for kind in engines:  # both up, idle but for the one being measured
                    port = ports[kind] = free_port()
                    argv = (kc_argv(path, flags, port, threads, ctx or SLOT_CTX, kc_extra) if kind == "kc"
                            else llama_argv(binary, gguf, port, threads, ctx))
                    # llama.cpp's weight repacking for some CPUs crashes on load (seen: Q8_0 on an AMX Xeon); its
                    # plain layout is what such a user would be left with.
                    fallback = argv + ["--no-repack"] if kind == "llama" else None
                    log = os.path.join(root, f"{kind}-{precision}{'-ttft' if ctx else ''}.log")
                    server = servers[kind] = stack.enter_context(
                        Server(kind, argv, port, log, fallback, ISA_ENV[isa] if kind == "kc" else None))
                    if server.argv is fallback:
                        notes.add(f"{precision}: llama-server crashed loading the model and ran with --no-repack")
                for run in range(num_runs):
                    for w in group_names:
                        if w in LONG_WORKLOADS:  # one prompt per run, the same for both servers
                            prompt = random_prompt(prompt_len[w], vocab_size, f"{w}-run{run}")
                        for kind in engines:  # adjacent in time: a drift in the machine's speed hits both alike
                            if w in LONG_WORKLOADS:
                                # the first run: warmed by a request as long (one-off costs of a long prefill)
                                warm = random_prompt(prompt_len[w] if run == 0 else 16, vocab_size,
                                                     f"{w}-warm{run}-{kind}")
                                ttft, first_tokens, last = asyncio.run(
                                    run_ttft(kind, ports[kind], prompt, out_len[w], warm))
                                if w in LONG_DECODE_WORKLOADS:
                                    tps = (out_len[w] - first_tokens) / (last - ttft)
                                    results[(kind, w)].append(tps)
                                    click.echo(f"  run {run + 1} {precision} {kind:5s} {w:10s} {tps:8.1f} tok/s "
                                               f"after the first token")
                                    continue
                                results[(kind, w)].append(ttft * 1000)
                                if first_tokens > 1:
                                    notes.add(f"{precision} {w}: {kind}'s first chunk carried {first_tokens} tokens "
                                              "(an incomplete UTF-8 piece held back): its TTFT is late by a step")
                                click.echo(f"  run {run + 1} {precision} {kind:5s} {w:10s} "
                                           f"{results[(kind, w)][-1]:8.1f} ms to the first token")
                                continue
                            with busy_neighbours(neighbours) if w == "neighbour1" else contextlib.nullcontext():
                                tps = asyncio.run(run_workload(kind, ports[kind], *work[w], stream=w == "stream1"))
                            results[(kind, w)].append(tps)
                            click.echo(f"  run {run + 1} {precision} {kind:5s} {w:10s} {tps:8.1f} tok/s")
                rss = {kind: server.resident_bytes() for kind, server in servers.items()}
                click.echo(f"  resident memory of the server tree{' (TTFT servers)' if ctx else ''}: " + ", ".join(
                    f"{kind} {b / 2**20:.0f} MiB" for kind, b in rss.items())
                    + (f" (kc/llama {rss['kc'] / rss['llama']:.2f}x)" if len(rss) == 2 else ""))
                rows.append(dict(precision=precision, workload="resident MiB" + (f" (context {ctx})" if ctx else ""),
                                 unit="MiB", kc=rss.get("kc", 0) / 2**20, llama=rss.get("llama", 0) / 2**20,
                                 ratio=rss["kc"] / rss["llama"] if len(rss) == 2 else float("nan"),
                                 kc_runs=[], llama_runs=[]))
            for w in group_names:
                kc, ll = results.get(("kc", w), []), results.get(("llama", w), [])
                med = lambda v: statistics.median(v) if v else float("nan")  # noqa: E731
                row = dict(precision=precision, workload=w, unit="tok/s", kc=med(kc), llama=med(ll),
                           ratio=med([a / b for a, b in zip(kc, ll, strict=False)]), kc_runs=kc, llama_runs=ll)
                if w in TTFT_WORKLOADS:  # milliseconds: the ratio llama/kc, > 1 where kc is faster
                    row.update(unit="ms to first token", ratio=med([b / a for a, b in zip(kc, ll, strict=False)]),
                               prompt_tokens=prompt_len[w], output_tokens=TTFT_OUT, context=ctx)
                elif w == "neighbour1":
                    row.update(neighbours=neighbours)
                elif w in LONG_DECODE_WORKLOADS:
                    row.update(unit="tok/s after the first token", prompt_tokens=prompt_len[w],
                               output_tokens=out_len[w], context=ctx)
                rows.append(row)
    speed = [r for r in rows if r["unit"] != "ms to first token"]
    ttft_rows = [r for r in rows if r["unit"] == "ms to first token"]
    if speed:
        click.echo("\n| workload | precision | kc serve tok/s | llama-server tok/s | ratio |\n|---|---|---|---|---|")
    for r in speed:
        label = r["workload"]
        if label == "neighbour1":
            label = f"neighbour1 (batch1 beside {neighbours} busy loop{'s' if neighbours > 1 else ''})"
        elif label in LONG_DECODE_WORKLOADS:
            label = f"{label} ({r['prompt_tokens']}-token prompt, {r['output_tokens']} out, after the first token)"
        click.echo(f"| {label} | {r['precision']} | {r['kc']:.0f} | {r['llama']:.0f} | {r['ratio']:.2f}x |")
    if ttft_rows:
        click.echo("\n| workload | precision | prompt tokens | kc serve TTFT ms | llama-server TTFT ms | ratio |"
                   "\n|---|---|---|---|---|---|")
    for r in ttft_rows:
        click.echo(f"| {r['workload']} | {r['precision']} | {r['prompt_tokens']} | {r['kc']:.0f} | {r['llama']:.0f} "
                   f"| {r['ratio']:.2f}x |")
    click.echo(f"(medians of {num_runs}; ratio > 1.00x: kc faster (tok/s kc/llama, TTFT llama/kc); resident MiB "
               f"kc/llama; load average at the end {os.getloadavg()[0]:.1f})")
    for note in sorted(notes):
        click.echo(f"note: {note}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
