"""Bad LoRA adapters against the real `kc serve`, TP=1 and TP=2: refused with 400 at load (shapes, a pickle
payload that is not run), a bad adapter named in a request fails that request alone while co-running base
streams get every token, and the server keeps serving; a bad --lora-modules is a clear start-up error."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys

import aiohttp
import pytest
import requests
from conftest_models import make_llama_checkpoint
from helpers import clean_env
from lora_helpers import make_bad_shape_adapter, make_peft_adapter, make_pickle_payload_adapter
from test_server_e2e import free_port, start_server, stop_server

pytestmark = pytest.mark.slow  # starts kc serve

PROMPT = [5, 9, 14, 3, 7, 11, 2, 8, 40, 41]
NUM_STREAM_TOKENS = 48


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-isolation-server")
    base = make_llama_checkpoint(str(root / "base"))
    adapters, resolvable = root / "adapters", root / "resolvable"
    good = make_peft_adapter(base, str(adapters / "good"), "llama", seed=5, rank=8)
    for name in ("fill-1", "fill-2"):
        shutil.copytree(good, adapters / name)
    make_bad_shape_adapter(good, str(adapters / "bad-shape"), "k_proj", "B")
    make_bad_shape_adapter(good, str(resolvable / "bad-resolved"), "o_proj", "A")
    marker = root / "payload-ran"
    make_pickle_payload_adapter(good, str(adapters / "payload"), str(marker))
    return {"root": str(root), "base": base, "adapters": str(adapters), "resolvable": str(resolvable),
            "marker": str(marker)}


def _lora_args(dirs) -> list[str]:
    return [dirs["base"], "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "2", "--max-lora-rank", "8",
            "--kv-cache-memory", "16MiB", "--skip-tokenizer-init", "--allow-runtime-lora-updating", "--lora-root",
            dirs["adapters"]]


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def url(request, dirs):
    old = os.environ.get("KC_LORA_RESOLVER_DIR")
    os.environ["KC_LORA_RESOLVER_DIR"] = dirs["resolvable"]
    try:
        proc, url = start_server(*_lora_args(dirs), "--tensor-parallel-size", str(request.param))
    finally:
        os.environ.pop("KC_LORA_RESOLVER_DIR") if old is None else os.environ.__setitem__("KC_LORA_RESOLVER_DIR", old)
    yield url
    stop_server(proc)


def load(url: str, name: str, path: str) -> requests.Response:
    return requests.post(url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}, timeout=120)


def complete(url: str, model: str) -> requests.Response:
    return requests.post(url + "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 4,
                                                        "temperature": 0}, timeout=120)


def assert_still_serving(url: str) -> None:
    assert requests.get(url + "/health", timeout=60).status_code == 200
    r = complete(url, "base")
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def assert_no_server_paths(message: str, dirs) -> None:
    assert dirs["root"] not in message and os.path.realpath(dirs["root"]) not in message


async def _stream(session: aiohttp.ClientSession, url: str, started: asyncio.Event) -> tuple[bool, dict | None]:
    """A base-model stream: (saw [DONE], the usage of its last chunk); ``started`` is set at its first chunk."""
    body = {"model": "base", "prompt": PROMPT, "max_tokens": NUM_STREAM_TOKENS, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    usage, done = None, False
    async with session.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[len("data: "):])
            assert "error" not in chunk, chunk
            started.set()
            usage = chunk.get("usage") or usage
    return done, usage


def run_beside_streams(url: str, model: str, num_streams: int = 3) -> tuple[int, dict, list]:
    """Start base streams, wait until each has its first chunk, then ask ``model``; (status, body, streams)."""
    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            events = [asyncio.Event() for _ in range(num_streams)]
            streams = [asyncio.create_task(_stream(session, url, e)) for e in events]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 300)
            async with session.post(url + "/v1/completions",
                                    json={"model": model, "prompt": PROMPT, "max_tokens": 4}) as r:
                status, body = r.status, await r.json()
            return status, body, await asyncio.gather(*streams)

    return asyncio.run(main())


def assert_streams_complete(streams: list) -> None:
    for done, usage in streams:
        assert done and usage["completion_tokens"] == NUM_STREAM_TOKENS


def test_bad_shape_adapter_is_refused_at_load(url, dirs):
    r = load(url, "bad-shape", os.path.join(dirs["adapters"], "bad-shape"))
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "bad-shape" in message and "k_proj" in message and "lora_B has shape (64, 8)" in message
    assert_no_server_paths(message, dirs)
    assert "bad-shape" not in [c["id"] for c in requests.get(url + "/v1/models").json()["data"]]
    assert complete(url, "bad-shape").status_code == 404
    assert_still_serving(url)


def test_pickle_payload_bin_is_400_and_not_run(url, dirs):
    r = load(url, "payload", os.path.join(dirs["adapters"], "payload"))
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "payload" in message and "adapter_model.bin" in message and "refused" in message
    assert_no_server_paths(message, dirs)
    assert not os.path.exists(dirs["marker"])
    assert_still_serving(url)


def test_resolver_served_bad_adapter_fails_only_its_request(url, dirs):
    status, body, streams = run_beside_streams(url, "bad-resolved")
    assert status == 400, body
    message = body["error"]["message"]
    assert "'bad-resolved'" in message and "o_proj" in message
    assert_no_server_paths(message, dirs)
    assert_streams_complete(streams)
    assert_still_serving(url)


def test_adapter_whose_files_go_bad_after_load_fails_only_its_request(url, dirs, tmp_path):
    swap = os.path.join(dirs["adapters"], f"swap-{os.path.basename(str(tmp_path))}")
    shutil.copytree(os.path.join(dirs["adapters"], "good"), swap)
    name = os.path.basename(swap)
    assert load(url, name, swap).status_code == 200
    for fill in ("fill-1", "fill-2"):  # the workers' CPU cache holds two adapters: this one is read again when used
        r = load(url, f"{fill}-{name}", os.path.join(dirs["adapters"], fill))
        assert r.status_code == 200, r.text
    shutil.rmtree(swap)
    shutil.copytree(os.path.join(dirs["adapters"], "bad-shape"), swap)
    status, body, streams = run_beside_streams(url, name)
    assert status == 400, body
    message = body["error"]["message"]
    assert f"LoRA adapter '{name}' cannot be used" in message and "k_proj" in message
    assert_no_server_paths(message, dirs)
    assert_streams_complete(streams)
    shutil.rmtree(swap)
    shutil.copytree(os.path.join(dirs["adapters"], "good"), swap)  # fixed: the adapter serves again
    assert complete(url, name).status_code == 200
    assert_still_serving(url)


@pytest.mark.slow
def test_bad_static_lora_module_is_a_clear_startup_error(dirs):
    bad = os.path.join(dirs["adapters"], "bad-shape")
    proc = subprocess.run([sys.executable, "-m", "kernelcore.entrypoints.cli", "serve", "--port", str(free_port()),
                           *_lora_args(dirs), "--lora-modules", f"broken={bad}"],
                          env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Invalid value for --lora-modules: broken=" in proc.stderr and "k_proj" in proc.stderr
    assert "Traceback" not in proc.stderr
