import pytest
import torch
from conftest_models import make_llama_checkpoint

from kernelcore import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(kv_cache_memory=8 << 20, max_model_len=512)


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return make_llama_checkpoint(str(tmp_path_factory.mktemp("llama")))


def test_generate_default_model_text_and_ids_in_order(llm):
    prompts = ["Hello, my name is", {"prompt_token_ids": [1, 20, 30, 40]}, "The capital of France is"]
    outs = llm.generate(prompts, [GREEDY, GREEDY, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)],
                        use_tqdm=False)
    assert [o.prompt for o in outs] == ["Hello, my name is", None, "The capital of France is"]
    assert outs[1].prompt_token_ids == [1, 20, 30, 40]
    assert [len(o.outputs[0].token_ids) for o in outs] == [12, 12, 3]
    for o in outs:
        c = o.outputs[0]
        assert o.finished and c.finish_reason == "length" and c.stop_reason is None
        assert c.text == llm.tokenizer.decode(o.prompt_token_ids + c.token_ids, skip_special_tokens=True)[
            len(llm.tokenizer.decode(o.prompt_token_ids, skip_special_tokens=True)):]
    again = llm.generate(prompts[0], GREEDY, use_tqdm=False)
    assert again[0].outputs[0].token_ids == outs[0].outputs[0].token_ids


def test_chat_applies_template(llm):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)[0]
    expected = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert llm.tokenizer.decode(out.prompt_token_ids) .endswith(expected.split("<|user|>")[1][-12:])
    assert len(out.outputs[0].token_ids) == 5


def test_stop_string_and_stop_token(llm):
    base = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    text = base.text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    cut = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop and cut.text == text[:text.index(stop)]
    stop_id = base.token_ids[5]
    by_id = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                            stop_token_ids=[stop_id]), use_tqdm=False)[0].outputs[0]
    first = base.token_ids.index(stop_id)
    assert by_id.token_ids == base.token_ids[:first + 1] and by_id.stop_reason == stop_id


def test_n_parallel_samples_and_seed(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=8, ignore_eos=True)
    a = llm.generate("Tell me a story", params, use_tqdm=False)[0]
    b = llm.generate("Tell me a story", params, use_tqdm=False)[0]
    assert [c.index for c in a.outputs] == [0, 1, 2]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1


def test_logprobs_and_prompt_logprobs(llm):
    out = llm.generate({"prompt_token_ids": [1, 50, 60, 70, 80]},
                       SamplingParams(temperature=0, max_tokens=4, logprobs=3, prompt_logprobs=2, ignore_eos=True),
                       use_tqdm=False)[0]
    c = out.outputs[0]
    assert len(c.logprobs) == 4
    for token_id, d in zip(c.token_ids, c.logprobs, strict=True):
        assert d[token_id].rank == 1 and len(d) == 3
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == 5
    for token_id, d in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:], strict=True):
        assert token_id in d and 2 <= len(d) <= 3


def test_rejects_too_long(llm):
    with pytest.raises(ValueError, match="maximum context length"):
        llm.generate({"prompt_token_ids": [5] * 500}, SamplingParams(max_tokens=100), use_tqdm=False)
    assert not llm.engine_core.has_unfinished_requests()


def test_greedy_matches_transformers(llama_path):
    from transformers import LlamaForCausalLM

    llm = LLM(llama_path, kv_cache_memory=4 << 20, block_size=8, max_num_batched_tokens=32)
    hf = LlamaForCausalLM.from_pretrained(llama_path).eval()
    prompts = [[1, 5, 9, 13, 200, 7], [1, 50, 60], list(range(3, 60))]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    for p, o in zip(prompts, outs, strict=True):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert o.outputs[0].token_ids == ref[0, len(p):].tolist()


def test_preemption_tiny_cache_same_greedy(llama_path):
    prompts = [{"prompt_token_ids": [1] + list(range(10 + i, 22 + 2 * i))} for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    big = LLM(llama_path, kv_cache_memory=4 << 20, block_size=8).generate(prompts, params, use_tqdm=False)
    block_bytes = 2 * 2 * 8 * 2 * 16 * 4  # layers * (k, v) * block_size * kv heads * head size * fp32
    tiny_llm = LLM(llama_path, kv_cache_memory=20 * block_bytes, block_size=8)
    assert tiny_llm.engine_core.num_blocks == 20
    tiny = tiny_llm.generate(prompts, params, use_tqdm=False)
    assert tiny_llm.engine_core.scheduler.num_preemptions_total > 0
    assert [o.outputs[0].token_ids for o in tiny] == [o.outputs[0].token_ids for o in big]
    kv = tiny_llm.engine_core.scheduler.kv
    assert kv.num_free_blocks == kv.num_blocks


def test_prefix_cache_hit_matches_miss(llama_path):
    llm = LLM(llama_path, kv_cache_memory=4 << 20, block_size=8)
    prompt = {"prompt_token_ids": [1] + list(range(20, 60))}
    params = SamplingParams(temperature=0, max_tokens=10, logprobs=5, ignore_eos=True)
    miss = llm.generate(prompt, params, use_tqdm=False)[0]
    hits_before = llm.engine_core.scheduler.kv.num_hits
    hit = llm.generate(prompt, params, use_tqdm=False)[0]
    assert llm.engine_core.scheduler.kv.num_hits - hits_before == 40
    assert hit.num_cached_tokens == 40
    assert hit.outputs[0].token_ids == miss.outputs[0].token_ids
    for a, b in zip(hit.outputs[0].logprobs, miss.outputs[0].logprobs, strict=True):
        assert a.keys() == b.keys()
        assert all(abs(a[k].logprob - b[k].logprob) < 1e-4 for k in a)
