"""Responses reasoning output items, streamed and not: a scripted model (test plugin kc-dummy-structured) thinks,
answers and calls a tool; the server runs with the qwen3 reasoning parser and hermes tool calls."""

from __future__ import annotations

import json
import re

import openai
import pytest
from helpers import scripted_default_model
from test_server_e2e import start_server, stop_server

pytestmark = pytest.mark.slow

SCRIPT = ('<think>Checking the forecast.</think>Sure.\n<tool_call>\n{"name": "get_weather", "arguments": '
          '{"city": "Paris"}}\n</tool_call>')
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The default model's files with architecture KcScriptedLlama writing SCRIPT after the prompt "go"."""
    from kernelcore.engine.tokenizer import get_tokenizer
    from kernelcore.models.default_model import ensure_default_model

    tok = get_tokenizer(ensure_default_model())
    prompt = tok.apply_chat_template([{"role": "user", "content": "go"}], add_generation_prompt=True, tokenize=False)
    ids = tok.encode(SCRIPT, add_special_tokens=False)
    assert tok.decode(ids) == SCRIPT
    target = scripted_default_model(str(tmp_path_factory.mktemp("scripted")),
                                    {str(len(tok.encode(prompt, add_special_tokens=False))): ids})
    proc, url = start_server(target, "--max-model-len", "2048", "--enable-auto-tool-choice", "--tool-call-parser",
                             "hermes", "--reasoning-parser", "qwen3", "--shutdown-timeout", "2")
    yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    stop_server(proc)


KWARGS = dict(model="", input="go", tools=TOOLS, temperature=0, max_output_tokens=100)


def test_reasoning_text_and_call_items(served):
    r = served.responses.create(**KWARGS)
    assert r.status == "completed"
    assert [item.type for item in r.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = r.output
    assert reasoning.id.startswith("rs_") and [c.text for c in reasoning.content] == ["Checking the forecast."]
    assert reasoning.summary == [] and message.content[0].text == "Sure." and r.output_text == "Sure."
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens

    events = list(served.responses.create(stream=True, **KWARGS))
    types = " ".join(e.type for e in events)
    shape = re.sub(r"(response\.(reasoning_text|output_text|function_call_arguments)\.delta ?)+", r"\2* ", types)
    assert shape.split() == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "reasoning_text*",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "output_text*", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "function_call_arguments*", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"], types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert [(i.type, getattr(i, "id", None)) for i in final.output] == [
        (e.item.type, e.item.id) for e in events if e.type == "response.output_item.done"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Checking the forecast."
    streamed = final.model_dump(exclude={"id", "created_at", "completed_at", "output"})
    assert streamed == r.model_dump(exclude={"id", "created_at", "completed_at", "output"})
    assert [(i.type, i.model_dump(exclude={"id", "call_id"})) for i in final.output] == [
        (i.type, i.model_dump(exclude={"id", "call_id"})) for i in r.output]

    with served.responses.stream(**KWARGS) as stream:  # the SDK's accumulator takes the sequence as it is
        for _ in stream:
            pass
        assert stream.get_final_response().output_text == "Sure."


def test_reasoning_effort_is_accepted_with_a_reasoning_parser(served):
    r = served.responses.create(reasoning={"effort": "low"}, **KWARGS)
    assert r.reasoning.effort == "low" and r.output[0].type == "reasoning"
