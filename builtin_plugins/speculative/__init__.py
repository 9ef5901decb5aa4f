"""Built-in general plugin: speculative-decoding proposers (``ngram``: prompt lookup, no extra weights)."""

from __future__ import annotations

from kernelcore.contract.hookspecs import hookimpl


@hookimpl
def register_speculative_proposers(registry) -> None:
    registry.register("ngram", "builtin_plugins.speculative.ngram:NgramProposer")
