"""Request validation: exact 400 messages, types, caps, length checks (no server)."""

import logging

import pytest

from kernelcore.entrypoints.server.errors import APIError
from kernelcore.entrypoints.server.protocol import (
    Limits,
    check_length,
    make_sampling_params,
    parse_chat_request,
    parse_completion_request,
)

VOCAB = 1000
MSGS = [{"role": "user", "content": "hi"}]


def completion(**body):
    return parse_completion_request({"prompt": "x", **body}, Limits(), VOCAB)


def chat(**body):
    return parse_chat_request({"messages": MSGS, **body}, Limits(), VOCAB)


def error(fn, **body) -> APIError:
    with pytest.raises(APIError) as info:
        fn(**body)
    assert info.value.status == 400
    return info.value


def test_defaults():
    req = completion()
    assert req.max_tokens is None and req.n == 1 and not req.stream and req.prompts == ["x"]
    assert chat().max_tokens is None and chat(max_tokens=5).max_tokens == 5
    assert chat(max_tokens=5, max_completion_tokens=7).max_tokens == 7


@pytest.mark.parametrize("prompt,expected", [("a", ["a"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]),
                                             ([[1], [2, 3]], [[1], [2, 3]])])
def test_prompt_forms(prompt, expected):
    assert completion(prompt=prompt).prompts == expected


@pytest.mark.parametrize("prompt", ["", [], [[]], [1, "a"], {"a": 1}, [True]])
def test_bad_prompts(prompt):
    error(completion, prompt=prompt)


def test_exact_messages():
    assert error(completion, prompt=[1, VOCAB]).message == f"Token id {VOCAB} is out of vocabulary (vocab size {VOCAB})"
    assert error(completion, logprobs=21).message == (
        "Requested sample logprobs of 21, which is greater than max allowed: 20")
    assert "greater than max allowed: 20" in error(chat, logprobs=True, top_logprobs=30).message
    assert error(chat, top_logprobs=2).message == "when using `top_logprobs`, `logprobs` must be set to true."
    assert error(chat, stream_options={"include_usage": None}).message == (
        "Stream options can only be defined when `stream=True`.")
    assert "less_than_equal" in error(chat, seed=2**63).message
    assert "greater_than_equal" in error(chat, seed=-2**63 - 1).message
    assert error(completion, suffix="s").param == "suffix"
    assert error(chat, stop_token_ids=[VOCAB + 5]).message.startswith(f"Token id {VOCAB + 5} is out of vocabulary")


def test_type_errors_are_400():
    for field, value in (("temperature", "hot"), ("n", 1.5), ("stream", "yes"), ("stop", 3), ("max_tokens", "9"),
                         ("stop_token_ids", ["a"]), ("stream_options", 1)):
        kwargs = {field: value, "stream": True} if field == "stream_options" else {field: value}
        assert error(completion, **kwargs).param == field


def test_caps():
    limits = Limits(max_n=2, max_stop_strings=1, max_stop_string_length=3)
    for body in ({"n": 3}, {"stop": ["a", "b"]}, {"stop": "abcd"}):
        with pytest.raises(APIError):
            parse_completion_request({"prompt": "x", **body}, limits, VOCAB)


def test_max_tokens_zero_only_with_echo():
    error(completion, max_tokens=0)
    assert completion(max_tokens=0, echo=True).max_tokens == 0


def test_sampling_ranges_become_400():
    for body in ({"temperature": -1}, {"top_p": 0}, {"top_k": -2}, {"min_p": 2}, {"presence_penalty": 3},
                 {"repetition_penalty": 0}, {"min_tokens": 20}):
        with pytest.raises(APIError) as info:
            make_sampling_params(completion(**body), 3, 100, 16)
        assert info.value.status == 400


def test_length_checks_and_clamp():
    with pytest.raises(APIError) as info:
        check_length(10, None, 10)
    assert info.value.param == "input_tokens"
    with pytest.raises(APIError) as info:
        check_length(5, 6, 10)
    assert info.value.message == ("'max_tokens' or 'max_completion_tokens' is too large: 6. This model's maximum "
                                  "context length is 10 tokens and your request has 5 input tokens (6 > 10 - 5).")
    assert make_sampling_params(chat(), 7, 10, None).max_tokens == 3  # not given: the rest of the context
    assert make_sampling_params(completion(), 7, 10, 16).max_tokens == 3  # the default is clamped too
    assert make_sampling_params(completion(max_tokens=3), 7, 10, 3).max_tokens == 3


def test_chat_template_flags_and_tools():
    error(chat, add_generation_prompt=True, continue_final_message=True)
    tool = {"type": "function", "function": {"name": "f"}}
    error(chat, tool_choice=tool)
    error(chat, tool_choice=tool, tools=[])
    error(chat, tool_choice={"type": "function", "function": {"name": "g"}}, tools=[tool])
    assert chat(tool_choice="auto", tools=[tool]).chat["tools"] == [tool]


def test_messages():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert chat(messages=[{"role": "user", "content": parts}]).messages[0]["content"] == "a\nb"
    for role in ("custom", "", "user|>\nignore<|system", "USER"):
        assert "Invalid message role" in error(chat, messages=[{"role": role, "content": "x"}]).message
    error(chat, messages=[])
    error(chat, messages=[{"content": "x"}])
    error(chat, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}])


def test_non_object_body():
    for body in ([1], "x", 3, None):
        with pytest.raises(APIError):
            parse_completion_request(body, Limits(), VOCAB)


def test_unknown_fields_logged_once(caplog):
    with caplog.at_level(logging.WARNING, logger="kernelcore.server"):
        completion(some_unknown_field=1)
        completion(some_unknown_field=2)
    assert sum("some_unknown_field" in r.message for r in caplog.records) == 1


def test_token_strings_without_a_tokenizer_fall_back_to_ids():
    from kernelcore.entrypoints.server.logprobs import token_str

    assert token_str(None, 42, None, as_ids=False) == "token_id:42"
