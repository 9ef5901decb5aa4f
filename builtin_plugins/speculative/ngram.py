"""Prompt-lookup (n-gram) proposer: when the last few tokens appeared earlier in the request, guess that what
followed them then follows them again. Input-grounded work (editing code, quoting a document, filling a form
from the prompt) repeats long runs of its context, and the guess needs no model at all."""

from __future__ import annotations

import numpy as np

from kernelcore.speculative.proposer import ProposalRequest, Proposer


class _History:
    """A request's tokens as a growing int64 array (appended to, never rebuilt)."""

    __slots__ = ("array", "length")

    def __init__(self) -> None:
        self.array = np.empty(256, dtype=np.int64)
        self.length = 0

    def sync(self, token_ids) -> np.ndarray:
        n = len(token_ids)
        if n < self.length:  # not an extension (a reused id): start over
            self.length = 0
        if n > self.array.size:
            grown = np.empty(max(n, 2 * self.array.size), dtype=np.int64)
            grown[:self.length] = self.array[:self.length]
            self.array = grown
        if n > self.length:
            self.array[self.length:n] = token_ids[self.length:n]
            self.length = n
        return self.array[:n]


def find_continuation(tokens: np.ndarray, min_n: int, max_n: int, num_tokens: int) -> list[int]:
    """The tokens after the most recent earlier occurrence of the longest suffix of ``tokens`` of ``max_n``
    down to ``min_n`` tokens (at most ``num_tokens`` of them; none when no suffix occurs earlier)."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        # candidate starts: an earlier window whose first token matches and whose continuation exists
        starts = np.flatnonzero(tokens[:length - n] == suffix[0])
        for offset in range(1, n):
            if starts.size == 0:
                break
            starts = starts[tokens[starts + offset] == suffix[offset]]
        if starts.size:
            start = int(starts[-1]) + n
            return tokens[start:start + num_tokens].tolist()
    return []


class NgramProposer(Proposer):
    def __init__(self, config, vocab_size: int) -> None:
        spec = config.speculative
        self.min_n, self.max_n = spec.prompt_lookup_min, spec.prompt_lookup_max
        self._histories: dict[str, _History] = {}

    def propose(self, requests: list[ProposalRequest]) -> list[list[int]]:
        drafts = []
        for request in requests:
            history = self._histories.get(request.request_id)
            if history is None:
                history = self._histories[request.request_id] = _History()
            tokens = history.sync(request.token_ids)
            drafts.append(find_continuation(tokens, self.min_n, self.max_n, request.num_tokens))
        return drafts

    def remove(self, request_id: str) -> None:
        self._histories.pop(request_id, None)
