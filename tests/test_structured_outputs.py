"""Constrained decoding through the real `kc serve` (default random-weight model) with the official openai client."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from test_server_e2e import post, start_server, stop_server

pytestmark = pytest.mark.slow
API_KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    is_member: bool
    color: Literal["red", "green", "blue"]
    tags: list[Literal["a", "b"]] = Field(max_length=2)


# as the openai client's strict mode sends
PERSON_SCHEMA = {**Person.model_json_schema(), "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1,
                                                                                    "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    proc, url = start_server("--max-model-len", "512", "--api-key", API_KEY, "--shutdown-timeout", "2")
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=API_KEY, max_retries=0)


def test_parse_pydantic_model(client):
    completion = client.chat.completions.parse(model="", messages=MESSAGES, response_format=Person, temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    jsonschema.validate(json.loads(choice.message.content), Person.model_json_schema())


def test_json_schema_stream_equals_non_stream_and_n2(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON_SCHEMA, "strict": True}}
    full = client.chat.completions.create(model="", messages=MESSAGES, response_format=fmt, temperature=0)
    stream = client.chat.completions.create(model="", messages=MESSAGES, response_format=fmt, temperature=0,
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == full.choices[0].message.content
    sampled = client.chat.completions.create(model="", messages=MESSAGES, response_format=fmt, n=2, temperature=1.0,
                                             seed=7, max_completion_tokens=200)
    assert len(sampled.choices) == 2
    for choice in sampled.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON_SCHEMA)


def test_regex_choice_grammar_on_completions(client):
    for extra in ({"guided_regex": r"[0-9]{2,4}-[a-z]{2}"}, {"structured_outputs": {"regex": r"[0-9]{2,4}-[a-z]{2}"}}):
        r = client.completions.create(model="", prompt="Hello", max_tokens=30, temperature=0.7, seed=3,
                                      extra_body=extra)
        assert re.fullmatch(r"[0-9]{2,4}-[a-z]{2}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    for extra in ({"guided_choice": ["alpha", "beta", "gamma"]}, {"structured_outputs": {"choice": ["alpha", "beta"]}}):
        r = client.completions.create(model="", prompt="Pick", max_tokens=30, temperature=0, extra_body=extra)
        assert r.choices[0].text in ("alpha", "beta", "gamma")
    grammar = 'start: "yes" | "no" | "x=" NUM\nNUM: /[0-9]{1,3}/'
    r = client.completions.create(model="", prompt="Say", max_tokens=30, temperature=0.9, seed=1,
                                  extra_body={"guided_grammar": grammar})
    assert re.fullmatch(r"yes|no|x=[0-9]{1,3}", r.choices[0].text)
    chat = client.chat.completions.create(model="", messages=MESSAGES, temperature=0,
                                          extra_body={"structured_outputs": {"choice": ["sunny", "rainy"]}})
    assert chat.choices[0].message.content in ("sunny", "rainy")


def test_json_object(client):
    # logit_bias favours closing the object, so a random model ends it; the grammar keeps it valid JSON.
    from transformers import AutoTokenizer

    from kernelcore.models.default_model import ensure_default_model

    tok = AutoTokenizer.from_pretrained(ensure_default_model())
    bias = {str(tok.convert_tokens_to_ids(t)): 8 for t in ("}", '"') if tok.convert_tokens_to_ids(t) is not None}
    r = client.chat.completions.create(model="", messages=MESSAGES, response_format={"type": "json_object"},
                                       temperature=0, logit_bias=bias, max_completion_tokens=300)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_named_and_required_tool_choice(client):
    named = client.chat.completions.create(model="", messages=MESSAGES, tools=[WEATHER, TIME], temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = named.choices[0]
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])
    assert choice.finish_reason == "tool_calls" and choice.message.content is None

    stream = client.chat.completions.create(model="", messages=MESSAGES, tools=[WEATHER, TIME], temperature=0,
                                            stream=True,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    fragments, finishes, ids = [], [], set()
    for chunk in stream:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                assert tc.index == 0
                ids.update([tc.id] if tc.id else [])
                fragments.append(tc.function.arguments or "")
            if c.finish_reason:
                finishes.append(c.finish_reason)
    assert "".join(fragments) == call.function.arguments and finishes == ["tool_calls"] and len(ids) == 1

    for parallel in (False, True):
        # Compact JSON: random weights given room for whitespace may still be writing calls at the token limit.
        required = client.chat.completions.create(model="", messages=MESSAGES, tools=[WEATHER, TIME], temperature=0.8,
                                                  seed=5, tool_choice="required", parallel_tool_calls=parallel,
                                                  max_completion_tokens=300,
                                                  extra_body={"structured_outputs": {"disable_any_whitespace": True}})
        calls = required.choices[0].message.tool_calls
        assert calls and required.choices[0].finish_reason == "tool_calls"
        assert parallel or len(calls) == 1
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_tool_messages_reach_the_template(server):
    template = ("{% for m in messages %}{{ m['role'] }}:{% if m.get('tool_calls') %}"
                "{% for c in m['tool_calls'] %}{{ c['function']['name'] }}{{ c['function']['arguments'] | tojson }}"
                "{% endfor %}{% endif %}{{ m['content'] or '' }}{% if m.get('tool_call_id') %}[{{ m['tool_call_id'] }}]"
                "{% endif %}\n{% endfor %}{% if tools %}tools:{{ tools | length }}{% endif %}")
    messages = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    body = {"messages": messages, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 2}
    assert post(server, "/v1/chat/completions", body, headers=AUTH).status_code == 200
    from kernelcore.engine.tokenizer import get_tokenizer
    from kernelcore.entrypoints.server.tools import template_messages
    from kernelcore.models.default_model import ensure_default_model

    tok = get_tokenizer(ensure_default_model())
    text = tok.apply_chat_template(template_messages(messages), tools=[WEATHER], chat_template=template, tokenize=False)
    assert 'get_weather{"city": "Paris"}' in text and "sunny[call_1]" in text and "tools:1" in text


def test_mixed_batch_unconstrained_outputs_unchanged(server, client):
    prompts = [f"Story {i}: once upon a time" for i in range(4)]
    alone = [client.completions.create(model="", prompt=p, max_tokens=12, temperature=0).choices[0].text
             for p in prompts]

    async def main():
        aclient = openai.AsyncOpenAI(base_url=server + "/v1", api_key=API_KEY, max_retries=0)
        plain = [aclient.completions.create(model="", prompt=p, max_tokens=12, temperature=0) for p in prompts]
        constrained = [aclient.completions.create(model="", prompt=p, max_tokens=40, temperature=0,
                                                  extra_body={"guided_json": PERSON_SCHEMA})
                       for p in prompts]
        results = await asyncio.gather(*plain, *constrained)
        await aclient.close()
        return results

    results = asyncio.run(main())
    assert [r.choices[0].text for r in results[:4]] == alone
    for r in results[4:]:
        if r.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(r.choices[0].text), PERSON_SCHEMA)


def _error(r, param=None):
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if param is not None:
        assert error["param"] == param, error
    return error["message"]


def test_bad_requests_are_400(server, client):
    chat = "/v1/chat/completions"

    def send(path=chat, **body):
        base = {"messages": MESSAGES} if path == chat else {"prompt": "x"}
        return post(server, path, {**base, **body}, headers=AUTH)

    assert "bogus" in _error(send(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "bogus"}}}), "response_format")
    _error(send(response_format={"type": "xml"}), "response_format.type")
    _error(send(response_format={"type": "json_schema"}), "response_format.json_schema")
    _error(send(path="/v1/completions", guided_regex="(unclosed"), "structured_outputs")
    _error(send(path="/v1/completions", guided_regex="a+", guided_choice=["x"]))
    _error(send(path="/v1/completions", structured_outputs={"regex": "a", "nonsense": 1}), "structured_outputs")
    _error(send(path="/v1/completions", guided_json="{not json"), "guided_json")
    assert "auto" in _error(send(tools=[WEATHER]), "tool_choice")
    _error(send(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice")
    _error(send(tool_choice="required"), "tool_choice")
    _error(send(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
                tool_choice="required"), "tools")
    _error(send(tools=[{"type": "function", "function": {"description": "no name"}}], tool_choice="required"), "tools")
    _error(send(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}), "tool_choice")
    for field, value in (("audio", {"voice": "x"}), ("modalities", ["text", "audio"]), ("prediction", {"type": "x"}),
                         ("web_search_options", {}), ("functions", [{"name": "f"}]), ("reasoning_effort", "low")):
        if value == {}:
            value = {"search_context_size": "low"}
        assert field in _error(send(**{field: value}), field)
    informational = {"user": "u", "metadata": {"k": "v"}, "store": False, "service_tier": "auto",
                     "safety_identifier": "s", "prompt_cache_key": "k", "max_tokens": 2}
    assert send(**informational).status_code == 200
    _error(send(messages=[{"role": "user", "content": "x"}], tools=[WEATHER], tool_choice="required",
                guided_json=PERSON_SCHEMA), "tool_choice")
