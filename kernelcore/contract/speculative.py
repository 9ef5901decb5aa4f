"""The proposer contract: what a plugin implements to propose draft tokens, and the registry it fills.

A proposer runs in the engine-core process, once per step, over the running requests that decode. It sees
each request's whole token sequence (prompt and output) and returns up to ``num_tokens`` guesses of what
follows. Guesses cost one wider forward pass to check and are free to be wrong: the engine keeps only the
prefix the target model agrees with (greedy) or accepts by rejection sampling (temperature > 0), so the
output is the plain decoding output whatever the proposer says.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kernelcore.contract.targets import resolve_target


@dataclass
class ProposalRequest:
    """One decoding request asking for drafts this step."""

    request_id: str
    token_ids: Sequence[int]  # prompt and output so far; the last token is the one this step computes
    num_tokens: int  # drafts wanted at most (>= 1)
    num_prompt_tokens: int = 0


class Proposer(abc.ABC):
    """Guesses the next tokens of running requests. Constructed as ``factory(config, vocab_size)`` with the
    engine's :class:`~kernelcore.contract.config.KernelConfig`; ``config.speculative`` holds its settings."""

    @abc.abstractmethod
    def propose(self, requests: list[ProposalRequest]) -> list[list[int]]:
        """Draft tokens for each request, in order (an empty list: no guess for that one this step).

        A list longer than its ``num_tokens`` is cut; ids outside the vocabulary are dropped with what follows.
        """

    def remove(self, request_id: str) -> None:  # noqa: B027 (optional: a no-op unless overridden)
        """Forget a finished request's state (proposers that keep some override it)."""


ProposerFactory = Callable[[Any, int], Proposer] | str  # or "module:Class", imported on first use


class SpeculativeProposerRegistry:
    """Proposers by method name (``--speculative-config '{"method": NAME, ...}'``)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[ProposerFactory, str | None]] = {}
        self.owner: str | None = None  # the plugin whose hook is registering (set by build_registry)

    def register(self, name: str, factory: ProposerFactory) -> None:
        if name in self._entries:
            raise ValueError(f"speculative proposer {name!r} is registered twice")
        self._entries[name] = (factory, self.owner)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def owners(self) -> dict[str, str | None]:
        return {name: self._entries[name][1] for name in self.names()}

    def factory(self, name: str) -> Callable[[Any, int], Proposer]:
        if name not in self._entries:
            raise ValueError(f"unknown speculative method {name!r}; installed: {', '.join(self.names()) or 'none'}")
        return resolve_target(self._entries[name][0])
