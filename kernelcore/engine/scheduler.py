"""Continuous batching: a token budget per step, chunked prefill mixed with decodes, running requests
first (FCFS), preemption by recompute when KV blocks run out."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from kernelcore.contract.config import KernelConfig
from kernelcore.core_types.runner_output import ModelRunnerOutput
from kernelcore.core_types.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from kernelcore.engine.kv_cache_manager import KVCacheManager
from kernelcore.engine.outputs import EngineCoreOutput
from kernelcore.engine.request import FINISH_REASONS, EngineCoreRequest, Request, RequestStatus
from kernelcore.engine.speculative_steps import SpeculativeSteps
from kernelcore.metrics.stats import EngineStats

if TYPE_CHECKING:
    from kernelcore.structured_output.manager import StructuredOutputManager


class RequestRejected(ValueError):
    """A request that can never be served (too long for the model or the whole KV cache)."""


class Scheduler(SpeculativeSteps):
    def __init__(self, config: KernelConfig, num_blocks: int, block_size: int) -> None:
        self.max_num_seqs = config.scheduler.max_num_seqs
        self.max_num_batched_tokens = config.scheduler.max_num_batched_tokens
        if config.model.max_model_len is None:
            raise ValueError("the scheduler needs config.model.max_model_len (build_config fills it)")
        self.max_model_len: int = config.model.max_model_len
        self.max_loras = config.lora.max_loras if config.lora.enable_lora else 0
        self.lora_names: dict[int, str] = {}  # adapters the workers know: id -> name
        self.kv = KVCacheManager(num_blocks, block_size, config.cache.enable_prefix_caching,
                                 config.cache.sliding_window)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: list[str] = []  # to tell the workers at the next step
        self.failed: dict[str, str] = {}  # failed alone since the engine last collected them: id -> message
        # requests in a batch whose output has not come back (pipeline parallelism keeps several batches in
        # flight): not scheduled again, and never preempted, until it has
        self.in_flight: set[str] = set()
        self.num_preemptions_total = 0
        self._step_stats = EngineStats()
        self.structured: StructuredOutputManager | None = None  # once a constrained request arrived

    # -- requests in and out -------------------------------------------------------------------------------

    def check_request(self, req: EngineCoreRequest) -> None:
        num_prompt = len(req.prompt_token_ids)
        max_tokens = req.sampling_params.max_tokens
        if req.lora_id and req.lora_id not in self.lora_names:
            raise RequestRejected(f"LoRA adapter id {req.lora_id} is not loaded"
                                  + ("" if self.max_loras else " (LoRA is not enabled)"))
        if num_prompt == 0:
            raise RequestRejected("The prompt is empty: at least one token is required.")
        if num_prompt >= self.max_model_len:
            raise RequestRejected(f"The prompt is {num_prompt} tokens long, but this model's maximum context length "
                                  f"is {self.max_model_len} tokens (the prompt must leave room for one output token).")
        if max_tokens is not None and num_prompt + max_tokens > self.max_model_len:
            raise RequestRejected(f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                                  f"requested {num_prompt + max_tokens} tokens ({num_prompt} in the prompt, "
                                  f"{max_tokens} for the completion). Please reduce the prompt or max_tokens.")
        capacity = self.kv.num_blocks * self.kv.block_size
        num_total = num_prompt + (max_tokens if max_tokens is not None else self.max_model_len - num_prompt)
        if num_total > capacity:
            raise RequestRejected(f"The request needs {num_total} tokens of KV cache "
                                  f"({num_prompt} prompt + max_tokens), but the whole cache holds {capacity} tokens "
                                  f"({self.kv.num_blocks} blocks of {self.kv.block_size}); "
                                  "raise kv_cache_memory or lower max_tokens.")

    def add_request(self, req: EngineCoreRequest) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        self.check_request(req)
        request = Request(req, self.max_model_len)
        if self.structured is not None:
            self.structured.add_request(request)  # compiles on a thread; the request waits for it
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self._finish(request, RequestStatus.FINISHED_ABORTED)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        self.kv.free(request)
        del self.requests[request.request_id]
        if self.structured is not None:
            self.structured.remove(request.request_id)
        if self.spec is not None:
            self.spec.remove(request.request_id)
        if request.num_sent_tokens:
            self.finished_req_ids.append(request.request_id)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step --------------------------------------------------------------------------------------------

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.is_resumed = request.num_sent_tokens > 0
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self._step_stats.num_preemptions += 1
        self.waiting.appendleft(request)

    def _is_sibling_prefilling(self, request: Request) -> bool:
        # n > 1: siblings wait for the first sample's prompt blocks, then share them through the prefix cache.
        return request.parent_id is not None and any(
            r.parent_id == request.parent_id and r.is_prefilling for r in self.running)

    def schedule(self) -> SchedulerOutput:
        self._step_stats = stats = EngineStats()
        budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached_reqs: list[CachedRequestData] = []
        scheduled: list[Request] = []

        drafts = self._propose() if self.spec is not None else {}
        draft_token_ids: dict[str, list[int]] = {}

        # Running requests first, in arrival order; the newest are preempted when blocks run out.
        i, is_short = 0, False
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            if request.request_id in self.in_flight:
                i += 1
                continue
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            request_drafts = drafts.get(request.request_id)
            if request_drafts:  # a decoding request: its drafts after its last token, as the budget allows
                request_drafts = request_drafts[:budget - 1]
                if request_drafts and self.kv.allocate_slots(request, 1 + len(request_drafts)):
                    draft_token_ids[request.request_id] = request_drafts
                    num_new = 1 + len(request_drafts)
            while request.request_id not in draft_token_ids and not self.kv.allocate_slots(request, num_new):
                if self.running[-1].request_id in self.in_flight:  # blocks come back when its batch does
                    is_short = True  # no waiting request is admitted this step either
                    break
                victim = self.running.pop()
                self._preempt(victim)
                if victim is request:
                    break
            else:
                scheduled.append(request)
                num_scheduled[request.request_id] = num_new
                budget -= num_new
                i += 1
                continue
            break

        # Then waiting requests (FCFS), unless this step had to preempt; at most max_loras adapters run at once.
        running_loras = {r.lora_id for r in self.running} - {0}
        skipped: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not stats.num_preemptions \
                and not is_short:
            request = self.waiting[0]
            if request.lora_id and request.lora_id not in running_loras and len(running_loras) >= self.max_loras:
                skipped.append(self.waiting.popleft())  # waits for an adapter slot; later requests may go first
                continue
            if self._is_sibling_prefilling(request):
                break
            if self.structured is not None and not self.structured.is_ready(request):
                skipped.append(self.waiting.popleft())  # its grammar is compiling: later requests may go first
                continue
            computed_blocks, num_hit = self.kv.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit, budget)
            if not self.kv.allocate_slots(request, num_new, computed_blocks):
                break
            self.waiting.popleft()
            self.kv.record_query(request.num_tokens, num_hit)
            stats.num_prefix_cache_queries += request.num_tokens
            stats.num_prefix_cache_hits += num_hit
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit
            request.num_computed_tokens = num_hit
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(request)
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            if request.lora_id:
                running_loras.add(request.lora_id)
        self.waiting.extendleft(reversed(skipped))

        for request in scheduled:
            num_new = num_scheduled[request.request_id]
            if request.num_computed_tokens < request.num_prompt_tokens:
                stats.num_prompt_tokens += min(num_new, request.num_prompt_tokens - request.num_computed_tokens)
            if request.num_sent_tokens == 0:
                new_reqs.append(NewRequestData(request.request_id, request.all_token_ids[:], request.sampling_params,
                                               request.block_ids[:], request.num_computed_tokens, request.lora_id,
                                               request.eos_token_id, request.num_prompt_tokens))
            else:
                is_resumed = request.is_resumed
                cached_reqs.append(CachedRequestData(
                    request.request_id, request.all_token_ids[request.num_sent_tokens:],
                    request.block_ids[:] if is_resumed else request.block_ids[request.num_sent_blocks:],
                    request.num_computed_tokens, is_resumed))
            request.is_resumed = False
            request.num_sent_tokens = request.num_tokens
            request.num_sent_blocks = len(request.block_ids)
            request.num_computed_tokens += num_new
        finished, self.finished_req_ids = self.finished_req_ids, []
        return SchedulerOutput(new_reqs, cached_reqs, num_scheduled, sum(num_scheduled.values()), finished,
                               draft_token_ids=draft_token_ids)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        stats = self._step_stats
        outputs: list[EngineCoreOutput] = []
        sampled = dict(zip(runner_output.req_ids, runner_output.sampled_token_ids, strict=True))
        for request_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # aborted meanwhile
            error = self._failure(request, runner_output)
            if error is not None:
                self._finish(request, RequestStatus.FINISHED_ERROR)
                self.failed[request_id] = error
                continue
            drafts = scheduler_output.draft_token_ids.get(request_id)
            if not drafts:
                self.kv.cache_blocks(request)
            prompt_logprobs = runner_output.prompt_logprobs.get(request_id)
            token_id = sampled.get(request_id)
            if token_id is None:
                if prompt_logprobs:
                    outputs.append(EngineCoreOutput(request_id, [], new_prompt_logprobs=prompt_logprobs))
                continue
            token_ids, logprobs = [token_id], runner_output.logprobs.get(request_id)
            new_logprobs = [logprobs] if logprobs else None
            if drafts:
                accepted = runner_output.accepted_draft_ids.get(request_id, [])
                self._record_verification(request_id, drafts, accepted)
                token_ids = accepted + token_ids
                if new_logprobs:
                    new_logprobs = runner_output.accepted_draft_logprobs.get(request_id, []) + new_logprobs
                num_valid = request.num_tokens + len(accepted)  # the KV of the rejected drafts is stale
            status, num_appended = None, 0
            for token_id in token_ids:
                request.all_token_ids.append(token_id)
                num_appended += 1
                is_grammar_done = self.structured is not None and self.structured.accept_token(request, token_id)
                status = self._check_stop(request, token_id, is_grammar_done)
                if status is not None:
                    break
            stats.num_generation_tokens += num_appended
            if drafts:
                request.num_computed_tokens = min(num_valid, request.num_tokens)
                self.kv.cache_blocks(request)
            output = EngineCoreOutput(request_id, token_ids[:num_appended],
                                      new_logprobs=new_logprobs[:num_appended] if new_logprobs else None,
                                      new_prompt_logprobs=prompt_logprobs,
                                      num_cached_tokens=max(request.num_cached_tokens, 0))
            if status is not None:
                self._finish(request, status)
                output.finish_reason, output.stop_reason = FINISH_REASONS[status], request.stop_reason
                stats.num_finished += 1
            outputs.append(output)
        stats.num_running, stats.num_waiting = len(self.running), len(self.waiting)
        stats.kv_cache_usage = self.kv.usage
        return outputs

    def _failure(self, request: Request, runner_output: ModelRunnerOutput) -> str | None:
        """The client's message when the workers left this request out of the step, else None."""
        reason = runner_output.failed.get(request.request_id)
        if reason is None and request.lora_id in runner_output.failed_loras:
            name = self.lora_names.get(request.lora_id, str(request.lora_id))
            reason = f"LoRA adapter {name!r} cannot be used: {runner_output.failed_loras[request.lora_id]}"
        return reason

    def _check_stop(self, request: Request, token_id: int, is_grammar_done: bool = False) -> RequestStatus | None:
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            if token_id == request.eos_token_id and not params.ignore_eos:
                return RequestStatus.FINISHED_STOPPED
            if token_id in request.stop_token_ids:
                request.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED
        if is_grammar_done:  # the grammar allows nothing but end-of-sequence now
            return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= request.max_tokens or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def make_stats(self) -> EngineStats:
        stats = self._step_stats
        stats.num_running, stats.num_waiting, stats.kv_cache_usage = len(self.running), len(self.waiting), self.kv.usage
        if self.lora_names:
            names = self.lora_names
            stats.running_lora_adapters = sorted({names[r.lora_id] for r in self.running if r.lora_id in names})
            stats.waiting_lora_adapters = sorted({names[r.lora_id] for r in self.waiting if r.lora_id in names})
        return stats
