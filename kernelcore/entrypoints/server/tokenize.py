"""POST /tokenize and /detokenize (not length-checked)."""

from __future__ import annotations

from aiohttp import web

from kernelcore.entrypoints.server.app import get_state, read_json
from kernelcore.entrypoints.server.errors import bad_request
from kernelcore.entrypoints.server.protocol import check_token_ids


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"Invalid value for `{name}`: expected a boolean", name)
    return value


async def tokenize(request: web.Request) -> web.Response:
    from kernelcore.entrypoints.server.chat import render_chat, resolve_template
    from kernelcore.entrypoints.server.protocol import _parse_messages

    state = get_state(request)
    tokenizer = state.engine.tokenizer
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    state.check_model(body.get("model") or None)
    if "messages" in body:
        messages = _parse_messages(body["messages"])
        chat = {"add_generation_prompt": _flag(body, "add_generation_prompt", True),
                "continue_final_message": _flag(body, "continue_final_message", False),
                "tools": body.get("tools"), "documents": body.get("documents"),
                "chat_template_kwargs": body.get("chat_template_kwargs") or {}}
        if chat["add_generation_prompt"] and chat["continue_final_message"]:
            raise bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        template = resolve_template(state, tokenizer, body.get("chat_template"))
        text = render_chat(tokenizer, messages, template, chat)
        token_ids = tokenizer.encode(text, add_special_tokens=_flag(body, "add_special_tokens", False))
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad_request("`prompt` must be a string (or send `messages`)", "prompt")
        token_ids = tokenizer.encode(prompt, add_special_tokens=_flag(body, "add_special_tokens", True))
    token_strs = tokenizer.convert_ids_to_tokens(token_ids) if _flag(body, "return_token_strs", False) else None
    return web.json_response({"count": len(token_ids), "max_model_len": state.engine.max_model_len,
                              "tokens": token_ids, "token_strs": token_strs})


async def detokenize(request: web.Request) -> web.Response:
    state = get_state(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    state.check_model(body.get("model") or None)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad_request("`tokens` must be an array of token ids", "tokens")
    check_token_ids(tokens, state.engine.vocab_size, "tokens")
    return web.json_response({"prompt": state.engine.tokenizer.decode(tokens)})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
