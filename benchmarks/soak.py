"""A bounded soak of the real `kc serve`: mixed traffic at about 80% of the measured capacity, for --minutes.

    python benchmarks/soak.py                                  # 30 minutes, docs/soak-memory.svg, JSON on stdout
    python benchmarks/soak.py --minutes 3 --capacity-seconds 15 --out /tmp/soak.json --plot /tmp/soak.svg

Never part of CI as such: tests/test_soak.py runs a 3-minute version of it (same functions) with bounds that do
not depend on the machine's speed.

One server: the embedded default model (random weights, a real tokenizer and chat template) with a PEFT LoRA
adapter made on it (`--lora-modules soak-lora=...`, peft from the `test` extra) and the hermes tool-call parser
(`--enable-auto-tool-choice`). Phases, each request drawn from the same weighted mix (MIX):

  1. warm-up: one request of every kind and bad variant in turn (fails fast on a broken setup);
  2. capacity: a closed loop of --concurrency clients sending back to back for --capacity-seconds; the capacity
     is the requests/s of the mix it finishes (saturation);
  3. soak: an open loop, Poisson arrivals at --load x capacity (default 0.8) for --minutes; requests do not wait
     for each other, so a slower machine queues them rather than sending fewer;
  4. drain: every response is awaited, then /metrics must show num_requests_running and num_requests_waiting
     back to 0 (waited for as an event, up to --drain-timeout).

The resident memory (RSS) of the server's process tree (the API process and all its children, summed with
psutil) is sampled every --sample-seconds from start-up to the end; the growth reported is from the end of the
capacity phase (warm: every kind has run at saturation) to after the drain, both idle.

Every good request must end with 200 and a well-formed body (a stream's events all JSON, one finish per
choice, its usage and then `data: [DONE]`; the asked number of choices and tokens; JSON that meets the schema;
a forced tool call whose arguments meet the tool's schema); a disconnect client must have had its first chunks
(then it closes the connection); every bad request must get a 4xx with an error body. A 5xx, also one sent as
an error event inside a stream, fails the run. The JSON result has per-window (--window-minutes, default 5)
p50/p99 latency of the good requests (disconnects excluded), counts by kind and status class, the RSS series
and the checks; the plot (hand-written SVG) is RSS against time with the phases shaded.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import shlex
import subprocess
import sys
import tempfile
import threading
import time

import click

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

BASE, LORA = "soak-base", "soak-lora"
MIX = {  # kind -> weight (percent of the requests)
    "chat_stream": 20,      # streamed chat, usage in the stream
    "completion": 15,       # non-streamed completions
    "disconnect": 10,       # a streamed completion whose client reads 3 chunks and closes the connection
    "n2": 10,               # chat with n=2, streamed or not
    "json_schema": 10,      # chat with response_format json_schema (strict)
    "lora": 10,             # completions (streamed or not) on the LoRA adapter's model name
    "tool_auto": 5,         # chat with tools, tool_choice auto (hermes parser)
    "tool_required": 5,     # chat with tools, tool_choice required (a forced, schema-valid call)
    "bad": 15,              # malformed JSON, unknown model, invalid parameters: must get 4xx
}
BAD_VARIANTS = {  # name -> (path, raw body or JSON body); every one must be answered with a 4xx
    "malformed_json": ("/v1/chat/completions", b'{"model": "soak-base", "messages": [{"role": '),
    "not_an_object": ("/v1/completions", b"[1, 2, 3]"),
    "unknown_model": ("/v1/completions", {"model": "no-such-model", "prompt": "hello", "max_tokens": 4}),
    "negative_max_tokens": ("/v1/completions", {"model": BASE, "prompt": "hello", "max_tokens": -1}),
    "bad_temperature": ("/v1/chat/completions", {"model": BASE, "messages": [{"role": "user", "content": "x"}],
                                                 "temperature": -2}),
    "n_zero": ("/v1/chat/completions", {"model": BASE, "messages": [{"role": "user", "content": "x"}], "n": 0}),
    "no_messages": ("/v1/chat/completions", {"model": BASE, "max_tokens": 4}),
    "bad_response_format": ("/v1/chat/completions", {"model": BASE, "messages": [{"role": "user", "content": "x"}],
                                                     "response_format": {"type": "xml"}}),
    "required_without_tools": ("/v1/chat/completions", {"model": BASE, "messages": [{"role": "user", "content": "x"}],
                                                        "tool_choice": "required"}),
    "prompt_too_long": ("/v1/completions", {"model": BASE, "prompt": [5] * 1100, "max_tokens": 4}),
}
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "color": {"enum": ["red", "green", "blue"]}, "member": {"type": "boolean"}},
    "required": ["name", "age", "color", "member"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"],
        "additionalProperties": False}}},
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
WORDS = ("the quick brown fox jumps over the lazy dog once upon a time in a small village at the edge of a great "
         "forest there lived an old clockmaker what is the capital of france how many days are there in a week").split()
MAX_MODEL_LEN = 1024
SERVER_FLAGS = ["--served-model-name", BASE, "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2",
                "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-model-len", str(MAX_MODEL_LEN),
                "--kv-cache-memory", "64MiB", "--shutdown-timeout", "2"]
MIB = 1 << 20


# -- the server ---------------------------------------------------------------------------------------------------


def make_adapter(work_dir: str) -> str:
    """A rank-8 PEFT adapter (all linears) on the embedded default model, made once per work dir."""
    from kernelcore.models.default_model import ensure_default_model

    path = os.path.join(work_dir, "soak-adapter")
    if not os.path.isfile(os.path.join(path, "adapter_config.json")):
        from lora_helpers import make_peft_adapter

        make_peft_adapter(ensure_default_model(), path, "llama", seed=11, rank=8, std=0.02)
    return path


def start_server(adapter: str, log_path: str, extra: list[str] = (),
                 timeout: float = 600) -> tuple[subprocess.Popen, str]:
    """`kc serve` (default model + the adapter + hermes tools) on a free port, output to ``log_path``."""
    from helpers import start_server as start_kc

    return start_kc(*SERVER_FLAGS, "--lora-modules", f"{LORA}={adapter}", *extra, timeout=timeout, log_path=log_path)


def read_log(proc: subprocess.Popen) -> str:
    from helpers import server_log

    return server_log(proc)


def stop_server(proc: subprocess.Popen) -> None:
    from helpers import stop_server as stop_kc

    stop_kc(proc, timeout=60)


def tree_rss(pid: int) -> dict[str, int]:
    """Resident bytes of the process ("api") and each descendant (by process title), {} once it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out: dict[str, int] = {}
    for p in procs:
        try:
            name = "api" if p.pid == pid else p.name()
            out[name] = out.get(name, 0) + p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return out


class RssSampler:
    """A thread sampling tree_rss(pid) every ``interval`` s: samples [(seconds since t0, total bytes)] and
    parts [(seconds, {process: bytes})]."""

    def __init__(self, pid: int, interval: float, t0: float) -> None:
        self.pid, self.interval, self.t0 = pid, interval, t0
        self.samples: list[tuple[float, int]] = []
        self.parts: list[tuple[float, dict[str, int]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict[str, int]:
        """One sample now (also recorded): {process: bytes}."""
        parts = tree_rss(self.pid)
        with self._lock:
            t = time.monotonic() - self.t0
            self.samples.append((t, sum(parts.values())))
            self.parts.append((t, parts))
        return parts

    def series(self) -> dict[str, list[tuple[float, float]]]:
        """MiB against seconds, in time order: "total" and each process."""
        with self._lock:
            parts = sorted(self.parts, key=lambda item: item[0])
        names = sorted({name for _, p in parts for name in p})
        out = {"total": [(t, sum(p.values()) / MIB) for t, p in parts]}
        out.update({name: [(t, p.get(name, 0) / MIB) for t, p in parts] for name in names})
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def engine_gauges(url: str) -> tuple[float, float]:
    """(num_requests_running, num_requests_waiting) from /metrics, summed over label sets."""
    import requests

    running = waiting = 0.0
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith(":num_requests_running"):
            running += float(line.rsplit(" ", 1)[1])
        elif name.endswith(":num_requests_waiting"):
            waiting += float(line.rsplit(" ", 1)[1])
    return running, waiting


def wait_idle(url: str, timeout: float) -> tuple[bool, float, tuple[float, float]]:
    """Wait (polling) until running and waiting are both 0: (reached, seconds waited, last gauges)."""
    start = time.monotonic()
    gauges = engine_gauges(url)
    while gauges != (0.0, 0.0) and time.monotonic() - start < timeout:
        time.sleep(0.5)
        gauges = engine_gauges(url)
    return gauges == (0.0, 0.0), time.monotonic() - start, gauges


# -- the requests -------------------------------------------------------------------------------------------------


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _messages(rng: random.Random) -> list[dict]:
    return [{"role": "user", "content": _text(rng, rng.randint(4, 40))}]


def make_request(kind: str, rng: random.Random, variant: str | None = None) -> dict:
    """One request of ``kind``: {kind, variant, path, body (dict or raw bytes), stream, expect}."""
    m = rng.randint(8, 32)
    spec = {"kind": kind, "variant": variant, "stream": False, "expect": {}}
    if kind == "chat_stream":
        spec.update(path="/v1/chat/completions", stream=True, expect={"choices": 1, "tokens": m}, body={
            "model": BASE, "messages": _messages(rng), "max_tokens": m, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": rng.choice([0, 0.8])})
    elif kind in ("completion", "lora"):
        stream = kind == "lora" and rng.random() < 0.5
        model = LORA if kind == "lora" else BASE
        spec.update(path="/v1/completions", stream=stream, expect={"choices": 1, "tokens": m, "model": model}, body={
            "model": model, "prompt": _text(rng, rng.randint(4, 60)), "max_tokens": m, "ignore_eos": True,
            "temperature": rng.choice([0, 0.7]), "stream": stream, "stream_options": {"include_usage": True}})
        if not stream:
            del spec["body"]["stream_options"]
    elif kind == "disconnect":
        spec.update(path="/v1/completions", stream=True, expect={"chunks": 3}, body={
            "model": rng.choice([BASE, LORA]), "prompt": _text(rng, rng.randint(4, 60)), "max_tokens": 128,
            "ignore_eos": True, "stream": True})
    elif kind == "n2":
        stream = rng.random() < 0.5
        spec.update(path="/v1/chat/completions", stream=stream, expect={"choices": 2, "tokens": 2 * m}, body={
            "model": BASE, "messages": _messages(rng), "n": 2, "max_tokens": m, "ignore_eos": True,
            "temperature": 0.9, "seed": rng.randrange(1 << 30), "stream": stream})
        if stream:
            spec["body"]["stream_options"] = {"include_usage": True}
    elif kind == "json_schema":
        spec.update(path="/v1/chat/completions", expect={"choices": 1, "schema": PERSON}, body={
            "model": BASE, "messages": _messages(rng), "max_tokens": 200, "temperature": 1.0,
            "seed": rng.randrange(1 << 30), "structured_outputs": {"disable_any_whitespace": True},
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                       "strict": True}}})
    elif kind == "tool_auto":
        stream = rng.random() < 0.5
        spec.update(path="/v1/chat/completions", stream=stream, expect={"choices": 1, "tools": "auto"}, body={
            "model": BASE, "messages": _messages(rng), "tools": TOOLS, "tool_choice": "auto", "max_tokens": m,
            "temperature": 0.8, "stream": stream})
    elif kind == "tool_required":
        spec.update(path="/v1/chat/completions", expect={"choices": 1, "tools": "required"}, body={
            "model": BASE, "messages": _messages(rng), "tools": TOOLS, "tool_choice": "required",
            "parallel_tool_calls": False, "max_tokens": 200, "temperature": 0.8, "seed": rng.randrange(1 << 30),
            "structured_outputs": {"disable_any_whitespace": True}})
    elif kind == "bad":
        variant = variant or rng.choice(sorted(BAD_VARIANTS))
        path, body = BAD_VARIANTS[variant]
        spec.update(path=path, body=body, variant=variant, expect={"bad": True})
    else:
        raise ValueError(kind)
    return spec


def draw(rng: random.Random) -> dict:
    kinds = list(MIX)
    return make_request(rng.choices(kinds, weights=[MIX[k] for k in kinds])[0], rng)


class BadBody(Exception):
    pass


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise BadBody(message)


def _check_usage(usage: dict | None, expect: dict) -> None:
    _check(isinstance(usage, dict), f"no usage: {usage!r}")
    if "tokens" in expect:
        _check(usage.get("completion_tokens") == expect["tokens"],
               f"completion_tokens {usage.get('completion_tokens')} != {expect['tokens']}")


def _check_tool_call(call: dict) -> None:
    import jsonschema

    fn = call.get("function") or {}
    _check(fn.get("name") in TOOL_SCHEMAS, f"unknown tool {fn.get('name')!r}")
    try:
        jsonschema.validate(json.loads(fn.get("arguments") or ""), TOOL_SCHEMAS[fn["name"]])
    except (ValueError, jsonschema.ValidationError) as exc:
        raise BadBody(f"tool arguments {fn.get('arguments')!r}: {exc}") from None


def check_full(spec: dict, body: dict) -> None:
    """A non-streamed answer of a good request: raises BadBody when it is not what was asked."""
    import jsonschema

    expect, chat = spec["expect"], spec["path"].endswith("chat/completions")
    _check(body.get("object") == ("chat.completion" if chat else "text_completion"), f"object {body.get('object')}")
    if "model" in expect:
        _check(body.get("model") == expect["model"], f"model {body.get('model')!r}")
    choices = body.get("choices") or []
    _check(sorted(c.get("index") for c in choices) == list(range(expect["choices"])), f"{len(choices)} choices")
    _check_usage(body.get("usage"), expect)
    for c in choices:
        finish = c.get("finish_reason")
        if "tokens" in expect:
            _check(finish == "length", f"finish_reason {finish!r} with ignore_eos")
            _check(isinstance(c["message"]["content"] if chat else c.get("text"), str), "no text")
        if "schema" in expect:
            _check(finish == "stop", f"json_schema finish_reason {finish!r}")
            try:
                jsonschema.validate(json.loads(c["message"]["content"]), expect["schema"])
            except (ValueError, TypeError, jsonschema.ValidationError) as exc:
                raise BadBody(f"json_schema content {c['message'].get('content')!r}: {exc}") from None
        if expect.get("tools") == "required":
            calls = c["message"].get("tool_calls") or []
            _check(finish == "tool_calls" and len(calls) == 1, f"required: {finish!r}, {len(calls)} calls")
            _check_tool_call(calls[0])
        if expect.get("tools") == "auto":
            _check(finish in ("stop", "length", "tool_calls"), f"auto finish_reason {finish!r}")
            for call in c["message"].get("tool_calls") or []:
                _check_tool_call(call)


def check_stream(spec: dict, events: list) -> None:
    """A streamed answer (its data events, decoded; the last one the string '[DONE]')."""
    expect, chat = spec["expect"], spec["path"].endswith("chat/completions")
    _check(events and events[-1] == "[DONE]", "the stream did not end with [DONE]")
    chunks = events[:-1]
    _check("[DONE]" not in chunks, "[DONE] before the end")
    finishes: dict[int, list] = {}
    usage = None
    for chunk in chunks:
        _check(isinstance(chunk, dict) and "error" not in chunk, f"error event {chunk!r}")
        _check(chunk.get("object") == ("chat.completion.chunk" if chat else "text_completion"),
               f"chunk object {chunk.get('object')}")
        if "model" in expect:
            _check(chunk.get("model") == expect["model"], f"chunk model {chunk.get('model')!r}")
        for c in chunk.get("choices") or []:
            if c.get("finish_reason"):
                finishes.setdefault(c["index"], []).append(c["finish_reason"])
            if chat:
                for call in (c.get("delta") or {}).get("tool_calls") or []:
                    _check("index" in call, "tool call delta without index")
        if chunk.get("usage"):
            usage = chunk["usage"]
    _check(sorted(finishes) == list(range(expect["choices"])), f"finishes {finishes}")
    for index, fin in finishes.items():
        _check(len(fin) == 1, f"choice {index}: finishes {fin}")
        if "tokens" in expect:
            _check(fin == ["length"], f"choice {index}: finish {fin} with ignore_eos")
        else:
            _check(fin[0] in ("stop", "length", "tool_calls"), f"choice {index}: finish {fin}")
    if "tokens" in expect:
        _check_usage(usage, expect)


def _status_class(status: int | None) -> str:
    return f"{status // 100}xx" if status else "none"


async def send(session, url: str, spec: dict, t0: float, timeout: float) -> dict:
    """Send one request and judge its answer: a record {kind, variant, start, latency, status, ok, error}."""
    import aiohttp

    rec = {"kind": spec["kind"], "variant": spec["variant"], "start": time.monotonic() - t0, "status": None,
           "ok": False, "error": None}
    started = time.monotonic()
    body = spec["body"]
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        async with session.post(url + spec["path"], data=data, headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            rec["status"] = resp.status
            if spec["kind"] == "bad":
                text = await resp.text()
                if 400 <= resp.status < 500:
                    try:
                        error = json.loads(text)["error"]
                        _check(bool(error.get("message")), "error without message")
                        rec["ok"] = True
                    except (ValueError, KeyError, TypeError, BadBody):
                        rec["error"] = f"4xx without an error body: {text[:200]!r}"
                else:
                    rec["error"] = f"bad request answered {resp.status}: {text[:300]!r}"
            elif resp.status != 200:
                rec["error"] = f"status {resp.status}: {(await resp.text())[:300]!r}"
            elif spec["stream"]:
                events = []
                want = spec["expect"].get("chunks")
                async for line in resp.content:
                    line = line.strip()
                    if not line.startswith(b"data: "):
                        continue
                    payload = line[6:].decode()
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
                    if isinstance(events[-1], dict) and "error" in events[-1]:
                        error = events[-1]["error"]
                        rec["status"] = error.get("code") if isinstance(error.get("code"), int) else 500
                        raise BadBody(f"error event mid-stream: {error}")
                    if want and len(events) >= want:
                        break  # the disconnect client: close the connection mid-stream
                if want:
                    resp.close()
                    _check(len(events) >= want or events[-1:] == ["[DONE]"], f"{len(events)} chunks before the end")
                else:
                    check_stream(spec, events)
                rec["ok"] = True
            else:
                check_full(spec, json.loads(await resp.text()))
                rec["ok"] = True
    except BadBody as exc:
        rec["error"] = str(exc)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["latency"] = time.monotonic() - started
    return rec


def _session(limit: int = 0):
    import aiohttp

    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit), raise_for_status=False)


async def warm_up(url: str, t0: float, rng: random.Random, timeout: float) -> list[dict]:
    """Every kind once (and every bad variant), in turn."""
    async with _session() as session:
        specs = [make_request(k, rng) for k in MIX if k != "bad"]
        specs += [make_request("bad", rng, variant) for variant in sorted(BAD_VARIANTS)]
        return [await send(session, url, spec, t0, timeout) for spec in specs]


async def closed_loop(url: str, t0: float, rng: random.Random, seconds: float, concurrency: int,
                      timeout: float) -> tuple[list[dict], float]:
    """``concurrency`` clients back to back for ``seconds``: (records, requests/s finished)."""
    records: list[dict] = []
    start = time.monotonic()
    deadline = start + seconds

    async def client(session) -> None:
        while time.monotonic() < deadline:
            records.append(await send(session, url, draw(rng), t0, timeout))

    async with _session() as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    elapsed = time.monotonic() - start
    return records, len(records) / elapsed


async def open_loop(url: str, t0: float, rng: random.Random, seconds: float, rate: float, timeout: float,
                    progress=None) -> list[dict]:
    """Poisson arrivals at ``rate``/s for ``seconds``, each request on its own; waits for every answer."""
    tasks = []
    async with _session() as session:
        start = time.monotonic()
        next_at = start + rng.expovariate(rate)
        while next_at < start + seconds:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(send(session, url, draw(rng), t0, timeout)))
            if progress is not None:
                progress(tasks)
            next_at += rng.expovariate(rate)
        return list(await asyncio.gather(*tasks))


# -- the report -------------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0-100)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def windows(records: list[dict], start: float, seconds: float, window: float) -> list[dict]:
    """Per window of arrival time: good finished requests' p50/p99 latency (ms) and the counts by status class."""
    out = []
    for i in range(max(1, math.ceil(seconds / window - 1e-9))):
        lo, hi = start + i * window, start + min((i + 1) * window, seconds)
        inside = [r for r in records if lo <= r["start"] < hi]
        lat = [r["latency"] * 1000 for r in inside if r["ok"] and r["kind"] not in ("bad", "disconnect")]
        classes: dict[str, int] = {}
        for r in inside:
            classes[_status_class(r["status"])] = classes.get(_status_class(r["status"]), 0) + 1
        out.append({"window": i, "from_s": round(lo - start, 1), "to_s": round(hi - start, 1),
                    "requests": len(inside), "good_timed": len(lat), "p50_ms": _round(percentile(lat, 50)),
                    "p99_ms": _round(percentile(lat, 99)), "status": classes})
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def summarize(records: list[dict]) -> dict:
    """Counts by kind (sent, ok, status classes) and the failures (first 20)."""
    kinds: dict[str, dict] = {}
    for r in records:
        k = kinds.setdefault(r["kind"], {"sent": 0, "ok": 0, "status": {}})
        k["sent"] += 1
        k["ok"] += r["ok"]
        cls = _status_class(r["status"])
        k["status"][cls] = k["status"].get(cls, 0) + 1
    bad_codes: dict[str, dict] = {}
    for r in records:
        if r["kind"] == "bad":
            codes = bad_codes.setdefault(r["variant"], {})
            codes[str(r["status"])] = codes.get(str(r["status"]), 0) + 1
    failures = [r for r in records if not r["ok"]]
    return {"requests": len(records), "by_kind": kinds, "bad_variants": bad_codes,
            "status": {c: sum(1 for r in records if _status_class(r["status"]) == c)
                       for c in sorted({_status_class(r["status"]) for r in records})},
            "num_5xx": sum(1 for r in records if (r["status"] or 0) >= 500),
            "good": sum(1 for r in records if r["kind"] != "bad"),
            "good_ok": sum(1 for r in records if r["kind"] != "bad" and r["ok"]),
            "bad": sum(1 for r in records if r["kind"] == "bad"),
            "bad_4xx": sum(1 for r in records if r["kind"] == "bad" and r["ok"]),
            "failures": len(failures), "first_failures": failures[:20]}


def log_problems(text: str) -> list[str]:
    """The server log's ERROR and Traceback lines."""
    return [line for line in text.splitlines() if " ERROR " in line or line.startswith("ERROR") or
            "Traceback" in line]


def write_svg(path: str, series: dict[str, list[tuple[float, float]]], phases: list[tuple[str, float, float]],
              title: str, marks: list[tuple[str, float]] = ()) -> None:
    """RSS (MiB) against minutes, one polyline per series ("total" first, thick), the phases shaded; by hand
    (no plotting library needed)."""
    width, height, left, right, top, bottom = 860, 400, 70, 20, 40, 70
    pw, ph = width - left - right, height - top - bottom
    xs = [t / 60 for points in series.values() for t, _ in points] or [0.0]
    ys = [v for points in series.values() for _, v in points] or [0.0]
    x_max = max(max(xs), max((b / 60 for _, _, b in phases), default=0.0), 1e-3)
    y_lo, y_hi = 0.0, max(max(ys) * 1.08, 1.0)

    def step(span: float, n: int) -> float:
        raw = span / n
        mag = 10 ** math.floor(math.log10(raw))
        return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)

    x_of = lambda x: left + pw * x / x_max  # noqa: E731
    y_of = lambda y: top + ph * (1 - (y - y_lo) / (y_hi - y_lo))  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="14">{_esc(title)}</text>']
    colours = {"capacity": "#fde2c8", "soak": "#dbeafe", "drain": "#e5e7eb", "start-up": "#f3f4f6"}
    for name, a, b in phases:
        xa, xb = x_of(a / 60), x_of(b / 60)
        out.append(f'<rect x="{xa:.1f}" y="{top}" width="{max(xb - xa, 0.5):.1f}" height="{ph}" '
                   f'fill="{colours.get(name, "#eeeeee")}"/>')
        out.append(f'<text x="{(xa + xb) / 2:.1f}" y="{top + 14}" text-anchor="middle" fill="#555">{_esc(name)}</text>')
    ys_step = step(y_hi - y_lo, 6)
    y = math.ceil(y_lo / ys_step) * ys_step
    while y <= y_hi:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y_of(y):.1f}" y2="{y_of(y):.1f}" stroke="#ccc" '
                   'stroke-width="0.5"/>')
        out.append(f'<text x="{left - 6}" y="{y_of(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        y += ys_step
    xs_step = step(x_max, 10)
    x = 0.0
    while x <= x_max + 1e-9:
        out.append(f'<line x1="{x_of(x):.1f}" x2="{x_of(x):.1f}" y1="{top + ph}" y2="{top + ph + 5}" stroke="#000"/>')
        out.append(f'<text x="{x_of(x):.1f}" y="{top + ph + 18}" text-anchor="middle">{x:g}</text>')
        x += xs_step
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#000"/>')
    palette = ["#1d4ed8", "#15803d", "#9333ea", "#b45309", "#0f766e"]
    for i, (name, pts) in enumerate(series.items()):
        colour = palette[i % len(palette)]
        points = " ".join(f"{x_of(t / 60):.1f},{y_of(v):.1f}" for t, v in pts)
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" '
                   f'stroke-width="{2 if i == 0 else 1.2}"/>')
        lx = left + 10 + 170 * i
        out.append(f'<line x1="{lx}" x2="{lx + 20}" y1="{height - 12}" y2="{height - 12}" stroke="{colour}" '
                   f'stroke-width="2"/>')
        out.append(f'<text x="{lx + 25}" y="{height - 8}">{_esc(name)}</text>')
    for label, t in marks:
        out.append(f'<line x1="{x_of(t / 60):.1f}" x2="{x_of(t / 60):.1f}" y1="{top}" y2="{top + ph}" '
                   'stroke="#b91c1c" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{x_of(t / 60) + 4:.1f}" y="{top + ph - 6}" fill="#b91c1c">{_esc(label)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{top + ph + 34}" text-anchor="middle">minutes since start-up</text>')
    out.append(f'<text x="16" y="{top + ph / 2}" text-anchor="middle" transform="rotate(-90 16 {top + ph / 2})">'
               'RSS of the server tree (MiB)</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# -- the run --------------------------------------------------------------------------------------------------------


def soak(minutes: float = 30, load: float = 0.8, capacity_seconds: float = 60, concurrency: int = 16,
         window_minutes: float = 5, sample_seconds: float = 5, seed: int = 0, work_dir: str | None = None,
         plot: str | None = None, kc_flags: str = "", request_timeout: float = 900, drain_timeout: float = 300,
         log=print) -> dict:
    """The whole benchmark; returns the result (see the module docstring). Never raises on a failed check:
    ``result["checks"]`` says what held."""
    work_dir = work_dir or tempfile.mkdtemp(prefix="kc-soak-")
    os.makedirs(work_dir, exist_ok=True)
    adapter = make_adapter(work_dir)
    rng = random.Random(seed)
    t0 = time.monotonic()
    proc, url = start_server(adapter, os.path.join(work_dir, "serve.log"), shlex.split(kc_flags))
    phases: list[tuple[str, float, float]] = [("start-up", 0.0, time.monotonic() - t0)]
    marks = []
    result: dict = {"command": " ".join(shlex.quote(a) for a in sys.argv), "server_args": proc.args_used[3:],
                    "mix": MIX, "bad_variants": sorted(BAD_VARIANTS), "minutes": minutes, "load": load,
                    "concurrency": concurrency, "capacity_seconds": capacity_seconds, "seed": seed,
                    "server_log": proc.log_path, "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg()}
    try:
        with RssSampler(proc.pid, sample_seconds, t0) as rss:
            rss_ready = rss.sample()
            a = time.monotonic() - t0
            warm = asyncio.run(warm_up(url, t0, rng, request_timeout))
            log(f"warm-up: {sum(r['ok'] for r in warm)}/{len(warm)} as expected")
            capacity_records, capacity = asyncio.run(closed_loop(url, t0, rng, capacity_seconds, concurrency,
                                                                 request_timeout))
            b = time.monotonic() - t0
            phases.append(("capacity", a, b))
            idle_after_capacity = wait_idle(url, drain_timeout)
            rss_warm = rss.sample()
            marks.append(("warm", time.monotonic() - t0))
            rate = load * capacity
            log(f"capacity: {capacity:.2f} req/s ({len(capacity_records)} requests, concurrency {concurrency}); "
                f"soak at {rate:.2f} req/s for {minutes:g} min; RSS warm {sum(rss_warm.values()) / MIB:.0f} MiB")
            soak_start = time.monotonic() - t0
            last_report = [time.monotonic()]

            def progress(tasks):
                if time.monotonic() - last_report[0] >= 60:
                    last_report[0] = time.monotonic()
                    done = sum(t.done() for t in tasks)
                    log(f"  {(time.monotonic() - t0 - soak_start) / 60:.1f} min: {len(tasks)} sent, {done} answered, "
                        f"RSS {rss.samples[-1][1] / MIB:.0f} MiB, load {os.getloadavg()[0]:.1f}")

            records = asyncio.run(open_loop(url, t0, rng, minutes * 60, rate, request_timeout, progress))
            soak_end = time.monotonic() - t0
            idle, drain_s, gauges = wait_idle(url, drain_timeout)
            rss_end = rss.sample()
            end = time.monotonic() - t0
            phases += [("soak", soak_start, soak_end), ("drain", soak_end, end)]
            marks.append(("end", end))
        series = rss.series()
        soak_max = max(v for t, v in series["total"] if soak_start <= t <= end)
        mib = lambda parts: round(sum(parts.values()) / MIB, 1)  # noqa: E731
        by_process = lambda parts: {name: round(v / MIB, 1) for name, v in sorted(parts.items())}  # noqa: E731
        summary = summarize(records)
        all_records = warm + capacity_records + records
        everything = summarize(all_records)
        problems = log_problems(read_log(proc))
        result.update({
            "capacity_rps": round(capacity, 3), "rate_rps": round(rate, 3),
            "capacity_phase": summarize(capacity_records), "warm_up": summarize(warm),
            "soak": summary, "soak_seconds": round(soak_end - soak_start, 1),
            "windows": windows(records, soak_start, minutes * 60, window_minutes * 60),
            "latency_ms": {k: {"p50": _round(percentile(lat, 50)), "p99": _round(percentile(lat, 99))}
                           for k in MIX if k != "bad" and (lat := [r["latency"] * 1000 for r in records
                                                                  if r["kind"] == k and r["ok"]])},
            "drain": {"idle": idle, "seconds": round(drain_s, 1), "running": gauges[0], "waiting": gauges[1],
                      "idle_after_capacity": idle_after_capacity[0]},
            "rss_mib": {"ready": mib(rss_ready), "warm": mib(rss_warm), "end": mib(rss_end),
                        "max_soak": round(soak_max, 1),
                        "growth_warm_to_end": round(mib(rss_end) - mib(rss_warm), 1),
                        "by_process": {"ready": by_process(rss_ready), "warm": by_process(rss_warm),
                                       "end": by_process(rss_end)},
                        "series": [(round(t, 1), round(v, 1)) for t, v in series["total"]]},
            "server_log_problems": problems[:20], "loadavg_end": os.getloadavg(),
        })
        result["checks"] = {
            "no_5xx": everything["num_5xx"] == 0,
            "every_good_request_complete": everything["good_ok"] == everything["good"],
            "every_bad_request_4xx": everything["bad_4xx"] == everything["bad"],
            "running_waiting_back_to_0": idle and idle_after_capacity[0],
            "no_errors_in_server_log": not problems,
        }
        result["ok"] = all(result["checks"].values())
        if plot:
            shown = {name: points for name, points in series.items() if max(v for _, v in points) >= 50}
            write_svg(plot, shown, phases,
                      f"kc serve soak: {minutes:g} min of mixed traffic at {rate:.2f} req/s "
                      f"({load:.0%} of {capacity:.2f})", marks)
            result["plot"] = plot
    finally:
        stop_server(proc)
    return result


@click.command()
@click.option("--minutes", type=float, default=30, show_default=True, help="Length of the open-loop soak.")
@click.option("--load", type=float, default=0.8, show_default=True, help="Arrival rate as a share of the capacity.")
@click.option("--capacity-seconds", type=float, default=60, show_default=True, help="Closed-loop capacity phase.")
@click.option("--concurrency", type=int, default=16, show_default=True, help="Clients in the capacity phase.")
@click.option("--window-minutes", type=float, default=5, show_default=True)
@click.option("--sample-seconds", type=float, default=5, show_default=True, help="RSS sampling period.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--work-dir", default=None, help="Keeps the adapter (and the server log) between runs.")
@click.option("--plot", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                                             "soak-memory.svg"), show_default="docs/soak-memory.svg")
@click.option("--out", default=None, help="Also write the JSON result here.")
@click.option("--kc-flags", default="", help="Extra `kc serve` flags.")
def main(minutes, load, capacity_seconds, concurrency, window_minutes, sample_seconds, seed, work_dir, plot, out,
         kc_flags):
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    result = soak(minutes, load, capacity_seconds, concurrency, window_minutes, sample_seconds, seed, work_dir,
                  os.path.normpath(plot) if plot else None, kc_flags, log=log)
    for w in result["windows"]:
        log(f"window {w['window']} ({w['from_s']:.0f}-{w['to_s']:.0f} s): {w['requests']} requests, "
            f"p50 {w['p50_ms']} ms, p99 {w['p99_ms']} ms, {w['status']}")
    log(f"5xx: {result['soak']['num_5xx']}; good {result['soak']['good_ok']}/{result['soak']['good']}; "
        f"bad 4xx {result['soak']['bad_4xx']}/{result['soak']['bad']}; RSS MiB {result['rss_mib']['warm']} -> "
        f"{result['rss_mib']['end']} (max {result['rss_mib']['max_soak']}); checks {result['checks']}")
    text = json.dumps(result, indent=1)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    print(text)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
