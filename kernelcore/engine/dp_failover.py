"""What the front end does when a data-parallel replica is lost: its requests go on on the others.

Each in-flight request of the lost replica is sent to a survivor with its prompt, the tokens it produced and
its sampling parameters (seeded draws depend on the seed and the position only), so it continues where it
stopped; the lost replica's share leaves the gauges at once. Losing the last replica kills the engine.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kernelcore.engine.core_client import EngineDeadError
from kernelcore.engine.core_proc import AddRequests
from kernelcore.metrics.stats import EngineStats

if TYPE_CHECKING:
    from kernelcore.engine.dp_router import DPRouter
    from kernelcore.engine.output_processor import OutputProcessor

logger = logging.getLogger("kernelcore.engine")


class ReplicaFailover:
    """Mixed into AsyncLLM (whose state it reads: replicas, router, tracked requests, stat loggers)."""

    router: DPRouter | None
    output_processor: OutputProcessor
    tracked: dict[str, Any]
    replica_of: dict[str, int]
    replica_hosts: list[str]
    lost_replicas: dict[int, str]
    dead_error: BaseException | None
    last_stats: EngineStats
    stat_loggers: list
    _channels: list
    _replica_processes: list
    _lora_answers: dict
    _tasks: list[asyncio.Task]

    def _serving(self) -> list[int]:
        return [r for r in range(len(self._channels)) if r not in self.lost_replicas]

    if TYPE_CHECKING:
        def _die(self, error: EngineDeadError, is_expected: bool = False) -> None: ...

    def _lose(self, replica: int, why: str) -> None:
        """A lost replica is dropped and its requests go on elsewhere; losing the last one kills the engine."""
        if replica in self.lost_replicas or self.dead_error is not None:
            return
        if self.router is None:
            self._die(EngineDeadError(why))
            return
        why = f"data-parallel replica {replica} ({self.replica_hosts[replica]}) lost: {why}"
        if len(self._serving()) <= 1:
            self._die(EngineDeadError(why))
            return
        logger.error("%s; its requests go on on the other replicas", why)
        self.lost_replicas[replica] = why
        self.router.drop(replica)
        self._channels[replica].close()
        process = self._replica_processes[replica]
        if process is not None:  # an engine core that lost its workers may still be alive
            self._tasks.append(asyncio.create_task(asyncio.to_thread(process.terminate),
                                                   name=f"kc-end-replica-{replica}"))
        for answer_key, answer in list(self._lora_answers.items()):
            if answer_key[1] == replica and not answer.done():
                answer.set_result(None)  # a lost replica does not veto an adapter
        num_moved = 0
        for request_id in [rid for rid, r in self.replica_of.items() if r == replica]:
            num_moved += self._resubmit(request_id, replica)
        if num_moved:
            logger.warning("%d request(s) of data-parallel replica %d resumed on the other replicas", num_moved,
                           replica)
        self._publish_gauges()

    def _resubmit(self, request_id: str, lost: int) -> int:
        """Carry one request of a lost replica to another: its prompt, the tokens it has produced and its sampling
        parameters (seeded draws depend on the seed and the position only), so it goes on where it stopped."""
        assert self.router is not None  # only data parallelism loses a replica and serves on
        core_requests = self.output_processor.resume_requests(request_id)
        parent = self.output_processor.parents.get(request_id)
        if not core_requests or parent is None or request_id not in self.tracked:
            return 0
        target = self.router.resubmitted(lost, parent.prompt_token_ids)
        self.replica_of[request_id] = target
        self._channels[target].send_nowait(AddRequests(core_requests))
        return 1

    def _publish_gauges(self) -> None:
        """Engine-wide gauges without the lost replicas' share, now (the others may be idle and report nothing)."""
        assert self.router is not None
        latest, serving = self.router.latest, self._serving()
        stats = EngineStats(timestamp=self.last_stats.timestamp, num_running=sum(s.num_running for s in latest),
                            num_waiting=sum(s.num_waiting for s in latest),
                            kv_cache_usage=sum(s.kv_cache_usage for s in latest) / max(1, len(serving)),
                            running_lora_adapters=self.last_stats.running_lora_adapters,
                            waiting_lora_adapters=self.last_stats.waiting_lora_adapters)
        self.last_stats = stats
        for stat_logger in self.stat_loggers:
            stat_logger.record(stats)

    async def _watch_process(self) -> None:
        """A local engine core that exits loses its replica (the connection's end usually says so first)."""
        while self.dead_error is None:
            for replica, process in enumerate(self._replica_processes):
                if process is not None and replica not in self.lost_replicas and not process.is_alive():
                    self._lose(replica, f"{process.role} process exited (exit code {process.process.exitcode})")
            await asyncio.sleep(0.5)
