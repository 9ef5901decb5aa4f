"""The engine core's side of speculative decoding: ask the proposer for drafts, and back a request off when
its drafts keep failing (a rejected draft costs a wider forward pass and gives nothing)."""

from __future__ import annotations

from dataclasses import dataclass

from kernelcore.speculative.proposer import ProposalRequest, build_registry

MAX_BACKOFF_STEPS = 64


@dataclass
class _Acceptance:
    rate: float = 1.0  # moving average of accepted / drafted per verification
    backoff: int = 1  # steps to wait after the next failure
    wait: int = 0  # steps left before this request proposes again


class SpeculativeController:
    def __init__(self, config, vocab_size: int) -> None:
        spec = config.speculative
        self.num_speculative_tokens = spec.num_speculative_tokens
        self.min_acceptance_rate = spec.min_acceptance_rate
        self.vocab_size = vocab_size
        self.proposer = build_registry().factory(spec.method)(config, vocab_size)
        self._acceptance: dict[str, _Acceptance] = {}

    def propose(self, candidates: list[tuple[str, list[int], int, int]]) -> dict[str, list[int]]:
        """Drafts for (request id, token ids, drafts wanted at most, prompt length) of each decoding request;
        requests backing off are not asked."""
        asked = []
        for request_id, token_ids, limit, num_prompt in candidates:
            state = self._acceptance.setdefault(request_id, _Acceptance())
            if state.wait:
                state.wait -= 1
                continue
            num_tokens = min(limit, self.num_speculative_tokens)
            if num_tokens > 0:
                asked.append(ProposalRequest(request_id, token_ids, num_tokens, num_prompt))
        if not asked:
            return {}
        drafts = {}
        for request, proposal in zip(asked, self.proposer.propose(asked), strict=False):
            proposal = list(proposal)[:request.num_tokens]
            for i, token_id in enumerate(proposal):
                if not (isinstance(token_id, int) and 0 <= token_id < self.vocab_size):
                    proposal = proposal[:i]
                    break
            if proposal:
                drafts[request.request_id] = proposal
        return drafts

    def record(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """One verification's outcome: a request whose acceptance rate falls below the minimum waits, twice as
        long each time it fails again, then tries again."""
        state = self._acceptance.get(request_id)
        if state is None or num_drafts == 0:
            return
        state.rate = 0.5 * state.rate + 0.5 * num_accepted / num_drafts
        if state.rate < self.min_acceptance_rate:
            state.wait = state.backoff
            state.backoff = min(2 * state.backoff, MAX_BACKOFF_STEPS)
            state.rate = self.min_acceptance_rate  # one good verification after the wait is enough to go on
        elif num_accepted / num_drafts >= self.min_acceptance_rate:
            state.backoff = max(1, state.backoff // 2)

    def remove(self, request_id: str) -> None:
        self._acceptance.pop(request_id, None)
        self.proposer.remove(request_id)
