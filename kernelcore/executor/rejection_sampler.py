"""Verifying draft tokens: given the target model's logits at each position of a request's drafts (and one past
them), keep the drafts plain sampling could have produced and sample the token after them.

Greedy rows keep a draft exactly when it is the argmax (so the output is token for token plain greedy
decoding). Sampled rows use rejection sampling against a point-mass draft distribution q (a proposer that
names tokens, not distributions): draft d is kept with probability min(1, p(d) / q(d)) = p(d); after a
rejection the token is drawn from the residual max(p - q, 0), i.e. p with d removed and renormalised. Each
output token then has exactly the distribution p of plain sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelcore.executor.sampler import Sampler, SamplingMetadata, argmax_rows


@dataclass
class VerifyResult:
    accepted: list[list[int]]  # per request: the drafts kept, in order
    next_token_ids: list[int]  # per request: the token sampled after them (recovered or bonus)
    row_token_ids: torch.Tensor  # [rows] long: the token each row produced (draft, recovered or bonus; -1 unused)
    raw_logits: torch.Tensor  # grammar-masked logits (what logprobs are reported from)


def verify(logits: torch.Tensor, md: SamplingMetadata, drafts: list[list[int]],
           generators: list[torch.Generator | None]) -> VerifyResult:
    """``logits`` has 1 + len(drafts[i]) consecutive rows per request i: row j predicts the token after the
    request's j-th draft (row 0: after its last real token). ``md`` is built over those rows (each request's
    parameters repeated, penalties and min_tokens counting the drafts before the row). ``generators``: per
    request, its seeded generator or None."""
    raw = Sampler.apply_grammar(logits, md)
    constrained = Sampler.constrain(raw, md)
    num_rows = constrained.shape[0]
    starts, draft_of_row = [], torch.full((num_rows,), -1, dtype=torch.long)
    row = 0
    for d in drafts:
        starts.append(row)
        if d:
            draft_of_row[row:row + len(d)] = torch.tensor(d, dtype=torch.long)
        row += len(d) + 1
    assert row == num_rows, f"{num_rows} logits rows for {row} draft positions"
    has_draft = draft_of_row >= 0
    safe_draft = draft_of_row.clamp(min=0)

    greedy_choice = argmax_rows(constrained)
    accept = has_draft & (greedy_choice == draft_of_row)
    choice = greedy_choice
    if not md.is_all_greedy:
        probs = Sampler.warp(constrained, md).softmax(dim=-1)
        # one uniform per row and one exponential race per row, seeded requests from their own generator
        uniform = torch.rand(num_rows)
        race = torch.empty_like(probs).exponential_()
        for i, generator in enumerate(generators):
            if generator is not None:
                rows = slice(starts[i], starts[i] + len(drafts[i]) + 1)
                uniform[rows] = torch.rand(len(drafts[i]) + 1, generator=generator)
                race[rows].exponential_(generator=generator)
        p_draft = probs.gather(1, safe_draft.unsqueeze(1)).squeeze(1)
        random_accept = has_draft & (uniform < p_draft)
        residual = probs.clone()
        draft_rows = has_draft.nonzero().squeeze(1)
        residual[draft_rows, draft_of_row[draft_rows]] = 0.0  # q is a point mass: max(p - q, 0) drops only d
        random_choice = argmax_rows(residual.div_(race))
        accept = torch.where(md.is_greedy, accept, random_accept)
        choice = torch.where(md.is_greedy, greedy_choice, random_choice)

    accept_list, choice_list, draft_list = accept.tolist(), choice.tolist(), draft_of_row.tolist()
    row_tokens = [-1] * num_rows
    accepted, next_ids = [], []
    for start, d in zip(starts, drafts, strict=True):
        kept = 0
        while kept < len(d) and accept_list[start + kept]:
            row_tokens[start + kept] = draft_list[start + kept]
            kept += 1
        row_tokens[start + kept] = choice_list[start + kept]
        accepted.append(list(d[:kept]))
        next_ids.append(choice_list[start + kept])
    return VerifyResult(accepted, next_ids, torch.tensor(row_tokens, dtype=torch.long), raw)
