"""The aiohttp app in-process against a fake engine: endpoint plugins, mid-stream errors, health, request ids."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kernelcore import hookimpl, plugins
from kernelcore.config import KernelConfig, ModelConfig
from kernelcore.engine.outputs import CompletionOutput, RequestOutput
from kernelcore.entrypoints.server.app import ServerOptions, create_app


class FakeEngine:
    """Yields one token per step (id 1, text "a"); `fail_after` raises mid-stream like a failed request."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.config = KernelConfig(model=ModelConfig(model="/models/fake", served_model_name="fake", max_model_len=64))
        self.max_model_len, self.vocab_size, self.tokenizer = 64, 100, None
        self.is_dead, self.fail_after, self.aborted = False, fail_after, []

    async def generate(self, request_id, prompt_token_ids, sampling_params, prompt=None, output_kind="cumulative"):
        for step in range(1, sampling_params.max_tokens + 1):
            if self.fail_after is not None and step > self.fail_after:
                raise RuntimeError("boom in the engine")
            await asyncio.sleep(0)
            finished = step == sampling_params.max_tokens
            yield RequestOutput(request_id=request_id, prompt=prompt, prompt_token_ids=prompt_token_ids,
                                finished=finished,
                                outputs=[CompletionOutput(index=0, text="a" * step, token_ids=[1] * step,
                                                          finish_reason="length" if finished else None)])

    async def abort(self, request_id):
        self.aborted.append(request_id)


def run(engine, options, body):
    async def main():
        app = await create_app(engine, options)
        async with TestClient(TestServer(app)) as client:
            return await body(client)

    return asyncio.run(main())


def test_mid_stream_error_is_an_sse_event_then_done(caplog):
    engine = FakeEngine(fail_after=2)

    async def body(client):
        r = await client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 5, "stream": True})
        return r.status, await r.text()

    status, text = run(engine, ServerOptions(), body)
    events = [e[len("data: "):] for e in text.strip().split("\n\n")]
    assert status == 200 and events[-1] == "[DONE]"
    # the client gets the server's own words; what went wrong inside goes to the log only
    assert json.loads(events[-2]) == {"error": {"message": "The request failed inside the engine; the server log has "
                                                "the details", "type": "InternalServerError", "param": None,
                                                "code": 500}}
    assert "boom in the engine" not in text and "boom in the engine" in caplog.text
    assert [json.loads(e)["choices"][0]["text"] for e in events[:-2]] == ["a", "a"]
    assert engine.aborted  # the failed request is aborted in the engine


def test_non_stream_engine_error_is_500_envelope_and_request_id_echoed():
    async def body(client):
        r = await client.post("/v1/completions", json={"prompt": [1], "max_tokens": 3},
                              headers={"X-Request-Id": "abc"})
        return r.status, await r.json(), r.headers.get("X-Request-Id")

    status, payload, request_id = run(FakeEngine(fail_after=1), ServerOptions(), body)
    assert status == 500 and payload["error"]["code"] == 500 and request_id == "abc"

    async def ok(client):
        r = await client.post("/v1/completions", json={"prompt": [1], "max_tokens": 3}, headers={"X-Request-Id": "abc"})
        return await r.json()

    assert run(FakeEngine(), ServerOptions(), ok)["id"] == "cmpl-abc"


def test_health_503_when_engine_dead():
    engine = FakeEngine()
    engine.is_dead = True

    async def body(client):
        return (await client.get("/health")).status

    assert run(engine, ServerOptions(), body) == 503


def test_auth_exempts_health_and_metrics_only():
    async def body(client):
        return [(await client.get(path)).status for path in ("/health", "/ping", "/metrics", "/version", "/load")]

    assert run(FakeEngine(), ServerOptions(api_key="k"), body) == [200, 200, 200, 401, 401]


def test_oversized_body_413_and_unknown_route_404():
    async def body(client):
        big = await client.post("/v1/completions", data=b"x" * 2000, headers={"Content-Type": "application/json"})
        missing = await client.get("/nope")
        return big.status, (await big.json())["error"]["code"], missing.status, (await missing.json())["error"]["code"]

    assert run(FakeEngine(), ServerOptions(max_body_bytes=1000), body) == (413, 413, 404, 404)


class GoodEndpoints:
    @hookimpl
    def register_endpoints(self, app, engine):
        async def hello(request):
            from aiohttp import web

            return web.json_response({"model": engine.config.model.served_model_name})

        app.router.add_get("/plugins/good/hello", hello)


class BrokenEndpoints:
    @hookimpl
    def register_endpoints(self, app):
        raise RuntimeError("cannot register")


@pytest.fixture
def endpoint_plugins(monkeypatch):
    monkeypatch.delenv("KC_PLUGINS", raising=False)
    pm = plugins.get_plugin_manager()
    good, broken = GoodEndpoints(), BrokenEndpoints()
    pm.register(good, name="good-endpoints")
    pm.register(broken, name="broken-endpoints")
    try:
        yield
    finally:
        pm.unregister(good)
        pm.unregister(broken)


def _status_of_plugin_route(options):
    async def body(client):
        r = await client.get("/plugins/good/hello", headers={"Authorization": "Bearer k"})
        return r.status, (await r.json())

    return run(FakeEngine(), options, body)


def test_endpoint_plugins_off_by_default(endpoint_plugins):
    assert _status_of_plugin_route(ServerOptions())[0] == 404


def test_endpoint_plugins_allowed_by_flag_and_failing_one_skipped(endpoint_plugins, caplog):
    with caplog.at_level(logging.ERROR, logger="kernelcore.server"):
        status, payload = _status_of_plugin_route(ServerOptions(enable_endpoint_plugins=True, api_key="k"))
    assert status == 200 and payload == {"model": "fake"}
    assert any("broken-endpoints" in r.getMessage() for r in caplog.records)


def test_endpoint_plugins_allowed_by_kc_plugins(endpoint_plugins, monkeypatch):
    monkeypatch.setenv("KC_PLUGINS", "good-endpoints")
    assert _status_of_plugin_route(ServerOptions())[0] == 200


def test_plugin_routes_need_the_api_key(endpoint_plugins):
    async def body(client):
        return (await client.get("/plugins/good/hello")).status

    assert run(FakeEngine(), ServerOptions(enable_endpoint_plugins=True, api_key="k"), body) == 401


def test_stream_error_before_first_output_is_plain_json():
    engine = FakeEngine(fail_after=0)

    async def body(client):
        r = await client.post("/v1/chat/completions",
                              json={"messages": [{"role": "user", "content": "x"}], "stream": True})
        return r.status, r.content_type

    engine.tokenizer = type("Tok", (), {"chat_template": "{{ 'x' }}", "encode": lambda self, text, **kw: [1, 2],
                                        "apply_chat_template": lambda self, messages, **kw: "x"})()
    assert run(engine, ServerOptions(), body) == (500, "application/json")


def _builtin_api_statuses(options):
    from kernelcore import platforms

    platforms.load_general_plugins()  # the built-in endpoint plugins, through their entry points

    async def body(client):
        auth = {"x-api-key": "k"}
        version = await client.get("/api/version", headers=auth)
        messages = await client.post("/v1/messages", json={}, headers=auth)
        responses = await client.post("/v1/responses", json={}, headers=auth)
        return version.status, messages.status, (await messages.json()).get("type"), responses.status

    return run(FakeEngine(), options, body)


def test_builtin_endpoint_plugins_are_on_by_default_and_each_can_be_switched_off():
    # x-api-key (Anthropic's clients) is accepted as the key; the routes answer in their own error shapes.
    assert _builtin_api_statuses(ServerOptions(api_key="k")) == (200, 400, "error", 400)
    off = ServerOptions(api_key="k", disabled_endpoint_plugins=["ollama_api", "anthropic_messages"])
    assert _builtin_api_statuses(off) == (404, 404, None, 400)


def test_an_error_shape_is_the_routes_even_for_the_middlewares_401():
    from kernelcore import platforms

    platforms.load_general_plugins()

    async def body(client):
        anthropic = await client.post("/v1/messages", json={}, headers={"x-api-key": "wrong"})
        ollama = await client.get("/api/tags")
        openai = await client.get("/v1/models")
        return [(r.status, await r.json()) for r in (anthropic, ollama, openai)]

    (a_status, a_body), (o_status, o_body), (p_status, p_body) = run(FakeEngine(), ServerOptions(api_key="k"), body)
    assert a_status == o_status == p_status == 401
    assert a_body["type"] == "error" and a_body["error"]["type"] == "authentication_error"
    assert isinstance(o_body["error"], str)
    assert p_body["error"]["type"] == "AuthenticationError"
