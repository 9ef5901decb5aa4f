"""What the engine core expects of an executor, whichever plugin provides it.

An executor is constructed with the finished :class:`~kernelcore.config.KernelConfig` inside the engine-core
process and drives every worker of one engine (all its tensor-parallel ranks, on one host or several).
"""

from __future__ import annotations

from kernelcore.config import KernelConfig
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

    def add_lora(self, lora_id: int, path: str) -> None:
        raise NotImplementedError

    def remove_lora(self, lora_id: int) -> None:
        raise NotImplementedError

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass
