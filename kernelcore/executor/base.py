"""What the engine core expects of an executor, whichever plugin provides it.

An executor is constructed with the finished :class:`~kernelcore.config.KernelConfig` inside the engine-core
process and drives every worker of one engine (all its tensor-parallel ranks, on one host or several).
"""

from __future__ import annotations

from typing import Any

from kernelcore.contract.config import KernelConfig
from kernelcore.core_types.runner_output import ModelRunnerOutput
from kernelcore.core_types.scheduler_output import SchedulerOutput
from kernelcore.errors import WorkerDiedError as WorkerDiedError  # public here too (docs/api.md)


class ExecutorBase:
    """The executor interface; ``vocab_size`` (an attribute or property) is the model's, once workers are up.
    ``check_health`` is called while the engine is idle; raise WorkerDiedError there
    (or from any call) when a worker is gone, and the engine is marked dead."""

    def __init__(self, config: KernelConfig) -> None:
        self.config = config

    @property
    def block_size(self) -> int:
        return self.config.cache.block_size

    def determine_num_blocks(self) -> int:
        raise NotImplementedError

    def initialize_cache(self, num_blocks: int) -> None:
        raise NotImplementedError

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        raise NotImplementedError

    @property
    def max_concurrent_batches(self) -> int:
        """Batches the engine core may keep in flight (> 1: it calls submit_model/collect_model instead of
        execute_model, and collects in submission order)."""
        return 1

    def submit_model(self, scheduler_output: SchedulerOutput) -> Any:
        """Start a batch without waiting for it; returns what collect_model takes."""
        return self.execute_model(scheduler_output)

    def collect_model(self, handle: Any) -> ModelRunnerOutput:
        """The output of the oldest submitted batch."""
        return handle

    def add_lora(self, lora_id: int, path: str) -> None:
        raise NotImplementedError

    def remove_lora(self, lora_id: int) -> None:
        raise NotImplementedError

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass
