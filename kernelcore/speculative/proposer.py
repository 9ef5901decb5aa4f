"""The speculative proposers of this process: the registry filled by the ``register_speculative_proposers`` hook,
and ``--speculative-config`` checked against it (the contract, base class and registry type, is
:mod:`kernelcore.contract.speculative`)."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from kernelcore.contract.config import SpeculativeConfig
from kernelcore.contract.speculative import ProposalRequest, Proposer, ProposerFactory, SpeculativeProposerRegistry

__all__ = ["ProposalRequest", "Proposer", "ProposerFactory", "SpeculativeProposerRegistry", "build_registry",
           "parse_speculative_config"]


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
