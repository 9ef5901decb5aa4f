"""Speculative decoding in the engine: n-gram drafts give token for token the output of plain greedy decoding, on
a real model and on random weights, with prefix caching, chunked prefill, structured outputs, LoRA and TP=2;
the acceptance counters count what happened; seeded sampling stays reproducible."""

from __future__ import annotations

import json

import pytest
import real_models
from conftest_models import make_llama_checkpoint
from helpers import run_python

from kernelcore.config_builder import build_config
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.engine.core import EngineCore
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.structured_output.params import StructuredOutputsParams

pytestmark = pytest.mark.slow  # the real SmolLM2 model and TP workers

smollm2_gguf = real_models.smollm2_gguf

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# back-off off: every draft the n-gram finds is verified, so the equivalence is checked on as many as possible
NGRAM_ALWAYS = {**NGRAM, "min_acceptance_rate": 0.0}
COUNTERS = ("spec_num_drafts", "spec_num_draft_tokens", "spec_num_accepted_tokens", "num_generation_tokens")


def run_engine(model: str | None, prompts: list[list[int]], params: list[SamplingParams], speculative=None,
               lora_ids: list[int] | None = None, adapters: dict[int, str] | None = None, repeat: int = 1,
               eos_token_id: int | None = None, **config):
    """Every prompt's output token ids (each prompt run ``repeat`` times, one after the other: the later runs
    hit the prefix cache) and the summed step counters."""
    core = EngineCore(build_config(model=model, speculative_config=speculative, kv_cache_memory=1 << 26, **config))
    for lora_id, path in (adapters or {}).items():
        core.add_lora(lora_id, f"adapter-{lora_id}", path)
    totals = dict.fromkeys(COUNTERS, 0)
    per_pos: list[int] = []
    outputs: dict[str, list[int]] = {}
    logprobs: dict[str, list] = {}
    try:
        for run in range(repeat):
            for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
                core.add_request(EngineCoreRequest(request_id=f"{run}-{i}", prompt_token_ids=prompt,
                                                   sampling_params=p, lora_id=(lora_ids or [0] * len(prompts))[i],
                                                   eos_token_id=eos_token_id))
            while core.has_unfinished_requests():
                step = core.step()
                for o in step.outputs:
                    outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
                    if o.new_logprobs:
                        assert len(o.new_logprobs) == len(o.new_token_ids)
                        logprobs.setdefault(o.request_id, []).extend(
                            (lp.token_ids[0], lp.logprobs[0], lp.token_ids[1:]) for lp in o.new_logprobs)
                if step.stats is not None:
                    for name in COUNTERS:
                        totals[name] += getattr(step.stats, name)
                    for pos, n in enumerate(step.stats.spec_accepted_per_pos):
                        per_pos.extend([0] * (pos + 1 - len(per_pos)))
                        per_pos[pos] += n
                assert not step.errors, step.errors
    finally:
        core.shutdown()
    totals["per_pos"] = per_pos
    totals["logprobs"] = logprobs
    return [outputs[f"{run}-{i}"] for run in range(repeat) for i in range(len(prompts))], totals


def chat_prompt(path: str, text: str) -> list[int]:
    from kernelcore.engine.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(path)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return tokenizer.encode(rendered, add_special_tokens=False)


CODE = """def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)
"""
REAL_PROMPTS = [
    "Fix the typo in this sentence and write the corrected sentence: The quick brown fox jumpd over the lazy dog.",
    "Context: The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
    "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.\n\nQuestion: "
    "Who is the Eiffel Tower named after? Quote the sentence from the context that answers.",
    f"Add type hints to this function and show the full function:\n\n{CODE}",
    "Write a short poem about the sea."]
SMOLLM2_EOS = 2  # <|im_end|>


@pytest.fixture(scope="module")
def real_prompts(smollm2_gguf):
    return [chat_prompt(smollm2_gguf, t) for t in REAL_PROMPTS]


@pytest.mark.parametrize("enable_prefix_caching", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_real_model_greedy_output_is_plain_decodings(smollm2_gguf, real_prompts, enable_prefix_caching):
    params = [SamplingParams(temperature=0, max_tokens=80)] * len(real_prompts)
    kw = dict(max_model_len=1024, enable_prefix_caching=enable_prefix_caching, repeat=2, eos_token_id=SMOLLM2_EOS)
    plain, plain_counts = run_engine(smollm2_gguf, real_prompts, params, **kw)
    spec, counts = run_engine(smollm2_gguf, real_prompts, params, NGRAM_ALWAYS, **kw)
    assert spec == plain
    assert plain_counts["spec_num_drafts"] == 0
    assert counts["num_generation_tokens"] == plain_counts["num_generation_tokens"] == sum(map(len, plain))
    # the answers quote their prompts in part: a good share of the drafts is right (about 40% on this model)
    assert counts["spec_num_accepted_tokens"] > 0.2 * counts["spec_num_draft_tokens"] > 0
    assert sum(counts["per_pos"]) == counts["spec_num_accepted_tokens"]
    assert counts["per_pos"] == sorted(counts["per_pos"], reverse=True)  # a later position needs the earlier ones
    # fewer steps than tokens: speculation saved forward passes
    assert counts["spec_num_accepted_tokens"] + counts["spec_num_drafts"] <= counts["num_generation_tokens"]


def test_real_model_many_drafts_are_plain_decodings(smollm2_gguf, real_prompts):
    """Twelve drafts: a verification of up to 13 rows, past the CPU's 8-row register kernels (passes of 4-8
    rows) and past its default graph size (verification sizes are captured beyond it)."""
    params = [SamplingParams(temperature=0, max_tokens=80)] * len(real_prompts)
    kw = dict(max_model_len=1024, eos_token_id=SMOLLM2_EOS)
    plain, _ = run_engine(smollm2_gguf, real_prompts, params, **kw)
    spec, counts = run_engine(smollm2_gguf, real_prompts, params, {**NGRAM_ALWAYS, "num_speculative_tokens": 12},
                              **kw)
    assert spec == plain
    assert len(counts["per_pos"]) > 8 and counts["per_pos"][8] > 0  # some verification accepted a 9th draft


def test_real_model_chunked_prefill_and_a_mixed_batch(smollm2_gguf, real_prompts):
    """Small prefill chunks while others decode with drafts; greedy and seeded requests side by side."""
    params = [SamplingParams(temperature=0, max_tokens=60), SamplingParams(temperature=0.8, seed=3, max_tokens=40),
              SamplingParams(temperature=0, max_tokens=60, logprobs=2), SamplingParams(temperature=0, max_tokens=60)]
    kw = dict(max_model_len=1024, max_num_batched_tokens=24, max_num_seqs=4, eos_token_id=SMOLLM2_EOS)
    plain, plain_counts = run_engine(smollm2_gguf, real_prompts, params, **kw)
    spec, counts = run_engine(smollm2_gguf, real_prompts, params, NGRAM_ALWAYS, **kw)
    again, _ = run_engine(smollm2_gguf, real_prompts, params, NGRAM_ALWAYS, **kw)
    # logprobs of accepted drafts are reported as for sampled tokens: same tokens, same top-2, close values
    ours, ref = counts["logprobs"]["0-2"], plain_counts["logprobs"]["0-2"]
    assert [(t, top) for t, _, top in ours] == [(t, top) for t, _, top in ref]
    assert [lp for _, lp, _ in ours] == pytest.approx([lp for _, lp, _ in ref], abs=2e-3)
    assert [spec[i] for i in (0, 2, 3)] == [plain[i] for i in (0, 2, 3)]  # greedy rows: the same tokens
    assert again == spec  # a seeded request with speculation is reproducible
    assert counts["spec_num_accepted_tokens"] > 0


def test_real_model_structured_output_with_drafts(smollm2_gguf):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                                               "age": {"type": "integer"}},
              "required": ["name", "city", "age"], "additionalProperties": False}
    text = ('Copy this record as JSON: {"name": "Ada Lovelace", "city": "London", "age": 36}. '
            'Then copy it once more.')
    prompt = chat_prompt(smollm2_gguf, text)
    constrained = SamplingParams(temperature=0, max_tokens=60,
                                 structured_outputs=StructuredOutputsParams(json=schema))
    params = [constrained, SamplingParams(temperature=0, max_tokens=40)]
    plain, _ = run_engine(smollm2_gguf, [prompt, prompt], params, max_model_len=1024)
    spec, counts = run_engine(smollm2_gguf, [prompt, prompt], params, NGRAM_ALWAYS, max_model_len=1024)
    assert spec == plain
    assert counts["spec_num_accepted_tokens"] > 0
    from kernelcore.engine.tokenizer import get_tokenizer

    record = json.loads(get_tokenizer(smollm2_gguf).decode(spec[0]))
    assert set(record) == {"name", "city", "age"}


def _looping_prompts(n: int, vocab: int = 320) -> list[list[int]]:
    """Prompts with repeated spans: random weights copy nothing, but greedy decoding falls into cycles that the
    n-gram lookup finds in the output."""
    import torch

    g = torch.Generator().manual_seed(11)
    prompts = []
    for i in range(n):
        span = torch.randint(3, vocab, (6 + i,), generator=g).tolist()
        prompts.append(span * 3 + span[:3])
    return prompts


def test_random_default_model_greedy_output_is_plain_decodings():
    prompts = _looping_prompts(4, vocab=1000)
    params = [SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)] * len(prompts)
    plain, _ = run_engine(None, prompts, params, max_model_len=512)
    spec, counts = run_engine(None, prompts, params, NGRAM_ALWAYS, max_model_len=512)
    assert spec == plain
    assert counts["spec_num_accepted_tokens"] > 0


@pytest.fixture(scope="module")
def llama_with_adapter(tmp_path_factory):
    from lora_helpers import make_peft_adapter

    root = tmp_path_factory.mktemp("spec-lora")
    base = make_llama_checkpoint(str(root / "base"), std=0.05)  # small weights: greedy output falls into cycles
    return base, make_peft_adapter(base, str(root / "adapter"), "llama", seed=1, rank=8, alpha=16, std=0.2)


def test_lora_requests_with_drafts_keep_their_adapter(llama_with_adapter):
    base, adapter = llama_with_adapter
    prompts = _looping_prompts(3)
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)] * 3
    kw = dict(lora_ids=[1, 0, 1], adapters={1: adapter}, enable_lora=True, max_lora_rank=8)
    plain, _ = run_engine(base, prompts, params, **kw)
    spec, counts = run_engine(base, prompts, params, NGRAM_ALWAYS, **kw)
    assert spec == plain
    assert plain[0] != run_engine(base, prompts[:1], params[:1])[0][0]  # the adapter changes the output
    assert counts["spec_num_accepted_tokens"] > 0


TP_SCRIPT = """
import json, sys
sys.path.insert(0, TESTS)
from test_speculative_engine import run_engine, _looping_prompts, NGRAM_ALWAYS
from kernelcore.core_types.sampling_params import SamplingParams
if __name__ == "__main__":
    prompts = _looping_prompts(3)
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)] * 3
    plain, _ = run_engine(MODEL, prompts, params, tensor_parallel_size=1)
    spec, counts = run_engine(MODEL, prompts, params, NGRAM_ALWAYS, tensor_parallel_size=2)
    print(json.dumps({"plain": plain, "spec": spec, "accepted": counts["spec_num_accepted_tokens"]}))
"""


def test_tensor_parallel_two_ranks_with_drafts(llama_with_adapter):
    import os

    base, _ = llama_with_adapter
    script = TP_SCRIPT.replace("TESTS", repr(os.path.dirname(__file__))).replace("MODEL", repr(base))
    result = json.loads(run_python(script, timeout=600).stdout.strip().splitlines()[-1])
    assert result["spec"] == result["plain"] and result["accepted"] > 0
