import json

from kernelcore import hookimpl
from kernelcore.entrypoints.tool_parsers import ParsedOutput, ToolParser


class NovaCallParser(ToolParser):
    """``CALL name {json arguments}`` on one line; anything else is content."""

    name = "nova_call"

    def parse(self, text, is_final):
        head, _, rest = text.strip().partition(" ")
        name, _, arguments = rest.partition(" ")
        if head != "CALL" or not name:
            return ParsedOutput(content=text)
        try:
            json.loads(arguments)
        except ValueError:
            return ParsedOutput(content=text if is_final else "")  # not complete yet, or malformed: content
        return ParsedOutput(content="", calls=[(name, arguments)])


@hookimpl
def register_tool_parsers(registry):
    registry.register("nova_call", NovaCallParser)  # kc serve --enable-auto-tool-choice --tool-call-parser nova_call
