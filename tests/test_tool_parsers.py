"""Tool-call and reasoning parsers (the built-in plugin's, through their registries): calls, content, malformed
calls, and streaming over every prefix adding up to the non-streamed message."""

from __future__ import annotations

import json

import pytest

from kernelcore.entrypoints.reasoning_parsers import reasoning_parser_registry
from kernelcore.entrypoints.server.chat_output import ChoiceOutput
from kernelcore.entrypoints.server.tools import ToolRequest
from kernelcore.entrypoints.tool_parsers import tool_parser_registry

CASES = {
    "hermes": ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"utc": true}}\n</tool_call>', "Let me check."),
    "llama3_json": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "get_time", "parameters": {"utc": true}}', None),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_time", "arguments": {"utc": true}}]', None),
    "pythonic": ('[get_weather(city="Paris"), get_time(utc=True)]', None),
}
MALFORMED = {
    "hermes": 'Sure <tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Par',
    "mistral": "[TOOL_CALLS][{\"name\": broken",
    "pythonic": "[get_weather(city=Paris + 1)]",
}
EXPECTED = [("get_weather", {"city": "Paris"}), ("get_time", {"utc": True})]
TOOLS = ToolRequest([{"name": "get_weather"}, {"name": "get_time"}], choice="auto")


def _stream(output: ChoiceOutput, text: str) -> dict:
    """Feed every prefix (one character at a time), then the final text; rebuild the message like a client."""
    content, reasoning, calls = "", "", {}
    for end in list(range(len(text) + 1)) + [len(text)]:
        for delta in output.deltas(text[:end], end == len(text)):
            content += delta.get("content", "")
            reasoning += delta.get("reasoning_content", "")
            for call in delta.get("tool_calls", []):
                entry = calls.setdefault(call["index"], {"name": "", "arguments": ""})
                entry["name"] += call.get("function", {}).get("name", "")
                entry["arguments"] += call.get("function", {}).get("arguments", "")
    return {"content": content, "reasoning": reasoning, "calls": [calls[i] for i in sorted(calls)]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_parser_calls_stream_and_malformed(name):
    parser_cls = tool_parser_registry().get(name)
    text, content = CASES[name]
    message, finish = ChoiceOutput(TOOLS, parser_cls(None)).message(text, "stop")
    assert finish == "tool_calls" and message["content"] == content
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]
    assert got == EXPECTED
    streamed = _stream(ChoiceOutput(TOOLS, parser_cls(None)), text)
    assert streamed["calls"] == [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                 for c in message["tool_calls"]]
    assert streamed["content"] == (content or "")

    bad = MALFORMED[name]
    message, finish = ChoiceOutput(TOOLS, parser_cls(None)).message(bad, "stop")
    assert message["tool_calls"] == [] and finish == "stop" and message["content"] == bad
    assert _stream(ChoiceOutput(TOOLS, parser_cls(None)), bad) == {"content": bad, "reasoning": "", "calls": []}

    plain = "Just text, [no] {calls} here."
    message, _ = ChoiceOutput(TOOLS, parser_cls(None)).message(plain, "stop")
    assert message["content"] == plain and _stream(ChoiceOutput(TOOLS, parser_cls(None)), plain)["content"] == plain


@pytest.mark.parametrize("name,text,reasoning,content", [
    ("qwen3", "<think>Let me think.</think>The answer is 4.", "Let me think.", "The answer is 4."),
    ("qwen3", "No thinking here.", None, "No thinking here."),
    ("deepseek_r1", "Thinking without the tag</think>Answer.", "Thinking without the tag", "Answer."),
    ("deepseek_r1", "<think>Tagged</think>Answer.", "Tagged", "Answer."),
    ("deepseek_r1", "Still thinking", "Still thinking", ""),
])
def test_reasoning_parsers(name, text, reasoning, content):
    parser_cls = reasoning_parser_registry().get(name)
    message, _ = ChoiceOutput(None, None, parser_cls(None)).message(text, "stop")
    assert message["reasoning_content"] == reasoning and message["content"] == content
    streamed = _stream(ChoiceOutput(None, None, parser_cls(None)), text)
    assert streamed["reasoning"] == (reasoning or "") and streamed["content"] == content


def test_reasoning_then_tool_call():
    hermes = tool_parser_registry().get("hermes")(None)
    qwen3 = reasoning_parser_registry().get("qwen3")(None)
    text = ('<think>I should call it.</think>'
            '<tool_call>\n{"name": "get_time", "arguments": {"utc": false}}\n</tool_call>')
    message, finish = ChoiceOutput(TOOLS, hermes, qwen3).message(text, "stop")
    assert message["reasoning_content"] == "I should call it." and message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "get_time", "arguments": '{"utc": false}'}


def test_registries_refuse_duplicates_and_unknown_names():
    registry = tool_parser_registry()
    with pytest.raises(ValueError, match="twice"):
        registry.register("hermes", object)
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        registry.get("nope")
    assert {"hermes", "llama3_json", "mistral", "pythonic", "dummy_xml"} <= set(registry.names())
    assert {"deepseek_r1", "qwen3"} <= set(reasoning_parser_registry().names())
