"""First-run messages on a model without a chat template (start-up warning, a 400 naming --chat-template, no
misleading transformers warning), `--no-web-console`, and the default kc: metrics parsed by prometheus_client."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import requests
from conftest_models import make_llama_checkpoint
from prometheus_client.parser import text_string_to_metric_families
from test_server_e2e import server_log, start_server, stop_server

MAX_MODEL_LEN = 128


def model_without_chat_template(path: str) -> str:
    """A random Llama with the default model's tokenizer, its chat template removed (like OPT or a base Llama)."""
    from transformers import AutoTokenizer

    from kernelcore.models.default_model import ensure_default_model

    source = ensure_default_model()
    tokenizer = AutoTokenizer.from_pretrained(source)
    make_llama_checkpoint(path, vocab_size=len(tokenizer), max_position_embeddings=MAX_MODEL_LEN,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), path)
    config_path = os.path.join(path, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    config.pop("chat_template", None)
    with open(config_path, "w") as f:
        json.dump(config, f)
    assert AutoTokenizer.from_pretrained(path).chat_template is None
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("first_run")
    model = model_without_chat_template(str(root / "no-template-llama"))
    proc, url = start_server(model, "--no-web-console", "--max-model-len", str(MAX_MODEL_LEN))
    yield url, proc  # its output goes to a file: server_log(proc)
    stop_server(proc)


@pytest.mark.slow
def test_startup_warns_about_the_missing_chat_template(served):
    text = server_log(served[1])
    assert "WARNING" in text and "has no chat template" in text and "--chat-template" in text, text
    assert "answers with random text" not in text  # that notice is only for the embedded default model


def test_chat_request_gets_a_400_that_names_the_flag_and_harms_nothing(served):
    url, _ = served
    r = requests.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]}, timeout=60)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "--chat-template" in message and "no chat template" in message
    assert "transformers v4.44" not in message
    r = requests.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_too_long_prompt_is_a_400_without_transformers_length_warning(served):
    url, proc = served
    r = requests.post(url + "/v1/completions", json={"prompt": "hello world " * 1500, "max_tokens": 1}, timeout=60)
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"].lower()
    # encodes past the limit too
    r = requests.post(url + "/tokenize", json={"prompt": "hello world " * 1500}, timeout=60)
    assert r.status_code in (200, 400)
    assert requests.get(url + "/health", timeout=30).status_code == 200
    assert "Token indices sequence length" not in server_log(proc)


def test_no_web_console_turns_the_page_and_its_api_off(served):
    url, _ = served
    for path in ("/", "/console/static/app.js", "/console/api/overview"):
        assert requests.get(url + path, timeout=30).status_code == 404, path


def test_default_kc_prefix_parses_with_prometheus_client(served):
    url, _ = served
    families = {f.name: f for f in text_string_to_metric_families(requests.get(url + "/metrics", timeout=30).text)}
    for name in ("kc:num_requests_running", "kc:kv_cache_usage_perc", "kc:time_to_first_token_seconds",
                 "kc:time_per_output_token_seconds", "kc:inter_token_latency_seconds", "kc:request_success",
                 "process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds", "python_info"):
        assert name in families, (name, sorted(families))
    assert not any(name.startswith("vllm:") for name in families)
    assert families["kc:time_per_output_token_seconds"].type == "histogram"
    assert families["process_resident_memory_bytes"].samples[0].value > 0
    # every native CPU kernel library is reported, in use (a missing one would read 0, and the log would say why)
    available = {s.labels["component"]: s.value for s in families["kc:component_available"].samples}
    assert available == {f"cpu.{name}": 1.0 for name in ("gguf_matmul", "paged_attention", "pointwise", "small_gemm")}
    assert "component cpu.gguf_matmul: ok" in server_log(served[1])
