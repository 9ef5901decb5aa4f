"""The Anthropic Messages API (builtin_plugins/anthropic_api) through the real anthropic SDK.

Against the real server serving SmolLM2 (the session's ``smollm2_server``): messages.create / messages.stream,
tool_use and tool_result, stop_sequences, max_tokens, count_tokens, the error classes and a fuzz of the routes.
In process, against a scripted engine, what SmolLM2 cannot show: reasoning as thinking blocks, tool calls
found by the tool parser, and an engine failure mid-stream. Greedy decoding (temperature 0) is deterministic, so
a streamed answer must equal the non-streamed one. This SDK no longer takes ``temperature`` as an argument; it
goes in ``extra_body``, as the API still accepts it.
"""

from __future__ import annotations

import asyncio
import json
import os

import anthropic
import jsonschema
import pytest
import requests
from aiohttp.test_utils import TestServer
from conftest import SMOLLM2_API_KEY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jiter import from_json

from builtin_plugins.anthropic_api.partial_json import partial_json
from builtin_plugins.anthropic_api.translate import translate
from kernelcore.config import KernelConfig, ModelConfig
from kernelcore.engine.outputs import CompletionOutput, RequestOutput
from kernelcore.entrypoints.server.app import ServerOptions, create_app
from kernelcore.entrypoints.server.errors import APIError

slow = pytest.mark.slow
GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                            "required": ["city", "days"], "additionalProperties": False}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]
FORCE_WEATHER = {"type": "tool", "name": "get_weather"}
ERROR_TYPES = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
               "request_too_large", "rate_limit_error", "api_error", "overloaded_error"}


@pytest.fixture(scope="module")
def client(smollm2_server):
    return anthropic.Anthropic(base_url=smollm2_server, api_key=SMOLLM2_API_KEY, max_retries=0)


def _create(client, **kwargs):
    kwargs.setdefault("max_tokens", 24)
    return client.messages.create(model="smollm2", extra_body=GREEDY, **kwargs)


def _stream(client, **kwargs):
    kwargs.setdefault("max_tokens", 24)
    with client.messages.stream(model="smollm2", extra_body=GREEDY, **kwargs) as stream:
        text = "".join(stream.text_stream)
        return text, stream.get_final_message()


def _text(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def assert_error_shape(body, kind: str | None = None) -> None:
    assert isinstance(body, dict) and body["type"] == "error" and set(body) == {"type", "error"}, body
    assert body["error"]["type"] in ERROR_TYPES and isinstance(body["error"]["message"], str), body
    assert kind is None or body["error"]["type"] == kind, body


# -- the real server ----------------------------------------------------------------------------------------


@slow
def test_create_with_system(client):
    system = "You are a geography teacher.\nAnswer in one sentence."
    message = _create(client, system=system, messages=QUESTION)
    blocks = _create(client, system=[{"type": "text", "text": "You are a geography teacher."},
                                     {"type": "text", "text": "Answer in one sentence."}], messages=QUESTION)
    assert message.type == "message" and message.role == "assistant" and message.model == "smollm2"
    assert message.id.startswith("msg_") and message.content[0].type == "text" and _text(message)
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert 0 < message.usage.output_tokens <= 24
    # the system prompt reaches the model (a longer one, a longer prompt); text blocks are joined by a newline
    longer = client.messages.count_tokens(model="smollm2", system=system + " Be precise.", messages=QUESTION)
    assert longer.input_tokens > message.usage.input_tokens
    assert blocks.usage.input_tokens == message.usage.input_tokens and _text(blocks) == _text(message)


@slow
def test_stream_equals_create(client):
    system = "You are a helpful assistant."
    message = _create(client, system=system, messages=QUESTION)
    text, final = _stream(client, system=system, messages=QUESTION)
    assert text == _text(message) and _text(final) == text
    assert final.id.startswith("msg_") and final.model == "smollm2" and final.role == "assistant"
    assert final.stop_reason == message.stop_reason and final.usage.input_tokens == message.usage.input_tokens
    assert final.usage.output_tokens == message.usage.output_tokens


@slow
def test_stream_events_in_order(smollm2_server):
    r = requests.post(smollm2_server + "/v1/messages", headers={"x-api-key": SMOLLM2_API_KEY}, stream=True, json={
        "model": "smollm2", "max_tokens": 4, "stream": True, "messages": QUESTION, **GREEDY})
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    frames = [frame.split("\n") for frame in r.text.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in frames]
    payloads = [json.loads(lines[1].removeprefix("data: ")) for lines in frames]
    assert [p["type"] for p in payloads] == names  # `event:` names the payload's type
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert payloads[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert payloads[-2]["usage"]["output_tokens"] == 4


@slow
def test_tool_use_and_tool_result_round_trip(client):
    message = _create(client, max_tokens=60, tools=[WEATHER], tool_choice=FORCE_WEATHER, messages=ASK_WEATHER)
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    assert isinstance(call.input, dict) and message.stop_reason == "tool_use"
    jsonschema.validate(call.input, WEATHER["input_schema"])
    _, streamed = _stream(client, max_tokens=60, tools=[WEATHER], tool_choice=FORCE_WEATHER, messages=ASK_WEATHER)
    assert [(b.type, b.name, b.input) for b in streamed.content] == [("tool_use", "get_weather", call.input)]

    history = [*ASK_WEATHER,
               {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": [{"type": "text", "text": "Sunny, 22 degrees Celsius"}]}]}]
    answer = _create(client, max_tokens=30, tools=[WEATHER], tool_choice={"type": "none"}, messages=history)
    assert [b.type for b in answer.content] == ["text"] and _text(answer).strip()
    assert answer.stop_reason in ("end_turn", "max_tokens")
    # the tool result is in the prompt: a longer result makes a longer prompt
    history[-1]["content"][0]["content"][0]["text"] += " with a light breeze from the west"
    longer = client.messages.count_tokens(model="smollm2", tools=[WEATHER], messages=history)
    assert longer.input_tokens > answer.usage.input_tokens


@slow
def test_tool_choice_any(client):
    """{"type": "any"} is a required choice: one call (disable_parallel_tool_use), streamed the same."""
    choice = {"type": "any", "disable_parallel_tool_use": True}
    message = _create(client, max_tokens=60, tools=[WEATHER], tool_choice=choice, messages=ASK_WEATHER)
    (call,) = message.content
    assert message.stop_reason == "tool_use" and call.type == "tool_use" and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])
    _, streamed = _stream(client, max_tokens=60, tools=[WEATHER], tool_choice=choice, messages=ASK_WEATHER)
    assert streamed.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in streamed.content] == [("tool_use", "get_weather", call.input)]


@slow
def test_tool_input_cut_by_max_tokens(client):
    """A forced call that max_tokens cuts stays a tool_use block holding the complete part of its input."""
    full = _create(client, max_tokens=60, tools=[WEATHER], tool_choice=FORCE_WEATHER, messages=ASK_WEATHER)
    assert full.stop_reason == "tool_use"
    cut_at = full.usage.output_tokens - 4  # inside the last value: the first one is complete
    cut = _create(client, max_tokens=cut_at, tools=[WEATHER], tool_choice=FORCE_WEATHER, messages=ASK_WEATHER)
    (block,) = cut.content
    assert cut.stop_reason == "max_tokens" and block.type == "tool_use" and block.name == "get_weather"
    assert block.input and block.input.items() <= full.content[0].input.items()
    _, streamed = _stream(client, max_tokens=cut_at, tools=[WEATHER], tool_choice=FORCE_WEATHER, messages=ASK_WEATHER)
    assert streamed.stop_reason == "max_tokens"
    assert [(b.type, b.name, b.input) for b in streamed.content] == [("tool_use", "get_weather", block.input)]


@slow
def test_stop_sequences(client):
    text = _text(_create(client, max_tokens=20, messages=QUESTION))
    words = text.split()
    assert len(words) >= 3, text
    word = words[2]
    stopped = _create(client, max_tokens=20, stop_sequences=[word, "unlikely-stop-zzz"], messages=QUESTION)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert _text(stopped) == text[:text.index(word)]
    streamed_text, final = _stream(client, max_tokens=20, stop_sequences=[word], messages=QUESTION)
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == word and streamed_text == _text(stopped)


@slow
def test_max_tokens(client):
    message = _create(client, max_tokens=3, messages=QUESTION)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    _, final = _stream(client, max_tokens=3, messages=QUESTION)
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3


@slow
def test_assistant_prefill_is_continued(client):
    answer = _text(_create(client, max_tokens=20, messages=QUESTION))
    prefill = " ".join(answer.split()[:3])
    continued = _create(client, max_tokens=20, messages=[*QUESTION, {"role": "assistant", "content": prefill}])
    assert (prefill + _text(continued)).startswith(answer[:len(prefill) + 3]), (prefill, _text(continued))
    assert not _text(continued).lstrip().startswith(prefill.split()[0])


@slow
def test_count_tokens_equals_usage(client):
    system = "You are a helpful assistant."
    count = client.messages.count_tokens(model="smollm2", system=system, messages=QUESTION)
    assert count.input_tokens == _create(client, max_tokens=2, system=system, messages=QUESTION).usage.input_tokens
    count = client.messages.count_tokens(model="smollm2", tools=[WEATHER], tool_choice=FORCE_WEATHER,
                                         messages=ASK_WEATHER)
    used = _create(client, max_tokens=2, tools=[WEATHER], tool_choice=FORCE_WEATHER, messages=ASK_WEATHER)
    assert count.input_tokens == used.usage.input_tokens


@slow
def test_authentication_error(smollm2_server):
    bad = anthropic.Anthropic(base_url=smollm2_server, api_key="wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        bad.messages.create(model="smollm2", max_tokens=2, messages=QUESTION)
    assert_error_shape(info.value.body, "authentication_error")
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.count_tokens(model="smollm2", messages=QUESTION)
    r = requests.post(smollm2_server + "/v1/messages", json={"model": "smollm2", "max_tokens": 2, "messages": QUESTION})
    assert r.status_code == 401
    assert_error_shape(r.json(), "authentication_error")


@slow
def test_unknown_model_is_not_found(client):
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="claude-nonexistent", max_tokens=2, messages=QUESTION)
    assert_error_shape(info.value.body, "not_found_error")
    assert "claude-nonexistent" in info.value.body["error"]["message"]


@slow
@pytest.mark.parametrize("kwargs, named", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type":
                                                 "image/png", "data": "iVBORw0KGgo="}}]}]}, "image"),
    ({"messages": QUESTION, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"messages": QUESTION, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
    ({"messages": QUESTION, "extra_body": {"temperature": -1}}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}, "max_tokens"),
    ({"messages": QUESTION, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "no_such_tool"}},
     "no_such_tool"),
])
def test_bad_request(client, kwargs, named):
    kwargs.setdefault("max_tokens", 2)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="smollm2", **kwargs)
    assert_error_shape(info.value.body, "invalid_request_error")
    assert named in info.value.body["error"]["message"]


@slow
def test_max_tokens_is_required(smollm2_server):
    r = requests.post(smollm2_server + "/v1/messages", headers={"x-api-key": SMOLLM2_API_KEY},
                      json={"model": "smollm2", "messages": QUESTION})
    assert r.status_code == 400
    assert_error_shape(r.json(), "invalid_request_error")
    assert "max_tokens" in r.json()["error"]["message"]
    r = requests.get(smollm2_server + "/v1/messages/no-such-route", headers={"x-api-key": SMOLLM2_API_KEY})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


# -- fuzzing the routes ---------------------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("KC_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
scalars = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
           | st.sampled_from(["user", "assistant", "system", "text", "tool_use", "tool_result", "image", "thinking",
                              "auto", "any", "tool", "none", "enabled", "get_weather", "json_schema", "object"]))
json_values = st.recursive(scalars, lambda children: st.lists(children, max_size=3) | st.dictionaries(
    st.sampled_from(["type", "text", "role", "content", "name", "input", "id", "tool_use_id", "is_error",
                     "input_schema", "schema", "format", "source"]) | st.text(max_size=6), children, max_size=4),
    max_leaves=10)
text = st.text(max_size=8)
text_block = st.fixed_dictionaries({"type": st.just("text"), "text": text})
blocks = st.one_of(
    text_block, text_block,
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.sampled_from(["toolu_1", "t2"]),
                           "name": st.sampled_from(["get_weather", "f"]),
                           "input": st.dictionaries(st.text(max_size=4), scalars, max_size=2)}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.sampled_from(["toolu_1", "t2"])},
                          optional={"content": text | st.lists(text_block, max_size=2), "is_error": st.booleans()}),
    st.fixed_dictionaries({"type": st.sampled_from(["image", "thinking", "document", "x"])},
                          optional={"text": json_values, "source": json_values, "thinking": json_values}))
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                           "content": text | st.lists(blocks, max_size=3)}), min_size=1, max_size=3)
tools = st.lists(st.fixed_dictionaries(
    {"name": st.sampled_from(["get_weather", "f"]), "input_schema": st.just(WEATHER["input_schema"])},
    optional={"description": text, "type": st.sampled_from(["custom", "web_search_20250305"])}), max_size=2)
FIELDS = {  # well-formed values (which may still ask for what the server refuses)
    "system": text | st.lists(text_block, max_size=2),
    "tools": tools,
    "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool", "none", "x"])}, optional={
        "name": st.sampled_from(["get_weather", "f", "g"]), "disable_parallel_tool_use": st.booleans()}),
    "stop_sequences": st.lists(text, max_size=2),
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "top_k": st.integers(-1, 50),
    "metadata": st.fixed_dictionaries({}, optional={"user_id": text}),
    "stream": st.booleans(),
    "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled", "adaptive", "x"])},
                                      optional={"budget_tokens": st.integers(0, 5000)}),
    "output_config": st.fixed_dictionaries({}, optional={"format": st.fixed_dictionaries({
        "type": st.just("json_schema"), "schema": st.just({"type": "object"})}), "effort": st.just("low")}),
}
# max_tokens 1 or 2: a valid body generates at most 2 tokens
well_formed = st.fixed_dictionaries({"model": st.just("smollm2"), "max_tokens": st.sampled_from([1, 2]),
                                     "messages": messages}, optional=FIELDS)
NAMES = ["model", "max_tokens", "messages", *FIELDS, "container", "cache_control", "unknown_field"]


def _set(body: dict, name: str, value):
    if name == "max_tokens" and type(value) is int and 2 < value < 2048:
        value += 2048  # a long answer would only cost time: past the context it is a 400
    return {**body, name: value}


one_field_off = st.tuples(well_formed, st.sampled_from(NAMES), json_values).map(lambda t: _set(*t))
bodies = st.one_of(well_formed, one_field_off, one_field_off, json_values)


@slow
@FUZZ
@given(st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]), bodies)
def test_fuzz_routes_answer_4xx_in_anthropic_shape(smollm2_server, path, body):
    r = requests.post(smollm2_server + path, data=json.dumps(body), timeout=120,
                      headers={"x-api-key": SMOLLM2_API_KEY, "Content-Type": "application/json"})
    assert r.status_code < 500, (body, r.status_code, r.text)
    if r.status_code == 200:  # a valid body
        if r.headers["Content-Type"].startswith("text/event-stream"):
            assert r.text.startswith("event: message_start\n") and "event: message_stop\n" in r.text
        else:
            assert (r.json()["type"] == "message" if path == "/v1/messages"
                    else isinstance(r.json()["input_tokens"], int))
    else:
        assert 400 <= r.status_code < 500
        assert_error_shape(r.json())


# -- in process, against a scripted engine ---------------------------------------------------------------------


class ScriptedEngine:
    """Writes ``script`` one character per step (finish "stop" at its end); raises after ``fail_after`` steps."""

    def __init__(self, script: str = "", fail_after: int | None = None) -> None:
        from kernelcore.engine.tokenizer import get_tokenizer
        from kernelcore.models.default_model import ensure_default_model

        self.config = KernelConfig(model=ModelConfig(model="/models/fake", served_model_name="fake",
                                                     max_model_len=512))
        self.max_model_len, self.is_dead = 512, False
        self.tokenizer = get_tokenizer(ensure_default_model())
        self.vocab_size = len(self.tokenizer)
        self.script, self.fail_after, self.aborted = script, fail_after, []

    async def generate(self, request_id, prompt_token_ids, sampling_params, prompt=None, output_kind="cumulative",
                       **kwargs):
        steps = min(len(self.script), sampling_params.max_tokens)
        for step in range(1, steps + 1):
            if self.fail_after is not None and step > self.fail_after:
                raise RuntimeError("boom in the engine")
            await asyncio.sleep(0)
            finished = step == steps
            reason = ("stop" if step == len(self.script) else "length") if finished else None
            if finished or output_kind != "final_only":
                yield RequestOutput(request_id=request_id, prompt=prompt, prompt_token_ids=prompt_token_ids,
                                    finished=finished, outputs=[CompletionOutput(
                                        index=0, text=self.script[:step], token_ids=[1] * step, finish_reason=reason)])

    async def abort(self, request_id):
        self.aborted.append(request_id)


def in_process(engine, options, body):
    async def main():
        server = TestServer(await create_app(engine, options))
        await server.start_server()
        try:
            sdk = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="k", max_retries=0)
            return await body(sdk, f"http://127.0.0.1:{server.port}")
        finally:
            await server.close()

    return asyncio.run(main())


async def _create_and_stream(sdk, **kwargs):
    message = await sdk.messages.create(model="fake", max_tokens=200, messages=QUESTION, **kwargs)
    async with sdk.messages.stream(model="fake", max_tokens=200, messages=QUESTION, **kwargs) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    return message, final, kinds


def test_reasoning_becomes_thinking_blocks():
    engine = ScriptedEngine("<think>The user asks for a capital.</think>Paris.")

    async def body(sdk, url):
        return await _create_and_stream(sdk, thinking={"type": "enabled", "budget_tokens": 1024})

    message, final, kinds = in_process(engine, ServerOptions(reasoning_parser="qwen3"), body)
    blocks = [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content]
    assert blocks == [("thinking", "The user asks for a capital."), ("text", "Paris.")]
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == blocks
    assert "thinking" in kinds and "text" in kinds and final.stop_reason == message.stop_reason == "end_turn"


def test_parsed_tool_calls_become_tool_use_blocks():
    engine = ScriptedEngine('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                            '</tool_call>')

    async def body(sdk, url):
        return await _create_and_stream(sdk, tools=[WEATHER])

    message, final, _ = in_process(engine, ServerOptions(enable_auto_tool_choice=True, tool_call_parser="hermes"),
                                   body)
    for answer in (message, final):
        assert answer.stop_reason == "tool_use"
        text, call = answer.content
        assert text.type == "text" and text.text == "Let me check."
        assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"}
        assert call.id.startswith("toolu_")


def test_mid_stream_error_is_an_error_event():
    engine = ScriptedEngine("a" * 20, fail_after=3)

    async def body(sdk, url):
        with pytest.raises(anthropic.APIStatusError) as info:
            async with sdk.messages.stream(model="fake", max_tokens=10, messages=QUESTION) as stream:
                async for _ in stream:
                    pass
        return info.value.body

    body = in_process(engine, ServerOptions(), body)
    assert_error_shape(body, "api_error")
    assert "boom" not in body["error"]["message"] and engine.aborted


def test_stream_refused_before_the_first_event_is_plain_json():
    engine = ScriptedEngine("abc", fail_after=0)

    async def body(sdk, url):
        with pytest.raises(anthropic.InternalServerError) as info:
            await sdk.messages.create(model="fake", max_tokens=10, messages=QUESTION, stream=True)
        return info.value.body

    assert_error_shape(in_process(engine, ServerOptions(), body), "api_error")


# -- translation and partial JSON, without a server ------------------------------------------------------------


def test_tool_blocks_translate_to_chat_messages():
    req = translate({"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "Be brief."}],
                     "tools": [WEATHER], "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                     "stop_sequences": ["\n\n"], "metadata": {"user_id": "u"}, "messages": [
                         {"role": "user", "content": "Weather?"},
                         {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                                           {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                            "input": {"city": "Paris"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                       "content": "timeout", "is_error": True},
                                                      {"type": "text", "text": "Try again."}]},
                         {"role": "user", "content": "Please."}]}, has_reasoning_parser=False)
    assert req.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: timeout"},
        {"role": "user", "content": "Try again.\nPlease."},  # consecutive user turns are one turn
    ]
    assert req.body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}}]
    assert req.body["tool_choice"] == "required" and req.body["parallel_tool_calls"] is False
    assert req.body["stop"] == ["\n\n"] and req.tool_choice == "any" and "add_generation_prompt" not in req.body
    named = translate({"model": "m", "max_tokens": 5, "tools": [WEATHER], "tool_choice": FORCE_WEATHER,
                       "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure"}]},
                      has_reasoning_parser=False)
    assert named.body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert named.body["add_generation_prompt"] is False and named.body["continue_final_message"] is True
    nulls = translate({"model": "m", "max_tokens": 5, "messages": QUESTION, "metadata": None, "container": None,
                       "system": None, "tools": None, "stream": None}, has_reasoning_parser=False)
    assert nulls.body == {"model": "m", "max_tokens": 5, "messages": QUESTION} and nulls.stream is False


@pytest.mark.parametrize("body, field", [
    ({"messages": QUESTION, "model": "m"}, "max_tokens"),
    ({"messages": QUESTION, "model": "m", "max_tokens": 5, "container": "c"}, "container"),
    ({"messages": QUESTION, "model": "m", "max_tokens": 5, "frequency_penalty": 1}, "frequency_penalty"),
    ({"messages": QUESTION, "model": "m", "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 2000}},
     "thinking"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}], "model": "m",
      "max_tokens": 5}, "document"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {}}]}]}], "model": "m", "max_tokens": 5}, "image"),
])
def test_refused_fields_are_named(body, field):
    with pytest.raises(APIError) as info:
        translate(body, has_reasoning_parser=False)
    assert info.value.status == 400 and field in info.value.message


DOCUMENTS = ['{"city": "Paris", "days": [1, 2.5e3, -3], "nested": {"a": null, "b": true, "c": "q\\u00e9\\""}}',
             '[{"name": "get_weather", "parameters": {"city": "Par is", "n": 12}}, {"name": "x"}]']


@pytest.mark.parametrize("document", DOCUMENTS)
def test_partial_json_reads_prefixes_as_the_sdk_does(document):
    for end in range(1, len(document) + 1):
        assert partial_json(document[:end]) == from_json(document[:end].encode(), partial_mode=True), document[:end]
