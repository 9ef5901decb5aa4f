"""The `auto` tool-choice path end to end: a scripted model (test plugin kc-dummy-structured) writes calls in each
built-in format; the real server, started with that format's parser, returns them to the openai client, streamed
and not. Also the plugin's third-party tool parser and grammar backend, used through their entry points."""

from __future__ import annotations

import json

import openai
import pytest
from helpers import scripted_default_model
from test_server_e2e import start_server, stop_server

pytestmark = pytest.mark.slow

CALL = ("get_weather", {"city": "Paris", "days": 2})
SCRIPTS = {  # name -> (completion the model writes, expected calls, expected content, expected reasoning)
    "hermes": ('<think>Checking.</think>Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
               '"days": 2}}\n</tool_call>', [CALL], "Sure.", "Checking."),
    "hermes_bad": ('Sure <tool_call>\n{"name": broken\n</tool_call>', [], 'Sure <tool_call>\n{"name": broken\n'
                   '</tool_call>', None),
    "llama3_json": ('Thinking first</think>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', [CALL],
                    None, "Thinking first"),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]', [CALL], None, None),
    "pythonic": ('[get_weather(city="Paris", days=2)]', [CALL], None, None),
    "dummy_xml": ('<call name="get_weather">{"city": "Paris", "days": 2}</call>', [CALL], None, None),
    "json_object": ('{"a":[1,true],"b":"x"}', [], '{"a":[1,true],"b":"x"}', None),
}
SERVERS = {  # server flags -> the scripts it answers
    "hermes": (["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"], ["hermes", "hermes_bad",
                                                                                 "json_object"]),
    "llama3_json": (["--tool-call-parser", "llama3_json", "--reasoning-parser", "deepseek_r1"], ["llama3_json"]),
    "mistral": (["--tool-call-parser", "mistral"], ["mistral"]),
    "pythonic": (["--tool-call-parser", "pythonic"], ["pythonic"]),
    "dummy_xml": (["--tool-call-parser", "dummy_xml", "--structured-outputs-backend", "dummy_choice"], ["dummy_xml"]),
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]


def _messages(repeats: int) -> list[dict]:
    return [{"role": "user", "content": "go " * repeats}]


@pytest.fixture(scope="module")
def scripted_model(tmp_path_factory):
    """The default model's files with architecture KcScriptedLlama and one script per conversation."""
    from kernelcore.engine.tokenizer import get_tokenizer
    from kernelcore.models.default_model import ensure_default_model

    tok = get_tokenizer(ensure_default_model())
    scripts, messages, repeats, end = {}, {}, 1, 0
    for name in SCRIPTS:
        while True:  # a prompt long enough that this script's positions start after the previous one's
            text = tok.apply_chat_template(_messages(repeats), add_generation_prompt=True, tokenize=False)
            start = len(tok.encode(text, add_special_tokens=False))
            if start - 1 > end:
                break
            repeats += 1
        ids = tok.encode(SCRIPTS[name][0], add_special_tokens=False)
        assert tok.decode(ids) == SCRIPTS[name][0]
        scripts[str(start)], messages[name] = ids, _messages(repeats)
        end = start + len(ids) + 1  # the EOS after the script
    return scripted_default_model(str(tmp_path_factory.mktemp("scripted")), scripts), messages


@pytest.fixture(scope="module", params=sorted(SERVERS))
def served(request, scripted_model):
    flags, names = SERVERS[request.param]
    path, messages = scripted_model
    proc, url = start_server(path, "--max-model-len", "2048", "--enable-auto-tool-choice", *flags,
                             "--shutdown-timeout", "2")
    yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0), names, messages
    stop_server(proc)


def _calls(tool_calls) -> list:
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls or []]


def test_auto_tool_calls_streamed_and_not(served):
    client, names, messages = served
    for name in names:
        text, calls, content, reasoning = SCRIPTS[name]
        extra = {"response_format": {"type": "json_object"}} if name == "json_object" else {}
        kwargs = dict(model="", messages=messages[name], tools=TOOLS, temperature=0, max_completion_tokens=100,
                      **extra)
        full = client.chat.completions.create(**kwargs).choices[0]
        assert _calls(full.message.tool_calls) == calls, name
        assert full.message.content == content, name
        assert getattr(full.message, "reasoning_content", None) == reasoning, name
        assert full.finish_reason == ("tool_calls" if calls else "stop"), name
        for c in full.message.tool_calls or []:
            assert c.id.startswith("call_") and c.type == "function"

        deltas, finishes, streamed = [], [], {}
        for chunk in client.chat.completions.create(**kwargs, stream=True):
            for choice in chunk.choices:
                deltas.append(choice.delta)
                finishes += [choice.finish_reason] if choice.finish_reason else []
                for tc in choice.delta.tool_calls or []:
                    entry = streamed.setdefault(tc.index, {"name": "", "arguments": "", "id": tc.id})
                    entry["name"] += tc.function.name or ""
                    entry["arguments"] += tc.function.arguments or ""
        assert finishes == [full.finish_reason], name
        assert "".join(d.content or "" for d in deltas) == (full.message.content or ""), name
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == (reasoning or ""), name
        assert [(e["name"], e["arguments"]) for e in streamed.values()] == [
            (c.function.name, c.function.arguments) for c in full.message.tool_calls or []], name


def test_third_party_backend_through_entry_point(served):
    client, names, _ = served
    if "dummy_xml" not in names:
        pytest.skip("only the server started with the dummy plugin's backend")
    r = client.completions.create(model="", prompt="pick", max_tokens=20, temperature=0,
                                  extra_body={"guided_choice": ["left", "right"]})
    assert r.choices[0].text in ("left", "right") and r.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError, match="dummy_choice serves only choice"):
        client.completions.create(model="", prompt="x", max_tokens=5, extra_body={"guided_regex": "a+"})
