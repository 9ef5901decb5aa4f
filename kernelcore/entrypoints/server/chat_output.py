"""One chat choice's generated text -> message fields (content, reasoning_content, tool_calls) and stream deltas.

The streaming path re-parses the growing text and sends only what is new; the non-streaming path parses the
whole text once with the same functions, so both give the same message.
"""

from __future__ import annotations

from typing import Any

from kernelcore.entrypoints.server.tools import ToolRequest, tool_call


class ChoiceOutput:
    def __init__(self, tools: ToolRequest | None, tool_parser: Any = None, reasoning_parser: Any = None) -> None:
        self.tools = tools if tools is not None else ToolRequest()  # choice "none"
        self.tool_parser, self.reasoning_parser = tool_parser, reasoning_parser
        self.choice = self.tools.choice
        # Streaming state.
        self.num_reasoning = 0
        self.num_content = 0
        self.call_ids: list[str] = []
        self.num_args = 0  # named choice: argument characters sent

    def _split(self, text: str, is_final: bool) -> tuple[str, str]:
        if self.reasoning_parser is None:
            return "", text
        return self.reasoning_parser.split(text, is_final)

    def _parsed(self, answer: str, is_final: bool) -> tuple[str, list[tuple[str, str]]]:
        """(content, complete calls) of the answer part."""
        if self.choice == "auto" and self.tool_parser is not None:
            parsed = self.tool_parser.parse(answer, is_final)
            return parsed.content, parsed.calls
        if self.choice in ("named", "required"):
            if not is_final:
                return "", []
            calls = self.tools.calls_from_constrained(answer)
            if calls is None:
                return answer, []
            return "", [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
        return answer, []

    # -- non-streaming ----------------------------------------------------------------------------------------

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        reasoning, answer = self._split(text, True)
        content, calls = self._parsed(answer, True)
        if calls:
            content = content.rstrip()
        message: dict[str, Any] = {"content": content or (None if calls else content),
                                   "tool_calls": [tool_call(name, args) for name, args in calls]}
        if self.reasoning_parser is not None:
            message["reasoning_content"] = reasoning or None
        if calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        return message, finish_reason

    # -- streaming -------------------------------------------------------------------------------------------

    def deltas(self, text: str, is_final: bool) -> list[dict[str, Any]]:
        """The deltas that bring what was sent up to ``text`` (the whole output so far)."""
        out: list[dict[str, Any]] = []
        reasoning, answer = self._split(text, is_final)
        if len(reasoning) > self.num_reasoning:
            out.append({"reasoning_content": reasoning[self.num_reasoning:]})
            self.num_reasoning = len(reasoning)
        if self.choice == "named":
            return out + self._named_deltas(answer, is_final)
        content, calls = self._parsed(answer, is_final)
        if self.choice == "auto" and (calls or not is_final):
            content = content.rstrip()  # trailing whitespace before a call is not content
        if len(content) > self.num_content:
            out.append({"content": content[self.num_content:]})
            self.num_content = len(content)
        for index in range(len(self.call_ids), len(calls)):
            name, arguments = calls[index]
            call = tool_call(name, arguments)
            self.call_ids.append(call["id"])
            out.append({"tool_calls": [{"index": index, **call}]})
        return out

    def _named_deltas(self, answer: str, is_final: bool) -> list[dict[str, Any]]:
        # The whole answer is the named tool's arguments (decoded under its schema): stream it as it comes.
        out = []
        if not self.call_ids and (answer or is_final):
            call = tool_call(self.tools.named_tool, "")
            self.call_ids.append(call["id"])
            out.append({"tool_calls": [{"index": 0, **call}]})
        if len(answer) > self.num_args:
            out.append({"tool_calls": [{"index": 0, "function": {"arguments": answer[self.num_args:]}}]})
            self.num_args = len(answer)
        return out

    @property
    def has_calls(self) -> bool:
        return bool(self.call_ids)


AUTO_NEEDS_PARSER = ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set '
                     '(or pass tool_choice "none", "required" or a named function)')


async def prepare_chat_output(state: Any, req: Any, body: dict[str, Any]):
    """Fix the request's constraint (named/required tools, response_format), validate it, and return a
    factory of per-choice :class:`ChoiceOutput` objects."""
    options = state.options
    tools: ToolRequest | None = req.tools
    tool_parser = reasoning_parser = None
    if body.get("reasoning_effort") is not None and state.reasoning_parser_cls is None:
        from kernelcore.entrypoints.server.errors import bad_request

        raise bad_request("`reasoning_effort` needs a reasoning model (kc serve --reasoning-parser NAME)",
                          "reasoning_effort")
    if state.reasoning_parser_cls is not None:
        reasoning_parser = state.reasoning_parser_cls(state.engine.tokenizer)
    param = "response_format"
    if tools is not None and tools.choice == "auto":
        if not (options.enable_auto_tool_choice and state.tool_parser_cls is not None):
            from kernelcore.entrypoints.server.errors import bad_request

            raise bad_request(AUTO_NEEDS_PARSER, "tool_choice")
        tool_parser = state.tool_parser_cls(state.engine.tokenizer)
        if not tool_parser.skip_special_tokens:
            req.params["skip_special_tokens"] = False
    elif tools is not None and tools.choice in ("named", "required"):
        if req.structured is not None:
            from kernelcore.entrypoints.server.errors import bad_request

            raise bad_request("A named or required `tool_choice` cannot be combined with another output "
                              "constraint (response_format, structured_outputs, guided_*)", "tool_choice")
        from kernelcore.entrypoints.server.structured import constraint_options

        req.structured, param = tools.constraint(), "tools"
        for key, value in constraint_options(body).items():
            setattr(req.structured, key, value)
    if req.structured is not None:
        if reasoning_parser is not None and reasoning_parser.starts_inside:
            # The output opens inside the thinking: the constraint applies once it ends.
            req.structured.start_after_token_ids = reasoning_parser.end_token_ids()
        await state.grammars.validate(req.structured, param)
    return lambda: ChoiceOutput(tools, tool_parser, reasoning_parser)
