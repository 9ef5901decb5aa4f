"""AsyncLLM: the asyncio front end of the engine-core process (used by the API server).

The front end keeps tokenization, detokenization, stop strings and request
bookkeeping (OutputProcessor); the engine core schedules and runs the model.
Stat loggers run here, fed by the per-step stats the core sends and by the
per-request timings measured here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernelcore.contract.config import KernelConfig
from kernelcore.contract.stat_logger import StatLoggerBase
from kernelcore.core_types.sampling_params import SamplingParams
from kernelcore.engine.core_client import EngineDeadError, RequestError
from kernelcore.engine.core_proc import (
    AbortRequests,
    AddLora,
    AddRequests,
    CoreDead,
    CoreOutputs,
    CoreRequestErrors,
    LoraAdded,
    RemoveLora,
    ShutdownCore,
)
from kernelcore.engine.dp_failover import ReplicaFailover
from kernelcore.engine.output_processor import OutputProcessor
from kernelcore.engine.outputs import RequestOutput
from kernelcore.engine.scheduler import RequestRejected
from kernelcore.hostproc.ipc import AsyncChannel, remove_private_dir
from kernelcore.metrics.request_stats import FinishedRequestStats
from kernelcore.metrics.stats import EngineStats

if TYPE_CHECKING:
    from kernelcore.engine.dp_router import DPRouter

logger = logging.getLogger("kernelcore.engine")
__all__ = ["AsyncLLM", "EngineDeadError", "RequestError", "RequestRejected"]


@dataclass
class _Tracked:
    queue: asyncio.Queue
    params: SamplingParams
    num_prompt_tokens: int
    arrival: float = field(default_factory=time.monotonic)
    token_times: list[float] = field(default_factory=list)
    num_generation_tokens: int = 0


class AsyncLLM(ReplicaFailover):
    num_blocks: int  # set by create(), from the first replica
    vocab_size: int

    def __init__(self, config: KernelConfig, stat_loggers: list[StatLoggerBase] | None = None) -> None:
        from kernelcore.config_builder import load_hf_config
        from kernelcore.engine.tokenizer import eos_token_id, try_get_tokenizer

        self.config = config
        self.tokenizer = None if config.model.skip_tokenizer_init else \
            try_get_tokenizer(config.model.tokenizer or config.model.model)
        self.eos_token_id = eos_token_id(self.tokenizer, load_hf_config(config.model))
        self.max_model_len = config.model.max_model_len
        self.stat_loggers = list(stat_loggers or [])
        self.output_processor = OutputProcessor(self.tokenizer)
        self.tracked: dict[str, _Tracked] = {}
        self.last_stats = EngineStats()
        self.dead_error: BaseException | None = None
        self._channels: list[AsyncChannel] = []  # one per data-parallel replica (engine core)
        self.processes: list = []  # the engine-core processes of this host
        self._replica_processes: list = []  # per replica: its engine-core process, or None on another host
        self.replica_hosts: list[str] = []  # "local", or the address of the host running that replica
        self.lost_replicas: dict[int, str] = {}  # remote replica -> why it was dropped
        self.router: DPRouter | None = None  # with --data-parallel-size > 1
        self.replica_of: dict[str, int] = {}
        self._tasks: list[asyncio.Task] = []
        self._lora_answers: dict[tuple[int, int], asyncio.Future] = {}  # (lora id, replica) -> its LoraAdded
        self._log_interval = 5.0
        self._private_dirs: list[str] = []

    @classmethod
    async def create(cls, config: KernelConfig, stat_loggers: list[StatLoggerBase] | None = None) -> AsyncLLM:
        from kernelcore.engine.dp_router import DPRouter, start_replicas

        self = cls(config, stat_loggers)
        started = await start_replicas(config)  # one engine core per data-parallel replica
        self.processes = [r.process for r in started if r.process is not None]
        self._replica_processes = [r.process for r in started]
        self._channels = [r.channel for r in started]
        self.replica_hosts = [r.host for r in started]
        self._private_dirs = [r.private_dir for r in started if r.private_dir is not None]
        self.num_blocks, self.vocab_size = started[0].info["num_blocks"], started[0].info["vocab_size"]
        if len(started) > 1:
            self.router = DPRouter(len(started), config.cache.block_size, self.stat_loggers,
                                   config.model.served_model_name or "model")
        self._tasks = [*(asyncio.create_task(self._read_loop(r), name=f"kc-engine-reader-{r}")
                         for r in range(len(started))),
                       asyncio.create_task(self._watch_process(), name="kc-engine-watch"),
                       asyncio.create_task(self._log_loop(), name="kc-stat-log")]
        return self

    @property
    def process(self):
        return self.processes[0]

    def _send(self, request_id: str, message) -> None:
        replica = self.replica_of.get(request_id, 0)
        if replica not in self.lost_replicas:
            self._channels[replica].send_nowait(message)

    # -- state ----------------------------------------------------------------------------------------

    @property
    def is_dead(self) -> bool:
        return self.dead_error is not None

    @property
    def num_requests_running(self) -> int:
        return self.last_stats.num_running

    @property
    def num_requests_waiting(self) -> int:
        return self.last_stats.num_waiting

    # -- requests ---------------------------------------------------------------------------------------

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                       prompt: str | None = None, lora_id: int = 0,
                       output_kind: str = "cumulative") -> AsyncIterator[RequestOutput]:
        """Cumulative outputs of one request; the last has ``finished=True``. Cancelling aborts it.
        ``output_kind="final_only"``: only the finished output (a caller that waits for it saves building and
        handing out one output per step)."""
        if self.dead_error is not None:
            raise EngineDeadError(f"the engine is dead: {self.dead_error}")
        if request_id in self.tracked:
            raise ValueError(f"request id {request_id!r} is already in use")
        if output_kind not in ("cumulative", "final_only"):
            raise ValueError(f"output_kind must be 'cumulative' or 'final_only', got {output_kind!r}")
        params = sampling_params.clone(output_kind=output_kind)
        core_requests = self.output_processor.add_request(request_id, prompt, prompt_token_ids, params,
                                                          self.eos_token_id, lora_id)
        tracked = _Tracked(asyncio.Queue(), params, len(prompt_token_ids))
        self.tracked[request_id] = tracked
        if self.router is not None:
            self.replica_of[request_id] = self.router.choose(prompt_token_ids)
        self._send(request_id, AddRequests(core_requests))
        is_finished = False
        try:
            while not is_finished:
                item = await tracked.queue.get()
                if isinstance(item, BaseException):
                    is_finished = True
                    raise item
                is_finished = item.finished
                yield item
        finally:
            if not is_finished:
                self.abort_nowait(request_id)
            replica = self.replica_of.pop(request_id, None)
            if replica is not None and self.router is not None:
                self.router.finished(replica)

    def abort_nowait(self, request_id: str) -> None:
        tracked = self.tracked.pop(request_id, None)
        child_ids = self.output_processor.abort_requests([request_id])
        if child_ids and self._channels and not self.is_dead:
            self._send(request_id, AbortRequests(child_ids))
        if tracked is not None:
            self._record_finished(tracked, "abort")

    async def abort(self, request_id: str) -> None:
        self.abort_nowait(request_id)

    def fail_all(self, error: BaseException) -> int:
        """Abort every request in flight; each ``generate`` raises ``error``. Returns how many there were."""
        failed = list(self.tracked.items())
        for request_id, tracked in failed:
            self.abort_nowait(request_id)
            tracked.queue.put_nowait(error)
        return len(failed)

    async def add_lora(self, lora_id: int, path: str, name: str | None = None) -> None:
        """Register an adapter directory before requests use ``lora_id``; returns once every worker checked it
        against the model (LoRAAdapterError, for the client, when they refused it)."""
        if self.dead_error is not None:
            raise EngineDeadError(f"the engine is dead: {self.dead_error}")
        loop = asyncio.get_running_loop()
        serving = self._serving()
        answers = {r: loop.create_future() for r in serving}  # every replica checks it against its model
        for replica, answer in answers.items():
            self._lora_answers[(lora_id, replica)] = answer
        try:
            for replica in serving:
                await self._channels[replica].send(AddLora(lora_id, name or str(lora_id), path))
            errors = [error for error in await asyncio.gather(*answers.values()) if error is not None]
        finally:
            for replica in answers:
                self._lora_answers.pop((lora_id, replica), None)
        if errors:
            from kernelcore.lora.adapter import LoRAAdapterError

            raise LoRAAdapterError(errors[0])

    async def remove_lora(self, lora_id: int) -> None:
        if self.dead_error is None:
            for replica in self._serving():
                await self._channels[replica].send(RemoveLora(lora_id))

    # -- the engine's messages ------------------------------------------------------------------------------

    async def _read_loop(self, replica: int = 0) -> None:
        try:
            while True:
                message = await self._channels[replica].recv()
                if isinstance(message, CoreOutputs):
                    self._on_outputs(message, replica)
                elif isinstance(message, CoreRequestErrors):
                    self._on_errors(message, replica)
                elif isinstance(message, LoraAdded):
                    answer = self._lora_answers.get((message.lora_id, replica))
                    if answer is not None and not answer.done():
                        answer.set_result(message.error)
                elif isinstance(message, CoreDead):
                    self._lose(replica, message.message)
                    return
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            why = f"engine core connection lost: {exc}"
            process = self._replica_processes[replica] if replica < len(self._replica_processes) else None
            if process is not None:  # a local engine core: say how it ended, once it has
                await asyncio.to_thread(process.process.join, 2.0)
                if process.process.exitcode is not None:
                    why = f"{process.role} process exited (exit code {process.process.exitcode})"
            self._lose(replica, why)

    def _on_outputs(self, message: CoreOutputs, replica: int = 0) -> None:
        now = time.monotonic()
        outputs, to_abort = self.output_processor.process_outputs(message.outputs.outputs)
        if to_abort:
            self._channels[replica].send_nowait(AbortRequests(to_abort))
        processor = self.output_processor
        for request_id, num_new in processor.new_tokens.items():  # final-only requests too
            tracked = self.tracked.get(request_id)
            if tracked is None:
                continue
            tracked.num_generation_tokens += num_new
            times, steps = tracked.token_times, processor.new_steps[request_id]
            if steps > 1 and times:  # steps the engine core merged: their latencies spread evenly
                last = times[-1]
                times.extend(last + (now - last) * i / steps for i in range(1, steps + 1))
            else:
                times.append(now)
        for output in outputs:
            tracked = self.tracked.get(output.request_id)
            if tracked is None:
                continue
            tracked.queue.put_nowait(output)
            if output.finished:
                self.tracked.pop(output.request_id, None)
                reasons = [c.finish_reason for c in output.outputs]
                self._record_finished(tracked, "length" if "length" in reasons else reasons[0] or "stop")
        if message.outputs.stats is not None:
            stats = message.outputs.stats
            if self.router is not None:
                stats = self.router.record(replica, stats)  # gauges summed over replicas, labelled per replica
            self.last_stats = stats
            for stat_logger in self.stat_loggers:
                stat_logger.record(stats)

    def _on_errors(self, message: CoreRequestErrors, replica: int = 0) -> None:
        error_cls = RequestRejected if message.is_rejected else RequestError
        for child_id, text in message.errors.items():
            child = self.output_processor.children.get(child_id)
            if child is None:
                continue
            parent_id = child.parent.request_id
            tracked = self.tracked.pop(parent_id, None)
            remaining = self.output_processor.abort_requests([parent_id])
            if remaining:
                self._channels[replica].send_nowait(AbortRequests(remaining))
            if tracked is not None:
                tracked.queue.put_nowait(error_cls(text))

    def _record_finished(self, tracked: _Tracked, finish_reason: str) -> None:
        now = time.monotonic()
        times = tracked.token_times
        ttft = (times[0] - tracked.arrival) if times else 0.0
        stats = FinishedRequestStats(
            finish_reason=finish_reason, num_prompt_tokens=tracked.num_prompt_tokens,
            num_generation_tokens=tracked.num_generation_tokens, max_tokens=tracked.params.max_tokens,
            n=tracked.params.n, e2e_latency=now - tracked.arrival, time_to_first_token=ttft, prefill_time=ttft,
            decode_time=(times[-1] - times[0]) if times else 0.0,
            inter_token_latencies=[b - a for a, b in itertools.pairwise(times)])
        for stat_logger in self.stat_loggers:
            try:
                stat_logger.record_finished(stats)
            except Exception:
                logger.exception("stat logger %s failed", type(stat_logger).__name__)

    def _die(self, error: EngineDeadError, is_expected: bool = False) -> None:
        if self.dead_error is not None:
            return
        if not is_expected:
            logger.error("engine is dead: %s", error)
        self.dead_error = error
        for answer in self._lora_answers.values():
            if not answer.done():
                answer.set_exception(EngineDeadError(str(error)))
        for tracked in list(self.tracked.values()):
            tracked.queue.put_nowait(EngineDeadError(str(error)))
        self.tracked.clear()

    async def _log_loop(self) -> None:
        while True:
            await asyncio.sleep(self._log_interval)
            for stat_logger in self.stat_loggers:
                try:
                    stat_logger.log()
                except Exception:
                    logger.exception("stat logger %s failed", type(stat_logger).__name__)

    async def shutdown(self, timeout: float = 10.0) -> None:
        for task in self._tasks:
            task.cancel()
        for replica in self._serving() if not self.is_dead else []:
            try:
                await self._channels[replica].send(ShutdownCore())
            except (ConnectionError, OSError):
                pass
        for process in self.processes:
            await asyncio.to_thread(process.process.join, timeout)
            process.terminate()
        for channel in self._channels:
            channel.close()
        for private_dir in self._private_dirs:
            remove_private_dir(private_dir)
        for stat_logger in self.stat_loggers:
            stat_logger.shutdown()
        self._die(EngineDeadError("the engine was shut down"), is_expected=True)
