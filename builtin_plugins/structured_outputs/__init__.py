"""Built-in general plugin: the llguidance grammar backend, tool-call parsers and reasoning parsers."""

from __future__ import annotations

import importlib.util

from kernelcore.contract.hookspecs import hookimpl

_PARSERS = "builtin_plugins.structured_outputs.tool_parsers"
_REASONING = "builtin_plugins.structured_outputs.reasoning"


@hookimpl
def register_structured_output_backends(registry) -> None:
    registry.register("guidance", "builtin_plugins.structured_outputs.guidance:GuidanceBackend", order=10)
    if importlib.util.find_spec("xgrammar") is not None:  # the kernelcore[xgrammar] extra
        registry.register("xgrammar", "builtin_plugins.structured_outputs.xgrammar_backend:XGrammarBackend", order=20)


@hookimpl
def register_tool_parsers(registry) -> None:
    registry.register("hermes", f"{_PARSERS}:HermesToolParser")
    registry.register("llama3_json", f"{_PARSERS}:Llama3JsonToolParser")
    registry.register("mistral", f"{_PARSERS}:MistralToolParser")
    registry.register("pythonic", f"{_PARSERS}:PythonicToolParser")


@hookimpl
def register_reasoning_parsers(registry) -> None:
    registry.register("deepseek_r1", f"{_REASONING}:DeepSeekR1ReasoningParser")
    registry.register("qwen3", f"{_REASONING}:Qwen3ReasoningParser")
