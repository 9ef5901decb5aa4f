"""The llguidance backend: JSON Schema, any JSON object, regex, choice and Lark grammars."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
import llguidance.torch
import torch

from kernelcore.contract.structured_output_params import MAX_JSON_WHITESPACE, StructuredOutputsParams
from kernelcore.structured_output.backend import GrammarMatcher, StructuredOutputBackend

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid Lark string literal


class GuidanceMatcher(GrammarMatcher):
    __slots__ = ("matcher",)

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher

    def accept_token(self, token_id: int) -> bool:
        if self.matcher.validate_tokens([token_id]) != 1:
            return False
        return self.matcher.consume_token(token_id)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, row)

    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)


class GuidanceBackend(StructuredOutputBackend):
    name = "guidance"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)

    def grammar(self, params: StructuredOutputsParams) -> str:
        kind = params.kind
        options: JsonCompileOptions = {"whitespace_pattern": f"[\\x20\\x0A\\x0D\\x09]{{0,{MAX_JSON_WHITESPACE}}}"}
        if params.compact_whitespace:
            options = {"whitespace_flexible": False}
        if params.whitespace_pattern:
            options = {"whitespace_pattern": params.whitespace_pattern}
        if kind == "json":
            schema = params.schema()
            if not isinstance(schema, (dict, bool)):
                raise ValueError("the JSON schema must be an object")
            return llguidance.LLMatcher.grammar_from_json_schema(params.text("json"), defaults=options)
        if kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=options)
        if kind == "regex":
            try:
                re.compile(params.text("regex"))
            except re.error as exc:
                raise ValueError(f"invalid regex: {exc}") from None
            return llguidance.LLMatcher.grammar_from_regex(params.text("regex"))
        if kind == "choice":
            choices = " | ".join(_lark_string(c) for c in params.choices)
            return llguidance.LLMatcher.grammar_from_lark("start: " + choices)
        return llguidance.LLMatcher.grammar_from_lark(params.text("grammar"))

    def compile(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        grammar = self.grammar(params)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
        if is_error:
            raise ValueError(f"the {params.kind} constraint does not compile: {'; '.join(messages)}")
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar)
        if matcher.is_error():
            raise ValueError(f"the {params.kind} constraint does not compile: {matcher.get_error()}")
        return matcher  # a template: each request gets a deep copy

    def matcher(self, compiled: llguidance.LLMatcher) -> GuidanceMatcher:
        return GuidanceMatcher(compiled.deep_copy())
