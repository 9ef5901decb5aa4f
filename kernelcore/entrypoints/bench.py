"""`kc bench serve` (load generator against a running server) and `kc bench throughput` (benchmarks/throughput.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
import time
from dataclasses import dataclass, field

import click

WORDS = ("the quick brown fox jumps over a lazy dog while clocks tick in an old shop by the river "
         "and children watch gears turn in the morning light").split()


class BenchGroup(click.Group):
    """Mounts `throughput` from the repository's benchmarks/throughput.py when it exists (not a package)."""

    def _throughput(self) -> click.Command | None:
        path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "throughput.py")
        if not os.path.isfile(path):
            return None
        spec = importlib.util.spec_from_file_location("kc_benchmarks_throughput", path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return getattr(module, "throughput", None)

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        has_file = os.path.isfile(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "throughput.py"))
        return sorted(names + ["throughput"]) if has_file else names

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "throughput":
            return self._throughput()
        return super().get_command(ctx, name)


@click.group("bench", cls=BenchGroup)
def bench_cmd() -> None:
    """Benchmarks: `serve` loads a running server over HTTP; `throughput` runs the engine offline."""


@dataclass
class Result:
    ttft: float = 0.0
    itls: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    error: str | None = None


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def _one(session, url: str, body: dict) -> Result:
    result = Result()
    start = last = time.perf_counter()
    try:
        async with session.post(url + "/v1/completions", json=body) as r:
            if r.status != 200:
                result.error = f"HTTP {r.status}: {(await r.text())[:200]}"
                return result
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    result.error = str(event["error"])
                    return result
                if event.get("usage") and not event["choices"]:
                    result.num_output_tokens = event["usage"]["completion_tokens"]
                    continue
                now = time.perf_counter()
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
    except Exception as exc:  # noqa: BLE001 - a benchmark reports failures instead of stopping
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run_bench(url: str, api_key: str | None, model: str | None, num_requests: int, concurrency: int,
                    input_len: int, max_tokens: int, seed: int, show_progress: bool = True) -> dict:
    import aiohttp
    from tqdm import tqdm

    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(concurrency)
    results: list[Result] = []
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=None)) as session:
        if model is None:
            async with session.get(url + "/v1/models") as r:
                model = (await r.json())["data"][0]["id"]
        # disable=None: shown only on a terminal.
        bar = tqdm(total=num_requests, desc="requests", disable=None if show_progress else True)

        async def worker(i: int) -> None:
            prompt = " ".join(rng.choice(WORDS) for _ in range(input_len))
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                    "temperature": 0.0, "stream_options": {"include_usage": True}}
            async with limit:
                results.append(await _one(session, url, body))
            bar.update(1)

        start = time.perf_counter()
        await asyncio.gather(*[worker(i) for i in range(num_requests)])
        elapsed = time.perf_counter() - start
        bar.close()
    ok = [r for r in results if r.error is None]
    ttfts = [r.ttft for r in ok]
    itls = [x for r in ok for x in r.itls]
    num_tokens = sum(r.num_output_tokens for r in ok)
    return {
        "model": model, "num_requests": num_requests, "concurrency": concurrency, "num_failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5], "duration_s": round(elapsed, 3),
        "request_throughput": round(len(ok) / elapsed, 3), "output_tokens_per_s": round(num_tokens / elapsed, 2),
        "ttft_ms_p50": round(percentile(ttfts, 50) * 1000, 2), "ttft_ms_p99": round(percentile(ttfts, 99) * 1000, 2),
        "itl_ms_p50": round(percentile(itls, 50) * 1000, 2), "itl_ms_p99": round(percentile(itls, 99) * 1000, 2),
    }


@bench_cmd.command("serve")
@click.option("--url", envvar="KC_URL", default="http://127.0.0.1:8000", show_default=True, show_envvar=True)
@click.option("--api-key", envvar="KC_API_KEY", default=None, show_envvar=True)
@click.option("--model", default=None, help="[default: the first served model]")
@click.option("--num-requests", "-n", type=int, default=100, show_default=True)
@click.option("--concurrency", "-c", type=int, default=16, show_default=True, help="Concurrent streaming clients.")
@click.option("--input-len", type=int, default=32, show_default=True, help="Prompt length in words.")
@click.option("--max-tokens", type=int, default=64, show_default=True, help="Output tokens per request (ignore_eos).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def bench_serve_cmd(url: str, api_key: str | None, model: str | None, num_requests: int, concurrency: int,
                    input_len: int, max_tokens: int, seed: int, as_json: bool) -> None:
    """N concurrent streaming clients against a running `kc serve`: throughput, TTFT and inter-token latency."""
    summary = asyncio.run(run_bench(url.rstrip("/"), api_key, model, num_requests, concurrency, input_len, max_tokens,
                                    seed))
    if as_json:
        click.echo(json.dumps(summary))
        return
    for key, value in summary.items():
        click.echo(f"{key:>22}: {value}")
