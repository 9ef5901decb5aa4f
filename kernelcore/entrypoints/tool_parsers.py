"""The tool-call parsers of this process: the registry filled by the ``register_tool_parsers`` hook (the
contract, base class and registry type, is :mod:`kernelcore.contract.parsers`)."""

from __future__ import annotations

from typing import Any

from kernelcore.contract.parsers import (
    ParsedOutput,
    ToolParser,
    ToolParserRegistry,
    call_from_json,
    hold_back,
    json_values,
)

__all__ = ["ParsedOutput", "ToolParser", "ToolParserRegistry", "build_registry", "call_from_json", "hold_back",
           "json_values", "tool_parser_registry"]


def build_registry(hook_name: str, registry: Any) -> Any:
    from kernelcore import platforms, plugins

    platforms.load_general_plugins()
    getattr(plugins.get_plugin_manager().hook, hook_name)(registry=registry)
    return registry


def tool_parser_registry() -> ToolParserRegistry:
    return build_registry("register_tool_parsers", ToolParserRegistry())
