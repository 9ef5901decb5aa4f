"""Chat tools: validating `tools` / `tool_choice` / `parallel_tool_calls`, the constraint a named or required
tool choice decodes under, and turning the constrained output back into `message.tool_calls`."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from kernelcore.contract.structured_output_params import StructuredOutputsParams
from kernelcore.entrypoints.server.errors import bad_request


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    return {"id": call_id or new_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


@dataclass
class ToolRequest:
    tools: list[dict[str, Any]] = field(default_factory=list)  # the `function` objects
    choice: str = "none"  # "none" | "auto" | "required" | "named"
    name: str | None = None  # the named tool
    parallel: bool = True

    @property
    def named_tool(self) -> str:
        """The tool a ``named`` choice names (validation sets ``name`` with that choice)."""
        if self.name is None:
            raise ValueError("tool_choice names no tool")
        return self.name

    def schema(self, name: str) -> dict[str, Any]:
        tool = next(t for t in self.tools if t["name"] == name)
        return tool.get("parameters") or {"type": "object", "properties": {}}

    def constraint(self) -> StructuredOutputsParams | None:
        """Named: the tool's parameters. Required: a non-empty array of {name, parameters} (one item if not
        parallel)."""
        if self.choice == "named":
            return StructuredOutputsParams(json=json.dumps(self.schema(self.named_tool)))
        if self.choice != "required":
            return None
        items = [{"type": "object", "properties": {"name": {"const": t["name"]}, "parameters": self.schema(t["name"])},
                  "required": ["name", "parameters"], "additionalProperties": False} for t in self.tools]
        array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
        if not self.parallel:
            array["maxItems"] = 1
        return StructuredOutputsParams(json=json.dumps(array))

    def calls_from_constrained(self, text: str) -> list[dict[str, Any]] | None:
        """The calls in a named/required output. One cut short (``max_tokens``) still gives its calls, the last
        one's arguments as generated (so not always complete JSON), as vLLM does; None when not even a tool
        name was generated."""
        if self.choice == "named":
            return [tool_call(self.named_tool, text)]
        try:
            items = json.loads(text)
        except ValueError:
            return _partial_calls(text)
        return [tool_call(item["name"], json.dumps(item["parameters"], ensure_ascii=False)) for item in items]


_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*(,\s*"parameters"\s*:\s*)?')


def _partial_calls(text: str) -> list[dict[str, Any]] | None:
    """The calls of a required-choice array cut short: ``[{"name": .., "parameters": {..}}, {"name": .., "para``.

    The grammar fixes the shape (``name`` before ``parameters``), so complete items decode as JSON and the
    last one is read up to where it stops.
    """
    decoder, calls = json.JSONDecoder(), []
    pos = text.find("[") + 1
    while pos > 0:
        while pos < len(text) and (text[pos].isspace() or text[pos] == ","):
            pos += 1
        try:
            item, pos = decoder.raw_decode(text, pos)
        except ValueError:
            match = _NAME.match(text, pos)
            if match is not None:
                arguments = text[match.end():] if match.group(2) else ""
                calls.append(tool_call(json.loads(match.group(1)), arguments))
            break
        calls.append(tool_call(item["name"], json.dumps(item["parameters"], ensure_ascii=False)))
    return calls or None


def parse_tools(body: dict[str, Any]) -> ToolRequest | None:
    """Validate `tools`; None when the request has none. `tool_choice` consistency is checked by chat_messages.py."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("`parallel_tool_calls` must be a boolean", "parallel_tool_calls")
    if not tools:
        if choice not in (None, "none"):
            raise bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice")
        return None
    functions = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise bad_request(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}", "tools")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise bad_request(f"tools[{i}].function.name must be a non-empty string", "tools")
        params = function.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON Schema of type object", "tools")
        functions.append(function)
    request = ToolRequest(functions, parallel=parallel if parallel is not None else True)
    if isinstance(choice, dict):
        request.choice, request.name = "named", choice["function"]["name"]
    else:
        request.choice = choice or "auto"
    return request


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: a null or absent ``content`` (an assistant turn that only calls
    tools) as the empty string, and tool-call arguments (JSON text on the wire) decoded to a mapping."""
    out = []
    for message in messages:
        if message.get("content") is None:
            message = {**message, "content": ""}
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            decoded = []
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    try:
                        function = {**function, "arguments": json.loads(function["arguments"])}
                    except ValueError:
                        pass
                    call = {**call, "function": function}
                decoded.append(call)
            message = {**message, "tool_calls": decoded}
        out.append(message)
    return out
