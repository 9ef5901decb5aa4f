"""The typed event stream of a streamed response, built from the shared path's :class:`ChoiceDelta`\\ s.

The sequence is the one the openai SDK's stream accumulator expects: ``response.created``,
``response.in_progress``, then for each output item ``response.output_item.added``, its content part's
``added`` / deltas / ``done`` (or a function call's ``arguments.delta`` / ``arguments.done``), and
``response.output_item.done``; last ``response.completed`` (``response.incomplete`` when max_output_tokens cut
the answer), carrying the same output items. Every event has the next ``sequence_number``. A change of kind
(reasoning -> text -> calls) closes the open item, so items never interleave.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from builtin_plugins.responses_api.items import call_item, message_item, reasoning_item
from builtin_plugins.responses_api.translate import ResponseBuilder, count_tokens, usage
from kernelcore.entrypoints.server.errors import APIError


class ResponseEvents:
    """Turns deltas into events and keeps the output items they build, for the final response."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder
        self.sequence_number = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, int] = {}  # "reasoning" / "message" -> output index of the open item
        self.calls: dict[int, int] = {}  # the delta's tool-call index -> output index of its open item
        self.reasoning_text = ""

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        response = self.builder.snapshot("in_progress")
        return [self.event("response.created", response=response), self.event("response.in_progress",
                                                                               response=response)]

    def error(self, error: APIError) -> dict[str, Any]:
        return self.event("error", code=str(error.status), message=error.message, param=error.param)

    # -- items ------------------------------------------------------------------------------------------------

    def _add(self, item: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        self.output.append(item)
        index = len(self.output) - 1
        return index, [self.event("response.output_item.added", output_index=index, item=_copy(item))]

    def _close_all(self, status: str) -> list[dict[str, Any]]:
        events = []
        for kind in ("reasoning", "message"):
            if kind in self.open:
                events += self._close_part(kind, status)
        for index in sorted(self.calls.values()):
            item = self.output[index]
            item["status"] = status
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                     arguments=item["arguments"]))
            events.append(self.event("response.output_item.done", output_index=index, item=_copy(item)))
        self.calls.clear()
        return events

    def _close_part(self, kind: str, status: str) -> list[dict[str, Any]]:
        index = self.open.pop(kind)
        item = self.output[index]
        item["status"] = status
        part = item["content"][0]
        common = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if kind == "reasoning":
            done = [self.event("response.reasoning_text.done", **common, text=part["text"])]
        else:
            done = [self.event("response.output_text.done", **common, text=part["text"], logprobs=[])]
        return done + [self.event("response.content_part.done", **common, part=dict(part)),
                       self.event("response.output_item.done", output_index=index, item=_copy(item))]

    def _text(self, kind: str, delta: str) -> list[dict[str, Any]]:
        events = []
        if kind not in self.open:
            events = self._close_all("completed")
            item = reasoning_item("", "in_progress") if kind == "reasoning" else message_item("", "in_progress")
            part = item["content"].pop()
            index, added = self._add(item)
            self.open[kind] = index
            item["content"].append(part)
            events += added + [self.event("response.content_part.added", item_id=item["id"], output_index=index,
                                          content_index=0, part=dict(part))]
        index = self.open[kind]
        item = self.output[index]
        if not delta:
            return events
        item["content"][0]["text"] += delta
        common = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if kind == "reasoning":
            return events + [self.event("response.reasoning_text.delta", **common, delta=delta)]
        return events + [self.event("response.output_text.delta", **common, delta=delta, logprobs=[])]

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events = []
        function = call.get("function") or {}
        if call["index"] not in self.calls:
            events += self._close_all("completed") if self.open else []
            item = call_item(call["id"], function.get("name", ""), "", "in_progress")
            index, added = self._add(item)
            self.calls[call["index"]] = index
            events += added
        index = self.calls[call["index"]]
        item = self.output[index]
        arguments = function.get("arguments") or ""
        if arguments:
            item["arguments"] += arguments
            events.append(self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                     delta=arguments))
        return events

    # -- the stream ---------------------------------------------------------------------------------------------

    async def stream(self, run: Any) -> AsyncGenerator[dict[str, Any], None]:
        """Every event of ``run`` (a started :class:`ChatRun`); the first one waits for the engine's answer."""
        finish_reason = None
        is_started = False
        async for delta in run.stream():
            if not is_started:  # after the engine has answered, so an engine error stays a plain HTTP error
                is_started = True
                for event in self.start():
                    yield event
            events = []
            if delta.reasoning:
                self.reasoning_text += delta.reasoning
                events += self._text("reasoning", delta.reasoning)
            if delta.content:
                events += self._text("message", delta.content)
            for call in delta.tool_calls:
                events += self._call(call)
            if delta.finish_reason is not None:
                finish_reason = delta.finish_reason
            for event in events:
                yield event
        if not is_started:
            for event in self.start():
                yield event
        is_cut = finish_reason == "length"
        if not self.output:  # an empty answer is still one (empty) message
            for event in self._text("message", ""):
                yield event
        for event in self._close_all("incomplete" if is_cut else "completed"):
            yield event
        reasoning = count_tokens(run.state.engine.tokenizer, self.reasoning_text)
        response = self.builder.finished(self.output, usage(run.num_prompt_tokens, run.num_completion_tokens,
                                                            min(reasoning, run.num_completion_tokens)), finish_reason)
        self.response = response
        yield self.event("response.incomplete" if is_cut else "response.completed", response=response)


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return {**item, "content": [dict(p) for p in item["content"]]} if "content" in item else dict(item)
