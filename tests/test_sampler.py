import torch
from test_engine_fakes import make_core, make_request, run_to_completion

from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.executor.sampler import Sampler, argmax_rows, build_metadata

V = 50


def _sample(logits, params, generators=None):
    md = build_metadata(params, generators or [None] * len(params), logits.shape[1])
    return Sampler()(logits.clone(), md)


def test_greedy_is_argmax():
    logits = torch.randn(4, V)
    out = _sample(logits, [SamplingParams(temperature=0)] * 4)
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))


def test_top_k_never_samples_outside_allowed_set():
    torch.manual_seed(0)
    logits = torch.randn(8, V).repeat(50, 1)
    params = [SamplingParams(temperature=1.5, top_k=k) for k in (1, 2, 3, 5, 10, 20, -1, 4)] * 50
    sampled = _sample(logits, params).sampled_token_ids
    for row, p in enumerate(params):
        if p.top_k > 0:
            allowed = set(logits[row].topk(p.top_k).indices.tolist())
            assert int(sampled[row]) in allowed


def test_top_p_never_samples_outside_nucleus_and_covers_it():
    torch.manual_seed(1)
    base = torch.randn(V) * 2
    logits = base.repeat(2000, 1)
    sampled = _sample(logits, [SamplingParams(temperature=1.0, top_p=0.5)] * 2000).sampled_token_ids
    probs = base.softmax(-1)
    order = probs.argsort(descending=True)
    cum = probs[order].cumsum(0)
    nucleus = set(order[:int((cum < 0.5).sum()) + 1].tolist())
    seen = set(sampled.tolist())
    assert seen <= nucleus
    assert len(seen) == len(nucleus)  # every allowed token shows up in 2000 draws


def test_min_p_filters_unlikely_tokens():
    logits = torch.tensor([[5.0, 4.9, 0.0, -1.0] + [-10.0] * (V - 4)]).repeat(500, 1)
    sampled = _sample(logits, [SamplingParams(temperature=1.0, min_p=0.5)] * 500).sampled_token_ids
    assert set(sampled.tolist()) == {0, 1}


def test_sampling_matches_distribution():
    torch.manual_seed(2)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    sampled = _sample(logits, [SamplingParams(temperature=1.0)] * 20000).sampled_token_ids
    freq = torch.bincount(sampled, minlength=4).float() / 20000
    assert torch.allclose(freq, logits[0].softmax(-1), atol=0.02)


def test_seed_reproducible_across_batch_mixes():
    logits = torch.randn(1, V)
    alone = []
    g = torch.Generator().manual_seed(1234)
    for _ in range(5):
        alone.append(int(_sample(logits, [SamplingParams(temperature=1.0, seed=1234)], [g]).sampled_token_ids[0]))
    g = torch.Generator().manual_seed(1234)
    mixed = []
    for step in range(5):
        others = torch.randn(3 + step, V)
        batch = torch.cat([others[:2], logits, others[2:]])
        params = [SamplingParams(temperature=0.7)] * 2 + [SamplingParams(temperature=1.0, seed=1234)] + \
                 [SamplingParams(temperature=0)] * (1 + step)
        gens = [None, None, g] + [None] * (1 + step)
        mixed.append(int(_sample(batch, params, gens).sampled_token_ids[2]))
    assert alone == mixed


def test_penalties():
    logits = torch.zeros(1, V)
    logits[0, 3] = 1.0
    logits[0, 4] = 0.9
    md = build_metadata([SamplingParams(temperature=0, frequency_penalty=1.0)], [None], V)
    md.prompt_token_ids, md.output_token_ids = [[1]], [[3]]
    assert int(Sampler()(logits, md).sampled_token_ids[0]) == 4
    md = build_metadata([SamplingParams(temperature=0, repetition_penalty=2.0)], [None], V)
    md.prompt_token_ids, md.output_token_ids = [[3]], [[]]
    assert int(Sampler()(logits, md).sampled_token_ids[0]) == 4
    md = build_metadata([SamplingParams(temperature=0, presence_penalty=0.05)], [None], V)
    md.prompt_token_ids, md.output_token_ids = [[]], [[3, 3]]
    assert int(Sampler()(logits, md).sampled_token_ids[0]) == 3


def test_logprobs_and_ranks():
    logits = torch.randn(3, V)
    md = build_metadata([SamplingParams(temperature=0, logprobs=5)] * 3, [None] * 3, V)
    out = Sampler()(logits, md)
    lp = logits.log_softmax(-1)
    assert torch.equal(out.logprob_token_ids[:, 0], logits.argmax(-1))
    assert torch.allclose(out.logprobs[:, 1:], lp.topk(5).values)
    assert out.ranks.tolist() == [1, 1, 1]


def test_engine_seeded_requests_reproducible_regardless_of_neighbours():
    prompt = [3, 4, 5, 6]
    core = make_core()
    core.add_request(make_request("alone", prompt, temperature=1.0, seed=7, max_tokens=12))
    alone = run_to_completion(core)["alone"][0]
    core = make_core(max_num_batched_tokens=16)
    for i in range(5):
        core.add_request(make_request(f"n{i}", [9, i + 1, 2] * (i + 1), temperature=1.0, max_tokens=12 + i))
    core.add_request(make_request("mixed", prompt, temperature=1.0, seed=7, max_tokens=12))
    assert run_to_completion(core)["mixed"][0] == alone


def test_params_validation():
    import pytest

    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(min_p=2), dict(n=0), dict(max_tokens=0),
                dict(min_tokens=5, max_tokens=2), dict(presence_penalty=3), dict(repetition_penalty=0),
                dict(seed=2**64)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert SamplingParams(stop="x").stop == ["x"]


def test_logit_bias_forces_and_bans_and_allowed_token_ids_restrict():
    from kernelcore.core_types.sampling_params import SamplingParams
    from kernelcore.executor.sampler import Sampler, build_metadata

    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    top = int(logits[1].argmax())
    params = [SamplingParams(temperature=0, logit_bias={7: 100.0}),
              SamplingParams(temperature=0, logit_bias={top: -100.0}),
              SamplingParams(temperature=1.0, allowed_token_ids=[3, 4])]
    for _ in range(20):
        out = Sampler()(logits.clone(), build_metadata(params, [None] * 3, 50)).sampled_token_ids.tolist()
        assert out[0] == 7 and out[1] != top and out[2] in (3, 4)


def test_argmax_rows_is_argmax_with_ties_infinities_and_nan():
    """Greedy tokens come from argmax_rows (max's indices, faster on the CPU): the first maximal index as
    argmax gives, where values tie, are infinite or NaN."""
    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        x = torch.randint(-3, 4, (1 + trial % 8, 1 + 37 * trial % 3001), generator=g).float()  # many ties
        r = torch.rand(x.shape, generator=g)
        x[r < 0.05] = float("-inf")
        x[(r > 0.5) & (r < 0.52)] = float("inf")
        if trial % 2:
            x[r > 0.995] = float("nan")
        assert torch.equal(argmax_rows(x), x.argmax(dim=-1)), trial
    every_minus_inf = torch.full((3, 50), float("-inf"))
    assert argmax_rows(every_minus_inf).tolist() == every_minus_inf.argmax(dim=-1).tolist() == [0, 0, 0]
