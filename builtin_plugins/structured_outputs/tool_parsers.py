"""Built-in tool-call parsers: hermes, llama3_json, mistral, pythonic."""

from __future__ import annotations

import ast
import json

from kernelcore.entrypoints.tool_parsers import ParsedOutput, ToolParser, call_from_json, hold_back, json_values


class HermesToolParser(ToolParser):
    """``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, repeated (Qwen2.5, Qwen3, Hermes)."""

    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"

    def parse(self, text: str, is_final: bool) -> ParsedOutput:
        first = text.find(self.start)
        if first < 0:
            return ParsedOutput(text if is_final else hold_back(text, self.start))
        out, pos = ParsedOutput(text[:first]), first
        while True:
            begin = text.find(self.start, pos)
            if begin < 0:
                if is_final and text[pos:].strip():
                    out.content += text[pos:]  # text after the last call
                return out
            if text[pos:begin].strip():  # text between calls ends the calls: the rest is content
                if is_final:
                    out.content += text[pos:]
                return out
            close = text.find(self.end, begin)
            body = text[begin + len(self.start):close if close >= 0 else len(text)]
            if close < 0 and not is_final:
                return out
            call = _loads_call(body)
            if call is None:
                if is_final:
                    out.content += text[begin:]
                return out
            out.calls.append(call)
            if close < 0:
                return out
            pos = close + len(self.end)


def _loads_call(body: str) -> tuple[str, str] | None:
    values = json_values(body)
    return call_from_json(values[0]) if values and len(values) == 1 else None


class Llama3JsonToolParser(ToolParser):
    """``{"name": "f", "parameters": {...}}``, optionally after ``<|python_tag|>``, several separated by ``;``."""

    name = "llama3_json"
    tag = "<|python_tag|>"

    def parse(self, text: str, is_final: bool) -> ParsedOutput:
        stripped = text.lstrip()
        if stripped.startswith(self.tag):
            stripped = stripped[len(self.tag):].lstrip()
        elif not is_final and self.tag.startswith(stripped) and stripped:
            return ParsedOutput()
        if not stripped.startswith("{"):
            return ParsedOutput("" if not is_final and not stripped else text)
        if not is_final:
            return ParsedOutput()  # a call is being written: decided at the end
        values = json_values(stripped)
        calls = [c for v in values or [] if (c := call_from_json(v)) is not None]
        if not values or len(calls) != len(values):
            return ParsedOutput(text)
        return ParsedOutput("", calls)


class MistralToolParser(ToolParser):
    """``[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]`` or ``[TOOL_CALLS]f[ARGS]{...}``."""

    name = "mistral"
    skip_special_tokens = False  # [TOOL_CALLS] is a special token
    start = "[TOOL_CALLS]"

    def parse(self, text: str, is_final: bool) -> ParsedOutput:
        first = text.find(self.start)
        if first < 0:
            return ParsedOutput(text if is_final else hold_back(text, self.start))
        out = ParsedOutput(text[:first])
        if not is_final:
            return out
        calls = self._calls(text[first:])
        if calls is None:
            out.content += text[first:]
        else:
            out.calls = calls
        return out

    def _calls(self, text: str) -> list[tuple[str, str]] | None:
        calls = []
        for part in text.split(self.start)[1:]:
            if "[ARGS]" in part:
                name, _, args = part.partition("[ARGS]")
                values = json_values(args)
                if not name.strip() or not values or len(values) != 1:
                    return None
                call = call_from_json({"name": name.strip(), "arguments": values[0]})
                if call is None:
                    return None
                calls.append(call)
                continue
            values = json_values(part)
            if not values or len(values) != 1:
                return None
            items = values[0] if isinstance(values[0], list) else [values[0]]
            parsed = [c for item in items if (c := call_from_json(item)) is not None]
            if not parsed or len(parsed) != len(items):
                return None
            calls.extend(parsed)
        return calls


class PythonicToolParser(ToolParser):
    """``[get_weather(city="Paris"), other()]`` (Llama 3.2, Llama 4): keyword arguments with literal values."""

    name = "pythonic"

    def parse(self, text: str, is_final: bool) -> ParsedOutput:
        stripped = text.strip()
        if not stripped.startswith("["):
            return ParsedOutput("" if not is_final and not stripped else text)
        if not is_final:
            return ParsedOutput()
        calls = self._calls(stripped)
        return ParsedOutput(text) if calls is None else ParsedOutput("", calls)

    @staticmethod
    def _calls(text: str) -> list[tuple[str, str]] | None:
        try:
            tree = ast.parse(text, mode="eval").body
        except (SyntaxError, ValueError):
            return None
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return None
            try:
                kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
                arguments = json.dumps(kwargs, ensure_ascii=False)
            except (ValueError, TypeError, SyntaxError):
                return None
            calls.append((node.func.id, arguments))
        return calls
