"""The web console in a real browser (Debian's chromium driven by Playwright), its JSON endpoints, the vllm:
metrics prefix, `kc chat`'s commands and a log written to a file, against one real `kc serve`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from helpers import clean_env
from test_server_e2e import server_log, start_server, stop_server

API_KEY = "sk-console"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DASHBOARD = os.path.join(os.path.dirname(__file__), "..", "docs", "grafana-dashboard.json")
SAFETY_TIMEOUT = 120  # seconds; only a net under event-driven waits


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    trace = tmp_path_factory.mktemp("console") / "trace.jsonl"
    proc, url = start_server("--api-key", API_KEY, "--metrics-prefix", "vllm", "--default-max-tokens", "5",
                             KC_TRACE_PLUGINS=str(trace))
    yield url, proc  # its output goes to a file: proc.log_path
    stop_server(proc)


@pytest.fixture(scope="module")
def url(served):
    return served[0]


def scrape(url: str) -> dict[str, float]:
    """Every sample of /metrics parsed by prometheus_client: name -> sum over labels; also name{finished_reason}."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(requests.get(url + "/metrics", timeout=30).text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
            if "finished_reason" in sample.labels:
                values[f"{sample.name}{{{sample.labels['finished_reason']}}}"] = sample.value
    return values


def wait_for(predicate, what: str):
    """Poll ``predicate`` (an HTTP read each time) until it holds; the deadline is only a safety net."""
    deadline = time.monotonic() + SAFETY_TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, f"never saw: {what}"
        time.sleep(0.2)


def launch_chromium(playwright):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: the browser test needs Debian's chromium. scripts/test.sh installs it "
                    "(apt-get update && apt-get install -y chromium); install it, then rerun.")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


@pytest.mark.slow
def test_browser_chat_stream_stop_and_console(url, tmp_path):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[test]' (scripts/test.sh does)")
    before = scrape(url)
    aborted_before, finished_before = before["vllm:request_success_total{abort}"], before["vllm:request_success_total"]
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            errors = []
            # The console in its own tab first, so its live charts see the generation below.
            console = browser.new_page(viewport={"width": 1400, "height": 1000})
            console.on("pageerror", lambda exc: errors.append(str(exc)))
            console.goto(url + "/#console")
            console.wait_for_selector("#key-dialog:not([hidden])")  # a JSON call answered 401: the page asks for the key
            console.fill("#api-key", API_KEY)
            console.click("#save-key")
            console.wait_for_selector("#platform dl")

            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url + "/")
            page.wait_for_selector("#key-dialog:not([hidden])")
            page.fill("#api-key", API_KEY)
            page.click("#save-key")
            page.wait_for_selector("#model option[value='default-model-v1']", state="attached")
            # Long enough that Stop lands mid-generation: 2000 tokens, the EOS ignored.
            page.fill("#max_tokens", "2000")
            page.check("#ignore_eos")
            page.fill("#system", "You are a test.")
            page.fill("#prompt", "Tell me a very long story")
            page.click("#send")
            page.wait_for_function("document.querySelector('.msg.assistant .content').textContent.length > 0",
                                   timeout=SAFETY_TIMEOUT * 1000)
            assert page.get_attribute("#gen-stats", "data-status") == "streaming"
            assert scrape(url)["vllm:num_requests_running"] == 1
            page.screenshot(path=str(tmp_path / "chat.png"))
            page.click("#stop")
            page.wait_for_selector("#gen-stats[data-status='stopped']")
            assert page.is_disabled("#stop") and page.is_enabled("#send")
            wait_for(lambda: scrape(url)["vllm:num_requests_running"] == 0, "running back to 0 after Stop")
            assert scrape(url)["vllm:request_success_total{abort}"] == aborted_before + 1
            assert "tokens/s" in page.text_content("#gen-stats")

            platform = console.text_content("#platform")
            assert "cpu" in platform and "built-in platform detected" in platform
            for plugin in ("cpu", "models", "lora", "dummy_model", "dummy_stat_logger"):
                console.wait_for_selector(f"#plugins tr[data-plugin='{plugin}']")
            assert "kc-dummy-model" in console.text_content("#plugins tr[data-plugin='dummy_model']")
            assert "register_models" in console.text_content("#plugins tr[data-plugin='models']")
            engine_row = console.text_content("#processes tr[data-role='engine-core']")
            assert "models" in engine_row and "alive" in engine_row
            console.wait_for_selector("#timeline .proc[data-process^='engine-core']")
            assert "register_models" in console.text_content("#timeline")
            # the charts: wait for a stats poll that saw the aborted request counted and nothing running
            console.wait_for_function(f"Console.previous && Console.previous.finished >= {finished_before + 1} "
                                      "&& Console.previous.running === 0",
                                      timeout=SAFETY_TIMEOUT * 1000)
            console.screenshot(path=str(tmp_path / "console.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()
    assert (tmp_path / "console.png").stat().st_size > 10_000


def test_console_endpoints_need_the_key_but_the_page_does_not(url):
    assert requests.get(url + "/", timeout=30).status_code == 200
    assert requests.get(url + "/console/static/app.js", timeout=30).status_code == 200
    for path in ("/console/api/overview", "/console/api/stats", "/console/api/trace", "/v1/models",
                 "/console/static/../v1/models", "/console/static/%2e%2e/v1/models"):
        assert requests.get(url + path, timeout=30).status_code in (401, 404), path
    overview = requests.get(url + "/console/api/overview", headers=AUTH, timeout=30).json()
    assert overview["platform"]["name"] == "cpu" and overview["metrics_prefix"] == "vllm"
    roles = [p["role"] for p in overview["processes"]]
    assert roles[:2] == ["frontend", "engine-core"]
    engine = overview["processes"][1]
    assert engine["parent_pid"] == overview["processes"][0]["pid"]
    assert {"cpu", "models"} <= {p["name"] for p in engine["plugins"]}
    trace = requests.get(url + "/console/api/trace", headers=AUTH, timeout=30).json()
    assert trace["enabled"] and {e["role"] for e in trace["events"]} >= {"frontend", "engine-core"}
    later = requests.get(url + f"/console/api/trace?offset={trace['offset']}", headers=AUTH, timeout=30).json()
    assert all(e not in trace["events"] for e in later["events"])


def test_vllm_prefix_parses_and_the_dashboard_finds_its_metrics(url):
    r = requests.post(url + "/v1/completions", headers=AUTH, json={"prompt": "Hi", "max_tokens": 4, "ignore_eos": True},
                      timeout=60)
    assert r.status_code == 200
    values = scrape(url)
    names = {name.split("{")[0] for name in values}
    assert not any(n.startswith("kc:") for n in names)
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:time_per_output_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "python_info"):
        assert name in names, name
    assert values["vllm:time_per_output_token_seconds_count"] == values["vllm:inter_token_latency_seconds_count"] > 0
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 8
    for expr in exprs:
        for metric in re.findall(r"\$\{prefix\}:[a-z0-9_]+|process_[a-z_]+", expr):
            metric = metric.replace("${prefix}", "vllm")
            assert any(n == metric or n.startswith(metric + "_") for n in names), (metric, expr)


def test_default_max_tokens_applies_to_chat_and_completions(url):
    chat = requests.post(url + "/v1/chat/completions", headers=AUTH, timeout=60,
                         json={"messages": [{"role": "user", "content": "Hi"}], "ignore_eos": True}).json()
    assert chat["usage"]["completion_tokens"] == 5
    completion = requests.post(url + "/v1/completions", headers=AUTH, timeout=60,
                               json={"prompt": "Hi", "ignore_eos": True}).json()
    assert completion["usage"]["completion_tokens"] == 5


def test_kc_chat_prints_model_and_url_and_answers_commands_locally(url):
    script = "/help\n/system Be brief.\nhello\n/reset\n/bogus\n//slash message\n/exit\nnever sent\n"
    before = scrape(url)["vllm:request_success_total"]
    proc = subprocess.run([sys.executable, "-m", "kernelcore.entrypoints.cli", "chat", "--url", url, "--max-tokens", "3"],
                          env=clean_env(KC_API_KEY=API_KEY), input=script, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"model default-model-v1 at {url}" in out and "/help for commands" in out
    assert "/reset" in out and "/system TEXT" in out  # the help text
    assert "(system message set; conversation cleared)" in out and "(conversation cleared)" in out
    assert "unknown command /bogus" in out
    # exactly two messages reached the model ("hello", "/slash message"); the commands and "never sent" did not
    assert scrape(url)["vllm:request_success_total"] == before + 2


def test_log_file_has_plain_lines_no_progress_bars(served):
    text = server_log(served[1])
    assert "\r" not in text and "%|" not in text and "\x1b[" not in text, text
    assert "Loading weights: 1 safetensors file(s)" in text
    assert "Its weights are random: it answers with random text" in text and "default-model-v1" in text
    for line in text.splitlines():  # every line is a log record, an echo of ours, or a traceback (none expected)
        assert line.split(" ", 1)[0] in ("INFO", "WARNING", "Starting"), text


def test_read_trace_returns_whole_lines_and_resumes_from_the_offset(tmp_path):
    from kernelcore.entrypoints.server.console import read_trace

    path = tmp_path / "trace.jsonl"
    path.write_text('{"hook": "a"}\n{"hook": "b"}\n{"hook": "c"')  # the last line is still being written
    events, offset = read_trace(str(path), 0)
    assert [e["hook"] for e in events] == ["a", "b"]
    with open(path, "a") as f:
        f.write('}\n')
    events, offset = read_trace(str(path), offset)
    assert [e["hook"] for e in events] == ["c"] and offset == path.stat().st_size
    assert read_trace(str(tmp_path / "missing.jsonl"), 5) == ([], 0)
