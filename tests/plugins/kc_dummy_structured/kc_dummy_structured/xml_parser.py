"""A third-party tool-call format: ``<call name="f">{"x": 1}</call>``."""

import json
import re

from kernelcore.entrypoints.tool_parsers import ParsedOutput, ToolParser, hold_back

CALL = re.compile(r'<call name="([A-Za-z_][A-Za-z0-9_]*)">(.*?)</call>', re.S)


class XmlToolParser(ToolParser):
    name = "dummy_xml"

    def parse(self, text, is_final):
        first = text.find("<call")
        if first < 0:
            return ParsedOutput(text if is_final else hold_back(text, "<call"))
        out = ParsedOutput(text[:first])
        for match in CALL.finditer(text, first):
            try:
                args = json.loads(match.group(2))
            except ValueError:
                break
            out.calls.append((match.group(1), json.dumps(args)))
        if is_final and not out.calls:
            out.content = text
        return out
