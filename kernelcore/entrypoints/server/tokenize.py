"""POST /tokenize and /detokenize (not length-checked)."""

from __future__ import annotations

import functools

import msgspec
from aiohttp import web

from kernelcore.entrypoints.server.errors import bad_request
from kernelcore.entrypoints.server.preprocess import encode_chat, run_preprocess
from kernelcore.entrypoints.server.protocol import _get, check_token_ids
from kernelcore.entrypoints.server.state import get_state, read_json


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"Invalid value for `{name}`: expected a boolean", name)
    return value


async def tokenize(request: web.Request) -> web.Response:
    from kernelcore.entrypoints.server.chat_template import render_chat, resolve_template
    from kernelcore.entrypoints.server.protocol import _check_tools, _parse_messages

    state = get_state(request)
    tokenizer = state.engine.tokenizer
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    state.check_model(_get(body, "model", "str") or None)
    if tokenizer is None:
        raise bad_request("This model has no tokenizer")
    if "messages" in body:
        messages = _parse_messages(body["messages"])
        tools = _get(body, "tools", "list")
        _check_tools(tools)
        chat = {"add_generation_prompt": _flag(body, "add_generation_prompt", True),
                "continue_final_message": _flag(body, "continue_final_message", False),
                "tools": tools, "documents": _get(body, "documents", "list"),
                "chat_template_kwargs": _get(body, "chat_template_kwargs", "dict", {})}
        if chat["add_generation_prompt"] and chat["continue_final_message"]:
            raise bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        template = resolve_template(state, tokenizer, _get(body, "chat_template", "str"))
        num_chars = sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))
        _, token_ids = await run_preprocess(num_chars, encode_chat, tokenizer, messages,
                                            lambda ms: render_chat(tokenizer, ms, template, chat),
                                            _flag(body, "add_special_tokens", False),
                                            state.options.allow_special_tokens_in_content)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad_request("`prompt` must be a string (or send `messages`)", "prompt")
        token_ids = await run_preprocess(len(prompt), functools.partial(
            tokenizer.encode, prompt, add_special_tokens=_flag(body, "add_special_tokens", True)))
    return_strs = _flag(body, "return_token_strs", False)

    def response_body() -> bytes:  # millions of ids take a while to serialize: not on the event loop
        token_strs = tokenizer.convert_ids_to_tokens(token_ids) if return_strs else None
        return msgspec.json.encode({"count": len(token_ids), "max_model_len": state.engine.max_model_len,
                                    "tokens": token_ids, "token_strs": token_strs})

    return web.Response(body=await run_preprocess(len(token_ids), response_body), content_type="application/json")


async def detokenize(request: web.Request) -> web.Response:
    state = get_state(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    state.check_model(_get(body, "model", "str") or None)
    if state.engine.tokenizer is None:
        raise bad_request("This model has no tokenizer")
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad_request("`tokens` must be an array of token ids", "tokens")
    check_token_ids(tokens, state.engine.vocab_size, "tokens")
    text = await run_preprocess(len(tokens), state.engine.tokenizer.decode, tokens)
    return web.json_response({"prompt": text})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
