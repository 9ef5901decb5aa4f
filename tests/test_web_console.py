"""The web console in a real browser (Debian's chromium driven by Playwright), its JSON endpoints, the vllm:
metrics prefix, `kc chat`'s commands and a log written to a file, against one real `kc serve`; and the page
against hostile text (markup in a model name, a reply, an error) with its Content-Security-Policy, against a
second one serving under a hostile name."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser

import pytest
import requests
from helpers import clean_env
from prometheus_client.parser import text_string_to_metric_families
from test_server_e2e import server_log, start_server, stop_server

API_KEY = "sk-console"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DASHBOARD = os.path.join(os.path.dirname(__file__), "..", "docs", "grafana-dashboard.json")
SAFETY_TIMEOUT = 120  # seconds; only a net under event-driven waits
STATIC = os.path.join(os.path.dirname(__file__), "..", "kernelcore", "entrypoints", "server", "static")
# Markup that would run if the page ever parsed the server's text as HTML (each sets window.__pwned).
HOSTILE_NAME = '<img src=x onerror="window.__pwned=1">'
IMG_PAYLOAD = "<img src=x onerror=window.__pwned=3>"
SCRIPT_PAYLOAD = "<script>window.__pwned=2</script>"
# Added before any script of the page's: CSP violations as the page sees them (DevTools' injection is not subject
# to the page's CSP).
CSP_WATCH = ("window.__csp = []; document.addEventListener('securitypolicyviolation', "
             "(e) => window.__csp.push(`${e.effectiveDirective} ${e.blockedURI}`));")
# A predicate for page.wait_for_function is written as a function ("() => ..."), never a bare expression:
# Playwright evaluates an expression with eval() inside the page, which the page's CSP refuses ('unsafe-eval').


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


def sync_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[test]' (scripts/test.sh does)")
    return sync_playwright()


def watch(page) -> dict[str, list[str]]:
    """What the page must never do, recorded as it happens: script errors, CSP violations (the browser's console
    message and the page's securitypolicyviolation event) and URLs it requested (the API key must be in none)."""
    seen: dict[str, list[str]] = {"errors": [], "csp": [], "urls": []}
    page.on("pageerror", lambda exc: seen["errors"].append(str(exc)))
    page.on("console", lambda msg: seen["csp"].append(msg.text) if "Content Security Policy" in msg.text else None)
    page.on("request", lambda request: seen["urls"].append(request.url))
    page.add_init_script(CSP_WATCH)
    return seen


def assert_clean(page, seen: dict[str, list[str]]) -> None:
    assert not seen["errors"], seen["errors"]
    assert not seen["csp"], seen["csp"]
    assert page.evaluate("window.__csp") == []
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert seen["urls"] and not [u for u in seen["urls"] if API_KEY in u], seen["urls"]


def assert_nothing_injected(page) -> None:
    """No element made from the server's text: no image, no script but the page's own."""
    assert page.query_selector_all("img, iframe, object, embed, style") == []
    assert page.eval_on_selector_all("script", "all => all.map((s) => new URL(s.src).pathname)") == [
        "/console/static/app.js"]


def enter_key(page) -> None:
    page.wait_for_selector("#key-dialog:not([hidden])")  # a JSON call answered 401: the page asks for the key
    page.fill("#api-key", API_KEY)
    page.click("#save-key")


@pytest.mark.slow
def test_browser_chat_stream_stop_and_console(url, tmp_path):
    before = scrape(url)
    aborted_before, finished_before = before["vllm:request_success_total{abort}"], before["vllm:request_success_total"]
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            # The console in its own tab first, so its live charts see the generation below.
            console = browser.new_page(viewport={"width": 1400, "height": 1000})
            console_seen = watch(console)
            console.goto(url + "/#console")
            enter_key(console)
            console.wait_for_selector("#platform dl")

            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page_seen = watch(page)
            page.goto(url + "/")
            enter_key(page)
            page.wait_for_selector("#model option[value='default-model-v1']", state="attached")
            # Long enough that Stop lands mid-generation: 2000 tokens, the EOS ignored.
            page.fill("#max_tokens", "2000")
            page.check("#ignore_eos")
            page.fill("#system", "You are a test.")
            page.fill("#prompt", "Tell me a very long story")
            page.click("#send")
            page.wait_for_function("() => document.querySelector('.msg.assistant .content').textContent.length > 0",
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
            console.wait_for_function(f"() => Console.previous && Console.previous.finished >= {finished_before + 1} "
                                      "&& Console.previous.running === 0",
                                      timeout=SAFETY_TIMEOUT * 1000)
            console.screenshot(path=str(tmp_path / "console.png"), full_page=True)
            # nothing the page did was blocked by its CSP, no script error, the key in no URL
            assert_clean(page, page_seen)
            assert_clean(console, console_seen)
        finally:
            browser.close()
    assert (tmp_path / "console.png").stat().st_size > 10_000


def parse_csp(value: str) -> dict[str, list[str]]:
    directives: dict[str, list[str]] = {}
    for part in value.split(";"):
        if part.strip():
            name, *sources = part.split()
            assert name.lower() not in directives, f"{name} twice in {value!r}"
            directives[name.lower()] = sources
    return directives


@pytest.mark.slow  # on the served console
def test_page_and_assets_carry_the_csp_and_nosniff(url):
    app_js = requests.get(url + "/console/static/app.js", timeout=30)
    answers = {
        "/": requests.get(url + "/", timeout=30),
        "app.js": app_js,
        "style.css": requests.get(url + "/console/static/style.css", timeout=30),
        "HEAD /": requests.head(url + "/", timeout=30),
        "app.js If-Modified-Since": requests.get(url + "/console/static/app.js", timeout=30,
                                                 headers={"If-Modified-Since": app_js.headers["Last-Modified"]}),
        "app.js If-None-Match": requests.get(url + "/console/static/app.js", timeout=30,
                                             headers={"If-None-Match": app_js.headers["ETag"]}),
        "missing asset": requests.get(url + "/console/static/missing.js", timeout=30),
    }
    assert [r.status_code for r in answers.values()] == [200, 200, 200, 200, 304, 304, 404]
    assert answers["/"].headers["Content-Type"].startswith("text/html")
    # nosniff: a script and a stylesheet must say what they are, or the browser refuses them
    assert answers["app.js"].headers["Content-Type"].split(";")[0] in ("text/javascript", "application/javascript")
    assert answers["style.css"].headers["Content-Type"].startswith("text/css")
    for what, r in answers.items():
        assert r.headers.get("X-Content-Type-Options") == "nosniff", what
        assert r.headers.get("Referrer-Policy") == "no-referrer", what
        csp = parse_csp(r.headers.get("Content-Security-Policy", ""))
        assert csp.get("default-src") == ["'none'"], (what, csp)
        script_src = [source.lower() for source in csp.get("script-src", [])]
        assert script_src and not {"'unsafe-inline'", "'unsafe-eval'", "'unsafe-hashes'", "'wasm-unsafe-eval'", "*",
                                    "data:", "blob:", "http:", "https:"} & set(script_src), (what, csp)
        assert "'unsafe-inline'" not in csp.get("style-src", []), (what, csp)
        for directive in ("base-uri", "form-action", "frame-ancestors"):
            assert csp.get(directive) == ["'none'"], (what, directive, csp)
    # the API leaves them alone (its JSON is no page)
    assert "Content-Security-Policy" not in requests.get(url + "/health", timeout=30).headers


class PageAudit(HTMLParser):
    """What in index.html could run code or send the key away: inline script, handlers, styles, javascript: URLs."""

    def __init__(self):
        super().__init__()
        self.problems: list[str] = []
        self.forms: list[dict[str, str | None]] = []
        self.in_script = False

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        for name, value in attrs:
            if name.startswith("on") or name == "style" or (value or "").strip().lower().startswith("javascript:"):
                self.problems.append(f"<{tag} {name}={value!r}>")
        if tag == "style":
            self.problems.append("<style>")
        if tag == "script":
            self.in_script = True
            if not (attributes.get("src") or "").startswith("/console/static/"):
                self.problems.append(f"<script {attributes}>")
        if tag == "form":
            self.forms.append(attributes)
        if tag == "input" and attributes.get("type") == "password" and "name" in attributes:
            self.problems.append("a named password field: a submission would send it")

    def handle_endtag(self, tag):
        self.in_script = self.in_script and tag != "script"

    def handle_data(self, data):
        if self.in_script and data.strip():
            self.problems.append(f"inline script {data.strip()[:40]!r}")


def test_page_has_no_inline_script_and_app_js_never_parses_text_as_markup():
    audit = PageAudit()
    with open(os.path.join(STATIC, "index.html")) as f:
        audit.feed(f.read())
    assert not audit.problems, audit.problems
    assert len(audit.forms) == 2 and all((form.get("method") or "").lower() == "post" for form in audit.forms), \
        audit.forms  # a form without method submits by GET: its fields would land in the URL
    with open(os.path.join(STATIC, "app.js")) as f:
        app_js = f.read()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "createContextualFragment", "DOMParser", ".href", ".src", "location.assign", "location ="):
        assert sink not in app_js, sink


@pytest.fixture(scope="module")
def hostile_url():
    """A second server, serving the model under a name that is markup."""
    proc, url = start_server("--api-key", API_KEY, "--served-model-name", HOSTILE_NAME, "--kv-cache-memory", "16MiB",
                             "--max-model-len", "256")
    yield url
    stop_server(proc)


@pytest.mark.slow
def test_browser_shows_a_hostile_model_name_as_text(hostile_url):
    models = requests.get(hostile_url + "/v1/models", headers=AUTH, timeout=30).json()["data"]
    assert [m["id"] for m in models] == [HOSTILE_NAME]
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            seen = watch(page)
            page.goto(hostile_url + "/")
            enter_key(page)
            page.wait_for_selector("#model option", state="attached")
            assert page.eval_on_selector("#model option", "o => [o.value, o.textContent]") == [HOSTILE_NAME] * 2
            assert page.text_content("#server-info").startswith(HOSTILE_NAME + " · ")
            # the name goes back to the server as it came: a real (short) reply under it
            page.fill("#max_tokens", "3")
            page.fill("#prompt", SCRIPT_PAYLOAD)  # the user's own text is shown as text too
            page.click("#send")
            page.wait_for_selector("#gen-stats[data-status='done']", timeout=SAFETY_TIMEOUT * 1000)
            assert page.text_content(".msg.user .content") == SCRIPT_PAYLOAD
            page.click("#tab-console")
            page.wait_for_selector("#model-info dl")
            assert HOSTILE_NAME in page.text_content("#model-info")
            page.wait_for_selector("#plugins tr[data-plugin='models']")
            assert_nothing_injected(page)
            assert_clean(page, seen)
        finally:
            browser.close()


def sse(*events) -> str:
    return "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"


def chunk(content: str | None = None, finish_reason: str | None = None, role: str | None = None) -> dict:
    delta = {"role": role} if role else {}
    if content is not None:
        delta["content"] = content
    return {"id": "chatcmpl-hostile", "object": "chat.completion.chunk", "created": 0, "model": "default-model-v1",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}


def error_envelope(message: str, status: int = 400) -> dict:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}


@pytest.mark.slow
def test_browser_shows_hostile_replies_and_errors_as_text(url):
    """The chat's POST answered by Playwright with markup in the streamed text, an error reply and a mid-stream
    error: the page shows each literally, creates no element from it, runs nothing, and its CSP is in force."""
    usage = {**chunk(), "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    cases = [  # (what the route answers, the status the page ends in, the text it must show)
        ({"status": 200, "content_type": "text/event-stream",
          "body": sse(chunk("", role="assistant"), chunk(IMG_PAYLOAD), chunk(SCRIPT_PAYLOAD),
                      chunk(finish_reason="stop"), usage)}, "done", IMG_PAYLOAD + SCRIPT_PAYLOAD),
        ({"status": 400, "content_type": "application/json", "body": json.dumps(error_envelope(IMG_PAYLOAD))},
         "error", IMG_PAYLOAD),
        ({"status": 200, "content_type": "text/event-stream",
          "body": sse(chunk("partial", role="assistant"), error_envelope(SCRIPT_PAYLOAD, 500))},
         "error", SCRIPT_PAYLOAD),
    ]
    answers, requests_seen = [case[0] for case in cases], []

    def answer(route):
        requests_seen.append(route.request)
        route.fulfill(**answers[len(requests_seen) - 1])

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            seen = watch(page)
            page.route("**/v1/chat/completions", answer)
            page.goto(url + "/")
            enter_key(page)
            page.wait_for_selector("#model option[value='default-model-v1']", state="attached")
            for _, status, text in cases:
                page.click("#reset")  # status idle, no messages: the next wait cannot see the last case's end
                page.fill("#prompt", "say something hostile")
                page.click("#send")
                page.wait_for_selector(f"#gen-stats[data-status='{status}']")
                assert page.text_content(".msg.assistant .content") == text
                # the two messages are a div holding two spans each, nothing parsed out of the text
                assert page.eval_on_selector_all("#messages *", "all => all.map((e) => e.tagName)") == [
                    "DIV", "SPAN", "SPAN"] * 2
            assert len(requests_seen) == len(cases)
            for request in requests_seen:  # the key went as a header, not in the URL
                assert request.headers["authorization"] == f"Bearer {API_KEY}" and API_KEY not in request.url
            assert_nothing_injected(page)
            assert_clean(page, seen)

            # And the CSP is in force: markup parsed on purpose (as the page never does) still runs nothing, and the
            # browser reports it, so the checks above would have seen a violation.
            with page.expect_console_message(lambda msg: "Content Security Policy" in msg.text):
                page.evaluate("""() => { const d = document.createElement('div');
                    d.innerHTML = '<img src="data:," onerror="window.__pwned=4">';
                    document.body.append(d); }""")
            page.wait_for_function("() => window.__csp.some((v) => v.startsWith('script-src'))")
            assert page.evaluate("typeof window.__pwned") == "undefined"
        finally:
            browser.close()


@pytest.mark.slow  # on the served console
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


@pytest.mark.slow  # on the served console
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


@pytest.mark.slow  # on the served console
def test_default_max_tokens_applies_to_chat_and_completions(url):
    chat = requests.post(url + "/v1/chat/completions", headers=AUTH, timeout=60,
                         json={"messages": [{"role": "user", "content": "Hi"}], "ignore_eos": True}).json()
    assert chat["usage"]["completion_tokens"] == 5
    completion = requests.post(url + "/v1/completions", headers=AUTH, timeout=60,
                               json={"prompt": "Hi", "ignore_eos": True}).json()
    assert completion["usage"]["completion_tokens"] == 5


@pytest.mark.slow  # on the served console
def test_kc_chat_prints_model_and_url_and_answers_commands_locally(url):
    script = "/help\n/system Be brief.\nhello\n/reset\n/bogus\n//slash message\n/exit\nnever sent\n"
    before = scrape(url)["vllm:request_success_total"]
    proc = subprocess.run([sys.executable, "-m", "kernelcore.entrypoints.cli", "chat", "--url", url, "--max-tokens",
                           "3"],
                          env=clean_env(KC_API_KEY=API_KEY), input=script, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"model default-model-v1 at {url}" in out and "/help for commands" in out
    assert "/reset" in out and "/system TEXT" in out  # the help text
    assert "(system message set; conversation cleared)" in out and "(conversation cleared)" in out
    assert "unknown command /bogus" in out
    # exactly two messages reached the model ("hello", "/slash message"); the commands and "never sent" did not
    assert scrape(url)["vllm:request_success_total"] == before + 2


@pytest.mark.slow  # on the served console
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
