"""The real `kc serve` in a subprocess (default model), driven over HTTP with the openai client and raw aiohttp."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time

import aiohttp
import openai
import psutil
import pytest
import requests
from helpers import clean_env, free_port, server_log, start_server, stop_server  # noqa: F401 (re-exported)

pytestmark = pytest.mark.slow  # real servers / several processes: run with the full suite

API_KEY = "sk-test-key"
MAX_MODEL_LEN = 256
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def server():
    proc, url = start_server("--max-model-len", str(MAX_MODEL_LEN), "--api-key", API_KEY,
                             "--max-request-body-bytes", str(MAX_BODY), "--shutdown-timeout", "2")
    yield proc, url
    stop_server(proc)


@pytest.fixture(scope="module")
def url(server):
    return server[1]


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


AUTH = {"Authorization": f"Bearer {API_KEY}"}


def post(url: str, path: str, body, **kwargs) -> requests.Response:
    headers = {**AUTH, **kwargs.pop("headers", {})}
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return requests.post(url + path, data=data, headers={"Content-Type": "application/json", **headers}, **kwargs)


def metric(url: str, name: str) -> float:
    text = requests.get(url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def greedy(**kwargs):
    return {"temperature": 0, **kwargs}


# -- plain endpoints and auth ---------------------------------------------------------------------------------


def test_open_endpoints_and_auth(url):
    assert requests.get(url + "/health").status_code == 200
    assert requests.get(url + "/metrics").status_code == 200
    assert requests.get(url + "/version", headers=AUTH).json()["version"]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = requests.get(url + "/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
    assert post(url, "/tokenize", {"prompt": "x"}, headers={"Authorization": "Bearer nope"}).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="bad", max_retries=0).models.list()


def test_models(client, url):
    (card,) = client.models.list().data
    raw = requests.get(url + "/v1/models", headers=AUTH).json()["data"][0]
    assert raw["object"] == "model" and raw["max_model_len"] == MAX_MODEL_LEN and raw["parent"] is None
    assert card.id == raw["id"]


# -- completions -------------------------------------------------------------------------------------------------


def test_completion_basic_and_token_prompt(client, model):
    out = client.completions.create(model=model, prompt="Hello, my name is", max_tokens=5,
                                    extra_body={"ignore_eos": True})
    assert out.id.startswith("cmpl-") and out.model == model
    choice = out.choices[0]
    assert choice.finish_reason == "length" and out.usage.completion_tokens == 5
    assert out.usage.total_tokens == out.usage.prompt_tokens + 5
    out = client.completions.create(model=model, prompt=[0, 0, 0, 0, 0], max_tokens=5, extra_body={"ignore_eos": True})
    assert out.usage.prompt_tokens == 5 and out.usage.completion_tokens == 5


def test_completion_missing_and_empty_model_use_served_name(url, model):
    for body in ({"prompt": "hi", "max_tokens": 2}, {"prompt": "hi", "max_tokens": 2, "model": ""}):
        r = post(url, "/v1/completions", body)
        assert r.status_code == 200 and r.json()["model"] == model


def test_completion_stream_equals_non_stream(client, model):
    kwargs = dict(model=model, prompt="The quick brown fox", max_tokens=12, **greedy(), extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert finishes == ["length"] and all(c.usage is None for c in chunks)


def test_completion_n_and_several_prompts(client, model):
    out = client.completions.create(model=model, prompt="Once upon a time", n=3, max_tokens=5, temperature=1.0,
                                    extra_body={"ignore_eos": True})
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert out.usage.completion_tokens == 15
    out = client.completions.create(model=model, prompt=["Hello there", "Hello there"], max_tokens=6, **greedy())
    assert [c.index for c in out.choices] == [0, 1] and out.choices[0].text == out.choices[1].text
    counts: dict[int, int] = {}
    finishes: dict[int, int] = {}
    for chunk in client.completions.create(model=model, prompt="Once upon a time", n=3, max_tokens=5, stream=True,
                                           extra_body={"ignore_eos": True}):
        (choice,) = chunk.choices
        counts[choice.index] = counts.get(choice.index, 0) + 1
        finishes[choice.index] = finishes.get(choice.index, 0) + (choice.finish_reason is not None)
    assert counts == {0: 5, 1: 5, 2: 5} and finishes == {0: 1, 1: 1, 2: 1}


def test_seed_reproducible(client, model):
    kwargs = dict(model=model, prompt="Tell me a story", max_tokens=16, temperature=1.0, seed=1234,
                  extra_body={"ignore_eos": True})
    assert client.completions.create(**kwargs).choices[0].text == client.completions.create(**kwargs).choices[0].text


def test_stop_string_spanning_tokens(client, model):
    base = dict(model=model, prompt="Water boils at", max_tokens=24, **greedy())
    full = client.completions.create(**base, extra_body={"ignore_eos": True, "logprobs": 0}).choices[0]
    tokens = full.logprobs.tokens
    # a stop string made of the end of one token and the start of the next
    k = next(i for i in range(3, len(tokens) - 1) if len(tokens[i]) >= 2 and tokens[i + 1])
    stop = tokens[k][-1] + tokens[k + 1][:1]
    position = full.text.index(stop)
    out = client.completions.create(**base, stop=[stop], extra_body={"ignore_eos": True}).choices[0]
    assert out.text == full.text[:position] and out.finish_reason == "stop"
    assert out.model_extra["stop_reason"] == stop
    out = client.completions.create(**base, stop=[stop], extra_body={"ignore_eos": True,
                                                                     "include_stop_str_in_output": True}).choices[0]
    assert out.text == full.text[:position] + stop
    deltas = [c.choices[0].text for c in client.completions.create(**base, stop=[stop], stream=True,
                                                                    extra_body={"ignore_eos": True})]
    assert "".join(deltas) == full.text[:position] and not any(stop in d for d in deltas)


def test_stop_token_ids(client, model):
    base = dict(model=model, prompt="The capital of France", max_tokens=16, **greedy())
    full = client.completions.create(**base, logprobs=0,
                                     extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}).choices[0]
    ids = [int(t.split(":")[1]) for t in full.logprobs.tokens]
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    out = client.completions.create(**base, extra_body={"ignore_eos": True, "stop_token_ids": [ids[k]]})
    assert out.choices[0].finish_reason == "stop" and out.choices[0].model_extra["stop_reason"] == ids[k]
    assert out.usage.completion_tokens == k + 1


def test_logit_bias_and_allowed_token_ids(client, model):
    base = dict(model=model, prompt="The capital of France", max_tokens=6, **greedy())
    extra = {"ignore_eos": True, "return_tokens_as_token_ids": True}

    def ids(**kw):
        out = client.completions.create(**base, logprobs=0, extra_body={**extra, **kw.pop("extra", {})}, **kw)
        return [int(t.split(":")[1]) for t in out.choices[0].logprobs.tokens]

    plain = ids()
    assert set(ids(logit_bias={"7": 100})) == {7}
    assert plain[0] not in ids(logit_bias={str(plain[0]): -100})
    assert set(ids(extra={"allowed_token_ids": [11, 12]})) <= {11, 12}


def test_completion_logprobs_and_echo(client, model):
    base = dict(model=model, prompt="Hello world", max_tokens=4, **greedy())
    assert client.completions.create(**base).choices[0].logprobs is None
    lp = client.completions.create(**base, logprobs=0).choices[0].logprobs
    assert all(len(d) == 1 for d in lp.top_logprobs) and len(lp.tokens) == 4
    lp = client.completions.create(**base, logprobs=5).choices[0].logprobs
    assert all(len(d) in (5, 6) for d in lp.top_logprobs)
    out = client.completions.create(**base, logprobs=1, echo=True).choices[0]
    assert out.text.startswith("Hello world") and out.logprobs.token_logprobs[0] is None
    assert not client.completions.create(**base).choices[0].text.startswith("Hello world")
    out = client.completions.create(model=model, prompt="Hello world", max_tokens=0, echo=True).choices[0]
    assert out.text == "Hello world"


# -- chat ------------------------------------------------------------------------------------------------------


def test_chat_session(client, model):
    messages = [{"role": "system", "content": "you are a helpful assistant"},
                {"role": "user", "content": "what is 1+1?"}]
    out = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=10,
                                         extra_body={"ignore_eos": True})
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    assert out.choices[0].finish_reason == "length" and out.choices[0].message.role == "assistant"
    assert out.usage.completion_tokens == 10 and out.usage.total_tokens == out.usage.prompt_tokens + 10
    messages += [{"role": "assistant", "content": out.choices[0].message.content}, {"role": "user", "content": "more"}]
    assert client.chat.completions.create(model=model, messages=messages, max_completion_tokens=5).choices[0].message


def test_chat_streaming_matches_and_usage(client, model):
    kwargs = dict(model=model, messages=[{"role": "user", "content": "Say hello"}], max_completion_tokens=10,
                  **greedy())
    full = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == (chunks[-1].usage.prompt_tokens
                                                                           + chunks[-1].usage.completion_tokens)
    assert all(c.usage is None for c in chunks[:-1])
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert all(c.usage is None for c in chunks)


def test_chat_list_content_equals_string(client, model):
    a = client.chat.completions.create(model=model, max_completion_tokens=6, **greedy(),
                                       messages=[{"role": "user", "content": "one\ntwo"}])
    b = client.chat.completions.create(model=model, max_completion_tokens=6, **greedy(), messages=[
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}])
    assert a.choices[0].message.content == b.choices[0].message.content


def test_chat_logprobs(client, model):
    base = dict(model=model, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=3, **greedy())
    assert client.chat.completions.create(**base).choices[0].logprobs is None
    content = client.chat.completions.create(**base, logprobs=True, top_logprobs=0).choices[0].logprobs.content
    assert len(content) == 3 and all(c.top_logprobs == [] for c in content)
    content = client.chat.completions.create(**base, logprobs=True, top_logprobs=5).choices[0].logprobs.content
    assert all(len(c.top_logprobs) == 5 and c.bytes is not None for c in content)
    with pytest.raises(openai.BadRequestError, match="greater than max allowed: 20"):
        client.chat.completions.create(**base, logprobs=True, top_logprobs=21, stream=True)
    assert client.chat.completions.create(**base).choices[0].message


# -- errors ------------------------------------------------------------------------------------------------------


def _error(r: requests.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error


def test_error_cases(url, model):
    c, ch = "/v1/completions", "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    assert _error(post(url, c, "{not json"), 400)["type"] == "BadRequestError"
    _error(post(url, c, [1, 2]), 400)
    r = requests.post(url + c, data={"prompt": "x"}, headers=AUTH)
    assert r.status_code == 415
    _error(post(url, c, {"prompt": "x" * (MAX_BODY + 10)}), 413)
    error = _error(post(url, c, {"model": "foo", "prompt": "x"}), 404)
    assert error == {"message": "The model `foo` does not exist.", "type": "NotFoundError", "param": "model",
                     "code": 404}
    _error(post(url, c, {"prompt": ""}), 400)
    _error(post(url, c, {"prompt": []}), 400)
    assert "Token id 10000000 is out of vocabulary" in _error(post(url, c, {"prompt": [1, 10000000]}), 400)["message"]
    assert "out of vocabulary" in _error(post(url, ch, {"messages": msgs, "stop_token_ids": [-1]}), 400)["message"]
    assert _error(post(url, ch, {"messages": msgs, "seed": 2**63}), 400)["param"] == "seed"
    _error(post(url, ch, {"messages": msgs, "stream_options": {"include_usage": None}}), 400)
    _error(post(url, ch, {"messages": msgs, "top_logprobs": 2}), 400)
    _error(post(url, c, {"prompt": "x", "logprobs": 21}), 400)
    _error(post(url, c, {"prompt": "x", "temperature": -1}), 400)
    _error(post(url, c, {"prompt": "x", "temperature": "hot"}), 400)
    _error(post(url, c, {"prompt": "x", "top_p": 0}), 400)
    _error(post(url, c, {"prompt": "x", "n": 1000}), 400)
    _error(post(url, c, {"prompt": "x", "suffix": "y"}), 400)
    _error(post(url, c, {"prompt": "x", "prompt_logprobs": -1}), 400)
    _error(post(url, ch, {"messages": msgs, "chat_template": "{{ 'x' }}"}), 400)
    _error(post(url, ch, {"messages": msgs, "add_generation_prompt": True, "continue_final_message": True}), 400)
    tool = {"type": "function", "function": {"name": "f"}}
    _error(post(url, ch, {"messages": msgs, "tool_choice": tool}), 400)
    _error(post(url, ch, {"messages": msgs, "tool_choice": tool, "tools": []}), 400)
    _error(post(url, ch, {"messages": msgs, "tools": [tool], "tool_choice": {"type": "function",
                                                                                 "function": {"name": "g"}}}), 400)
    _error(post(url, ch, {"messages": []}), 400)
    # unknown fields are accepted
    assert post(url, ch, {"messages": msgs, "max_tokens": 2, "no_such_field": 1}).status_code == 200
    # the length checks of the contract
    long_ids = [5] * MAX_MODEL_LEN
    error = _error(post(url, c, {"prompt": long_ids}), 400)
    assert error["param"] == "input_tokens" and error["message"] == (
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your request has {MAX_MODEL_LEN} "
        "input tokens. Please reduce the length of the input messages.")
    error = _error(post(url, c, {"prompt": [5] * 200, "max_tokens": 100}), 400)
    assert error["param"] == "max_tokens" and error["message"] == (
        f"'max_tokens' or 'max_completion_tokens' is too large: 100. This model's maximum context length is "
        f"{MAX_MODEL_LEN} tokens and your request has 200 input tokens (100 > {MAX_MODEL_LEN} - 200).")
    r = post(url, c, {"prompt": [5] * (MAX_MODEL_LEN - 3), "ignore_eos": True})  # the default 16 is clamped
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    r = post(url, ch, {"messages": msgs, "max_completion_tokens": None})
    assert r.status_code == 200  # no limit given: the rest of the context
    assert requests.get(url + "/health").status_code == 200


def test_openai_client_errors(client, model):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=model, prompt=[5] * MAX_MODEL_LEN)


def test_tokenize_detokenize(url):
    from transformers import AutoTokenizer

    from kernelcore.models.default_model import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    r = post(url, "/tokenize", {"prompt": "Hello world", "return_token_strs": True}).json()
    assert r["tokens"] == tok.encode("Hello world") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == MAX_MODEL_LEN and r["token_strs"] == tok.convert_ids_to_tokens(r["tokens"])
    msgs = [{"role": "user", "content": "hi there"}]
    r = post(url, "/tokenize", {"messages": msgs}).json()
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert r["tokens"] == tok.encode(text, add_special_tokens=False)
    assert post(url, "/detokenize", {"tokens": tok.encode("Hello world", add_special_tokens=False)}).json() == {
        "prompt": "Hello world"}


# -- load, disconnects, metrics -----------------------------------------------------------------------------------


async def _stream_some(url: str, body: dict, num_chunks: int) -> None:
    async with aiohttp.ClientSession(headers=AUTH) as session:
        async with session.post(url + "/v1/completions", json={**body, "stream": True}) as r:
            assert r.status == 200
            seen = 0
            async for line in r.content:
                if line.startswith(b"data: "):
                    seen += 1
                    if seen >= num_chunks:
                        return  # leaving the block closes the connection mid-stream


def _wait_idle(url: str, timeout: float = 20) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if metric(url, "kc:num_requests_running") == 0 and metric(url, "kc:num_requests_waiting") == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"requests still running: {metric(url, 'kc:num_requests_running')}")


def _aborted(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(url + "/metrics").text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "kc:request_success_total" and sample.labels.get("finished_reason") == "abort")


async def _wait_running(session: aiohttp.ClientSession, url: str, at_least: int) -> None:
    """Until the engine runs at least this many requests (an event the test observes, not a duration)."""
    while True:
        async with session.get(url + "/metrics") as r:
            text = await r.text()
        running = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith("kc:num_requests_running"))
        if running >= at_least:
            return
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def long_server():
    """A server with the default model's whole context, so a request can run for 2000 decode steps."""
    proc, url = start_server("--api-key", API_KEY, "--shutdown-timeout", "0")
    yield proc, url
    stop_server(proc)


def test_disconnect_aborts(long_server):
    # requests that run to the end of the context unless aborted: the test, not a timer, ends them
    _, url = long_server
    body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True}
    before = _aborted(url)

    async def main():
        await asyncio.gather(*[_stream_some(url, body, 3) for _ in range(3)])  # streams closed after 3 chunks
        await asyncio.to_thread(_wait_idle, url, 120)
        async with aiohttp.ClientSession(headers=AUTH) as session:  # a non-streaming client that gives up
            task = asyncio.create_task(session.post(url + "/v1/completions", json=body))
            await asyncio.wait_for(_wait_running(session, url, 1), 60)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    _wait_idle(url, 120)  # a safety net: the aborts free the engine at once
    assert _aborted(url) - before == 4
    assert requests.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                         headers=AUTH).status_code == 200
    log = server_log(long_server[0])
    assert "Error handling request" not in log and "Traceback" not in log, log  # leaving is not a server error


def test_shutdown_ends_running_streams_with_an_error_event(long_server):
    proc, url = long_server
    body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with requests.post(url + "/v1/completions", json=body, headers=AUTH, stream=True, timeout=120) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line).startswith(b"data: {")
        proc.send_signal(signal.SIGTERM)  # --shutdown-timeout 0: the running stream is ended at once
        events = [line[len(b"data: "):] for line in lines if line]
    assert events[-1] == b"[DONE]"
    assert json.loads(events[-2])["error"]["code"] == 503, events[-3:]
    assert proc.wait(30) == 0


def test_64_concurrent_streams(url):
    async def one(session: aiohttp.ClientSession, i: int) -> str | None:
        body = {"prompt": f"Request number {i}", "max_tokens": 8, "stream": True, "ignore_eos": True}
        finish = None
        async with session.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200
            async for line in r.content:
                if line.startswith(b"data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    finish = choice["finish_reason"] or finish
        return finish

    async def main():
        async with aiohttp.ClientSession(headers=AUTH) as session:
            return await asyncio.gather(*[one(session, i) for i in range(64)])

    assert asyncio.run(main()) == ["length"] * 64
    _wait_idle(url)


def test_metrics_counts(url, model):
    names = ["kc:request_success_total", "kc:prompt_tokens_total", "kc:generation_tokens_total",
             "kc:time_to_first_token_seconds_count", "kc:e2e_request_latency_seconds_count",
             "kc:inter_token_latency_seconds_count", "kc:request_params_max_tokens_sum"]
    before = {n: metric(url, n) for n in names}
    prompt = [7, 8, 9, 10, 11, 12]
    for _ in range(3):
        assert post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 10, "ignore_eos": True}).status_code == 200
    deadline = time.monotonic() + 60  # a safety net: the counters are updated as the responses are written
    while metric(url, "kc:e2e_request_latency_seconds_count") - before["kc:e2e_request_latency_seconds_count"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    delta = {n: metric(url, n) - before[n] for n in names}
    assert delta["kc:request_success_total"] == 3 and delta["kc:generation_tokens_total"] == 30
    assert delta["kc:prompt_tokens_total"] <= 18  # prefix caching may skip recomputation
    assert delta["kc:time_to_first_token_seconds_count"] == 3 and delta["kc:e2e_request_latency_seconds_count"] == 3
    assert delta["kc:inter_token_latency_seconds_count"] == 27 and delta["kc:request_params_max_tokens_sum"] == 30
    text = requests.get(url + "/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "cache_config_info",
                 "request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total",
                 "request_queue_time_seconds", "request_decode_time_seconds", "num_preemptions_total"):
        assert f"kc:{name}" in text
    assert re.search(rf'kc:num_requests_running\{{model_name="{re.escape(model)}"\}}', text)


# -- the client commands against the server ------------------------------------------------------------------


def _kc(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "kernelcore.entrypoints.cli", *args],
                          env=clean_env(KC_API_KEY=API_KEY), capture_output=True, text=True, timeout=120, input=input)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_cli_complete_and_chat(url):
    out = _kc("complete", "--url", url, "--max-tokens", "5", "--temperature", "0", "Hello world").stdout
    assert out.strip()
    out = _kc("chat", "--url", url, "--max-tokens", "5", "-m", "hi", "-m", "again").stdout
    assert len(out.strip().splitlines()) >= 1
    out = _kc("chat", "--url", url, "--max-tokens", "3", input="hello\n/exit\n").stdout
    assert "> " in out


def test_cli_bench_serve(url):
    out = _kc("bench", "serve", "--url", url, "-n", "8", "-c", "4", "--max-tokens", "8", "--json").stdout
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["num_failed"] == 0 and summary["output_tokens_per_s"] > 0
    assert summary["ttft_ms_p50"] > 0 and summary["itl_ms_p99"] >= summary["itl_ms_p50"]


# -- shutdown (last: it stops the module's server) ----------------------------------------------------------------


def test_sigterm_stops_everything(server):
    proc, url = server
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "the engine core runs in a child process"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"orphans: {alive}"
