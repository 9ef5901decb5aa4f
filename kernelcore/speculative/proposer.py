"""The proposer contract: what a plugin implements to propose draft tokens, and the registry it fills.

A proposer runs in the engine-core process, once per step, over the running requests that decode. It sees
each request's whole token sequence (prompt and output) and returns up to ``num_tokens`` guesses of what
follows. Guesses cost one wider forward pass to check and are free to be wrong: the engine keeps only the
prefix the target model agrees with (greedy) or accepts by rejection sampling (temperature > 0), so the
output is the plain decoding output whatever the proposer says.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Callable

from kernelcore.config import SpeculativeConfig


@dataclass
class ProposalRequest:
    """One decoding request asking for drafts this step."""

    request_id: str
    token_ids: Sequence[int]  # prompt and output so far; the last token is the one this step computes
    num_tokens: int  # drafts wanted at most (>= 1)
    num_prompt_tokens: int = 0


class Proposer(abc.ABC):
    """Guesses the next tokens of running requests. Constructed as ``factory(config, vocab_size)`` with the
    engine's :class:`~kernelcore.config.KernelConfig`; ``config.speculative`` holds its settings."""

    @abc.abstractmethod
    def propose(self, requests: list[ProposalRequest]) -> list[list[int]]:
        """Draft tokens for each request, in order (an empty list: no guess for that one this step).

        A list longer than its ``num_tokens`` is cut; ids outside the vocabulary are dropped with what follows.
        """

    def remove(self, request_id: str) -> None:
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
        factory = self._entries[name][0]
        if isinstance(factory, str):
            import importlib

            module, _, attr = factory.partition(":")
            factory = getattr(importlib.import_module(module), attr)
        return factory


def build_registry() -> SpeculativeProposerRegistry:
    """A registry filled by every general plugin's ``register_speculative_proposers`` hook."""
    from kernelcore import platforms, plugins

    platforms.load_general_plugins()
    registry = SpeculativeProposerRegistry()
    for impl in plugins.get_plugin_manager().hook.register_speculative_proposers.get_hookimpls():
        registry.owner = impl.plugin_name
        try:
            plugins.call_plugin_hook(impl.plugin_name, "register_speculative_proposers", registry=registry)
        finally:
            registry.owner = None
    return registry


def parse_speculative_config(value: str | dict[str, Any] | None) -> SpeculativeConfig:
    """``--speculative-config`` (JSON, vLLM's spelling) as a checked :class:`SpeculativeConfig`; keys it does not
    name go to ``options`` for the proposer. Raises ValueError with the reason."""
    if value is None or value == "":
        return SpeculativeConfig()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative config is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("speculative config must be a JSON object such as "
                         '{"method": "ngram", "num_speculative_tokens": 4}')
    known = {f.name for f in fields(SpeculativeConfig)} - {"options"}
    given = {k: v for k, v in value.items() if k in known}
    options = {k: v for k, v in value.items() if k not in known}
    method = given.get("method")
    if not isinstance(method, str) or not method:
        raise ValueError('speculative config needs "method" (a proposer name such as "ngram")')
    build_registry().factory(method)  # an unknown name fails here, with the installed ones
    for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
        if name in given and (not isinstance(given[name], int) or isinstance(given[name], bool) or given[name] < 1):
            raise ValueError(f"speculative config {name} must be a positive integer (got {given[name]!r})")
    if "num_speculative_tokens" not in given:
        raise ValueError("speculative config needs num_speculative_tokens (draft tokens per step, e.g. 4)")
    if given.get("num_speculative_tokens", 0) > 64:
        raise ValueError("speculative config num_speculative_tokens must be at most 64")
    rate = given.get("min_acceptance_rate", 0.2)
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"speculative config min_acceptance_rate must be within [0, 1] (got {rate!r})")
    # vLLM's rule: one of the two lookup bounds given alone sets the other
    if "prompt_lookup_max" in given and "prompt_lookup_min" not in given:
        given["prompt_lookup_min"] = min(given["prompt_lookup_max"], SpeculativeConfig.prompt_lookup_min)
    if "prompt_lookup_min" in given and "prompt_lookup_max" not in given:
        given["prompt_lookup_max"] = max(given["prompt_lookup_min"], SpeculativeConfig.prompt_lookup_max)
    config = SpeculativeConfig(**given, options=options)
    if config.prompt_lookup_min > config.prompt_lookup_max:
        raise ValueError(f"speculative config prompt_lookup_min ({config.prompt_lookup_min}) is larger than "
                         f"prompt_lookup_max ({config.prompt_lookup_max})")
    return config
