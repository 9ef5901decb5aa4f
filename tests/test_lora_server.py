"""LoRA against the real `kc serve`: lineage in /v1/models, load/unload endpoints, resolvers, 10 concurrent loads."""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp
import pytest
import requests
from conftest_models import make_llama_checkpoint
from lora_helpers import make_peft_adapter
from test_server_e2e import start_server, stop_server

pytestmark = pytest.mark.slow  # real servers / several processes: run with the full suite

PROMPT = [5, 9, 14, 3, 7, 11, 2, 8, 40, 41]
GREEDY = {"prompt": PROMPT, "temperature": 0, "logprobs": 1, "return_tokens_as_token_ids": True}  # no tokenizer


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-server")
    base = make_llama_checkpoint(str(root / "base"))
    adapters, resolvable = root / "adapters", root / "resolvable"
    for i in range(3):
        make_peft_adapter(base, str(adapters / f"a{i}"), "llama", seed=i, rank=8)
    make_peft_adapter(base, str(resolvable / "found"), "llama", seed=7, rank=4)
    make_peft_adapter(base, str(resolvable / "too-big"), "llama", seed=8, rank=16)  # above --max-lora-rank 8
    os.makedirs(adapters / "empty")
    return {"root": root, "base": base, "adapters": str(adapters), "resolvable": str(resolvable)}


def _serve(dirs, *extra: str, runtime: bool = True):
    args = [dirs["base"], "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "2", "--max-lora-rank", "8",
            "--kv-cache-memory", "16MiB", "--skip-tokenizer-init", "--lora-modules", f"static={dirs['adapters']}/a0",
            *extra]
    if runtime:
        args += ["--allow-runtime-lora-updating", "--lora-root", dirs["adapters"]]
    env_dir = {"KC_LORA_RESOLVER_DIR": dirs["resolvable"]}
    old = {k: os.environ.get(k) for k in env_dir}
    os.environ.update(env_dir)
    try:
        return start_server(*args)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def url(dirs):
    proc, url = _serve(dirs)
    yield url
    stop_server(proc)


def complete(url: str, model: str, max_tokens: int = 6) -> requests.Response:
    return requests.post(url + "/v1/completions", json={"model": model, "max_tokens": max_tokens, **GREEDY},
                         timeout=120)


def load(url: str, name: str, path: str) -> requests.Response:
    return requests.post(url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}, timeout=60)


def test_static_adapter_is_listed_with_its_parent_and_changes_the_output(url, dirs):
    cards = requests.get(url + "/v1/models").json()["data"]
    assert [c["id"] for c in cards] == ["base", "static"]
    assert cards[0]["parent"] is None
    assert cards[1]["parent"] == "base" and cards[1]["root"] == os.path.realpath(f"{dirs['adapters']}/a0")
    base, static = complete(url, "base"), complete(url, "static")
    assert base.status_code == static.status_code == 200
    assert static.json()["model"] == "static"
    assert base.json()["choices"][0]["logprobs"] != static.json()["choices"][0]["logprobs"]


def test_load_errors(url, dirs):
    adapters = dirs["adapters"]
    r = load(url, "static", f"{adapters}/a1")
    assert r.status_code == 400 and "already been loaded" in r.text
    assert load(url, "", f"{adapters}/a1").status_code == 400
    r = requests.post(url + "/v1/load_lora_adapter", data="{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    r = load(url, "escape", dirs["resolvable"] + "/found")  # a real adapter, but outside --lora-root
    assert r.status_code == 400 and "outside the adapter root" in r.text
    r = load(url, "dotdot", f"{adapters}/../resolvable/found")
    assert r.status_code == 400
    assert load(url, "nothing", f"{adapters}/empty").status_code == 404
    r = requests.post(url + "/v1/unload_lora_adapter", json={"lora_name": "never"})
    assert r.status_code == 404 and r.json()["error"]["message"] == "The lora adapter 'never' cannot be found."
    assert complete(url, "nothing").status_code == 404


def test_ten_concurrent_loads_with_two_cpu_slots_all_succeed_and_serve(url, dirs):
    names = [f"c{i}" for i in range(10)]

    async def main():
        async with aiohttp.ClientSession() as session:
            async def post(path, body):
                async with session.post(url + path, json=body) as r:
                    return r.status, await r.text()

            loads = await asyncio.gather(*(post("/v1/load_lora_adapter", {
                "lora_name": n, "lora_path": f"{dirs['adapters']}/a{i % 3}"}) for i, n in enumerate(names)))
            runs = await asyncio.gather(*(post("/v1/completions", {"model": n, "max_tokens": 6, **GREEDY})
                                          for n in names))
            return loads, runs

    loads, runs = asyncio.run(main())
    assert all(status == 200 for status, _ in loads), loads
    assert loads[0][1] == "Success: LoRA adapter 'c0' added successfully."
    assert all(status == 200 for status, _ in runs), runs
    tokens = [json.loads(text)["choices"][0]["logprobs"]["tokens"] for _, text in runs]
    for i in range(3, 10):  # the same adapter gives the same greedy output, whichever slot it landed in
        assert tokens[i] == tokens[i % 3]
    ids = [c["id"] for c in requests.get(url + "/v1/models").json()["data"]]
    assert set(names) <= set(ids)
    r = requests.post(url + "/v1/unload_lora_adapter", json={"lora_name": "c9"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'c9' removed successfully."
    assert complete(url, "c9").status_code == 404
    metrics = requests.get(url + "/metrics").text
    assert "kc:lora_requests_info{" in metrics and 'max_lora="2"' in metrics


def test_resolvers_and_invalid_loads_do_not_disturb_running_requests(url, dirs):
    async def main():
        async with aiohttp.ClientSession() as session:
            async def post(path, body):
                async with session.post(url + path, json=body) as r:
                    return r.status, await r.text()

            # the running request streams, so the bad ones are sent once it has produced its first token
            body = {"model": "static", "prompt": PROMPT, "max_tokens": 60, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            async with session.post(url + "/v1/completions", json=body) as stream:
                first = await stream.content.readline()
                assert first.startswith(b"data: "), first
                answers = [await post("/v1/completions", {"model": name, "prompt": PROMPT, "max_tokens": 4})
                           for name in ("unknown-adapter", "found", "too-big", "..")]
                answers.append(await post("/v1/load_lora_adapter",
                                          {"lora_name": "bad", "lora_path": dirs["adapters"]}))
                rest = first + await stream.read()
                usage = [json.loads(line[6:])["usage"] for line in rest.decode().splitlines()
                         if line.startswith("data: {") and json.loads(line[6:]).get("usage")]
                return (stream.status, usage[-1]), answers

    (status, usage), answers = asyncio.run(main())
    assert status == 200 and usage["completion_tokens"] == 60
    (s404, _), (s_found, found), (s_big, big), (s_dots, dots), (s_bad, _) = answers
    assert s404 == 404
    assert s_found == 200 and json.loads(found)["model"] == "found"
    assert s_big == 400 and "'too-big'" in big and "max-lora-rank" in big
    assert s_dots == 400 and "filesystem" in dots
    assert s_bad == 404  # the root itself holds no adapter_config.json
    cards = {c["id"]: c for c in requests.get(url + "/v1/models").json()["data"]}
    assert cards["found"]["parent"] == "base"


def test_without_the_runtime_flag_resolvers_are_not_consulted(dirs):
    proc, url = _serve(dirs, runtime=False)
    try:
        assert complete(url, "found").status_code == 404
        assert complete(url, "static").status_code == 200
        r = requests.post(url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": dirs["adapters"]})
        assert r.status_code == 404
    finally:
        stop_server(proc)
