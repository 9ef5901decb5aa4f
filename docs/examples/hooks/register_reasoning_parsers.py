from kernelcore import hookimpl
from kernelcore.entrypoints.reasoning_parsers import ReasoningParser


class NovaThoughtParser(ReasoningParser):
    name = "nova_thought"
    start, end = "<thought>", "</thought>"


@hookimpl
def register_reasoning_parsers(registry):
    registry.register("nova_thought", NovaThoughtParser)  # kc serve --reasoning-parser nova_thought
