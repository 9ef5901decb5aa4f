"""Speculative decoding's parts alone: the n-gram lookup, --speculative-config checking, the back-off, and the
rejection sampler's output distribution (a statistical test against the exact distribution)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from builtin_plugins.speculative.ngram import NgramProposer, find_continuation
from kernelcore.config import KernelConfig, SpeculativeConfig
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.executor.rejection_sampler import verify
from kernelcore.executor.sampler import build_metadata
from kernelcore.speculative.controller import SpeculativeController
from kernelcore.speculative.proposer import ProposalRequest, build_registry, parse_speculative_config


def _lookup(tokens, min_n=1, max_n=3, k=3):
    return find_continuation(np.array(tokens, dtype=np.int64), min_n, max_n, k)


def test_ngram_takes_the_longest_suffix_and_its_latest_occurrence():
    assert _lookup([5, 6, 7, 8, 9, 1, 6, 7]) == [8, 9, 1]  # "6 7" seen before: what followed it
    assert _lookup([1, 2, 3, 9, 2, 3, 4, 0, 2, 3]) == [4, 0, 2]  # the latest "2 3" wins
    assert _lookup([1, 2, 3, 4, 7, 3, 4, 5, 1, 2, 3, 4], max_n=4) == [7, 3, 4]  # "1 2 3 4" beats "3 4"
    assert _lookup([4, 5, 6, 7, 8], min_n=1) == []  # nothing repeats
    assert _lookup([1, 2, 9, 1, 2], min_n=3) == []  # shorter than the minimum
    assert _lookup([3, 4, 3, 4], k=5) == [3, 4]  # only what exists after the match
    assert _lookup([7, 7, 7], min_n=1, max_n=2, k=2) == [7]


def test_ngram_proposer_follows_each_request_incrementally():
    config = KernelConfig(speculative=SpeculativeConfig("ngram", 2, prompt_lookup_max=2, prompt_lookup_min=1))
    proposer = NgramProposer(config, 100)
    tokens = [1, 2, 3, 1]
    assert proposer.propose([ProposalRequest("a", tokens, 2)]) == [[2, 3]]
    tokens += [2, 3, 9, 2]
    assert proposer.propose([ProposalRequest("a", tokens, 2), ProposalRequest("b", [5, 6], 2)]) == [[3, 9], []]
    proposer.remove("a")
    assert proposer.propose([ProposalRequest("a", [8, 1, 8], 1)]) == [[1]]  # a fresh history


def test_builtin_ngram_is_registered_through_its_entry_point():
    assert build_registry().owners()["ngram"] == "speculative"


@pytest.mark.parametrize("value, message", [
    ("{", "not JSON"), ("[1]", "JSON object"), ({"num_speculative_tokens": 2}, "method"),
    ({"method": "nope", "num_speculative_tokens": 2}, "unknown speculative method 'nope'; installed: .*ngram"),
    ({"method": "ngram"}, "num_speculative_tokens"), ({"method": "ngram", "num_speculative_tokens": 0}, "positive"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2}, "larger"),
    ({"method": "ngram", "num_speculative_tokens": 3, "min_acceptance_rate": 2}, "min_acceptance_rate"),
])
def test_bad_speculative_configs_are_refused_with_the_reason(value, message):
    with pytest.raises(ValueError, match=message):
        parse_speculative_config(value)


def test_speculative_config_uses_vllm_spelling_and_keeps_other_keys_for_the_proposer():
    config = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5, '
                                      '"vendor_knob": 1}')
    assert (config.method, config.num_speculative_tokens, config.prompt_lookup_max) == ("ngram", 3, 5)
    assert config.prompt_lookup_min == 2 and config.options == {"vendor_knob": 1} and config.enabled
    assert not parse_speculative_config(None).enabled


def test_a_request_whose_drafts_fail_backs_off_for_longer_each_time():
    config = KernelConfig(speculative=SpeculativeConfig("ngram", 2, prompt_lookup_min=1, min_acceptance_rate=0.3))
    controller = SpeculativeController(config, 100)
    tokens = [1, 2, 1]
    asked = []
    for _ in range(11):
        drafts = controller.propose([("r", tokens, 5, 1)])
        asked.append(bool(drafts))
        if drafts:
            controller.record("r", len(drafts["r"]), 0)  # every draft rejected
    # fails twice before the average falls below 0.3, then waits 1, 2, 4 steps between tries
    assert asked == [True, True, False, True, False, False, True, False, False, False, False]
    assert controller.propose([("r", tokens, 5, 1)])
    controller.record("r", 2, 2)  # a verification that pays: proposing goes on
    assert controller.propose([("r", tokens, 5, 1)])


# -- the rejection sampler -----------------------------------------------------------------------------------

VOCAB = 5


def _simulate(chain: torch.Tensor, params: SamplingParams, num_sequences: int, length: int, propose) -> np.ndarray:
    """Generate ``length`` tokens after token 0 for ``num_sequences`` requests with speculative steps against
    a Markov-chain "model" (logits = chain[previous token]); returns [num_sequences, length] token ids."""
    sequences = [[0] for _ in range(num_sequences)]
    while any(len(s) <= length for s in sequences):
        active = [s for s in sequences if len(s) <= length]
        drafts = [propose(s) for s in active]
        rows = [chain[t] for s, d in zip(active, drafts, strict=True) for t in [s[-1], *d]]
        md = build_metadata([params] * len(rows), [None] * len(rows), VOCAB)
        result = verify(torch.stack(rows), md, drafts, [None] * len(active))
        for s, kept, nxt in zip(active, result.accepted, result.next_token_ids, strict=True):
            s.extend([*kept, nxt])
    return np.array([s[1:length + 1] for s in sequences])


def _exact_joint(chain: torch.Tensor, params: SamplingParams) -> np.ndarray:
    md = build_metadata([params] * VOCAB, [None] * VOCAB, VOCAB)
    from kernelcore.executor.sampler import Sampler

    p = Sampler.warp(Sampler.constrain(chain, md), md).softmax(-1).double().numpy()  # p[prev, next]
    return p[0][:, None] * p  # P(t1, t2) = p(t1 | 0) p(t2 | t1)


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3),
                                    SamplingParams(temperature=1.3, top_p=0.8)], ids=["t1", "topk", "topp"])
def test_rejection_sampling_gives_plain_samplings_distribution(params):
    """Drafts right, wrong and half right: the first two output tokens' joint distribution must be the chain's
    own. Chi-square over the 25 cells, N = 20000, fixed seed; the bound 52.6 is the 0.1% point of chi2(24)
    (cells with an expected count under 5 are pooled)."""
    torch.manual_seed(1234)
    generator = torch.Generator().manual_seed(7)
    chain = torch.randn(VOCAB, VOCAB, generator=generator) * 1.5
    guesses = torch.randint(0, VOCAB, (64,), generator=generator).tolist()

    def propose(sequence):  # a proposer that is sometimes right: depends on the context, not on the chain
        n = len(sequence)
        return [guesses[(sequence[-1] * 7 + n + i) % 64] for i in range(n % 3)]  # 0, 1 or 2 drafts

    observed = _simulate(chain, params, 20000, 2, propose)
    counts = np.zeros((VOCAB, VOCAB))
    np.add.at(counts, (observed[:, 0], observed[:, 1]), 1)
    expected = _exact_joint(chain, params) * len(observed)
    assert counts[expected == 0].sum() == 0, "a token outside top-k/top-p was produced"
    big = expected >= 5
    obs = np.append(counts[big], counts[~big & (expected > 0)].sum())
    exp = np.append(expected[big], expected[~big & (expected > 0)].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < 52.6, f"chi2 = {chi2:.1f}"


def test_a_procedure_that_trusts_drafts_fails_the_same_statistical_test():
    """The test above can fail: accepting every draft (no rejection) is caught by the same bound."""
    torch.manual_seed(1234)
    chain = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(7)) * 1.5
    params = SamplingParams(temperature=1.0)
    observed = _simulate(chain, params, 20000, 2, lambda s: [])
    observed[::2, 1] = 3  # half the second tokens replaced by an always-accepted draft
    counts = np.zeros((VOCAB, VOCAB))
    np.add.at(counts, (observed[:, 0], observed[:, 1]), 1)
    expected = _exact_joint(chain, params) * len(observed)
    chi2 = float(((counts - expected) ** 2 / np.maximum(expected, 1e-9)).sum())
    assert chi2 > 52.6


def test_greedy_keeps_exactly_the_drafts_that_are_the_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    md = build_metadata([SamplingParams(temperature=0)] * 5, [None] * 5, 3)
    result = verify(logits, md, [[1, 1], [0]], [None, None])
    # request 0: draft 1 = argmax(row 0) kept, draft 1 != argmax(row 1) = 0: replaced by 0
    # request 1: draft 0 = argmax(row 3) kept, bonus argmax(row 4) = 1
    assert result.accepted == [[1], [0]] and result.next_token_ids == [0, 1]
    assert result.row_token_ids.tolist() == [1, 0, -1, 0, 1]
