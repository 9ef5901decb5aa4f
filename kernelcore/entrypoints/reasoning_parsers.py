"""The reasoning parsers of this process: the registry filled by the ``register_reasoning_parsers`` hook (the
contract, base class and registry type, is :mod:`kernelcore.contract.parsers`)."""

from __future__ import annotations

from kernelcore.contract.parsers import ReasoningParser, ReasoningParserRegistry
from kernelcore.entrypoints.tool_parsers import build_registry

__all__ = ["ReasoningParser", "ReasoningParserRegistry", "reasoning_parser_registry"]


def reasoning_parser_registry() -> ReasoningParserRegistry:
    return build_registry("register_reasoning_parsers", ReasoningParserRegistry())
