"""The xgrammar backend (``pip install 'kernelcore[xgrammar]'``): JSON Schema, JSON object, regex, choice, EBNF."""

from __future__ import annotations

import json
from typing import Any

import torch
import xgrammar as xgr

from kernelcore.contract.structured_output_params import MAX_JSON_WHITESPACE, StructuredOutputsParams
from kernelcore.structured_output.backend import GrammarMatcher, StructuredOutputBackend


class XGrammarMatcher(GrammarMatcher):
    __slots__ = ("matcher",)

    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self.matcher = matcher

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.accept_token(token_id)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)


def _whitespace(params: StructuredOutputsParams) -> dict[str, Any]:
    if params.compact_whitespace:
        return {"any_whitespace": False}
    return {"any_whitespace": True, "max_whitespace_cnt": MAX_JSON_WHITESPACE}


class XGrammarBackend(StructuredOutputBackend):
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(info)

    def compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        kind = params.kind
        try:
            if kind == "json":
                return self.compiler.compile_json_schema(params.text("json"), **_whitespace(params))
            if kind == "json_object":
                return self.compiler.compile_json_schema('{"type": "object"}', **_whitespace(params))
            if kind == "regex":
                return self.compiler.compile_regex(params.text("regex"))
            if kind == "choice":
                return self.compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in params.choices))
            return self.compiler.compile_grammar(params.text("grammar"))  # EBNF (GBNF)
        except RuntimeError as exc:
            raise ValueError(f"the {kind} constraint does not compile: {exc}") from None

    def matcher(self, compiled: xgr.CompiledGrammar) -> XGrammarMatcher:
        return XGrammarMatcher(xgr.GrammarMatcher(compiled))
