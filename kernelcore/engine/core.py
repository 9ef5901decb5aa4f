"""EngineCore: the scheduler and the executor behind a message-level interface
(add_request / abort_requests / step -> EngineCoreOutputs), so it can run in its own process unchanged."""

from __future__ import annotations

import collections
import logging
import time

from kernelcore.contract.config import KernelConfig
from kernelcore.core_types.scheduler_output import SchedulerOutput
from kernelcore.engine.outputs import EngineCoreOutputs
from kernelcore.engine.request import EngineCoreRequest
from kernelcore.engine.scheduler import RequestRejected, Scheduler
from kernelcore.errors import RequestStateError
from kernelcore.executor.registry import get_executor_cls
from kernelcore.metrics.stats import EngineStats

logger = logging.getLogger("kernelcore.engine")


class EngineCore:
    def __init__(self, config: KernelConfig, executor_cls: type | None = None) -> None:
        self.config = config
        self.executor = (executor_cls or get_executor_cls(config))(config)
        self.num_blocks = self.executor.determine_num_blocks()
        self.executor.initialize_cache(self.num_blocks)
        self.block_size = self.executor.block_size
        self.vocab_size = self.executor.vocab_size
        self.scheduler = Scheduler(config, self.num_blocks, self.block_size)
        if config.speculative.enabled:
            from kernelcore.speculative.controller import SpeculativeController

            self.scheduler.spec = SpeculativeController(config, self.vocab_size)
        self.max_batches = getattr(self.executor, "max_concurrent_batches", 1)
        self.batch_queue: collections.deque[SchedulerOutput] = collections.deque()  # submitted, not collected
        self.peak_batches_in_flight = 0
        self.last_stats = EngineStats()
        logger.info("KV cache: %d blocks of %d tokens (%d tokens)", self.num_blocks, self.block_size,
                    self.num_blocks * self.block_size)

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request; raises RequestRejected (a ValueError) when it can never be served."""
        params = request.sampling_params
        for ids in (request.prompt_token_ids, params.stop_token_ids, params.allowed_token_ids, params.logit_bias):
            bad = [t for t in ids or () if not 0 <= t < self.vocab_size]
            if bad:
                raise RequestRejected(f"Token id {bad[0]} is out of vocabulary (vocab size {self.vocab_size})")
        if params.structured_outputs is not None and self.scheduler.structured is None:
            from kernelcore.structured_output.manager import StructuredOutputManager

            self.scheduler.structured = StructuredOutputManager(self.config, self.vocab_size)
        self.scheduler.add_request(request)

    def add_lora(self, lora_id: int, name: str, path: str) -> None:
        """Make adapter ``lora_id`` (a local PEFT directory) available; every worker reads and checks it from
        ``path`` (a RequestStateError such as LoRAAdapterError when it does not fit the model: nothing is kept)."""
        if not self.config.lora.enable_lora:
            raise ValueError("LoRA is not enabled (enable_lora=False)")
        try:
            self.executor.add_lora(lora_id, path)
        except RequestStateError:
            self.executor.remove_lora(lora_id)  # ranks that accepted it forget it too
            raise
        self.scheduler.lora_names[lora_id] = name

    def remove_lora(self, lora_id: int) -> None:
        """New requests for it are rejected; the workers drop it unless requests still use it."""
        self.scheduler.lora_names.pop(lora_id, None)
        if not any(r.lora_id == lora_id for r in self.scheduler.requests.values()):
            self.executor.remove_lora(lora_id)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Finish these requests now and free their KV blocks (unknown ids are ignored)."""
        self.scheduler.abort_requests(request_ids)

    def step(self) -> EngineCoreOutputs:
        """Schedule, run one forward pass, sample, and return the new tokens of every scheduled request."""
        started = time.perf_counter()
        structured = self.scheduler.structured
        if structured is not None:  # grammars that did not compile: those requests fail alone
            for request_id, error in structured.pop_errors().items():
                self.scheduler.abort_requests([request_id])
                self.scheduler.failed[request_id] = error
        if not self.scheduler.has_unfinished_requests() and not self.scheduler.finished_req_ids \
                and not self.batch_queue:
            errors, self.scheduler.failed = self.scheduler.failed, {}
            return EngineCoreOutputs([], self.get_stats(), time.time(), errors)
        if self.max_batches > 1:
            return self._step_pipelined(started)
        scheduler_output = self._schedule()
        runner_output = self.executor.execute_model(scheduler_output)
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        return self._outputs(outputs, started)

    def _schedule(self) -> SchedulerOutput:
        structured = self.scheduler.structured
        scheduler_output = self.scheduler.schedule()
        if structured is not None:
            if not scheduler_output.num_scheduled_tokens and structured.has_pending() and not self.batch_queue:
                structured.wait_for_compilation(timeout=0.1)  # nothing else can run: wait for a grammar
            requests = self.scheduler.requests
            sampling = [r for r in scheduler_output.num_scheduled_tokens
                        if requests[r].num_computed_tokens >= requests[r].num_tokens]
            scheduler_output.grammar_req_ids, scheduler_output.grammar_bitmask = structured.bitmask(
                sampling, scheduler_output.draft_token_ids)
        return scheduler_output

    def _step_pipelined(self, started: float) -> EngineCoreOutputs:
        """Several batches in flight (one per pipeline stage): submit a new batch of requests not in flight
        while the queue has room, else (or when nothing new can run) wait for the oldest and return its tokens.
        The batches are disjoint, so each request's tokens come out exactly as with one batch at a time."""
        if len(self.batch_queue) < self.max_batches:
            scheduler_output = self._schedule()
            if scheduler_output.num_scheduled_tokens or not self.batch_queue:
                self.executor.submit_model(scheduler_output)
                self.batch_queue.append(scheduler_output)
                self.scheduler.in_flight.update(scheduler_output.num_scheduled_tokens)
                self.peak_batches_in_flight = max(self.peak_batches_in_flight, len(self.batch_queue))
                if len(self.batch_queue) < self.max_batches and scheduler_output.num_scheduled_tokens:
                    return EngineCoreOutputs([], None, time.time(), {})  # the next step fills the next stage
            else:  # nothing new: the finished ids go to the workers with the next batch
                self.scheduler.finished_req_ids[:0] = scheduler_output.finished_req_ids
        scheduler_output = self.batch_queue.popleft()
        self.scheduler.in_flight.difference_update(scheduler_output.num_scheduled_tokens)
        runner_output = self.executor.collect_model(None)
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        return self._outputs(outputs, started)

    def _outputs(self, outputs: list, started: float) -> EngineCoreOutputs:
        errors, self.scheduler.failed = self.scheduler.failed, {}
        stats = self.scheduler.make_stats()
        stats.timestamp, stats.step_time = time.time(), time.perf_counter() - started
        num_tokens = stats.num_prompt_tokens + stats.num_generation_tokens
        stats.iteration_tokens = [num_tokens] if num_tokens else []
        self.last_stats = stats
        return EngineCoreOutputs(outputs, stats, stats.timestamp, errors)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self.batch_queue)

    def get_stats(self) -> EngineStats:
        kv = self.scheduler.kv
        return EngineStats(timestamp=time.time(), num_running=len(self.scheduler.running),
                           num_waiting=len(self.scheduler.waiting), kv_cache_usage=kv.usage)

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.kv.reset_prefix_cache()

    def shutdown(self) -> None:
        self.executor.shutdown()
