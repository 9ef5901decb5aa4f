"""Front-end request bookkeeping: fans n > 1 out into child requests, turns EngineCoreOutputs into
RequestOutputs (detokenized text, stop strings, logprobs) and says which requests the core must abort."""

from __future__ import annotations

import time

import msgspec

from kernelcore.core_types.runner_output import TokenLogprobs
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.engine.detokenizer import IncrementalDetokenizer
from kernelcore.engine.outputs import CompletionOutput, EngineCoreOutput, Logprob, RequestOutput
from kernelcore.engine.request import EngineCoreRequest


class ChildState:
    def __init__(self, request_id: str, index: int, parent: ParentState, tokenizer) -> None:
        params = parent.params
        self.request_id, self.index, self.parent = request_id, index, parent
        self.detokenizer = IncrementalDetokenizer(tokenizer, parent.prompt_token_ids, params) if tokenizer else None
        self.token_ids: list[int] = []
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0 if params.logprobs is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.num_new_tokens = 0  # since the last delta
        # Nothing reads the text of a final-only request before it finishes unless a stop string is searched:
        # its tokens wait here and are detokenized (the same incremental walk) at the end, off the decode steps.
        self.defer_text = params.output_kind == "final_only" and not params.stop
        self.undecoded: list[int] = []
        self.core_request: EngineCoreRequest | None = None  # what the engine core was sent (to resume it elsewhere)

    def make_output(self, is_delta: bool) -> CompletionOutput:
        is_finished = self.finish_reason is not None
        text = self.detokenizer.get_next_output_text(is_finished, is_delta) if self.detokenizer else ""
        token_ids, logprobs = self.token_ids, self.logprobs
        if is_delta:
            token_ids = token_ids[len(token_ids) - self.num_new_tokens:]
            logprobs = logprobs[len(logprobs) - self.num_new_tokens:] if logprobs is not None else None
        self.num_new_tokens = 0
        return CompletionOutput(index=self.index, text=text, token_ids=list(token_ids),
                                logprobs=list(logprobs) if logprobs is not None else None,
                                cumulative_logprob=self.cumulative_logprob, finish_reason=self.finish_reason,
                                stop_reason=self.stop_reason)


class ParentState:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams) -> None:
        self.request_id, self.prompt, self.prompt_token_ids, self.params = request_id, prompt, prompt_token_ids, params
        self.children: list[ChildState] = []
        self.prompt_logprobs: list | None = [None] if params.prompt_logprobs is not None else None
        self.num_cached_tokens = 0
        self.arrival_time = time.time()
        self.eos_token_id: int | None = None

    @property
    def is_finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.children)


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.children: dict[str, ChildState] = {}
        self.parents: dict[str, ParentState] = {}
        # What the last process_outputs call added, by parent id: tokens (all samples), and steps (the most any
        # one sample got: more than one where the engine core merged the steps of a final-only request).
        self.new_tokens: dict[str, int] = {}
        self.new_steps: dict[str, int] = {}

    def has_unfinished_requests(self) -> bool:
        return bool(self.parents)

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
                    eos_token_id: int | None = None, lora_id: int = 0) -> list[EngineCoreRequest]:
        """Track a request; returns the engine-core requests to send (one per parallel sample)."""
        if request_id in self.parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        parent = ParentState(request_id, prompt, prompt_token_ids, params)
        parent.eos_token_id = eos_token_id
        core_requests = []
        for index in range(params.n):
            child_id = request_id if params.n == 1 else f"{index}_{request_id}"
            child_params = params if params.n == 1 else params.clone(
                n=1, seed=None if params.seed is None else params.seed + index)
            core_requests.append(EngineCoreRequest(
                request_id=child_id, prompt_token_ids=prompt_token_ids, sampling_params=child_params,
                eos_token_id=eos_token_id, arrival_time=parent.arrival_time, lora_id=lora_id,
                parent_id=None if params.n == 1 else request_id))
            child = ChildState(child_id, index, parent, self.tokenizer)
            child.core_request = core_requests[-1]
            parent.children.append(child)
        self.parents[request_id] = parent
        for child in parent.children:
            self.children[child.request_id] = child
        return core_requests

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Forget these (parent) requests; returns the child ids the core must abort."""
        child_ids = []
        for request_id in request_ids:
            parent = self.parents.pop(request_id, None)
            for child in parent.children if parent else ():
                self.children.pop(child.request_id, None)
                if child.finish_reason is None:
                    child_ids.append(child.request_id)
        return child_ids

    def resume_requests(self, request_id: str) -> list[EngineCoreRequest]:
        """The engine-core requests that continue this request's unfinished samples on another replica: each
        carries the tokens it produced so far (its prompt logprobs were already reported)."""
        parent = self.parents.get(request_id)
        resumed = []
        for child in parent.children if parent else ():
            if child.finish_reason is None and child.core_request is not None:
                params = child.core_request.sampling_params
                if params.prompt_logprobs is not None:
                    params = params.clone(prompt_logprobs=None)
                resumed.append(msgspec.structs.replace(child.core_request, sampling_params=params,
                                                       output_token_ids=list(child.token_ids)))
        return resumed

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Returns the RequestOutputs to hand out and the child ids to abort in the core (stop strings)."""
        touched: dict[str, ParentState] = {}
        to_abort: list[str] = []
        new_tokens: dict[str, int] = {}
        new_steps: dict[str, int] = {}
        self.new_tokens, self.new_steps = new_tokens, new_steps
        for out in outputs:
            child = self.children.get(out.request_id)
            if child is None or child.finish_reason is not None:
                continue
            parent = child.parent
            touched[parent.request_id] = parent
            if out.new_prompt_logprobs and parent.prompt_logprobs is not None:
                parent.prompt_logprobs.extend(self._logprob_dicts(out.new_prompt_logprobs,
                                                                  parent.params.prompt_logprobs))
            if out.num_cached_tokens:
                parent.num_cached_tokens = out.num_cached_tokens
            if not out.new_token_ids and not out.finish_reason:
                continue
            child.token_ids.extend(out.new_token_ids)
            child.num_new_tokens += len(out.new_token_ids)
            if out.new_token_ids:
                new_tokens[parent.request_id] = new_tokens.get(parent.request_id, 0) + len(out.new_token_ids)
                new_steps[parent.request_id] = max(new_steps.get(parent.request_id, 0), len(out.new_token_ids))
            if child.logprobs is not None and child.cumulative_logprob is not None and out.new_logprobs:
                new = self._logprob_dicts(out.new_logprobs, parent.params.logprobs)
                child.logprobs.extend(new)
                child.cumulative_logprob += sum(lp.logprob for tl, d in zip(out.new_logprobs, new, strict=True)
                                                for lp in [d[tl.token_ids[0]]])
            child.finish_reason, child.stop_reason = out.finish_reason, out.stop_reason
            if child.detokenizer is not None:
                new_ids = out.new_token_ids
                if child.defer_text:
                    child.undecoded.extend(new_ids)
                    if out.finish_reason is None:
                        continue
                    new_ids, child.undecoded = child.undecoded, []
                # EOS and stop ids end with "stop" and their text is dropped; so does a completed grammar,
                # whose last token is text.
                last = new_ids[-1] if new_ids else None
                is_stop_token = out.finish_reason == "stop" and (
                    isinstance(out.stop_reason, int) or last == parent.eos_token_id)
                stop_str = child.detokenizer.update(new_ids, is_stop_token)
                if stop_str is not None:
                    if child.finish_reason is None:
                        to_abort.append(child.request_id)
                    child.finish_reason, child.stop_reason = "stop", stop_str
        results = [r for r in (self._make_output(p) for p in touched.values()) if r is not None]
        for parent in touched.values():
            if parent.is_finished:
                self.parents.pop(parent.request_id, None)
                for child in parent.children:
                    self.children.pop(child.request_id, None)
        return results, to_abort

    def _make_output(self, parent: ParentState) -> RequestOutput | None:
        kind = parent.params.output_kind
        is_finished = parent.is_finished
        if kind == "final_only" and not is_finished:
            return None
        if kind == "delta":
            completions = [c.make_output(True) for c in parent.children if c.num_new_tokens or c.finish_reason]
        else:
            completions = [c.make_output(False) for c in parent.children]
        return RequestOutput(request_id=parent.request_id, prompt=parent.prompt,
                             prompt_token_ids=parent.prompt_token_ids, prompt_logprobs=parent.prompt_logprobs,
                             outputs=completions, finished=is_finished, num_cached_tokens=parent.num_cached_tokens)

    def _logprob_dicts(self, entries: list[TokenLogprobs], num_top: int | None) -> list[dict[int, Logprob]]:
        result = []
        for entry in entries:
            d = {}
            for i, (token_id, logprob) in enumerate(zip(entry.token_ids, entry.logprobs, strict=True)):
                if token_id not in d:
                    d[token_id] = Logprob(max(logprob, -9999.0), entry.rank if i == 0 else i,
                                          self._token_text(token_id))
            result.append(d)
        return result

    def _token_text(self, token_id: int) -> str | None:
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else None
