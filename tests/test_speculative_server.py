"""kc serve --speculative-config with the real SmolLM2: chat answers (streamed and not, tool calls and JSON
schemas included) are the plain server's, /metrics counts drafts and acceptance, a bad config is refused."""

from __future__ import annotations

import json
import re

import openai
import pytest
import real_models
import requests
from conftest import SMOLLM2_API_KEY
from helpers import run_kc
from test_server_e2e import start_server, stop_server

pytestmark = pytest.mark.slow  # starts kc serve

SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
KEY = "sk-spec"


@pytest.fixture(scope="module")
def spec_url():
    path = real_models.real_model("smollm2-135m-instruct-q4_1")
    proc, url = start_server(path, "--max-model-len", "2048", "--enable-auto-tool-choice", "--tool-call-parser",
                             "hermes", "--api-key", KEY, "--served-model-name", "smollm2", "--speculative-config",
                             SPEC)
    yield url
    stop_server(proc)


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


QUOTE = ("Context: The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is "
         "named after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889."
         "\n\nQuestion: Who is the Eiffel Tower named after? Quote the sentence from the context that answers.")


def _metrics(url: str) -> dict[str, float]:
    text = requests.get(url + "/metrics", timeout=10).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r'kc:(spec_decode_\w+?)_total\{(?:[^}]*position="(\d+)")?[^}]*\} (\S+)', line)
        if match:
            name = match[1] + (f"[{match[2]}]" if match[2] else "")
            values[name] = float(match[3])
    return values


def test_answers_streamed_and_not_are_the_plain_servers(spec_url, smollm2_server):
    before = _metrics(spec_url)
    messages = [{"role": "user", "content": QUOTE}]
    kw = dict(model="smollm2", messages=messages, temperature=0, max_tokens=60)
    plain = _client(smollm2_server, SMOLLM2_API_KEY).chat.completions.create(**kw).choices[0].message.content
    spec_client = _client(spec_url, KEY)
    ours = spec_client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       spec_client.chat.completions.create(**kw, stream=True) if chunk.choices)
    assert ours == plain == streamed and "Gustave Eiffel" in ours
    after = _metrics(spec_url)
    drafts = after["spec_decode_num_draft_tokens"] - before.get("spec_decode_num_draft_tokens", 0)
    accepted = after["spec_decode_num_accepted_tokens"] - before.get("spec_decode_num_accepted_tokens", 0)
    assert 0 < accepted <= drafts
    assert after["spec_decode_num_drafts"] > before.get("spec_decode_num_drafts", 0)
    per_pos = [after[f"spec_decode_num_accepted_tokens_per_pos[{i}]"] for i in range(4)]
    assert sum(per_pos) == after["spec_decode_num_accepted_tokens"]


def test_tool_calls_and_json_schema_are_the_plain_servers(spec_url, smollm2_server):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"]}
    requests_ = [
        dict(messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=tools,
             tool_choice="required"),
        dict(messages=[{"role": "user", "content": "Paris is the capital of France. Give the city and country."}],
             response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}),
    ]
    for body in requests_:
        kw = dict(model="smollm2", temperature=0, max_tokens=60, **body)
        plain = _client(smollm2_server, SMOLLM2_API_KEY).chat.completions.create(**kw).choices[0].message
        ours = _client(spec_url, KEY).chat.completions.create(**kw).choices[0].message
        assert ours.content == plain.content
        assert [(c.function.name, c.function.arguments) for c in ours.tool_calls or []] == \
            [(c.function.name, c.function.arguments) for c in plain.tool_calls or []]
    assert json.loads(ours.content)["city"] == "Paris"


@pytest.mark.parametrize("value, message", [
    ("{bad", "not JSON"), ('{"method": "nope", "num_speculative_tokens": 2}', "unknown speculative method"),
    ('{"method": "ngram"}', "num_speculative_tokens")])
def test_a_bad_speculative_config_is_a_usage_error(value, message):
    result = run_kc("serve", "--speculative-config", value, check=False, timeout=120)
    assert result.returncode == 2 and message in result.stderr and "--speculative-config" in result.stderr
