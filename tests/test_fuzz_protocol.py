"""Property-based fuzzing of the request parsers: any JSON value in any field is either a valid request whose
SamplingParams cross to the engine core, or a 400 with the error envelope; never another exception."""

from __future__ import annotations

import json
import os

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelcore.entrypoints.server.errors import APIError
from kernelcore.entrypoints.server.jsonbody import decode_json
from kernelcore.entrypoints.server.protocol import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    Limits,
    make_sampling_params,
    parse_chat_request,
    parse_completion_request,
)

VOCAB = 1000
EXAMPLES = int(os.environ.get("KC_FUZZ_EXAMPLES", "300"))  # a longer soak: KC_FUZZ_EXAMPLES=20000
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

scalars = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["user", "assistant", "tool", "auto", "required", "none", "function", "text", "</s>"]))
json_values = st.recursive(scalars, lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.text(max_size=8) | st.sampled_from(["role", "content", "type",
                                                                                    "function", "name", "text"]),
                                             children, max_size=4), max_leaves=12)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "x", ""]) | json_values},
                                          optional={"content": json_values}), max_size=3)


def bodies(fields: set[str], base: dict) -> st.SearchStrategy[dict]:
    return st.dictionaries(st.sampled_from(sorted(fields)), json_values, max_size=6).map(lambda b: {**base, **b})


def check(parse, body: dict) -> None:
    try:
        request = parse(body, Limits(), VOCAB)
        params = make_sampling_params(request, 5, 256, 16)
    except APIError as exc:
        assert exc.status == 400, exc.to_dict()
        assert set(exc.to_dict()["error"]) == {"message", "type", "param", "code"}
        return
    msgspec.msgpack.encode(params)  # what crosses to the engine core must encode
    params.verify()


@SETTINGS
@given(bodies(COMPLETION_FIELDS, {"prompt": "hi"}))
def test_completion_fields(body):
    check(parse_completion_request, body)


@SETTINGS
@given(bodies(CHAT_FIELDS, {"messages": [{"role": "user", "content": "hi"}]}))
def test_chat_fields(body):
    check(parse_chat_request, body)


@SETTINGS
@given(messages)
def test_chat_messages(value):
    check(parse_chat_request, {"messages": value})


@SETTINGS
@given(st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
def test_decode_any_bytes(raw):
    try:
        decode_json(raw)
    except APIError as exc:
        assert exc.status == 400
