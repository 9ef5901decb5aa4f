"""The OpenAI Responses API (built-in plugin responses_api) against the real SmolLM2 server, with the real clients:
the openai SDK (create, stream, parse, retrieve, cancel, input_items) and the openai-agents SDK; then a fuzz of
the routes with random bodies (a 4xx with the OpenAI error envelope, never a 5xx)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import openai
import pytest
import requests
from conftest import SMOLLM2_API_KEY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

pytestmark = pytest.mark.slow

TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                         "additionalProperties": False}, "strict": True}]
GREEDY = dict(model="smollm2", temperature=0)
FINAL = ("completed", "incomplete", "failed", "cancelled")


@pytest.fixture(scope="module")
def url(smollm2_server):
    return smollm2_server


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=SMOLLM2_API_KEY, max_retries=0)


def _post(url, body, **kwargs):
    return requests.post(url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {SMOLLM2_API_KEY}"},
                         timeout=120, **kwargs)


def _check_usage(usage):
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0 and usage.output_tokens_details.reasoning_tokens == 0


def test_string_input(client):
    r = client.responses.create(input="What is the capital of France?", max_output_tokens=20, **GREEDY)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "smollm2"
    assert r.status == "completed" and r.incomplete_details is None and r.error is None
    assert [item.type for item in r.output] == ["message"]
    message = r.output[0]
    assert message.role == "assistant" and message.status == "completed" and message.id.startswith("msg_")
    assert [part.type for part in message.content] == ["output_text"]
    assert "Paris" in r.output_text
    _check_usage(r.usage)


def test_item_list_input_with_instructions(client):
    items = [{"type": "message", "role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]}]
    bare = client.responses.create(input=items, max_output_tokens=10, **GREEDY)
    r = client.responses.create(input=items, instructions="You are a helpful assistant who answers in English.",
                                max_output_tokens=10, **GREEDY)
    assert r.instructions.startswith("You are a helpful") and bare.instructions is None
    assert r.output_text and r.output[0].type == "message"
    # the instructions and every item reach the prompt: it grows with them
    assert r.usage.input_tokens > bare.usage.input_tokens
    shorter = client.responses.create(input=items[:1] + items[3:], max_output_tokens=10, **GREEDY)
    assert bare.usage.input_tokens > shorter.usage.input_tokens + 4


def _events(client, **kwargs):
    return list(client.responses.create(stream=True, **kwargs))


def test_stream_event_sequence_and_same_text(client):
    kwargs = dict(input="What is the capital of France?", max_output_tokens=20, **GREEDY)
    full = client.responses.create(**kwargs)
    events = _events(client, **kwargs)
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert types == (["response.created", "response.in_progress", "response.output_item.added",
                      "response.content_part.added"] + ["response.output_text.delta"] * len(deltas)
                     + ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                        "response.completed"])
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    item_id = events[2].item.id
    assert all(e.item_id == item_id for e in deltas) and events[-2].item.id == item_id
    text = "".join(e.delta for e in deltas)
    assert text == full.output_text and events[-4].text == text and events[-3].part.text == text
    final = events[-1].response
    assert final.status == "completed" and final.output_text == text and final.usage.output_tokens == \
        full.usage.output_tokens
    assert client.responses.retrieve(final.id).output_text == text  # a streamed response is stored too
    # the SDK's own accumulator (responses.stream) rebuilds the same response
    with client.responses.stream(**kwargs) as stream:
        accumulated = [e.type for e in stream]
        assert stream.get_final_response().output_text == text
    assert accumulated == types


def test_max_output_tokens_makes_it_incomplete(client):
    kwargs = dict(input="Write a long story about a dragon.", max_output_tokens=3, **GREEDY)
    r = client.responses.create(**kwargs)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    events = _events(client, **kwargs)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output_text == r.output_text


class City(BaseModel):
    name: str
    country: str


def test_parse_with_pydantic_text_format(client):
    r = client.responses.parse(input="Give the capital of France as JSON.", text_format=City, max_output_tokens=60,
                               **GREEDY)
    assert r.status == "completed" and isinstance(r.output_parsed, City)
    assert City.model_validate_json(r.output_text) == r.output_parsed
    assert r.text.format.type == "json_schema" and r.text.format.name == "City"
    loose = client.responses.create(input="A JSON object with one key.", text={"format": {"type": "json_object"}},
                                    max_output_tokens=40, **GREEDY)
    if loose.status == "completed":
        assert isinstance(json.loads(loose.output_text), dict)


def _check_call(call):
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    arguments = json.loads(call.arguments)
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
    return arguments


def test_forced_tool_choice(client):
    kwargs = dict(input="What is the weather in Paris?", tools=TOOLS, max_output_tokens=40, **GREEDY)
    for choice in ({"type": "function", "name": "get_weather"}, "required"):
        r = client.responses.create(tool_choice=choice, **kwargs)
        assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
        _check_call(r.output[0])
        assert r.tools[0].name == "get_weather"
        assert r.tool_choice == choice if isinstance(choice, str) else r.tool_choice.name == "get_weather"
    named = dict(kwargs, tool_choice={"type": "function", "name": "get_weather"})
    full = client.responses.create(**named)
    events = _events(client, **named)
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert streamed == full.output[0].arguments == events[-3].arguments == events[-1].response.output[0].arguments


def test_function_call_output_round_trip(client):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    r = client.responses.create(input=[question], tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"},
                                max_output_tokens=40, **GREEDY)
    call = r.output[0]
    _check_call(call)
    result = {"type": "function_call_output", "call_id": call.call_id,
              "output": json.dumps({"temperature_c": 21, "sky": "sunny"})}
    final = client.responses.create(input=[question, call.model_dump(exclude_none=True), result], tools=TOOLS,
                                    tool_choice="none", max_output_tokens=40, **GREEDY)
    assert final.status in ("completed", "incomplete") and [o.type for o in final.output] == ["message"]
    assert final.output_text.strip()
    # the call and its output are in the prompt
    assert final.usage.input_tokens > r.usage.input_tokens
    with pytest.raises(openai.BadRequestError, match="No tool call found"):
        client.responses.create(input=[question, dict(result, call_id="call_unknown")], max_output_tokens=5, **GREEDY)


def test_store_previous_response_and_retrieve(client):
    first = client.responses.create(input="My name is Alice.", max_output_tokens=15, **GREEDY)
    second = client.responses.create(input="What is my name?", previous_response_id=first.id, max_output_tokens=15,
                                     **GREEDY)
    assert second.previous_response_id == first.id
    # the previous response's input and output come before the new input
    alone = client.responses.create(input="What is my name?", max_output_tokens=15, **GREEDY)
    assert second.usage.input_tokens >= alone.usage.input_tokens + first.usage.output_tokens
    got = client.responses.retrieve(second.id)
    assert got.model_dump() == second.model_dump()
    items = list(client.responses.input_items.list(second.id, order="asc"))
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant"), ("message", "user")]
    assert items[0].content[0].text == "My name is Alice." and items[1].id == first.output[0].id
    assert [i.id for i in client.responses.input_items.list(second.id)] == [i.id for i in items][::-1]
    page = client.responses.input_items.list(second.id, order="asc", limit=2)
    assert [i.id for i in page.data] == [i.id for i in items[:2]] and page.has_more
    # store=false keeps nothing; unknown ids are 404s
    unstored = client.responses.create(input="Hi.", store=False, max_output_tokens=3, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError, match="Previous response"):
        client.responses.create(input="Hi.", previous_response_id=unstored.id, max_output_tokens=3, **GREEDY)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def _aborted(url) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("kc:request_success_total")
             and 'finished_reason="abort"' in line]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def _wait(condition, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_background_then_cancel(client, url):
    aborted = _aborted(url)
    r = client.responses.create(input="Count from 1 to 1000.", max_output_tokens=1500, background=True,
                                extra_body={"ignore_eos": True}, **GREEDY)
    assert r.background and r.status in ("queued", "in_progress")
    # wait until the engine is generating: the polled response shows its growing output
    _wait(lambda: client.responses.retrieve(r.id).output_text, "the first output tokens")
    cancelled = client.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    final = _wait(lambda: (lambda g: g if g.status in FINAL else None)(client.responses.retrieve(r.id)),
                  "a final status")
    assert final.status == "cancelled" and final.output_text
    _wait(lambda: _aborted(url) > aborted, "the engine to abort the request")
    assert client.responses.cancel(r.id).status == "cancelled"  # cancelling again changes nothing

    done = client.responses.create(input="Say hi.", max_output_tokens=8, background=True, **GREEDY)
    finished = _wait(lambda: (lambda g: g if g.status in FINAL else None)(client.responses.retrieve(done.id)),
                     "the background response to finish")
    foreground = client.responses.create(input="Say hi.", max_output_tokens=8, **GREEDY)
    assert finished.status == foreground.status and finished.output_text == foreground.output_text
    with pytest.raises(openai.BadRequestError, match="Cannot cancel"):
        client.responses.cancel(done.id)
    with pytest.raises(openai.BadRequestError, match="Only background"):
        client.responses.cancel(foreground.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_missing")
    with pytest.raises(openai.BadRequestError, match="store"):
        client.responses.create(input="x", background=True, store=False, **GREEDY)


def test_agents_sdk_tool_then_answer(url):
    import agents
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool

    agents.set_tracing_disabled(True)
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return f"It is sunny and 21 C in {city}."

    async def main():
        model = OpenAIResponsesModel(model="smollm2", openai_client=openai.AsyncOpenAI(
            base_url=url + "/v1", api_key=SMOLLM2_API_KEY, max_retries=0))
        agent = Agent(name="weather", instructions="You answer questions about the weather.", tools=[get_weather],
                      model=model, model_settings=ModelSettings(tool_choice="get_weather", temperature=0,
                                                                max_tokens=60))
        return await Runner.run(agent, "What is the weather in Paris?", max_turns=4)

    result = asyncio.run(main())
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem"
    assert len(cities) == 1 and cities[0].strip()
    assert isinstance(result.final_output, str) and result.final_output.strip()


def test_refused_and_harmless_fields(client, url):
    cases = [({"tools": [{"type": "web_search"}]}, "tools[0].type"),
             ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
              "input[0].content[0].type"),
             ({"input": [{"type": "file_search_call", "id": "x"}]}, "input[0].type"),
             ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
             ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
             ({"conversation": "conv_1"}, "conversation"), ({"truncation": "auto"}, "truncation"),
             ({"max_output_tokens": 0}, "max_output_tokens"), ({"no_such_field": 1}, "no_such_field"),
             ({"tool_choice": "required"}, "tool_choice"), ({"model": "other"}, "model")]
    for extra, param in cases:
        r = _post(url, {"input": "hi", "max_output_tokens": 2, **extra})
        assert 400 <= r.status_code < 500, (extra, r.text)
        assert r.json()["error"]["param"] == param, (extra, r.json())
    r = client.responses.create(input="hi", max_output_tokens=2, metadata={"k": "v"}, user="u1", truncation="disabled",
                                service_tier="auto", store=True, include=["reasoning.encrypted_content"],
                                parallel_tool_calls=False, top_p=0.9, **GREEDY)
    assert r.metadata == {"k": "v"} and r.user == "u1" and r.top_p == 0.9 and r.parallel_tool_calls is False


# -- fuzz ----------------------------------------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("KC_FUZZ_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
FIELDS = ["model", "input", "instructions", "tools", "tool_choice", "text", "reasoning", "max_output_tokens",
          "temperature", "top_p", "parallel_tool_calls", "stream", "store", "previous_response_id", "background",
          "metadata", "truncation", "include", "top_logprobs", "user", "service_tier", "conversation", "seed"]
scalars = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats()
           | st.text(max_size=10) | st.sampled_from(["function", "message", "function_call", "function_call_output",
                                                     "input_text", "json_schema", "auto", "required", "user",
                                                     "assistant", "reasoning", "smollm2"]))
KEYS = st.text(max_size=6) | st.sampled_from(["type", "role", "content", "text", "name", "call_id", "arguments",
                                               "output", "format", "schema", "parameters", "effort"])
json_values = st.recursive(scalars, lambda children: st.lists(children, max_size=3)
                           | st.dictionaries(KEYS, children, max_size=4), max_leaves=10)
items = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["message", "function_call", "function_call_output",
                                                                 "reasoning", "web_search_call"]) | json_values},
                                       optional={"role": json_values, "content": json_values, "call_id": json_values,
                                                 "name": json_values, "arguments": json_values,
                                                 "output": json_values}), max_size=3)
bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5).map(lambda b: {"input": "hi", **b}) | \
    items.map(lambda i: {"input": i})


def _check_reply(r: requests.Response) -> None:
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == r.status_code, error


@SETTINGS
@given(body=bodies)
def test_fuzz_create(url, body):
    limit = body.get("max_output_tokens")
    if isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit >= 1:
        body["max_output_tokens"] = 1  # a valid request stays quick
    elif limit is None:
        body["max_output_tokens"] = 1
    # json.dumps writes NaN and Infinity, which the server must refuse as non-strict JSON
    _check_reply(requests.post(url + "/v1/responses", data=json.dumps(body).encode(), timeout=120, headers={
        "Authorization": f"Bearer {SMOLLM2_API_KEY}", "Content-Type": "application/json"}))


@SETTINGS
@given(body=bodies)
def test_fuzz_translation(body):
    """In process, many more bodies: a request the plugin accepts becomes a chat body the chat parser takes or
    refuses with a 400; nothing else is raised."""
    from builtin_plugins.responses_api.protocol import parse_request
    from builtin_plugins.responses_api.translate import chat_body
    from kernelcore.entrypoints.server.errors import APIError
    from kernelcore.entrypoints.server.protocol import Limits, parse_chat_request

    try:
        req = parse_request(body)
        chat = chat_body(req, req.items)
        json.dumps(chat, allow_nan=True)
        parse_chat_request(chat, Limits(), 1000)
    except APIError as exc:
        assert exc.status == 400 and set(exc.to_dict()["error"]) == {"message", "type", "param", "code"}


@SETTINGS
@given(response_id=st.text(min_size=1, max_size=12).filter(lambda s: "/" not in s and s not in (".", "..")),
       method=st.sampled_from(["GET", "DELETE", "POST cancel", "GET input_items"]),
       query=st.dictionaries(st.sampled_from(["limit", "order", "after", "stream"]), st.text(max_size=5), max_size=2))
def test_fuzz_stored_routes(url, response_id, method, query):
    verb, _, suffix = method.partition(" ")
    path = f"{url}/v1/responses/{requests.utils.quote(response_id, safe='')}" + (f"/{suffix}" if suffix else "")
    r = requests.request(verb, path, params=query, headers={"Authorization": f"Bearer {SMOLLM2_API_KEY}"},
                         timeout=60)
    _check_reply(r)
    assert r.status_code in (400, 404, 405), r.text
