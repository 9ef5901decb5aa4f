"""Every installed grammar backend, driven like the engine drives it: compile, fill bitmasks, accept tokens."""

from __future__ import annotations

import json
import re

import pytest
import torch

from kernelcore.executor.sampler import apply_bitmask_rows
from kernelcore.structured_output.backend import UnsupportedConstraint, allocate_bitmask, build_registry
from kernelcore.structured_output.compiler import GrammarCompiler
from kernelcore.structured_output.params import StructuredOutputsParams

REGISTRY = build_registry()


@pytest.fixture(scope="module")
def tokenizer():
    from kernelcore.engine.tokenizer import get_tokenizer
    from kernelcore.models.default_model import ensure_default_model

    return get_tokenizer(ensure_default_model())


def _walk(backend, compiled, tokenizer, pick) -> str:
    """Decode under the grammar, choosing among the allowed tokens with ``pick`` until it terminates."""
    matcher, ids, vocab = backend.matcher(compiled), [], len(tokenizer)
    for _ in range(200):
        mask = allocate_bitmask(1, vocab)
        matcher.fill_bitmask(mask, 0)
        logits = apply_bitmask_rows(torch.zeros(1, vocab), torch.tensor([0]), mask)
        allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
        allowed = [t for t in allowed if t != tokenizer.eos_token_id] or allowed
        token = pick(allowed)
        assert matcher.accept_token(token)
        if token == tokenizer.eos_token_id:
            break
        ids.append(token)
        if matcher.is_terminated():
            break
    return tokenizer.decode(ids)


@pytest.mark.parametrize("name", [n for n in REGISTRY.names() if n in ("guidance", "xgrammar")])
def test_backend_constraints(name, tokenizer):
    compiler = GrammarCompiler(tokenizer, len(tokenizer), name)
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "n": {"type": "integer", "minimum": 0,
                                                                                 "maximum": 9}},
              "required": ["k", "n"], "additionalProperties": False}
    cases = [(StructuredOutputsParams(json=schema), lambda s: json.loads(s)["k"] in ("a", "b")),
             (StructuredOutputsParams(regex="[a-c]{3}x"), lambda s: re.fullmatch("[a-c]{3}x", s)),
             (StructuredOutputsParams(choice=["left", "right"]), lambda s: s in ("left", "right"))]
    for params, check in cases:
        backend, compiled = compiler.compile(params)
        assert backend.name == name
        assert compiler.compile(params)[1] is compiled  # cached by source
        for pick in (min, max):
            assert check(_walk(backend, compiled, tokenizer, pick)), params
    with pytest.raises(ValueError):
        compiler.compile(StructuredOutputsParams(json={"type": "bogus"}) if name == "guidance"
                         else StructuredOutputsParams(regex="(unclosed"))


def test_auto_falls_back_on_unsupported(tokenizer):
    assert "dummy_choice" in REGISTRY.names()  # the test plugin's backend, through its entry point
    compiler = GrammarCompiler(tokenizer, len(tokenizer), "dummy_choice")
    backend, compiled = compiler.compile(StructuredOutputsParams(choice=["yes", "no"]))
    assert _walk(backend, compiled, tokenizer, min) in ("yes", "no")
    with pytest.raises(ValueError, match="no structured-output backend supports"):
        compiler.compile(StructuredOutputsParams(regex="a+"))
    with pytest.raises(UnsupportedConstraint):
        backend.compile(StructuredOutputsParams(regex="a+"))
    with pytest.raises(ValueError, match="not installed"):
        GrammarCompiler(tokenizer, len(tokenizer), "nope")


def test_bitmask_applies_only_to_its_rows():
    logits = torch.randn(3, 70)
    mask = torch.zeros(1, 3, dtype=torch.int32)
    mask[0, 1] = 1 << 5  # only token 37 allowed
    out = apply_bitmask_rows(logits, torch.tensor([1]), mask)
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert out[1].argmax() == 37 and torch.isinf(out[1]).sum() == 69
