"""`kc run-batch`: OpenAI batch files run through the real server routes, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import real_models
from helpers import clean_env, run_kc

from kernelcore.entrypoints.batch_file import BatchRequest, LineError, parse_lines

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _line(custom_id: str, url: str, body: dict) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def _chat(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 3, **extra}


def _outputs(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def _assert_shape(out: dict) -> None:
    assert set(out) == {"id", "custom_id", "response", "error"}
    assert out["id"].startswith("batch_req_")
    assert (out["response"] is None) != (out["error"] is None)
    if out["response"] is not None:
        assert set(out["response"]) == {"status_code", "request_id", "body"} and out["response"]["request_id"]
    else:
        assert set(out["error"]) == {"code", "message"} and out["error"]["message"]


def test_parse_lines_fails_bad_lines_alone():
    items = parse_lines([
        _line("a", CHAT, _chat("hi")), "", "   ", "{oops", "[1, 2]", json.dumps({"url": CHAT, "body": {}}),
        _line("a", COMPLETIONS, {"prompt": "x"}), json.dumps({"custom_id": "g", "method": "GET", "url": CHAT,
                                                              "body": {}}),
        _line("u", "/v1/embeddings", {"input": "x"}), _line("s", COMPLETIONS, {"prompt": "x", "stream": True}),
        json.dumps({"custom_id": "n", "method": "POST", "url": CHAT, "body": "text"}),
        _line("b", COMPLETIONS, {"prompt": "x", "stream": False})])
    assert isinstance(items[0], BatchRequest) and items[0].custom_id == "a" and items[0].url == CHAT
    errors = items[1:-1]
    assert all(isinstance(e, LineError) for e in errors)
    assert [(e.custom_id, e.code) for e in errors if isinstance(e, LineError)] == [
        (None, "invalid_json_line"), (None, "invalid_json_line"), (None, "missing_required_parameter"),
        ("a", "duplicate_custom_id"), ("g", "invalid_method"), ("u", "invalid_url"), ("s", "invalid_body"),
        ("n", "invalid_body")]
    assert isinstance(items[-1], BatchRequest)  # blank lines make no item; stream: false is fine


def test_mixed_file(tmp_path):
    lines = [
        _line("chat-1", CHAT, _chat("Hello there")),
        _line("cmpl-1", COMPLETIONS, {"prompt": "Once upon a time", "max_tokens": 2}),
        "this is not json",
        _line("embed-1", "/v1/embeddings", {"input": "x"}),
        _line("refused-1", CHAT, _chat("hi", max_tokens=-1)),
        _line("refused-2", CHAT, {"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 2}),
        "",  # skipped: no output line
        _line("chat-1", COMPLETIONS, {"prompt": "a duplicate id", "max_tokens": 2}),
        _line("stream-1", CHAT, _chat("hi", stream=True)),
        _line("chat-2", CHAT, _chat("Another one", n=2)),
        _line("cmpl-2", COMPLETIONS, {"prompt": ["two", "prompts"], "max_tokens": 2}),
    ]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    proc = run_kc("run-batch", "-i", str(src), "-o", str(dst), "--max-model-len", "256", "--seed", "0",
                  "--max-concurrency", "2", "--no-progress")
    assert "10 line(s) written" in proc.stderr and "4 succeeded, 6 failed" in proc.stderr
    outs = _outputs(dst.read_text())
    assert [o["custom_id"] for o in outs] == ["chat-1", "cmpl-1", None, "embed-1", "refused-1", "refused-2",
                                              "chat-1", "stream-1", "chat-2", "cmpl-2"]
    for out in outs:
        _assert_shape(out)
    assert len({o["id"] for o in outs}) == len(outs)
    by_index = dict(enumerate(outs))
    for index, kind, choices in ((0, "chat.completion", 1), (1, "text_completion", 1), (8, "chat.completion", 2),
                                 (9, "text_completion", 2)):
        response = by_index[index]["response"]
        assert response["status_code"] == 200, response
        body = response["body"]
        assert body["object"] == kind and len(body["choices"]) == choices
        assert body["usage"]["completion_tokens"] >= 1 and body["usage"]["prompt_tokens"] >= 1
        assert response["request_id"] in body["id"]  # the server used the id the line was sent with
    assert isinstance(outs[0]["response"]["body"]["choices"][0]["message"]["content"], str)
    assert outs[1]["response"]["body"]["usage"]["completion_tokens"] == 2
    for index, param in ((4, "max_tokens"), (5, None)):
        response = outs[index]["response"]
        assert 400 <= response["status_code"] < 500 and outs[index]["error"] is None
        error = response["body"]["error"]  # the server's own envelope
        assert error["message"] and error["type"] and error["code"] == response["status_code"]
        if param:
            assert error["param"] == param
    assert [(i, outs[i]["error"]["code"]) for i in (2, 3, 6, 7)] == [
        (2, "invalid_json_line"), (3, "invalid_url"), (6, "duplicate_custom_id"), (7, "invalid_body")]


def test_unreadable_input_is_a_clear_error(tmp_path):
    missing = run_kc("run-batch", "-i", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "out.jsonl"),
                     check=False)
    assert missing.returncode != 0 and "cannot read the input file" in missing.stderr
    assert "Starting kernelcore" not in missing.stderr  # refused before any model is read
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    proc = run_kc("run-batch", "-i", str(binary), "-o", str(tmp_path / "out.jsonl"), check=False)
    assert proc.returncode != 0 and "not UTF-8" in proc.stderr
    src = tmp_path / "in.jsonl"
    src.write_text(_line("a", CHAT, _chat("hi")) + "\n")
    proc = run_kc("run-batch", "-i", str(src), "-o", str(tmp_path / "no" / "such" / "out.jsonl"), check=False)
    assert proc.returncode != 0 and "cannot write the output file" in proc.stderr


def test_only_bad_lines_need_no_engine(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("nope\n" + _line("x", "/v1/embeddings", {}) + "\n")
    proc = run_kc("run-batch", "-i", str(src), "-o", str(dst), "--no-progress")
    assert "0 succeeded, 2 failed" in proc.stderr and "Starting the engine" not in proc.stderr
    assert [o["error"]["code"] for o in _outputs(dst.read_text())] == ["invalid_json_line", "invalid_url"]


def test_help_shares_the_serve_options():
    out = run_kc("run-batch", "--help").stdout
    for flag in ("--input-file", "--output-file", "--max-concurrency", "--no-progress", "--max-model-len", "--dtype",
                 "--quantization", "--chat-template", "--served-model-name", "--enable-auto-tool-choice",
                 "--tool-call-parser", "--reasoning-parser", "--seed", "KC_MAX_MODEL_LEN"):
        assert flag in out, flag


def test_real_model_line_from_stdin_to_stdout():
    path = real_models.real_model("smollm2-135m-instruct-q4_1")
    batch = "\n".join([
        _line("greet", CHAT, {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}],
                              "max_tokens": 8, "temperature": 0}),
        _line("other-model", CHAT, {"model": "not-served", "messages": [{"role": "user", "content": "hi"}]}),
    ])
    proc = subprocess.run([sys.executable, "-m", "kernelcore.entrypoints.cli", "run-batch", "-i", "-", "-o", "-",
                           path, "--served-model-name", "smollm2", "--max-model-len", "512"],
                          input=batch, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    greet, other = _outputs(proc.stdout)  # stdout holds the output lines and nothing else
    assert greet["custom_id"] == "greet" and greet["response"]["status_code"] == 200
    body = greet["response"]["body"]
    assert body["model"] == "smollm2" and body["choices"][0]["message"]["content"].strip()
    assert other["response"]["status_code"] == 404 and "not-served" in other["response"]["body"]["error"]["message"]


def test_platform_options_reach_the_platform(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(_line("a", COMPLETIONS, {"prompt": "x", "max_tokens": 1}) + "\n")
    assert "--dummy-flag" in run_kc("run-batch", "--help", KC_DUMMY_DEVICE="1").stdout
    proc = run_kc("run-batch", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), "--dummy-flag", "refuse",
                  check=False, KC_DUMMY_DEVICE="1")
    assert proc.returncode != 0 and "DummyPlatform refuses --dummy-flag=refuse" in proc.stderr
