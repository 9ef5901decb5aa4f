"""What a real agent loop needs from /v1/chat/completions, checked on the real SmolLM2-135M-Instruct (its ChatML
template, its weights) with the openai client: an assistant turn that only calls tools (null or absent content)
renders, a forced tool choice cut by max_tokens still returns its call, and constrained JSON lets the model put
the whitespace it wants, which is what keeps its answers right."""

from __future__ import annotations

import json

import openai
import pytest
from conftest import SMOLLM2_API_KEY

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
                 "additionalProperties": False}


@pytest.fixture(scope="module")
def client(smollm2_server):
    return openai.OpenAI(base_url=smollm2_server + "/v1", api_key=SMOLLM2_API_KEY, max_retries=0)


def _round_trip(assistant: dict) -> list[dict]:
    return [QUESTION, assistant, {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 22 C"}]


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.mark.parametrize("assistant", [{"role": "assistant", "content": None, "tool_calls": [CALL]},
                                       {"role": "assistant", "tool_calls": [CALL]}], ids=["null", "absent"])
def test_an_assistant_turn_with_only_tool_calls_renders_as_empty_content(client, assistant):
    reply = client.chat.completions.create(model="smollm2", messages=_round_trip(assistant), tools=[WEATHER],
                                           temperature=0, max_tokens=24)
    same = client.chat.completions.create(model="smollm2", messages=_round_trip({**assistant, "content": ""}),
                                          tools=[WEATHER], temperature=0, max_tokens=24)
    assert reply.choices[0].message.content  # the model answers from the tool's result
    assert reply.choices[0].message.content == same.choices[0].message.content
    assert reply.usage.prompt_tokens == same.usage.prompt_tokens


def test_a_named_tool_choice_cut_by_max_tokens_still_returns_the_call(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    full = client.chat.completions.create(model="smollm2", messages=[QUESTION], tools=[WEATHER], tool_choice=named,
                                          temperature=0, max_tokens=60)
    (complete,) = full.choices[0].message.tool_calls
    assert full.choices[0].finish_reason == "tool_calls" and isinstance(json.loads(complete.function.arguments), dict)
    cut = client.chat.completions.create(model="smollm2", messages=[QUESTION], tools=[WEATHER], tool_choice=named,
                                         temperature=0, max_tokens=4)
    choice = cut.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert complete.function.arguments.startswith(call.function.arguments)  # the arguments as generated
    assert call.function.arguments != complete.function.arguments

    stream = client.chat.completions.create(model="smollm2", messages=[QUESTION], tools=[WEATHER], tool_choice=named,
                                            temperature=0, max_tokens=4, stream=True)
    names, arguments, finish = [], "", None
    for chunk in stream:
        for delta_call in chunk.choices[0].delta.tool_calls or []:
            names += [delta_call.function.name] if delta_call.function.name else []
            arguments += delta_call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"] and arguments == call.function.arguments and finish == "length"


def test_a_required_tool_choice_cut_by_max_tokens_returns_the_calls_generated(client):
    full = client.chat.completions.create(model="smollm2", messages=[QUESTION], tools=[WEATHER, TIME],
                                          tool_choice="required", temperature=0, max_tokens=80)
    assert full.choices[0].finish_reason == "tool_calls"
    first = full.choices[0].message.tool_calls[0]
    cut = client.chat.completions.create(model="smollm2", messages=[QUESTION], tools=[WEATHER, TIME],
                                         tool_choice="required", temperature=0,
                                         max_tokens=full.usage.completion_tokens * 2 // 3)  # inside the arguments
    choice = cut.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == first.function.name
    with pytest.raises(ValueError):
        json.loads(call.function.arguments)  # cut short: as generated, not made up


@pytest.mark.parametrize("question, truth", [("What is 2+3?", 5), ("How many days are in a week?", 7)])
def test_constrained_json_allows_the_models_whitespace_and_stays_right(client, question, truth):
    def ask(**extra):
        reply = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": question}], temperature=0, max_tokens=30,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}},
            extra_body=extra)
        return reply.choices[0].message.content

    flexible = ask()
    assert json.loads(flexible) == {"answer": truth}  # the answer it gives unconstrained
    compact = ask(structured_outputs={"disable_any_whitespace": True})
    assert json.loads(compact).keys() == {"answer"}
    assert not any(c.isspace() for c in compact)  # the documented switch: no whitespace at all
