"""A data-parallel replica lost under load, through the real `kc serve --data-parallel-size 2`: SIGKILL of one
replica's engine core while 16 streams and 2 plain requests run costs them nothing but a pause (each carried to
the other replica with its tokens and sampling state: the same text as an undisturbed run, greedy and seeded),
/health stays 200 naming the lost replica, the metrics say which replica is down and count what was carried;
losing the last replica fails what runs with the clear error, naming it, and /health turns 503. A killed
tensor-parallel worker of one replica (DP=2 x TP=2) loses that replica only."""

from __future__ import annotations

import asyncio
import json
import signal

import aiohttp
import psutil
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from test_server_e2e import server_log, start_server, stop_server

pytestmark = pytest.mark.slow

API_KEY = "sk-failover"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
NUM_STREAMS, NUM_PLAIN, MAX_TOKENS = 16, 2, 300


def body(i: int) -> dict:
    """Distinct short prompts (shorter than a KV block: routed by load, so both replicas get half); every other
    request samples at temperature 0.8 with a seed."""
    sampling = {"temperature": 0.8, "seed": 100 + i} if i % 2 else {"temperature": 0}
    return {"prompt": f"Story {i}: once", "max_tokens": MAX_TOKENS, "ignore_eos": True, **sampling}


def samples(url: str) -> list:
    return [s for family in text_string_to_metric_families(requests.get(url + "/metrics", timeout=30).text)
            for s in family.samples]


def per_replica(url: str, name: str) -> dict[str, float]:
    return {s.labels["replica"]: s.value for s in samples(url) if s.name == name}


def engine_cores(proc) -> dict[str, psutil.Process]:
    """The server's engine-core processes by data-parallel rank (their titles say it)."""
    cores = {}
    for child in psutil.Process(proc.pid).children(recursive=True):
        title = " ".join(child.cmdline())
        if "kc::engine-core-dp" in title:
            cores[title.split("kc::engine-core-dp", 1)[1].split()[0]] = child
    return cores


@pytest.fixture(scope="module")
def dp_server():
    proc, url = start_server("--data-parallel-size", "2", "--api-key", API_KEY, "--kv-cache-memory", "64MiB")
    yield proc, url
    stop_server(proc)


async def stream(session: aiohttp.ClientSession, url: str, i: int, progress: dict[int, int],
                 all_started: asyncio.Event) -> tuple[str, list[dict]]:
    """One streamed completion: its text and any error event."""
    text, errors = [], []
    async with session.post(url + "/v1/completions", json={**body(i), "stream": True}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[len(b"data: "):])
            if "error" in event:
                errors.append(event["error"])
                continue
            text.append(event["choices"][0]["text"])
            progress[i] += 1
            if len(progress) == NUM_STREAMS and min(progress.values()) >= 3:
                all_started.set()
    return "".join(text), errors


async def plain(session: aiohttp.ClientSession, url: str, i: int) -> tuple[int, dict]:
    async with session.post(url + "/v1/completions", json=body(i)) as r:
        return r.status, await r.json()


def test_a_killed_replica_costs_its_requests_nothing_and_the_last_one_fails_clearly(dp_server):
    proc, url = dp_server
    indexes = range(NUM_STREAMS + NUM_PLAIN)
    reference = {i: requests.post(url + "/v1/completions", json=body(i), headers=AUTH, timeout=600).json()
                 ["choices"][0]["text"] for i in indexes}  # undisturbed, one at a time
    cores = engine_cores(proc)
    assert sorted(cores) == ["0", "1"], cores
    routed_before = per_replica(url, "kc:dp_routed_requests_total")

    async def disturbed():
        progress: dict[int, int] = {}
        all_started = asyncio.Event()
        async with aiohttp.ClientSession(headers=AUTH, timeout=aiohttp.ClientTimeout(total=600)) as session:
            for i in range(NUM_STREAMS):
                progress[i] = 0
            streams = [asyncio.create_task(stream(session, url, i, progress, all_started)) for i in range(NUM_STREAMS)]
            plains = [asyncio.create_task(plain(session, url, i)) for i in range(NUM_STREAMS, len(indexes))]
            await all_started.wait()  # every stream is under way: each replica runs half of them
            cores["1"].send_signal(signal.SIGKILL)
            return await asyncio.gather(*streams), await asyncio.gather(*plains)

    streamed, plain_results = asyncio.run(disturbed())
    for i, (text, errors) in enumerate(streamed):
        assert not errors, errors
        assert text == reference[i], f"stream {i} differs from the undisturbed run"  # nothing repeated or dropped
    for i, (status, answer) in zip(range(NUM_STREAMS, len(indexes)), plain_results, strict=True):
        assert status == 200, answer
        assert answer["choices"][0]["text"] == reference[i] and answer["usage"]["completion_tokens"] == MAX_TOKENS

    health = requests.get(url + "/health", timeout=30)
    assert health.status_code == 200 and "data-parallel replica 1 (local) lost" in health.text, health.text
    assert "exit code -9" in health.text
    routed = {r: v - routed_before.get(r, 0) for r, v in per_replica(url, "kc:dp_routed_requests_total").items()}
    resubmitted = per_replica(url, "kc:dp_requests_resubmitted_total")
    assert per_replica(url, "kc:dp_replica_up") == {"0": 1.0, "1": 0.0}
    assert resubmitted["1"] == routed["1"] > 0 and resubmitted["0"] == 0  # all of replica 1's, each once
    assert per_replica(url, "kc:dp_num_requests_running") == {"0": 0.0, "1": 0.0}
    assert sum(s.value for s in samples(url) if s.name == "kc:num_requests_running") == 0
    again = requests.post(url + "/v1/completions", json=body(0), headers=AUTH, timeout=600).json()
    assert again["choices"][0]["text"] == reference[0]  # replica 0 serves on

    async def last_replica_lost():
        progress = {i: 0 for i in range(NUM_STREAMS)}
        started = asyncio.Event()
        async with aiohttp.ClientSession(headers=AUTH, timeout=aiohttp.ClientTimeout(total=600)) as session:
            task = asyncio.create_task(stream(session, url, 0, progress, started))
            while not progress[0]:  # the stream's first token arrived
                await asyncio.sleep(0.05)
            cores["0"].send_signal(signal.SIGKILL)
            return await task

    _, errors = asyncio.run(last_replica_lost())
    assert len(errors) == 1 and "data-parallel replica 0 (local) lost" in errors[0]["message"], errors
    refused = requests.post(url + "/v1/completions", json=body(0), headers=AUTH, timeout=60)
    assert refused.status_code == 503 and "data-parallel replica 0 (local) lost" in refused.json()["error"]["message"]
    health = requests.get(url + "/health", timeout=30)
    assert health.status_code == 503 and "data-parallel replica 0 (local) lost" in health.text, health.text
    log = server_log(proc)
    assert "Traceback" not in log, log


WORKER_KILL = """
import asyncio, json, os, signal
import psutil
from kernelcore.config_builder import build_config
from kernelcore.engine.async_llm import AsyncLLM
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.models.default_model import ensure_default_model

PROMPTS = [[3 + i, 40 + i, 17, 99, 5 * i + 1, 8] for i in range(4)]
PARAMS = [SamplingParams(temperature=0.8, seed=i, max_tokens=120, ignore_eos=True) if i % 2 else
          SamplingParams(temperature=0, max_tokens=120, ignore_eos=True) for i in range(4)]

async def run(llm, tag, kill=False):
    progress, started, out = [0] * 4, asyncio.Event(), {}

    async def one(i):
        async for o in llm.generate(f"{tag}-{i}", PROMPTS[i], PARAMS[i]):
            progress[i] = len(o.outputs[0].token_ids)
            if min(progress) >= 3:
                started.set()
        out[i] = o.outputs[0].token_ids

    tasks = [asyncio.create_task(one(i)) for i in range(4)]
    if kill:
        await started.wait()
        core = psutil.Process(llm._replica_processes[1].pid)
        workers = [c for c in core.children(recursive=True) if "kc::worker" in " ".join(c.cmdline())]
        workers[-1].send_signal(signal.SIGKILL)  # one tensor-parallel worker of replica 1
    await asyncio.gather(*tasks)
    return [out[i] for i in range(4)]

async def main():
    llm = await AsyncLLM.create(build_config(model=ensure_default_model(), kv_cache_memory=1 << 24,
                                             data_parallel_size=2, tensor_parallel_size=2))
    reference = await run(llm, "reference")
    disturbed = await run(llm, "disturbed", kill=True)
    result = {"same": disturbed == reference, "lost": list(llm.lost_replicas.values()), "is_dead": llm.is_dead}
    await llm.shutdown()
    print(json.dumps(result))

if __name__ == "__main__":
    asyncio.run(main())
"""


def test_a_lost_tensor_parallel_worker_loses_only_its_replica():
    from helpers import run_python

    result = json.loads(run_python(WORKER_KILL, timeout=600).stdout.strip().splitlines()[-1])
    assert result["same"] and not result["is_dead"], result
    assert len(result["lost"]) == 1 and "data-parallel replica 1 (local) lost" in result["lost"][0], result
    assert "worker-1" in result["lost"][0]
