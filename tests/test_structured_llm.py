"""Constrained decoding in the engine, offline (LLM + SamplingParams): every constraint kind, mixed batches,
n > 1, stop strings, preemption under a small KV cache, grammar errors, and no cost for unconstrained batches."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.engine.llm import LLM
from kernelcore.structured_output.params import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "n", "ok"], "additionalProperties": False}
PROMPT = "Hello, my name is"
# Random weights: JSON constraints here are compact, or a model with no preference may spend its tokens on the
# whitespace the default allows (tests/test_chat_agent_loop_real.py checks that default on a real model).


@pytest.fixture(scope="module")
def llm():
    engine = LLM(max_model_len=512)
    yield engine
    engine.shutdown()


def test_constraints_in_a_mixed_batch(llm):
    plain = SamplingParams(temperature=0, max_tokens=12)
    params = [SamplingParams(temperature=0, max_tokens=80, structured_outputs=StructuredOutputsParams(json=SCHEMA,
                                                                                         compact_whitespace=True)),
              plain,
              SamplingParams(temperature=0.9, seed=2, n=2, max_tokens=20, structured_outputs={"regex": "[a-c]{2,5}"}),
              SamplingParams(temperature=0, max_tokens=20, structured_outputs={"choice": ["yes", "no", "maybe"]}),
              SamplingParams(temperature=0, max_tokens=20, stop=["b"], structured_outputs={"regex": "a{0,3}b{4}"})]
    outputs = llm.generate([PROMPT] * len(params), params, use_tqdm=False)
    first = outputs[0].outputs[0]
    assert first.finish_reason == "stop" and first.stop_reason is None
    jsonschema.validate(json.loads(first.text), SCHEMA)
    assert list(json.loads(first.text)) == ["name", "n", "ok"]  # schema order
    assert outputs[1].outputs[0].text == llm.generate([PROMPT], plain, use_tqdm=False)[0].outputs[0].text
    assert all(re.fullmatch("[a-c]{2,5}", c.text) for c in outputs[2].outputs) and len(outputs[2].outputs) == 2
    assert outputs[3].outputs[0].text in ("yes", "no", "maybe")
    stopped = outputs[4].outputs[0]
    assert stopped.stop_reason == "b" and re.fullmatch("a{0,3}", stopped.text)
    assert llm.engine_core.scheduler.structured.grammars == {}  # matchers are dropped with their requests


def test_preemption_keeps_constrained_output_valid():
    # A KV cache too small for all requests at once: some are preempted and recomputed mid-generation.
    llm = LLM(max_model_len=512, kv_cache_memory=24 * 64 * 1024, block_size=16)
    try:
        schema = {"type": "array", "items": {"enum": ["apple", "pear", "fig"]}, "minItems": 20, "maxItems": 20}
        params = SamplingParams(temperature=0.8, seed=1, max_tokens=200,
                                structured_outputs=StructuredOutputsParams(json=schema, compact_whitespace=True))
        outputs = llm.generate([f"{PROMPT} {i}" for i in range(6)], params, use_tqdm=False)
        assert llm.engine_core.scheduler.num_preemptions_total > 0
        for out in outputs:
            assert out.outputs[0].finish_reason == "stop"
            jsonschema.validate(json.loads(out.outputs[0].text), schema)
    finally:
        llm.shutdown()


def test_bad_grammar_fails_alone_and_unconstrained_costs_nothing(llm):
    bad = SamplingParams(max_tokens=5, structured_outputs={"json": {"type": "bogus"}})
    with pytest.raises(ValueError, match="bogus"):
        llm.generate([PROMPT], bad, use_tqdm=False)
    assert len(llm.generate([PROMPT], SamplingParams(max_tokens=3), use_tqdm=False)[0].outputs[0].token_ids) == 3
    fresh = LLM(max_model_len=128)
    try:
        fresh.generate([PROMPT], SamplingParams(max_tokens=3), use_tqdm=False)
        assert fresh.engine_core.scheduler.structured is None  # no manager, no bitmask, nothing per step
    finally:
        fresh.shutdown()


def test_chat_with_tools_offline(llm):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    params = SamplingParams(temperature=0, max_tokens=30, structured_outputs={"json": {
        "type": "object", "properties": {"x": {"enum": [1, 2]}}, "required": ["x"], "additionalProperties": False},
        "compact_whitespace": True})
    out = llm.chat([{"role": "user", "content": "call f"}], params, use_tqdm=False, tools=tools)[0].outputs[0]
    assert json.loads(out.text)["x"] in (1, 2)


def test_params_validation():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    assert StructuredOutputsParams(json={"type": "object"}).cache_key == StructuredOutputsParams(
        json='{"type": "object"}').cache_key


@pytest.mark.slow
def test_mixed_with_lora_and_tensor_parallel(tmp_path):
    """Constrained, unconstrained and LoRA requests in one batch, under TP=2: the mask is built once in the
    engine core and the unconstrained requests get the tokens they get alone."""
    from helpers import run_python
    from lora_helpers import make_peft_adapter

    from kernelcore.models.default_model import ensure_default_model

    adapter = make_peft_adapter(ensure_default_model(), str(tmp_path / "adapter"), "llama", seed=3)
    proc = run_python(f"""
        import json
        from kernelcore.engine.llm import LLM
        from kernelcore.core_types.sampling_params import SamplingParams
        from kernelcore.lora.serving import LoRARequest
        if __name__ == "__main__":
            llm = LLM(max_model_len=256, tensor_parallel_size=2, enable_lora=True, kv_cache_memory=1 << 24)
            lora = LoRARequest("a", 1, {adapter!r})
            plain = SamplingParams(temperature=0, max_tokens=10)
            constrained = SamplingParams(temperature=0, max_tokens=60, structured_outputs={{"json": {SCHEMA!r},
                                                                                      "compact_whitespace": True}})
            prompts = ["Hello, my name is", "Once upon a time", "The capital of France"]
            alone = [llm.generate([p], plain, use_tqdm=False, lora_request=l)[0].outputs[0].text
                     for p, l in ((prompts[0], None), (prompts[1], lora))]
            mixed = llm.generate(prompts, [plain, plain, constrained], use_tqdm=False, lora_request=[None, lora, lora])
            print("RESULT", json.dumps({{"alone": alone, "mixed": [o.outputs[0].text for o in mixed],
                                        "finish": mixed[2].outputs[0].finish_reason}}))
            llm.shutdown()
    """, timeout=600)
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert result["mixed"][:2] == result["alone"]
    assert result["finish"] == "stop"
    jsonschema.validate(json.loads(result["mixed"][2]), SCHEMA)
