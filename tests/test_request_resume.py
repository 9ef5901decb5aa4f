"""A request resumed with the tokens it had produced (what a lost data-parallel replica's requests carry to a
survivor) continues exactly as the undisturbed request: greedy with penalties, seeded sampling, a JSON-schema
grammar, min_tokens, prompt logprobs (not reported twice) and max_tokens counting the carried tokens."""

from __future__ import annotations

import json

import pytest
from helpers import run_python

pytestmark = pytest.mark.slow  # spawns an engine core

SCRIPT = """
import json

import pytest
from kernelcore.config_builder import build_config
from kernelcore.engine.core import EngineCore
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.models.default_model import ensure_default_model

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
          "required": ["name", "ok"], "additionalProperties": False}
CASES = {
    "greedy-penalties": dict(temperature=0, max_tokens=40, ignore_eos=True, repetition_penalty=1.3,
                             presence_penalty=0.5, frequency_penalty=0.4),
    "seeded": dict(temperature=1.0, top_k=40, seed=7, max_tokens=40, ignore_eos=True),
    "grammar": dict(temperature=0, max_tokens=60, structured_outputs={"json": SCHEMA, "compact_whitespace": True}),
    "min-tokens": dict(temperature=0.7, seed=3, min_tokens=30, max_tokens=40, prompt_logprobs=1),
}

def run(core, request_id, prompt, params, produced=()):
    core.add_request(EngineCoreRequest(request_id=request_id, prompt_token_ids=prompt, output_token_ids=list(produced),
                                       sampling_params=SamplingParams(**params), eos_token_id=EOS))
    tokens, num_prompt_logprobs, reason = [], 0, None
    while core.has_unfinished_requests():
        for o in core.step().outputs:
            tokens += o.new_token_ids
            num_prompt_logprobs += len(o.new_prompt_logprobs or [])
            reason = o.finish_reason or reason
    return tokens, num_prompt_logprobs, reason

if __name__ == "__main__":
    core = EngineCore(build_config(model=ensure_default_model(), kv_cache_memory=1 << 24))
    EOS = 2
    prompt = [5, 17, 44, 98, 12, 7, 250, 31]
    result = {}
    for name, params in CASES.items():
        full, num_lp, reason = run(core, name, prompt, params)
        resumed = {}
        for k in (1, 9, 25):
            if k < len(full):
                params_k = dict(params, prompt_logprobs=None) if "prompt_logprobs" in params else params
                rest, rest_lp, rest_reason = run(core, f"{name}-{k}", prompt, params_k, full[:k])
                resumed[k] = [full[:k] + rest == full, rest_lp, rest_reason == reason]
        result[name] = {"num": len(full), "prompt_logprobs": num_lp, "resumed": resumed, "text": full}
    core.shutdown()
    print(json.dumps(result))
"""


def test_a_request_resumed_with_its_tokens_continues_as_the_undisturbed_one():
    result = json.loads(run_python(SCRIPT, timeout=600).stdout.strip().splitlines()[-1])
    for name, case in result.items():
        assert case["resumed"], f"{name}: too short to resume ({case['num']} tokens)"
        for k, (same, num_prompt_logprobs, same_reason) in case["resumed"].items():
            assert same and same_reason, f"{name} resumed after {k} tokens differs"
            assert num_prompt_logprobs == 0, name
    assert result["greedy-penalties"]["num"] == result["seeded"]["num"] == 40  # max_tokens counts carried tokens
    # prompt_logprobs: one per prompt token after the first
    assert result["min-tokens"]["num"] >= 30 and result["min-tokens"]["prompt_logprobs"] == 7
