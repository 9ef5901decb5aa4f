"""The CPU platform's decode graphs end to end: an engine replaying kernel tapes generates exactly what the same
engine run eagerly generates (tokens and logprobs; float32, bfloat16 and int8 weights; one sequence and a
batch that pads to a captured size), and the tapes were replayed."""

from __future__ import annotations

import pytest
from conftest_models import make_llama_checkpoint

from kernelcore import LLM, SamplingParams


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    # head_size 32, rows of 128/256: the native kernels' shapes
    return make_llama_checkpoint(str(tmp_path_factory.mktemp("llama") / "ckpt"), hidden_size=128,
                                 intermediate_size=256)


def generate(path, prompts, **kwargs):
    llm = LLM(path, kv_cache_memory=8 << 20, block_size=8, max_num_seqs=8, **kwargs)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


@pytest.mark.parametrize("config", [dict(dtype="float32"), dict(dtype="bfloat16"),
                                    dict(dtype="bfloat16", quantization="int8")], ids=["fp32", "bf16", "int8"])
@pytest.mark.parametrize("num_prompts", [1, 3])
def test_replayed_decode_steps_generate_what_eager_steps_do(llama_path, config, num_prompts):
    prompts = [[5 + i, 17, 33 + 7 * i, 101, 9][: 3 + i] for i in range(num_prompts)]
    llm, got = generate(llama_path, prompts, **config)
    runner = llm.engine_core.executor.worker.model_runner
    assert runner.graph_runner is not None and runner.graph_runner.num_replays >= 20
    _, want = generate(llama_path, prompts, enforce_eager=True, **config)
    for (got_ids, got_lps), (want_ids, want_lps) in zip(got, want, strict=True):
        assert got_ids == want_ids
        for g, w in zip(got_lps, want_lps, strict=True):  # the same kernels on the same inputs: equal logprobs
            assert g.keys() == w.keys()
            assert all(abs(g[t].logprob - w[t].logprob) < 1e-5 for t in g)


def test_weights_move_to_one_huge_page_arena_with_ties_and_values_kept():
    import torch
    from torch import nn

    from builtin_plugins.cpu.hugepages import move_weights_to_huge_pages

    model = nn.Sequential(nn.Embedding(4096, 256), nn.Linear(256, 4096, bias=True))
    model[1].weight = model[0].weight  # tied, as an LM head and its embedding
    model.register_buffer("table", torch.arange(10.0))
    before = {name: t.clone() for name, t in model.state_dict().items()}
    moved = move_weights_to_huge_pages(model, min_total_bytes=0)
    assert moved >= 4096 * 256 * 4 + 4096 * 4 and "_kc_huge_page_arena" in model.__dict__
    assert model[1].weight is model[0].weight
    arena = torch.frombuffer(model.__dict__["_kc_huge_page_arena"], dtype=torch.uint8)
    start, end = arena.data_ptr(), arena.data_ptr() + arena.numel()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
        assert start <= tensor.data_ptr() < end and tensor.data_ptr() % 64 == 0, name
