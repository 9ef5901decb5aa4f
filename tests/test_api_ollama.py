"""The Ollama API (builtin_plugins/ollama_api) with the real `ollama` client.

Against the real SmolLM2-135M-Instruct server (the session's ``smollm2_server``, marked slow): list, show, ps,
chat streamed and not, generate (templated and raw), format as a JSON schema, tools, the 501s and 404s, and a
small fuzz. In-process against a scripted engine with a real tokenizer (fast): mid-stream errors, thinking, the
error shape of the middlewares, the option and message translation, and a larger fuzz of every new route.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from datetime import datetime, timezone

import httpx
import ollama
import pydantic
import pytest
from conftest import SMOLLM2_API_KEY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builtin_plugins.ollama_api import translate
from builtin_plugins.ollama_api.routes import OLLAMA_VERSION
from kernelcore.config import KernelConfig, ModelConfig
from kernelcore.engine.outputs import CompletionOutput, RequestOutput
from kernelcore.entrypoints.server.app import ServerOptions, create_app

slow = pytest.mark.slow
EXAMPLES = int(os.environ.get("KC_FUZZ_EXAMPLES", "300"))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
GREEDY = {"temperature": 0, "seed": 7}


def _few_shot_call(city: str) -> str:
    return f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'


# One earlier turn that answered with a hermes call: SmolLM2 then calls the tool for the next city, greedily.
FEW_SHOT = [{"role": "user", "content": "What is the weather in London?"},
            {"role": "assistant", "content": _few_shot_call("London")},
            {"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(smollm2_server):
    return ollama.Client(host=smollm2_server, headers={"Authorization": f"Bearer {SMOLLM2_API_KEY}"})


# -- the real model --------------------------------------------------------------------------------------------


@slow
def test_version_list_show_ps(client, smollm2_server):
    version = httpx.get(smollm2_server + "/api/version", headers={"Authorization": f"Bearer {SMOLLM2_API_KEY}"})
    assert version.json() == {"version": OLLAMA_VERSION}

    (model,) = client.list().models
    assert model.model == "smollm2:latest" and model.size > 50_000_000 and len(model.digest) == 64
    assert model.modified_at is not None and model.modified_at < datetime.now(timezone.utc)
    details = model.details
    assert (details.format, details.family, details.families, details.parameter_size, details.quantization_level) == \
        ("gguf", "llama", ["llama"], "135M", "Q4_1")

    for name in ("smollm2", "smollm2:latest"):
        shown = client.show(name)
        assert shown.capabilities == ["completion", "tools"]  # hermes with auto tool choice; no reasoning parser
        assert shown.modelinfo["llama.context_length"] == 2048 and shown.modelinfo["general.architecture"] == "llama"
        assert shown.modelinfo["general.parameter_count"] > 100_000_000
        assert "<|im_start|>" in shown.template and shown.template in shown.modelfile
        assert "num_ctx 2048" in shown.parameters and shown.details.quantization_level == "Q4_1"

    (loaded,) = client.ps().models
    assert loaded.name == "smollm2:latest" and loaded.size_vram == 0 and loaded.context_length == 2048
    assert loaded.expires_at.year > datetime.now(timezone.utc).year + 100  # kept loaded


@slow
def test_chat_streamed_equals_not_streamed(client, smollm2_server):
    messages = [{"role": "user", "content": "Name three colors."}]
    options = {**GREEDY, "num_predict": 10}
    whole = client.chat(model="smollm2", messages=messages, options=options, stream=False)
    parts = list(client.chat(model="smollm2:latest", messages=messages, options=options, stream=True))
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 10
    assert whole.message.role == "assistant" and whole.message.content
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.done_reason == "length" and last.eval_count == 10 and last.model == "smollm2:latest"
    assert last.prompt_eval_count == whole.prompt_eval_count > 10  # the chat template's system turn is counted
    for counts in (whole, last):
        assert counts.total_duration >= counts.prompt_eval_duration + counts.eval_duration > 0
        assert counts.load_duration == 0
    raw = httpx.post(smollm2_server + "/api/chat", json={"model": "smollm2", "messages": messages,
                                                           "options": {**GREEDY, "num_predict": 2}},
                     headers={"Authorization": f"Bearer {SMOLLM2_API_KEY}"})
    assert raw.headers["Content-Type"].startswith("application/x-ndjson")  # streamed by default
    lines = [json.loads(line) for line in raw.text.splitlines()]
    assert lines[-1]["done"] is True and all(line["done"] is False for line in lines[:-1])


@slow
def test_generate_templated_and_raw(client):
    prompt = "The capital of France is"
    options = {**GREEDY, "num_predict": 6}
    templated = client.generate(model="smollm2", prompt=prompt, system="Answer in one word.", options=options)
    raw = client.generate(model="smollm2", prompt=prompt, raw=True, options=options)
    streamed = "".join(p.response for p in client.generate(model="smollm2", prompt=prompt, raw=True, options=options,
                                                            stream=True))
    assert templated.response and raw.response and streamed == raw.response
    assert raw.done_reason in ("stop", "length") and raw.eval_count <= 6
    # raw: no template around the prompt, so far fewer prompt tokens than the templated system + user turns
    assert raw.prompt_eval_count < 10 < templated.prompt_eval_count
    scored = client.generate(model="smollm2", prompt=prompt, raw=True, options=options, logprobs=True, top_logprobs=2)
    assert scored.response == raw.response and len(scored.logprobs) == scored.eval_count
    assert "".join(lp.token for lp in scored.logprobs) == scored.response
    for lp in scored.logprobs:  # greedy: the sampled token is the most likely one
        assert len(lp.top_logprobs) == 2 and lp.top_logprobs[0].token == lp.token and lp.logprob <= 0
    loaded = client.generate(model="smollm2")  # no prompt: Ollama's "load the model"
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


class City(pydantic.BaseModel):
    name: str
    country: str


@slow
def test_format_json_schema(client):
    answer = client.chat(model="smollm2", messages=[{"role": "user", "content": "Name a city in France as JSON."}],
                         format=City.model_json_schema(), options={**GREEDY, "num_predict": 60})
    assert answer.done_reason == "stop"
    City.model_validate_json(answer.message.content)


@slow
def test_tools_plain_prompt_has_a_valid_shape(client):
    # SmolLM2's chat template does not show it the tools: greedily it answers in text. Either way the shape holds.
    answer = client.chat(model="smollm2", messages=[{"role": "user", "content": "What is the weather in Paris? "
                                                     "Use the get_weather tool."}], tools=TOOLS,
                         options={**GREEDY, "num_predict": 12})
    if answer.message.tool_calls:
        assert all(c.function.name == "get_weather" and isinstance(c.function.arguments, dict)
                   for c in answer.message.tool_calls)
    else:
        assert isinstance(answer.message.content, str) and answer.message.content


@slow
def test_tool_call_streamed_and_not_then_the_result_sent_back(client):
    options = {**GREEDY, "num_predict": 40}
    answer = client.chat(model="smollm2", messages=FEW_SHOT, tools=TOOLS, options=options)
    (call,) = answer.message.tool_calls
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert answer.message.content == "" and answer.done_reason == "stop"
    parts = list(client.chat(model="smollm2", messages=FEW_SHOT, tools=TOOLS, options=options, stream=True))
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == [("get_weather", {"city": "Paris"})]
    # the call back as an assistant message (arguments an object) and the tool's answer by tool_name
    follow = client.chat(model="smollm2", tools=TOOLS, options={**GREEDY, "num_predict": 12}, messages=[
        *FEW_SHOT, answer.message, {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 22 C"}])
    assert follow.message.role == "assistant" and follow.message.content and not follow.message.tool_calls


@slow
def test_errors_in_ollama_shape(client, smollm2_server):
    with pytest.raises(ollama.ResponseError) as pulled:
        client.pull("smollm2")
    assert pulled.value.status_code == 501 and "kc pull" in pulled.value.error
    for call in (lambda: client.chat(model="nope", messages=[{"role": "user", "content": "hi"}]),
                 lambda: client.generate(model="nope:7b", prompt="hi"), lambda: client.show("nope")):
        with pytest.raises(ollama.ResponseError) as missing:
            call()
        assert missing.value.status_code == 404 and missing.value.error.startswith("model 'nope")
    with pytest.raises(ollama.ResponseError) as embed:
        client.embed(model="smollm2", input="hi")
    assert embed.value.status_code == 501 and "not served" in embed.value.error
    with pytest.raises(ollama.ResponseError) as think:
        client.chat(model="smollm2", messages=[{"role": "user", "content": "hi"}], think=True)
    assert think.value.status_code == 400 and "does not support thinking" in think.value.error
    with pytest.raises(ollama.ResponseError) as unauthorized:
        ollama.Client(host=smollm2_server).list()
    assert unauthorized.value.status_code == 401
    refused = httpx.post(smollm2_server + "/api/generate", json={"model": "smollm2", "prompt": "a", "suffix": "b"},
                         headers={"Authorization": f"Bearer {SMOLLM2_API_KEY}"})
    assert refused.status_code == 400 and "suffix" in refused.json()["error"]


# -- fuzz ------------------------------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=10) | st.sampled_from(["json", "user", "tool", "assistant", "smollm2", "fake", "-1"]))
json_values = st.recursive(scalars, lambda children: st.lists(children, max_size=3) | st.dictionaries(
    st.text(max_size=6) | st.sampled_from(["type", "function", "name", "arguments", "properties"]), children,
    max_size=3), max_leaves=10)


def mostly(good: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` three times in four, any JSON value otherwise: most bodies get past the first check."""
    return st.integers(0, 3).flatmap(lambda i: json_values if i == 0 else good)


option_values = mostly(st.dictionaries(st.sampled_from(sorted({*translate.OPTIONS, *translate.IGNORED_OPTIONS,
                                                                "num_predict", "x"})), json_values, max_size=4))
messages = st.lists(st.fixed_dictionaries({"role": mostly(st.sampled_from(["user", "system", "assistant", "tool",
                                                                           "x"]))},
                                          optional={"content": mostly(st.text(max_size=8)), "tool_calls": json_values,
                                                    "tool_name": json_values, "images": json_values}), max_size=3)
COMMON = {"stream": mostly(st.booleans()), "format": mostly(st.sampled_from(["json", "", {"type": "object"}])),
          "options": option_values, "think": json_values, "keep_alive": json_values, "logprobs": json_values,
          "top_logprobs": json_values}
MODEL = mostly(st.sampled_from(["MODEL", "MODEL:latest", "nope"]))
ROUTES = {
    "/api/chat": st.fixed_dictionaries({"model": MODEL}, optional={**COMMON, "messages": mostly(messages),
                                                                   "tools": st.just(TOOLS) | json_values}),
    "/api/generate": st.fixed_dictionaries({"model": MODEL},
                                           optional={**COMMON, "prompt": mostly(st.text(max_size=8)),
                                                     "system": json_values, "raw": mostly(st.booleans()),
                                                     "suffix": json_values, "images": json_values,
                                                     "template": json_values, "context": json_values}),
    "/api/show": st.fixed_dictionaries({}, optional={"model": MODEL, "name": json_values, "verbose": json_values}),
}
requests_ = st.sampled_from(sorted(ROUTES)).flatmap(lambda path: st.tuples(st.just(path), ROUTES[path]))


def _named(body: dict, model: str) -> dict:
    return {k: (v.replace("MODEL", model) if isinstance(v, str) else v) for k, v in body.items()}


def check_answer(path: str, response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        body = response.json()
        assert set(body) == {"error"} and isinstance(body["error"], str) and 400 <= response.status_code < 500
        return
    if path == "/api/show":
        assert "model_info" in response.json()
        return
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert lines and lines[-1]["done"] is True and "error" not in lines[-1]


@slow
@settings(max_examples=max(EXAMPLES // 10, 20), deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=True)
@given(requests_)
def test_fuzz_real_server(client, smollm2_server, request_):
    path, body = request_
    body = _named(body, "smollm2")
    if "options" in body:  # what a valid body generates stays short on a CPU
        body["options"] = {**(body["options"] if isinstance(body["options"], dict) else {}), "num_predict": 1}
    else:
        body["options"] = {"num_predict": 1}
    check_answer(path, httpx.post(smollm2_server + path, json=body, timeout=120,
                            headers={"Authorization": f"Bearer {SMOLLM2_API_KEY}"}))


# -- in process: a scripted engine with the default model's real tokenizer -------------------------------------


class ScriptedEngine:
    """Writes ``script`` one character (token id 1) per step. With ``fail_after`` it raises after that many steps,
    once the test sets ``release`` (so the client has the first lines, whatever the machine's speed)."""

    def __init__(self, script: str = "Hello there.", fail_after: int | None = None) -> None:
        from kernelcore.engine.tokenizer import get_tokenizer
        from kernelcore.models.default_model import ensure_default_model

        path = ensure_default_model()
        self.config = KernelConfig(model=ModelConfig(model=path, served_model_name="fake", max_model_len=512))
        self.tokenizer = get_tokenizer(path)
        self.max_model_len, self.vocab_size = 512, len(self.tokenizer)
        self.script, self.fail_after, self.is_dead, self.aborted = script, fail_after, False, []
        self.release = threading.Event()

    async def generate(self, request_id, prompt_token_ids, sampling_params, prompt=None, output_kind="cumulative"):
        steps = min(len(self.script), sampling_params.max_tokens)
        for step in range(1, steps + 1):
            if self.fail_after is not None and step > self.fail_after:
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
                self.release.clear()
                raise RuntimeError("boom in the engine")
            await asyncio.sleep(0)
            finished = step == steps
            reason = ("stop" if steps == len(self.script) else "length") if finished else None
            yield RequestOutput(request_id=request_id, prompt=prompt, prompt_token_ids=prompt_token_ids,
                                finished=finished, outputs=[CompletionOutput(index=0, text=self.script[:step],
                                                                             token_ids=[1] * step,
                                                                             finish_reason=reason)])

    async def abort(self, request_id):
        self.aborted.append(request_id)


class InProcess:
    """The app served from a thread of its own, for the synchronous clients."""

    def __init__(self, engine: ScriptedEngine, options: ServerOptions) -> None:
        from aiohttp import web

        from kernelcore import platforms

        platforms.load_general_plugins()  # the built-in endpoint plugins, through their entry points

        self.engine, self.loop, ready = engine, asyncio.new_event_loop(), threading.Event()

        async def start():
            self.runner = web.AppRunner(await create_app(engine, options))
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", 0).start()
            self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]:d}"
            ready.set()

        self.thread = threading.Thread(target=lambda: (self.loop.run_until_complete(start()), self.loop.run_forever()),
                                       daemon=True)
        self.thread.start()
        assert ready.wait(60)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@pytest.fixture(scope="module")
def fake():
    server = InProcess(ScriptedEngine(), ServerOptions(api_key="k", enable_auto_tool_choice=True,
                                                       tool_call_parser="hermes"))
    yield server
    server.close()


def _client(server: InProcess) -> ollama.Client:
    return ollama.Client(host=server.url, headers={"Authorization": "Bearer k"})


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(requests_)
def test_fuzz_in_process(fake, request_):
    path, body = request_
    check_answer(path, httpx.post(fake.url + path, json=_named(body, "fake"), headers={"Authorization": "Bearer k"},
                            timeout=60))


def test_mid_stream_error_is_an_ndjson_line():
    server = InProcess(ScriptedEngine("abcdef", fail_after=3), ServerOptions())
    error = {"error": "The request failed inside the engine; the server log has the details"}
    try:
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", server.url + "/api/chat", json=body) as response:
            lines, text = response.iter_lines(), ""
            while text != "abc":
                line = json.loads(next(lines))
                assert line["done"] is False
                text += line["message"]["content"]
            server.engine.release.set()
            assert [json.loads(line) for line in lines] == [error]  # no done line after it
        parts, text = ollama.Client(host=server.url).generate(model="fake", prompt="hi", stream=True), ""
        while text != "abc":
            text += next(parts).response
        server.engine.release.set()
        with pytest.raises(ollama.ResponseError, match="failed inside the engine"):
            next(parts)
        assert len(server.engine.aborted) == 2  # each failed request is aborted in the engine
    finally:
        server.close()


def test_thinking_with_a_reasoning_parser():
    server = InProcess(ScriptedEngine("<think>Let me see.</think>Blue."), ServerOptions(reasoning_parser="qwen3"))
    try:
        client = ollama.Client(host=server.url)
        assert client.show("fake").capabilities == ["completion", "thinking"]  # no tool parser here
        answer = client.chat(model="fake", messages=[{"role": "user", "content": "Sky?"}], think=True)
        assert (answer.message.thinking, answer.message.content) == ("Let me see.", "Blue.")
        parts = list(client.generate(model="fake", prompt="Sky?", think=True, stream=True))
        assert "".join(p.thinking or "" for p in parts) == "Let me see." and parts[-1].done
        assert "".join(p.response for p in parts) == "Blue."
        hidden = client.chat(model="fake", messages=[{"role": "user", "content": "Sky?"}], think=False)
        assert hidden.message.thinking is None and hidden.message.content == "Blue."
    finally:
        server.close()


def test_hugging_face_directory_details_and_route_errors(fake):
    client = _client(fake)
    (model,) = client.list().models
    assert model.model == "fake:latest" and model.details.format == "safetensors" and model.details.family
    shown = client.show("fake")
    assert shown.modelinfo[f"{model.details.family}.context_length"] == 512 and shown.capabilities == \
        ["completion", "tools"]
    for method, path in (("GET", "/api/tags"), ("GET", "/api/nope"), ("GET", "/api/chat"), ("POST", "/api/show")):
        r = httpx.request(method, fake.url + path)  # no API key: 401 in Ollama's shape first
        assert r.status_code == 401 and set(r.json()) == {"error"}
    r = httpx.get(fake.url + "/api/nope", headers={"Authorization": "Bearer k"})
    assert r.status_code == 404 and set(r.json()) == {"error"}
    r = httpx.get(fake.url + "/api/chat", headers={"Authorization": "Bearer k"})
    assert r.status_code == 405 and set(r.json()) == {"error"}
    r = httpx.head(fake.url + "/api/blobs/sha256:00", headers={"Authorization": "Bearer k"})
    assert r.status_code == 501
    # curl -d sends a form Content-Type: Ollama reads the JSON anyway, and so does this server
    r = httpx.post(fake.url + "/api/generate", content=b'{"model": "fake", "prompt": "hi", "stream": false}',
                   headers={"Authorization": "Bearer k", "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["response"] == "Hello there." and r.json()["done_reason"] == "stop"
    for body, status in (({"model": "fake", "prompt": "hi", "images": ["aGk="]}, 400),
                         ({"model": "fake", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400),
                         ({"prompt": "hi"}, 400), ({"model": "fake", "prompt": "hi", "options": {"num_predict": 0}},
                                                   400)):
        path = "/api/chat" if "messages" in body else "/api/generate"
        r = httpx.post(fake.url + path, json=body, headers={"Authorization": "Bearer k"})
        assert r.status_code == status and isinstance(r.json()["error"], str), (body, r.text)


def test_num_predict_and_logprobs(fake):
    client = _client(fake)
    short = client.generate(model="fake", prompt="hi", options={"num_predict": 3, "num_ctx": 99999, "mirostat": 2,
                                                                "made_up": 1})
    assert (short.response, short.done_reason, short.eval_count) == ("Hel", "length", 3)
    full = client.generate(model="fake", prompt="hi", options={"num_predict": -1})
    assert full.response == "Hello there." and full.done_reason == "stop"


def test_options_and_messages_translate():
    assert translate.sampling_fields({"temperature": 0.5, "repeat_penalty": 1.2, "num_predict": 7, "stop": ["x"],
                                      "num_ctx": 4096, "top_k": 3, "min_p": 0.1, "seed": 1, "unknown": 2}) == {
        "temperature": 0.5, "repetition_penalty": 1.2, "max_tokens": 7, "stop": ["x"], "top_k": 3, "min_p": 0.1,
        "seed": 1}
    assert translate.sampling_fields({"num_predict": -1}) == {}
    assert translate.response_format("json") == {"type": "json_object"}
    assert translate.response_format({"type": "object"})["json_schema"]["schema"] == {"type": "object"}
    converted = translate.chat_messages([
        {"role": "user", "content": "w?"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}},
                                             {"function": {"name": "g", "arguments": {}}}]},
        {"role": "tool", "tool_name": "f", "content": "1"}, {"role": "tool", "tool_name": "g", "content": "2"}])
    calls = converted[1]["tool_calls"]
    assert converted[1]["content"] == "" and [json.loads(c["function"]["arguments"]) for c in calls] == [{"a": 1}, {}]
    assert [(m["name"], m["tool_call_id"]) for m in converted[2:]] == [("f", calls[0]["id"]), ("g", calls[1]["id"])]
    assert translate.ollama_call({"id": "c", "function": {"name": "f", "arguments": '{"a": [1]}'}}, 0) == \
        {"id": "c", "function": {"index": 0, "name": "f", "arguments": {"a": [1]}}}
