"""POST /v1/completions: string, list and token-id prompts; echo; legacy logprobs; n and several prompts."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncGenerator
from typing import Any

from aiohttp import web

from kernelcore.engine.outputs import RequestOutput
from kernelcore.entrypoints.server.errors import bad_request
from kernelcore.entrypoints.server.logprobs import completion_logprobs, merge_completion_logprobs
from kernelcore.entrypoints.server.preprocess import check_text_fits, run_preprocess
from kernelcore.entrypoints.server.protocol import GenerateRequest, make_sampling_params, parse_completion_request
from kernelcore.entrypoints.server.state import base_request_id, get_state, read_json
from kernelcore.entrypoints.server.streaming import (
    ChoiceState,
    EnginePrompt,
    check_not_aborted,
    engine_error,
    final_outputs,
    merged,
    stream_events,
)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def truncate(token_ids: list[int], request: GenerateRequest, max_model_len: int) -> list[int]:
    k = request.truncate_prompt_tokens
    if k is None:
        return token_ids
    if k > max_model_len:
        raise bad_request(f"truncate_prompt_tokens value ({k}) is greater than max_model_len ({max_model_len}). "
                          "Please, select a smaller truncation size.", "truncate_prompt_tokens")
    return token_ids[-k:]


def engine_prompt(engine: Any, request: GenerateRequest, text: str | None, token_ids: list[int],
                  default_max_tokens: int | None) -> EnginePrompt:
    truncated = truncate(token_ids, request, engine.max_model_len)
    if not truncated:
        raise bad_request("The prompt cannot be empty", "prompt")
    if request.echo and (text is None or len(truncated) != len(token_ids)):
        text = engine.tokenizer.decode(truncated)
    params = make_sampling_params(request, len(truncated), engine.max_model_len, default_max_tokens)
    return EnginePrompt(text, truncated, params)


def usage(num_prompt_tokens: int, num_completion_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens, **extra}


async def create_completion(request: web.Request) -> web.StreamResponse:
    state = get_state(request)
    engine = state.engine
    body = await read_json(request)
    req = parse_completion_request(body, state.options.limits, engine.vocab_size)
    model, lora_id = await state.resolve_model(req.model)
    if req.structured is not None:
        await state.grammars.validate(req.structured, "structured_outputs")
    default_max_tokens = state.options.default_max_tokens or DEFAULT_MAX_TOKENS
    prompts = []
    for raw in req.prompts:
        if isinstance(raw, str):
            if engine.tokenizer is None:
                raise bad_request("This model has no tokenizer: send prompts as token ids", "prompt")
            if req.truncate_prompt_tokens is None:
                check_text_fits(engine.tokenizer, len(raw), engine.max_model_len)
            token_ids = await run_preprocess(len(raw), functools.partial(
                engine.tokenizer.encode, raw, add_special_tokens=req.add_special_tokens))
            prompts.append(engine_prompt(engine, req, raw, token_ids, default_max_tokens))
        else:
            prompts.append(engine_prompt(engine, req, None, list(raw), default_max_tokens))
    for prompt in prompts:
        prompt.lora_id = lora_id
    response_id = f"cmpl-{base_request_id(request)}"
    header = {"id": response_id, "object": "text_completion", "created": int(time.time()), "model": model}
    headers = {"X-Request-Id": request.headers.get("X-Request-Id", response_id)}
    if req.stream:
        return await stream_events(request, headers, _events(engine, req, prompts, response_id, header))
    try:
        finals = await final_outputs(engine, response_id, prompts)
    except Exception as exc:
        raise engine_error(exc) from exc
    choices, num_completion_tokens = [], 0
    for prompt_index, (prompt, output) in enumerate(zip(prompts, finals, strict=True)):
        for choice in sorted(output.outputs, key=lambda c: c.index):
            check_not_aborted(choice)
            token_ids, entries, text = choice.token_ids, choice.logprobs or [], choice.text
            finish_reason, stop_reason = choice.finish_reason, choice.stop_reason
            if req.max_tokens == 0:  # echo only: the one generated token is dropped
                token_ids, entries, text, finish_reason, stop_reason = [], [], "", "length", None
            num_completion_tokens += len(token_ids)
            choices.append({
                "index": prompt_index * req.n + choice.index,
                "text": ((prompt.text or "") if req.echo else "") + text,
                "logprobs": _logprobs(engine, req, prompt, output, token_ids, entries),
                "finish_reason": finish_reason, "stop_reason": stop_reason,
                "prompt_logprobs": _prompt_logprobs(output) if req.prompt_logprobs is not None else None,
            })
    num_prompt_tokens = sum(len(p.token_ids) for p in prompts)
    return web.json_response({**header, "system_fingerprint": None, "choices": choices,
                              "usage": usage(num_prompt_tokens, num_completion_tokens, prompt_tokens_details=None)},
                             headers=headers)


def _logprobs(engine: Any, req: GenerateRequest, prompt: EnginePrompt, output: RequestOutput, token_ids: list[int],
              entries: list, is_first: bool = True, offset: int = 0) -> dict[str, Any] | None:
    if req.logprobs is None:
        return None
    tokenizer, k, as_ids = engine.tokenizer, req.logprobs, req.return_tokens_as_token_ids
    if req.echo and is_first:
        prompt_entries = list(output.prompt_logprobs or [None] * len(prompt.token_ids))
        echoed = completion_logprobs(tokenizer, prompt.token_ids, prompt_entries, k, 0, as_ids)
        offset = sum(len(t) for t in echoed["tokens"])
        return merge_completion_logprobs(echoed, completion_logprobs(tokenizer, token_ids, entries, k, offset, as_ids))
    return completion_logprobs(tokenizer, token_ids, entries, k, offset, as_ids)


def _prompt_logprobs(output: RequestOutput) -> list[dict[str, Any] | None]:
    return [None if by_id is None else
            {str(tid): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
             for tid, lp in by_id.items()} for by_id in (output.prompt_logprobs or [])]


async def _events(engine: Any, req: GenerateRequest, prompts: list[EnginePrompt], response_id: str,
                  header: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
    states: dict[int, ChoiceState] = {}
    offsets: dict[int, int] = {}
    num_completion_tokens: dict[int, int] = {}
    num_prompt_tokens = sum(len(p.token_ids) for p in prompts)
    async for prompt_index, output in merged(engine, response_id, prompts):
        prompt = prompts[prompt_index]
        for choice in output.outputs:
            index = prompt_index * req.n + choice.index
            state = states.setdefault(index, ChoiceState())
            if state.is_finished:
                continue
            check_not_aborted(choice)
            is_first = state.num_tokens == 0
            delta, start = state.advance(choice)
            token_ids, entries = choice.token_ids[start:], (choice.logprobs or [])[start:]
            finish_reason, stop_reason = choice.finish_reason, choice.stop_reason
            if req.max_tokens == 0:
                delta, token_ids, entries, finish_reason, stop_reason = "", [], [], "length", None
                state.is_finished = True
            elif not delta and not token_ids and not state.is_finished:
                continue
            num_completion_tokens[index] = num_completion_tokens.get(index, 0) + len(token_ids)
            logprobs = _logprobs(engine, req, prompt, output, token_ids, entries, is_first, offsets.get(index, 0))
            if logprobs is not None and logprobs["tokens"]:
                offsets[index] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
            text = ((prompt.text or "") if req.echo and is_first else "") + delta
            chunk_usage = None
            if req.continuous_usage:
                chunk_usage = usage(num_prompt_tokens, sum(num_completion_tokens.values()))
            yield {**header, "choices": [{"index": index, "text": text, "logprobs": logprobs,
                                          "finish_reason": finish_reason,
                                          "stop_reason": stop_reason if finish_reason else None}],
                   "usage": chunk_usage}
    if req.include_usage:
        yield {**header, "choices": [], "usage": usage(num_prompt_tokens, sum(num_completion_tokens.values()))}
